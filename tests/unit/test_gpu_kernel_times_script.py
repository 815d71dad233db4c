"""`scripts/gpu_kernel_times.py`: a call's device time read from a profiler trace. The reading is tested on
traces written as text in the layout of a GPU trace (a device plane with stream lines, host marks);
the script itself runs its programs and traces on the CPU, where it finds no device plane and says so."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jax.profiler import ProfileData

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_kernel_times.py"
_spec = importlib.util.spec_from_file_location("gpu_kernel_times", SCRIPT)
kt = sys.modules.setdefault("gpu_kernel_times", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(kt)


def trace(device_lines: dict[str, list[tuple[str, int, int]]], marks: list[tuple[int, int]]) -> ProfileData:
    """A trace: one GPU plane whose lines hold (name, start_ns, end_ns) events, and a host plane with a
    call mark per (start_ns, end_ns)."""
    names = sorted({name for events in device_lines.values() for name, _, _ in events})
    ids = {name: i + 1 for i, name in enumerate(names)}
    lines = []
    for n, (line, events) in enumerate(device_lines.items()):
        body = " ".join(
            f"events {{ metadata_id: {ids[name]} offset_ps: {a * 1000} duration_ps: {(b - a) * 1000} }}"
            for name, a, b in events
        )
        lines.append(f'lines {{ id: {n + 1} name: "{line}" timestamp_ns: 0 {body} }}')
    metadata = " ".join(
        f'event_metadata {{ key: {i} value {{ id: {i} name: "{name}" }} }}' for name, i in ids.items()
    )
    mark_events = " ".join(
        f"events {{ metadata_id: 1 offset_ps: {a * 1000} duration_ps: {(b - a) * 1000} }}" for a, b in marks
    )
    text = (
        f'planes {{ id: 1 name: "/device:GPU:0" {" ".join(lines)} {metadata} }} '
        f'planes {{ id: 2 name: "/host:CPU" lines {{ id: 1 name: "python" timestamp_ns: 0 {mark_events} }} '
        f'event_metadata {{ key: 1 value {{ id: 1 name: "{kt.CALL_MARK}" }} }} }}'
    )
    return ProfileData.from_text_proto(text)


# Two calls. Call 1: a 10 ns kernel on one stream overlapping a 6 ns copy on another (busy 12 ns, span
# 12 ns); call 2: two kernels of 5 ns with a 3 ns gap (busy 10 ns, span 13 ns). A derived line repeats
# call 1's kernel and the tracer's own overhead has a line: neither may count.
STREAMS = {
    "Stream #13(Compute)": [
        ("GatherKernel", 1_000, 1_010),
        ("GatherKernel", 2_000, 2_005),
        ("Finish", 2_008, 2_013),
    ],
    "Stream #14(MemcpyH2D)": [("MemcpyH2D", 1_006, 1_012)],
    "XLA Ops": [("GatherKernel", 1_000, 1_010)],
    "CUPTI overhead": [("BUFFER_FLUSH", 2_013, 2_030)],
}


def test_a_calls_device_time_is_the_union_of_its_stream_events_inside_its_mark() -> None:
    found = kt.analyze(trace(STREAMS, [(990, 1_100), (1_990, 2_100)]), iters=2)
    assert found["split"] == "marks" and found["calls"] == 2 and found["events_outside_marks"] == 0
    assert found["busy_us"] == pytest.approx((0.012 + 0.010) / 2) and found["busy_us_min"] == pytest.approx(
        0.010
    )
    assert found["span_us"] == pytest.approx((0.012 + 0.013) / 2)
    assert found["wall_us"] == pytest.approx((0.110 + 0.110) / 2)
    assert found["events_per_call"] == 2
    assert found["by_name_us"] == pytest.approx(
        {"GatherKernel": 0.0075, "MemcpyH2D": 0.003, "Finish": 0.0025}
    )


def test_without_a_shared_clock_the_calls_are_told_apart_by_the_largest_gaps() -> None:
    # The marks lie far from the device events (as if the device clock were offset): no call gets an
    # event, so the events are split at their largest gap (between 1,012 and 2,000), with the same result.
    found = kt.analyze(trace(STREAMS, [(50_000, 50_100), (60_000, 60_100)]), iters=2)
    assert found["split"] == "gaps" and found["calls"] == 2 and found["wall_us"] is None
    assert found["busy_us"] == pytest.approx(0.011) and found["span_us"] == pytest.approx(0.0125)


def test_an_event_belongs_to_the_call_it_starts_in_and_events_of_no_call_are_counted_apart() -> None:
    streams = {
        "Stream #7(Compute)": [
            ("First", 10, 20), ("LongCopy", 90, 160), ("Second", 170, 180), ("RuntimeWork", 400, 420)
        ]
    }  # fmt: skip
    found = kt.analyze(trace(streams, [(0, 100), (150, 300)]), iters=2)
    assert found["split"] == "marks" and found["events_outside_marks"] == 1
    # call 1: First and LongCopy (which ends inside call 2's mark), call 2: Second alone
    assert found["by_name_us"] == pytest.approx({"LongCopy": 0.035, "First": 0.005, "Second": 0.005})
    assert found["busy_us_min"] == pytest.approx(0.010) and found["events_per_call"] == 1.5


def test_gaps_are_measured_from_the_latest_end_so_far() -> None:
    # A long event covers the next two; the last one starts 10 ns after it ends. From each event's own
    # end (or from starts), the largest gap would be the 50 ns before C, which lies inside A.
    events = [kt.Event("A", 0, 100), kt.Event("B", 10, 20), kt.Event("C", 70, 80), kt.Event("D", 110, 120)]
    groups = kt.split_by_gaps(events, 2)
    assert [[e.name for e in g] for g in groups] == [["A", "B", "C"], ["D"]]


def test_throughput_and_the_report_line() -> None:
    assert kt.gb_per_s(1 << 20, 100.0) == pytest.approx(10.48576)  # 1 MiB in 100 us
    record = {"point": "65536x256", "bytes": 16 << 20}
    for name, busy in (("gear_jax", 400.0), ("pinned_copy_jit", 320.0)):
        record[name] = {"busy_us": busy, "span_us": busy + 5, "wall_us": busy + 60, "events_per_call": 3,
                        "split": "marks", "busy_gbps": kt.gb_per_s(16 << 20, busy)}  # fmt: skip
    line = kt.report_line(record)
    assert "point 65536x256 (16.00 MiB)" in line and "gear_jax: busy 400.0 span 405.0 wall 460.0 us" in line
    assert "gear_jax / copy GB/s on the device: 0.80" in line


def test_the_union_counts_overlapping_events_once() -> None:
    events = [kt.Event("a", 0, 10), kt.Event("b", 5, 15), kt.Event("c", 2, 3), kt.Event("d", 20, 25)]
    assert kt.busy_ns(events) == 20
    assert kt.busy_ns([]) == 0
    groups = kt.split_by_gaps(sorted(events, key=lambda e: e.start_ns), 2)
    assert [[e.name for e in g] for g in groups] == [["a", "c", "b"], ["d"]]
    with pytest.raises(ValueError, match="cannot make 5 calls"):
        kt.split_by_gaps(events, 5)


def test_a_trace_without_device_events_says_which_lines_it_had() -> None:
    found = kt.analyze(trace({"XLA Ops": [("GatherKernel", 1_000, 1_010)]}, [(990, 1_100)]), iters=1)
    assert found["error"] == "no device events in the trace" and found["marks"] == 1
    assert found["device_lines"] == ["/device:GPU:0: XLA Ops"]


def test_points_are_parsed_and_bad_ones_named() -> None:
    rows, windows = kt.parse_points("65536x256, 4096x512w16")
    assert (rows.item_bytes, rows.batch, rows.window, rows.bytes_out) == (65536, 256, 0, 16 << 20)
    assert (windows.steps_out, windows.max_steps, windows.bytes_out, windows.label()) == (
        16, 64, 512 * 16 * 4096, "4096x512w16"
    )  # fmt: skip
    for bad in ("4096", "4096x", "0x32", "axb", ""):
        with pytest.raises(ValueError, match="--points"):
            kt.parse_points(bad)


def test_the_script_traces_its_programs_on_the_cpu_and_finds_no_device_plane(tmp_path: Path) -> None:
    out = tmp_path / "times.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--platform=cpu", "--points=1024x32,256x8w4", "--iters=3", "--warmup=1",
         "--table_mib=4", "--systems=gear_jax,pinned_copy_jit,jnp_take", f"--json={out}",
         f"--xspace_dir={tmp_path}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [p["point"] for p in report["points"]] == ["1024x32", "256x8w4"]
    for point in report["points"]:
        for system in ("gear_jax", "pinned_copy_jit", "jnp_take"):
            # every traced call was marked on the host; a CPU trace has no device plane
            assert point[system]["error"] == "no device events in the trace" and point[system]["marks"] == 3
    assert len(list(tmp_path.glob("*.xplane.pb"))) == 6
    assert "point 1024x32" in done.stdout


def test_without_a_gpu_the_script_says_so_and_exits_2() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--points=1024x32"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip
    assert done.returncode == 2 and "needs a GPU" in done.stderr

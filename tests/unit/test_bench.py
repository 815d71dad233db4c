"""Tests of the benchmarks (`benchmarks/`, imported as `gear_jax.bench`), not of speed.

Each suite runs once in a tiny configuration, as a subprocess of `python -m gear_jax.bench`, and its
report must cover exactly the requested sweep points and systems, with the requested iterations. The
statistics, speedups, diff and CUDA copy reference are checked on known inputs. Baselines that are not
installed are skipped by the suites with a note, so they never fail these tests. Tests marked `gpu`
time the CUDA copy reference for real and skip without a GPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gear_jax as gj
from gear_jax.bench import common, cuda_copy, priorities, references, selection, systems
from gear_jax.bench.data import Dataset
from gear_jax.bench.systems import Workload

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RECORD_KEYS = {"point", "system", "op", "iters", "latency_s", "throughput"}
REPORT_KEYS = {"suite", "available", "config", "machine", "notes", "plot", "records"}
TINY = ["--iters=4", "--warmup=1"]
GATHER_ALWAYS = ["gear_jax", "numpy", "jnp_take", "pinned_host_loop", "pure_callback", "pinned_copy"]
ON_CUDA = jax.default_backend() == "gpu"


def run_bench(out: Path, suite: str, *flags: str, module: str = "gear_jax.bench") -> dict[str, Any]:
    """Runs one suite with --json/--plot under `out`; returns the report."""
    report, plot = out / f"{suite}.json", out / f"{suite}.png"
    cmd = [sys.executable, "-m", module, suite, *TINY, *flags, f"--json={report}", f"--plot={plot}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(report.read_text())


def check_report(
    report: dict[str, Any],
    suite: str,
    points: list[dict[str, Any]],
    always: list[str],
    open_ended: tuple[str, ...] = (),
) -> None:
    """Structure: keys, one record per point x system x op, only of requested systems, each with the
    requested iterations; `always` systems have every point, others a subset; a requested system with
    no record has a note. Ops in `open_ended` (actor_learner's inserts) run for as long as the others
    do: at least one call per actor."""
    assert REPORT_KEYS <= set(report)
    assert report["suite"] == suite and report["available"] is True
    assert report["machine"]["cpu_count"] >= 1 and "version" in report["machine"]["gear_jax"]
    assert isinstance(report["machine"]["malloc_tuning"]["applied"], bool)
    assert isinstance(report["machine"]["gear_jax_environment"], dict)
    records = report["records"]
    counts = Counter((json.dumps(r["point"], sort_keys=True), r["system"], r["op"]) for r in records)
    assert all(n == 1 for n in counts.values()), counts
    assert {r["system"] for r in records} <= set(report["config"]["systems"])
    iters = report["config"]["iters"]
    for r in records:
        assert RECORD_KEYS <= set(r)
        if r["op"] in open_ended:
            assert r["iters"] >= r["point"]["world_size"], (r["system"], r["point"], r["iters"])
        else:  # one timed call per iteration, per writer process where several write
            assert r["iters"] == iters * r["point"].get("writers", 1), (r["system"], r["point"], r["iters"])
    wanted = {json.dumps(p, sort_keys=True) for p in points}
    for system in {r["system"] for r in records} | set(always):
        have = {json.dumps(r["point"], sort_keys=True) for r in records if r["system"] == system}
        assert have == wanted if system in always else have <= wanted, (system, have ^ wanted)
    for name in set(report["config"]["systems"]) - {r["system"] for r in records}:
        assert any(f"skipped {name}" in n for n in report["notes"]), (name, report["notes"])


def grid(**axes: list[Any]) -> list[dict[str, Any]]:
    """Every combination of the axes, as points."""
    return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


@pytest.fixture(scope="module")
def gather_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("gather")
    return out, run_bench(out, "gather", "--table_rows=1000", "--item_bytes=64,256", "--batch_size=8,32")


def by_point(records: list[dict[str, Any]], system: str) -> dict[str, dict[str, Any]]:
    """The records of one system, keyed by their point."""
    return {json.dumps(r["point"], sort_keys=True): r for r in records if r["system"] == system}


def check_reference(report: dict[str, Any], reference: str) -> None:
    """Every gear_jax record has its GB/s fraction and p50 ratio against the reference at its point,
    and the reference says what it timed: a CUDA copy on a CUDA GPU, a labelled host read elsewhere."""
    refs = by_point(report["records"], reference)
    gear = by_point(report["records"], "gear_jax")
    assert refs.keys() == gear.keys()
    for key, r in gear.items():
        ref = refs[key]
        fraction = r["throughput"]["bytes_per_s"] / ref["throughput"]["bytes_per_s"]
        assert r[f"bandwidth_fraction_vs_{reference}"] == pytest.approx(fraction)
        assert r[f"time_ratio_vs_{reference}"] == pytest.approx(
            r["latency_s"]["p50"] / ref["latency_s"]["p50"]
        )
        assert r[f"speedup_vs_{reference}"] == pytest.approx(1 / r[f"time_ratio_vs_{reference}"])
    kind = "cudaMemcpyAsync" if ON_CUDA else "numpy"
    assert all(r["measured_as"].startswith(kind) for r in refs.values()), refs
    assert any(n.startswith(f"{reference} is {kind}") for n in report["notes"]), report["notes"]


def test_gather_report_and_plot(gather_report: tuple[Path, dict[str, Any]]) -> None:
    out, report = gather_report
    points = grid(table_rows=[1000], item_bytes=[64, 256], window=[0], batch_size=[8, 32])
    check_report(report, "gather", points, always=GATHER_ALWAYS)
    gear = [r for r in report["records"] if r["system"] == "gear_jax"]
    assert all("speedup_vs_numpy" in r and r["speedup_vs_numpy"] > 0 for r in gear)
    assert all(r["iters"] == 4 for r in report["records"])
    assert (out / "gather.png").read_bytes()[:8] == PNG_MAGIC


def test_gather_references_and_memory_kinds(gather_report: tuple[Path, dict[str, Any]]) -> None:
    out, report = gather_report
    check_reference(report, "pinned_copy")
    for r in by_point(report["records"], "pinned_copy").values():  # B rows of 64 or 256 B: no padding
        copied = r["throughput"]["bytes_per_s"] / r["throughput"]["items_per_s"]
        assert copied == pytest.approx(r["point"]["item_bytes"])
    device = report["machine"]["devices"][0]
    notes = report["notes"]
    assert f"jnp_take holds its rows on {device}, memory kind device" in notes, notes
    pinned = f"pinned_host_loop holds its rows on {device}, memory kind pinned_host"
    loop = [n for n in notes if n.startswith(pinned)]
    assert len(loop) == 1 and "compiled program (B=8,32): parameters in host memory S(5): 1;" in loop[0], (
        notes
    )
    assert (
        "p50 / pinned_copy"
        in subprocess.run(
            [sys.executable, "-m", "gear_jax.bench.markdown", str(out / "gather.json")],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    )


def test_summary_of_reports(gather_report: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    out, report = gather_report
    cmd = [
        sys.executable,
        "-m",
        "gear_jax.bench.summary",
        str(out / "gather.json"),
        str(tmp_path / "none.json"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "  every point: table_rows=1000 window=0" in lines
    points = [line for line in lines if " sample_gather: gear_jax " in line]
    assert len(points) == 4 and all("| gear/pinned_copy: GB/s " in line for line in points), lines
    assert lines[-1] == f"{tmp_path / 'none.json'}: no report"


def test_gather_windows(tmp_path: Path) -> None:
    report = run_bench(
        tmp_path,
        "gather",
        "--table_rows=200",
        "--item_bytes=32",
        "--batch_size=8",
        "--window=4",
        "--systems=" + ",".join(GATHER_ALWAYS),
    )
    points = grid(table_rows=[200], item_bytes=[32], window=[4], batch_size=[8])
    check_report(report, "gather", points, always=GATHER_ALWAYS)
    assert report["records"][0]["throughput"]["bytes_per_s"] > 0
    copy = next(r for r in report["records"] if r["system"] == "pinned_copy")
    assert copy["throughput"]["bytes_per_s"] / copy["throughput"]["items_per_s"] == pytest.approx(4 * 32)


def gathered(name: str, work: Workload, batch_size: int, i: int) -> np.ndarray:
    """What one step of system `name` returns at iteration `i`."""
    system = systems.IN_PROCESS[name](work)
    try:
        return np.asarray(system.make_step(batch_size)(i))
    finally:
        system.close()


@pytest.mark.parametrize("window", [0, 3])
def test_host_memory_baselines_gather_what_jnp_take_gathers(window: int) -> None:
    data = Dataset(rows=40, steps=6 if window else 1, item_bytes=16)
    work = Workload(data, window=window)
    expected = gathered("jnp_take", work, 8, 3)
    flat = data.as_array().reshape(-1, data.item_bytes)
    picks = expected.reshape(8, max(window, 1), 16)
    for pick in picks:  # each pick is consecutive steps of one row, as stored
        first = next(i for i in range(len(flat)) if np.array_equal(flat[i], pick[0]))
        np.testing.assert_array_equal(pick, flat[first : first + len(pick)])
        assert first // data.steps == (first + len(pick) - 1) // data.steps
    assert len({p.tobytes() for p in picks}) > 1  # not one row repeated
    for name in ("pinned_host_loop", "pure_callback"):
        np.testing.assert_array_equal(gathered(name, work, 8, 3), expected, err_msg=name)


def measure_notes(name: str, work: Workload) -> tuple[list[dict[str, Any]], list[str]]:
    """Records and notes of `selection.measure` for one system at a tiny point."""
    notes: list[str] = []
    args = argparse.Namespace(systems=[name], iters=2, warmup=1, reverb_python=None, reverb_timeout=10.0)
    records = selection.measure(
        work, {"table_rows": work.data.rows}, "sample_gather", [8], args, notes.append
    )
    return records, notes


NO_CUDA_DEVICE = pytest.mark.skipif(
    gj._native.cuda_device_count() > 0, reason="a CUDA device can time the copy"
)


@NO_CUDA_DEVICE
@pytest.mark.parametrize("pinned", [False, True])
def test_cuda_copy_that_cannot_run_is_a_note(pinned: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(references, "cuda_device", lambda: (0, ""))  # as if jax ran on a CUDA GPU
    monkeypatch.setattr(gj.Table, "pinned", property(lambda self: pinned))
    records, notes = measure_notes("pinned_copy", Workload(Dataset(64, 1, 32)))
    assert records == []
    assert len(notes) == 1 and notes[0].startswith("skipped pinned_copy at"), notes
    why = notes[0].split("the pinned host-to-device copy could not be timed: ")[1]
    if pinned:  # the timer ran and found no libcudart, or a CUDA runtime without a device
        assert why.startswith("no loadable libcudart") or " failed: " in why, why
    else:
        assert why.startswith("the table's memory is not registered with CUDA"), why


def test_cuda_copy_timer_refuses_bad_input() -> None:
    memory = np.zeros(4096, np.uint8)
    with pytest.raises(ValueError, match="nbytes=0"):
        cuda_copy.time_host_to_device_copies(memory[:0])
    with pytest.raises(ValueError, match="repeats=0"):
        cuda_copy.time_host_to_device_copies(memory[:64], repeats=0)
    with pytest.raises(ValueError, match="C-contiguous"):
        cuda_copy.time_host_to_device_copies(memory[::2])


@NO_CUDA_DEVICE
def test_cuda_copy_timer_without_a_gpu_raises_its_error() -> None:
    with pytest.raises(cuda_copy.CudaCopyError, match="libcudart| failed: "):
        cuda_copy.time_host_to_device_copies(np.zeros(64, np.uint8))


def test_reference_spans_lie_inside_the_table() -> None:
    system = references.PinnedCopySystem(Workload(Dataset(rows=10, steps=1, item_bytes=64)))
    try:
        offset, nbytes = system.span(4, 2)
        assert system.bytes_of(offset, nbytes).ctypes.data == system.memory.ctypes.data + offset
        for i in range(8):  # every span of 4 of the 10 rows starts on a row and ends inside the column
            offset, nbytes = system.span(4, i)
            assert (offset - system.offset) % system.row_stride == 0 and nbytes == 4 * system.row_stride
            assert offset + nbytes <= system.offset + 10 * system.row_stride
        with pytest.raises(ValueError, match="not in the table"):
            system.bytes_of(system.memory.size - 8, 16)
    finally:
        system.close()


@pytest.mark.parametrize("window", [0, 3])
def test_pinned_copy_jit_copies_consecutive_rows_of_a_new_span_each_call(window: int) -> None:
    data = Dataset(rows=40, steps=4 if window else 1, item_bytes=64)
    system = references.PinnedCopyJitSystem(Workload(data, window=window))
    try:
        step = system.make_step(5)
        flat = data.as_array().reshape(-1, 64)
        spans = set()
        for i in range(6):
            out = np.asarray(step(i))
            steps = 5 * (window or 1)
            assert out.shape == (steps, 64)
            first = int(np.flatnonzero((flat == out[0]).all(axis=1))[0])
            np.testing.assert_array_equal(out, flat[first : first + steps])
            spans.add(first)
        assert len(spans) == 6  # each call copies another span
        with pytest.raises(common.Unavailable, match="more than the table"):
            system.make_step(1000)
    finally:
        system.close()


def test_pinned_copy_jit_without_pinned_host_memory_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(systems, "memory_kinds", lambda device: {"device"})
    with pytest.raises(common.Unavailable, match="no pinned_host memory"):
        references.PinnedCopyJitSystem(Workload(Dataset(rows=8, steps=1, item_bytes=64)))


@pytest.mark.gpu
def test_cuda_copy_times_copies_of_a_pinned_table() -> None:
    try:
        jax.devices("gpu")
    except RuntimeError:
        pytest.skip("jax sees no GPU")
    table = gj.Table.create(gj.TableSpec({"x": gj.Field((1 << 20,), "uint8")}, capacity=64))
    try:
        assert table.pinned, "gear_jax did not register the table's memory with CUDA"
        memory = np.frombuffer(table.native.mapping(), np.uint8)
        seconds = cuda_copy.time_host_to_device_copies(memory[: 64 << 20], device=0, repeats=5)
        assert len(seconds) == 5 and all(s > 0 for s in seconds), seconds
        assert (64 << 20) / np.median(seconds) > 1e9, seconds  # bytes/s: any PCIe or NVLink link
        del memory
    finally:
        table.close()
    system = references.PinnedCopySystem(Workload(Dataset(rows=256, steps=1, item_bytes=1024)))
    try:
        latencies = system.latencies([8, 64], warmup=1, iters=3, tick=lambda: None)
        assert system.measured_as.startswith("cudaMemcpyAsync"), system.measured_as
        assert sorted(latencies) == [8, 64] and all(len(v) == 3 and (v > 0).all() for v in latencies.values())
    finally:
        system.close()


def test_pinned_host_loop_without_pinned_host_memory_is_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(systems, "memory_kinds", lambda device: {"device"})
    records, notes = measure_notes("pinned_host_loop", Workload(Dataset(64, 1, 32)))
    assert records == []
    assert len(notes) == 1 and "has no pinned_host memory" in notes[0], notes


def test_host_memory_summary_reads_an_offloading_program() -> None:
    hlo = "\n".join(
        [
            "HloModule m, entry_computation_layout={(s32[], u8[100,64]{1,0:S(5)})->u8[8,64]{1,0}}",
            "  %p = u8[100,64]{1,0:S(5)} parameter(1)",
            "  %ds = u8[1,64]{1,0:S(5)} dynamic-slice(%p, %i, %z)",
            "  %cs = (u8[1,64]{1,0}, u8[1,64]{1,0:S(5)}, u32[]) copy-start(%ds)",
            "  %all = u8[100,64]{1,0} copy(%p)",
            "  ROOT %w = (s32[], u8[100,64]{1,0}) while(%t), condition=%c, body=%b",
        ]
    )
    assert systems.host_memory_summary(hlo, "u8[100,64]", "u8[8,64]") == (
        "parameters in host memory S(5): 1; ops with results in host memory: copy-start x1, "
        "dynamic-slice x1, parameter x1; ops producing the whole table: copy x1"
    )
    assert systems.host_memory_summary(hlo, "u8[100,64]", "u8[100,64]").endswith(
        "ops producing the whole table: not told apart (result of the table's shape)"
    )


def test_priorities(tmp_path: Path) -> None:
    # about 49 B of table per row: 0.002 GiB for two tables caps 100000 rows to about 21900
    report = run_bench(
        tmp_path, "priorities", "--table_rows=1000,100000", "--batch_size=16", "--mem_budget_gib=0.002"
    )
    rows = sorted({r["point"]["table_rows"] for r in report["records"]})
    assert rows[0] == 1000 and 1000 < rows[1] < 100000, rows
    assert any(f"table_rows capped from 100000 to {rows[1]}" in n for n in report["notes"]), report["notes"]
    points = grid(table_rows=rows, item_bytes=[8], batch_size=[16])
    check_report(report, "priorities", points, always=["gear_jax", "priority_read"])
    assert {r["op"] for r in report["records"]} == {"prioritized"}
    for r in report["records"]:  # both account one read of the state column: 8 B per row
        per_step = r["throughput"]["bytes_per_s"] / r["throughput"]["items_per_s"] * 16
        assert per_step == pytest.approx(8 * r["point"]["table_rows"])
    check_reference(report, "priority_read")
    assert (tmp_path / "priorities.png").read_bytes()[:8] == PNG_MAGIC


def test_priorities_baselines_and_update_workload(tmp_path: Path) -> None:
    report = run_bench(
        tmp_path, "priorities", "--table_rows=1000", "--batch_size=16", "--workloads=static,update"
    )
    points = grid(table_rows=[1000], item_bytes=[8], batch_size=[16])
    always = ["gear_jax", "gear_jax_host", "numpy_cumsum", "jnp_take", "priority_read"]
    check_report(report, "priorities", points, always=always)
    assert {r["op"] for r in report["records"]} == {"prioritized", "prioritized+update"}
    ran = {(r["system"], r["op"]) for r in report["records"]}
    # The learner step with the update as a JAX effect runs in the update workload only.
    assert {op for s, op in ran if s == "gear_jax_effect"} == {"prioritized+update"}
    for r in report["records"]:
        if r["system"] == "gear_jax":  # a ratio against every baseline that ran at its point and op
            baselines = {s for s, op in ran if op == r["op"] and s not in common.GEAR_SYSTEMS}
            assert {f"speedup_vs_{s}" for s in baselines} <= set(r), (r["op"], sorted(r))
            assert "time_ratio_vs_priority_read" in r


def test_interleaved_priorities_cap_tables_for_every_system_held_at_once(tmp_path: Path) -> None:
    # about 49 B of table per row: 0.002 GiB for 4 tables (3 systems + 1) caps 100000 rows near 10950
    report = run_bench(
        tmp_path,
        "priorities",
        "--table_rows=100000",
        "--batch_size=16,32",
        "--mem_budget_gib=0.002",
        "--interleave=2",
        "--systems=gear_jax,numpy_cumsum,priority_read",
        "--workloads=static,update",
    )
    rows = {r["point"]["table_rows"] for r in report["records"]}
    assert len(rows) == 1 and 8000 < rows.pop() < 14000, report["notes"]
    assert any("must hold 4 tables" in n for n in report["notes"]), report["notes"]
    assert report["config"]["interleave"] == 2
    check_report(
        report,
        "priorities",
        grid(
            table_rows=sorted({r["point"]["table_rows"] for r in report["records"]}),
            item_bytes=[8],
            batch_size=[16, 32],
        ),
        always=["gear_jax", "numpy_cumsum", "priority_read"],
    )
    assert {r["op"] for r in report["records"]} == {"prioritized", "prioritized+update"}
    for r in report["records"]:
        if r["system"] == "gear_jax":
            assert {"speedup_vs_numpy_cumsum", "time_ratio_vs_priority_read"} <= set(r)


def test_interleave_calls_takes_turns_and_numbers_each_steps_calls() -> None:
    calls: list[tuple[str, int]] = []
    steps = {name: (lambda i, name=name: calls.append((name, i))) for name in ("a", "b", "c")}
    ticks = []
    latencies = selection.interleave_calls(steps, iters=5, turn=2, tick=lambda: ticks.append(1))
    assert calls == [
        *[("a", 0), ("a", 1), ("b", 0), ("b", 1), ("c", 0), ("c", 1)],  # round 0: a, b, c
        *[("b", 2), ("b", 3), ("c", 2), ("c", 3), ("a", 2), ("a", 3)],  # round 1: b, c, a
        *[("c", 4), ("a", 4), ("b", 4)],  # round 2: c, a, b; the last call of each
    ]
    assert len(ticks) == 15
    assert set(latencies) == {"a", "b", "c"}
    for times in latencies.values():
        assert times.shape == (5,) and np.all(times >= 0) and np.all(times < 1)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7])
def test_turn_orders_let_every_step_follow_every_other_equally_often(n: int) -> None:
    orders = selection.turn_orders(n)
    assert len(orders) == (n if n % 2 == 0 else 2 * n)
    assert all(sorted(order) == list(range(n)) for order in orders)
    follows = Counter((a, b) for order in orders for a, b in zip(order, order[1:]))
    assert set(follows) == {(a, b) for a in range(n) for b in range(n) if a != b}
    assert len(set(follows.values())) <= 1, follows  # each ordered pair equally often
    # A rotation (round r starting with step r) would not do: step k would always follow step k - 1.
    rotations = [[(r + k) % n for k in range(n)] for r in range(n)]
    assert n < 3 or Counter((a, b) for order in rotations for a, b in zip(order, order[1:]))[(1, 2)] == n - 1


def test_interleave_flag_refuses_other_suites_and_negative_turns() -> None:
    for flags in (["insert", "--interleave=2"], ["gather", "--interleave=-1"]):
        done = subprocess.run(
            [sys.executable, "-m", "gear_jax.bench", *flags], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2 and "--interleave" in done.stderr, (flags, done.stderr)


def test_priorities_workloads_flag_refuses_unknown_names() -> None:
    cmd = [sys.executable, "-m", "gear_jax.bench", "priorities", "--workloads=static,dynamic"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--workloads" in done.stderr, done.stderr


def test_sum_tree_nodes_are_those_flashbax_sets() -> None:
    sum_tree = pytest.importorskip("flashbax.buffers.sum_tree")
    leaves = Dataset(1000, 1, 8).priorities().astype(np.float64) ** 0.6
    nodes, depth = systems.sum_tree_nodes(leaves)
    state = sum_tree.set_batch_scan(sum_tree.init(1000), jnp.arange(1000), jnp.asarray(leaves, jnp.float32))
    assert depth == state.tree_depth and nodes.shape == state.nodes.shape
    np.testing.assert_allclose(nodes, np.asarray(state.nodes), rtol=1e-5)


@pytest.mark.parametrize(
    "name", ["gear_jax", "gear_jax_host", "gear_jax_effect", "numpy_cumsum", "flashbax_sumtree", "jnp_take"]
)
def test_priority_update_steps_set_the_priorities_of_their_last_picks(name: str) -> None:
    """Each update step sets new priorities (p**a for the baselines) of the rows the step before picked
    and of no other row, and picks row ids of the table."""
    if name == "flashbax_sumtree":
        pytest.importorskip("flashbax")
    work = Workload(Dataset(64, 1, 8), "prioritized", 0.5, collect=False)
    system = priorities.build(name, work, updates=True)
    try:
        step = system.make_step(8)
        start = held_priorities(system)
        picks = np.asarray(step(0).indices if name.startswith("gear_jax") else step(0))
        assert picks.shape == (8,) and ((0 <= picks) & (picks < 64)).all(), picks
        first = held_priorities(system)
        assert 1 <= np.count_nonzero(first != start) <= 8  # the picks made when the step was built
        step(1)
        changed = np.flatnonzero(held_priorities(system) != first)
        assert 1 <= len(changed) and set(changed) <= set(picks.tolist()), (changed, picks)
    finally:
        system.close()


def held_priorities(system: systems.System) -> np.ndarray:
    """The priorities (gear_jax) or p**a (baselines) a system of the priorities suite holds, float64[N]."""
    if isinstance(system, systems.GearSystem):
        return system.table.row_status()["priority"].astype(np.float64)
    if isinstance(system, systems.FlashbaxSumTreeSystem):
        rows = jnp.arange(system.work.data.rows)
        return np.asarray(system.sum_tree.get_batch(system.state, rows), np.float64)
    return np.array(system.weights, np.float64)  # a copy: numpy_cumsum writes into its array


def test_gather_only_systems_are_not_sample_systems() -> None:
    cmd = [sys.executable, "-m", "gear_jax.bench", "sample", "--systems=gear_jax,pinned_copy"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "not systems of the sample suite" in done.stderr, done.stderr


def test_sample(tmp_path: Path) -> None:
    report = run_bench(
        tmp_path,
        "sample",
        "--table_rows=300",
        "--batch_size=8,16",
        "--methods=uniform,prioritized,fifo,lifo,topk",
        "--systems=gear_jax,numpy,jnp_take",
    )
    points = grid(table_rows=[300], item_bytes=[8], batch_size=[8, 16])
    check_report(report, "sample", points, always=["gear_jax", "numpy", "jnp_take"])
    assert {r["op"] for r in report["records"]} == {"uniform", "prioritized", "fifo", "lifo", "topk"}
    assert (tmp_path / "sample.png").read_bytes()[:8] == PNG_MAGIC


def test_insert_with_writer_processes(tmp_path: Path) -> None:
    report = run_bench(
        tmp_path,
        "insert",
        "--table_rows=500",
        "--item_bytes=64",
        "--batch_size=8",
        "--writers=1,2",
        "--systems=gear_jax,gear_jax_jit,gear_jax_jit_scan8,numpy",
    )
    gear = grid(table_rows=[500], writers=[1, 2], item_bytes=[64], batch_size=[8])
    check_report(report, "insert", gear, always=["gear_jax"])
    for system in ("numpy", "gear_jax_jit", "gear_jax_jit_scan8"):  # in this process: one writer
        points = [r["point"]["writers"] for r in report["records"] if r["system"] == system]
        assert points == [1], system
    assert (tmp_path / "insert.png").read_bytes()[:8] == PNG_MAGIC


def test_insert_one_row_against_a_numpy_row_write(tmp_path: Path) -> None:
    report = run_bench(
        tmp_path,
        "insert",
        "--table_rows=300",
        "--item_bytes=64",
        "--batch_size=1",
        "--writers=1",
        "--systems=gear_jax,numpy,sb3",
    )
    one_row = [r for r in report["records"] if "_one_row" in r["op"]]
    sb3 = {("sb3", "add_one_row")} if any(r["system"] == "sb3" for r in one_row) else set()
    if not sb3:  # not installed here: skipped with a note, never a made-up number
        assert any(n.startswith("skipped sb3 add_one_row") for n in report["notes"]), report["notes"]
    assert {(r["system"], r["op"]) for r in one_row} == {
        ("gear_jax", "add_one_row"),
        ("gear_jax", "add_one_row_typed"),
        ("gear_jax", "insert_one_row"),
        ("gear_jax", "insert_one_row_typed"),
        ("numpy", "add_one_row"),
    } | sb3
    for r in one_row:  # a CartPole transition: obs and next_obs float32[4], int32, float32, float32 done
        assert r["point"] == {"table_rows": 300, "writers": 1, "item_bytes": 44, "batch_size": 1}
        assert r["throughput"]["items_per_s"] > 0 and r["iters"] == report["config"]["iters"]
    gear_add = next(r for r in one_row if r["op"] == "add_one_row" and r["system"] == "gear_jax")
    numpy_add = next(r for r in one_row if r["system"] == "numpy")
    assert gear_add["speedup_vs_numpy"] == pytest.approx(
        numpy_add["latency_s"]["p50"] / gear_add["latency_s"]["p50"]
    )
    # The insert points of batches never run the one-row-only baseline.
    assert not [r for r in report["records"] if r["system"] == "sb3" and r["op"] == "insert"]


def test_actor_learner(tmp_path: Path) -> None:
    report = run_bench(
        tmp_path,
        "actor_learner",
        "--table_rows=500",
        "--item_bytes=64",
        "--batch_size=16",
        "--world_size=1,2",
        "--insert_batch=8",
    )
    points = grid(table_rows=[500], item_bytes=[64], batch_size=[16], world_size=[1, 2])
    check_report(report, "actor_learner", points, always=["gear_jax"], open_ended=("insert",))
    assert {r["op"] for r in report["records"]} == {"insert", "learner_step"}
    assert (tmp_path / "actor_learner.png").read_bytes()[:8] == PNG_MAGIC


def test_actor_learner_with_a_rate_limiter(tmp_path: Path) -> None:
    """Under --samples_per_insert the limiter's shared counts end within its bounds, so the achieved
    ratio is the target within the tolerance (error_buffer plus the prefill's offset, over the inserts)."""
    report = run_bench(
        tmp_path,
        "actor_learner",
        "--iters=20",
        "--table_rows=500",
        "--item_bytes=64",
        "--batch_size=8",
        "--world_size=1,2",
        "--insert_batch=4",
        "--samples_per_insert=2",
    )
    points = grid(
        table_rows=[500], item_bytes=[64], batch_size=[8], world_size=[1, 2], samples_per_insert=[2.0]
    )
    check_report(report, "actor_learner", points, always=["gear_jax"], open_ended=("insert",))
    for r in report["records"]:
        limiter = r["rate_limiter"]
        assert limiter["error_buffer"] == 8 + 4 * 2  # the default: batch + insert_batch x ratio
        assert limiter["samples"] == (20 + 1) * 8  # warmup and timed learner steps, each declaring 8
        assert limiter["min_diff"] <= limiter["diff"] <= limiter["max_diff"]
        assert r["achieved_samples_per_insert"] == pytest.approx(limiter["samples"] / limiter["inserts"])
        tolerance = (limiter["error_buffer"] + 2 * limiter["min_size_to_sample"]) / limiter["inserts"]
        assert abs(r["achieved_samples_per_insert"] - 2) <= tolerance + 1e-9, r


def test_latency_statistics_and_throughput_of_known_timings() -> None:
    latencies = [0.004, 0.001, 0.003, 0.002, 0.010]
    stats = common.latency_stats(latencies)
    assert stats["p50"] == pytest.approx(0.003)
    assert stats["p75"] == pytest.approx(0.004)
    assert stats["p90"] == pytest.approx(0.0076)  # linear interpolation between 0.004 and 0.010
    assert stats["mean"] == pytest.approx(0.004) and stats["min"] == 0.001 and stats["max"] == 0.010
    record = common.make_record({"batch_size": 8}, "gear_jax", "op", latencies, 8, 8 * 1024)
    assert record["iters"] == 5
    assert record["throughput"]["items_per_s"] == pytest.approx(40 / 0.020)  # total items / total time
    assert record["throughput"]["bytes_per_s"] == pytest.approx(40 * 1024 / 0.020)
    overlapped = common.make_record({"batch_size": 8}, "gear_jax", "op", latencies, 8, 0, wall_s=0.010)
    assert overlapped["throughput"]["items_per_s"] == pytest.approx(40 / 0.010)


def test_speedups_compare_p50_at_the_same_point_and_op() -> None:
    records = [
        common.make_record({"b": 1}, "gear_jax", "op", [1.0, 1.0, 1.0], 1, 1),
        common.make_record({"b": 1}, "numpy", "op", [3.0, 3.0, 3.0], 1, 1),
        common.make_record({"b": 2}, "numpy", "op", [5.0, 5.0, 5.0], 1, 1),
    ]
    common.add_speedups(records)
    assert records[0]["speedup_vs_numpy"] == pytest.approx(3.0)
    assert "speedup_vs_numpy" not in records[1]


def test_torch_handoff(tmp_path: Path) -> None:
    report = run_bench(
        tmp_path,
        "torch",
        "--table_rows=256",
        "--item_bytes=64",
        "--batch_size=16",
        "--systems=gear_jax,numpy_from,copy",
    )
    points = grid(table_rows=[256], item_bytes=[64], batch_size=[16])
    check_report(report, "torch", points, always=["gear_jax", "numpy_from", "copy"])
    ops = {(r["system"], r["op"]) for r in report["records"]}
    assert ops == {
        ("gear_jax", "handoff"),
        ("gear_jax", "sampler"),
        ("numpy_from", "handoff"),
        ("copy", "handoff"),
    }


def test_pool_fresh_against_pooled(tmp_path: Path) -> None:
    report = run_bench(tmp_path, "pool", "--table_rows=256", "--item_bytes=4096", "--batch_size=16")
    points = [
        {
            "table_rows": 256,
            "item_bytes": 4096,
            "batch_size": 16,
            "table_bytes": report["records"][0]["point"]["table_bytes"],
        }
    ]
    check_report(report, "pool", points, ["gear_jax", "fresh_create"])
    ops = {(r["system"], r["op"]) for r in report["records"]}
    assert ops == {
        (s, op) for s in ("gear_jax", "fresh_create") for op in ("create", "first_call", "close", "cycle")
    }
    pooled = {r["op"]: r for r in report["records"] if r["system"] == "gear_jax"}
    assert {"speedup_vs_fresh_create"} <= set(pooled["cycle"])
    # Every timed pooled create reused the closed table's memory and handle; no fresh create did.
    iters = report["config"]["iters"]
    assert pooled["cycle"]["pool_counts"] == {"reused": iters, "reused_handles": iters, "pooled": iters}
    fresh = next(r for r in report["records"] if r["system"] == "fresh_create")
    assert fresh["pool_counts"] == {"reused": 0, "reused_handles": 0, "pooled": 0}
    assert report["records"][0]["point"]["table_bytes"] >= 256 * 4096


def hand_made_report(latencies: dict[tuple[int, str], float]) -> dict[str, Any]:
    """A report with one record per (batch size, system) of constant latency, 8 items per call."""
    records = [
        common.make_record({"batch_size": b}, system, "op", [seconds] * 3, 8, 0)
        for (b, system), seconds in latencies.items()
    ]
    machine = {"cpu": "test cpu", "gear_jax": {"version": "0"}}
    return {"suite": "gather", "machine": machine, "records": records}


def test_diff_of_two_hand_made_reports(tmp_path: Path) -> None:
    base = hand_made_report({(8, "gear_jax"): 0.002, (8, "numpy"): 0.004, (16, "gear_jax"): 0.010})
    test = hand_made_report({(8, "gear_jax"): 0.001, (8, "numpy"): 0.005, (32, "gear_jax"): 0.020})
    (tmp_path / "base.json").write_text(json.dumps(base))
    (tmp_path / "test.json").write_text(json.dumps(test))
    cmd = [
        sys.executable,
        "-m",
        "gear_jax.bench.diff",
        str(tmp_path / "base.json"),
        str(tmp_path / "test.json"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rows = {}
    for line in done.stdout.splitlines():  # table rows: point | system | op | 6 figures
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) == 9 and cells[0].startswith("{"):
            rows[(json.loads(cells[0])["batch_size"], cells[1])] = (cells[5], cells[8])
    # p50 diff and items/s diff, (test - base) / base; "-" where one report lacks the record
    assert rows == {
        (8, "gear_jax"): ("-50.0%", "+100.0%"),
        (8, "numpy"): ("+25.0%", "-20.0%"),
        (16, "gear_jax"): ("-", "-"),
        (32, "gear_jax"): ("-", "-"),
    }, done.stdout


@pytest.mark.multiprocess
def test_sharded_layouts_modes_and_bytes_moved(tmp_path: Path) -> None:
    from gear_jax import sharded
    from gear_jax.bench import sharded as suite

    # Uniform and prioritized, and one decentralized method once gear_jax.sharded has them: the others
    # compile the same way and would only lengthen the test (each system compiles in every process).
    methods = ["uniform", "prioritized", *(["topk"] if "topk" in sharded.SHARDED_METHODS else [])]
    report = run_bench(
        tmp_path,
        "sharded",
        "--layouts=1x2,2x1",
        "--table_rows=64",
        "--item_bytes=32",
        "--batch_size=8",
        f"--methods={','.join(methods)}",
    )
    systems = [f"{mode}_{method}" for mode in ("global", "globalfull", "local") for method in methods]
    points = [
        {"shards": 2, "devices_per_process": d, "table_rows": 64, "item_bytes": 32, "batch_size": 8}
        for d in (2, 1)
    ]
    check_report(report, "sharded", points, always=systems)
    records = report["records"]
    assert sorted((r["layout"], r["system"]) for r in records) == sorted(
        itertools.product(["1x2", "2x1"], systems)
    )
    for r in records:
        assert r["processes"] * r["point"]["devices_per_process"] == r["point"]["shards"]
        assert len(r["per_process_p50_s"]) == r["processes"]
        assert 0 < r["latency_s"]["p50"] <= r["latency_s"]["max"]
        assert r["throughput"]["bytes_per_s"] == pytest.approx(32 * r["throughput"]["items_per_s"])
        # S = 2 shards of C = 64 rows, B = 8 picks of R = 32 bytes, by hand: counts 4 S^2 = 16;
        # global selection 4 S^2 + 16 = 32, rows S B (R + 17) = 784; naive 4 S C + 4 S B = 576.
        moved = r["bytes_moved"]
        assert moved["naive"] == {
            "select": 576,
            "rows": moved["gear_jax"]["rows"],
            "total": 576 + moved["gear_jax"]["rows"],
        }
        if r["mode"] == "local":
            assert moved["gear_jax"] == {"select": 16, "rows": 0, "total": 16}
            assert r["exchange_capacities"] is None
            continue
        # B / S = 4 picks per consumer: every capacity is 4, full-size blocks.
        assert set(r["exchange_capacities"]) == {4} and moved["sent_over_picked"] == 2.0
        if r["method"] == "topk":
            assert moved["gear_jax"] == {"select": 8 * 4 * 8 + 16, "rows": 784, "total": 256 + 16 + 784}
        else:
            assert moved["gear_jax"] == {"select": 32, "rows": 784, "total": 816}
            assert moved["select_ratio"] == 18.0 and moved["total_ratio"] == pytest.approx(1360 / 816)

    # A known shape: S = 4, C = 1000, B = 64, R = 100 (slots of 117 bytes).
    g = suite.bytes_moved("global", "prioritized", 4, 1000, 64, 100)
    assert g["gear_jax"] == {"select": 128, "rows": 4 * 64 * 117, "total": 128 + 29952}
    assert g["naive"] == {"select": 17024, "rows": 29952, "total": 17024 + 29952}
    assert g["picked_row_bytes"] == 64 * 117 and g["sent_over_picked"] == 4.0
    # The compact exchange with blocks of 100 slots at S = 4, B = 1024: S^2 x 100 slots sent for 1,024.
    c = suite.bytes_moved("global", "uniform", 4, 1000, 1024, 100, block_capacity=100)
    assert c["gear_jax"]["rows"] == 16 * 100 * 117 and c["sent_over_picked"] == pytest.approx(1600 / 1024)
    assert suite.bytes_moved("global", "fifo", 4, 1000, 64, 100)["gear_jax"]["select"] == 8 * 16 * 64 + 64
    assert suite.bytes_moved("local", "uniform", 4, 1000, 64, 100)["gear_jax"] == {
        "select": 64,
        "rows": 0,
        "total": 64,
    }
    # With many rows per shard, every design of gear_jax selects with fewer bytes than one rank would.
    for mode, method in itertools.product(suite.MODES, suite.METHODS):
        for shards in (2, 4, 8, 16):
            m = suite.bytes_moved(mode, method, shards, 1_000_000, 1024, 1024)
            assert m["gear_jax"]["select"] < m["naive"]["select"], (mode, method, shards)
            assert m["select_ratio"] > 1 and m["total_ratio"] >= 1


def test_the_machine_record_names_the_gear_jax_variables_that_are_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GEAR_JAX_HUGE_PAGES", "0")
    monkeypatch.delenv("GEAR_JAX_GATHER_BLOCK_ROW_BYTES", raising=False)
    monkeypatch.setenv("NOT_GEAR_JAX_HUGE_PAGES", "1")
    environment = common.machine_info()["gear_jax_environment"]
    assert environment["GEAR_JAX_HUGE_PAGES"] == "0"
    assert (
        "GEAR_JAX_GATHER_BLOCK_ROW_BYTES" not in environment and "NOT_GEAR_JAX_HUGE_PAGES" not in environment
    )

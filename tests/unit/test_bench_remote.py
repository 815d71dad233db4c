"""Tests of the `remote` benchmark suite (`benchmarks/remote_inserts.py`), not of speed.

A tiny sweep (1 and 2 actors, 1 and 32 rows per call, 1 KiB rows, a fifth of a second per point) of the
gear_jax systems and torch_rpc; Reverb's (reverb and reverb_buffered) runs only where its interpreter is
installed. Also: the measuring loop's buffered calls (in threads), and the table and plot showing
gear_jax_remote as the suite's gear_jax.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import queue
import threading
import time

import pytest

from gear_jax.bench import __main__ as bench_main
from gear_jax.bench import display, plot
from gear_jax.bench import remote_inserts as ri
from gear_jax.bench import remote_sweep

REVERB_PYTHON = "/opt/reverb-venv/bin/python"
WORLD_SIZES = (1, 2)
BATCHES = (1, 32)
ITEM_BYTES = 1024


def tiny_args(
    systems: list[str], reverb_python: str | None = None, world_sizes: tuple[int, ...] = WORLD_SIZES
) -> argparse.Namespace:
    return argparse.Namespace(
        systems=systems,
        world_size=",".join(map(str, world_sizes)),
        batch_size=",".join(map(str, BATCHES)),
        item_bytes=str(ITEM_BYTES),
        seconds=0.2,
        reverb_python=reverb_python,
        reverb_timeout=120.0,
    )


def check_records(
    records: list[dict], systems: list[str], world_sizes: tuple[int, ...] = WORLD_SIZES
) -> None:
    """Every (system, point) once (a buffered system's at BUFFERED_BATCHES only), in the suite's order,
    with counts and figures that add up."""
    expected = {
        (s, w, b)
        for s, w, b in itertools.product(systems, world_sizes, BATCHES)
        if s not in ri.BUFFERED or ri.BUFFERED_BATCHES is None or b in ri.BUFFERED_BATCHES
    }
    got = [(r["system"], r["point"]["world_size"], r["point"]["insert_batch"]) for r in records]
    assert sorted(got) == sorted(expected)
    for r in records:
        point = r["point"]
        assert r["op"] == ri.OP and point["item_bytes"] == ITEM_BYTES
        assert len(r["calls_per_actor"]) == point["world_size"] and min(r["calls_per_actor"]) >= 1
        assert sum(r["calls_per_actor"]) == r["iters"]
        assert r["rows_timed"] == r["iters"] * point["insert_batch"]
        assert r["rows_received"] == r["rows_sent"] > r["rows_timed"]  # the warmup calls count too
        assert r["throughput"]["items_per_s"] == pytest.approx(r["rows_timed"] / r["wall_s"])
        assert r["throughput"]["bytes_per_s"] == pytest.approx(r["throughput"]["items_per_s"] * ITEM_BYTES)
        assert r["throughput"]["items_per_s"] > 0
        assert 0 < r["latency_s"]["p50"] <= r["latency_s"]["p95"] < 10
        assert r["wall_s"] >= 0.2


def check_ratios(records: list[dict], systems: list[str]) -> None:
    """gear_jax_remote(_add) records carry their rows/s over every other system's, and their p50 speedup
    over those of their kind (buffered or not); the other records carry neither."""
    by_key = {(r["system"], *r["point"].values()): r for r in records}
    for r in records:
        if r["system"] not in ri.GEAR_SYSTEMS:
            assert not any(k.startswith(("throughput_ratio_vs_", "speedup_vs_")) for k in r)
            continue
        for other in (s for s in systems if s != r["system"]):
            o = by_key.get((other, *r["point"].values()))
            if o is None:  # a buffered system not run at this insert batch
                assert other in ri.BUFFERED and f"throughput_ratio_vs_{other}" not in r
                continue
            ratio = r["throughput"]["items_per_s"] / o["throughput"]["items_per_s"]
            assert r[f"throughput_ratio_vs_{other}"] == pytest.approx(ratio)
            if (other in ri.BUFFERED) == (r["system"] in ri.BUFFERED):
                speedup = o["latency_s"]["p50"] / r["latency_s"]["p50"]
                assert r[f"speedup_vs_{other}"] == pytest.approx(speedup)
            else:
                assert f"speedup_vs_{other}" not in r


def test_gear_jax_and_torch_rpc_sweep(monkeypatch) -> None:
    monkeypatch.setattr(ri, "BUFFERED_BATCHES", (1,))  # gear_jax_remote_add at 1 row per call only
    systems = [ri.GEAR_REMOTE, ri.GEAR_REMOTE_ADD, ri.GEAR_LOCAL, ri.TORCH_RPC]
    notes: list[str] = []
    records = ri.run(tiny_args(systems), notes.append)
    assert notes == [f"{ri.GEAR_REMOTE_ADD} run at insert_batch [1] only (remote_inserts.BUFFERED_BATCHES)"]
    check_records(records, systems)
    check_ratios(records, systems)
    header, rows = display.table_cells(records, "rows")
    column, system = header.index("gear_jax_remote speedup"), header.index("system")
    for row in rows:  # filled in the rows of the systems it compares its latency with
        assert bool(row[column]) == (row[system] in (ri.GEAR_LOCAL, ri.TORCH_RPC)), row


@pytest.mark.skipif(
    not os.path.exists(REVERB_PYTHON), reason=f"Reverb's interpreter {REVERB_PYTHON} is missing"
)
def test_reverb_sweep() -> None:
    notes: list[str] = []
    systems = [ri.GEAR_REMOTE_ADD, ri.REVERB, ri.REVERB_BUFFERED]
    records = ri.run(tiny_args(systems, REVERB_PYTHON, world_sizes=(2,)), notes.append)  # 2 actors only
    check_records(records, systems, world_sizes=(2,))
    check_ratios(records, systems)
    # the worker says what a call is in Reverb, in each mode
    assert any(n.startswith(f"{ri.REVERB} versions") and "then flush()" in n for n in notes)
    assert any(n.startswith(f"{ri.REVERB_BUFFERED} versions") and "no flush" in n for n in notes)


class FakeClock:
    """`remote_sweep`'s `time`: a perf_counter that only the fake calls and flushes advance (times in
    binary fractions, so that sums are exact), and the real monotonic clock (the coordinator's waits)."""

    def __init__(self):
        self.now, self.monotonic = 0.0, time.monotonic

    def perf_counter(self) -> float:
        return self.now


class FakeBufferedServer:
    """Rows a buffered call keeps (taking `call_s` on `clock`) until `flush`, which takes `flush_s` to
    deliver them."""

    def __init__(self, clock: FakeClock, call_s: float, flush_s: float):
        self.clock, self.call_s, self.flush_s = clock, call_s, flush_s
        self.kept, self.held, self.flushes = 0, 0, 0

    def call(self) -> None:
        self.clock.now += self.call_s
        self.kept += 3

    def flush(self) -> None:
        self.clock.now += self.flush_s
        self.held, self.kept, self.flushes = self.held + self.kept, 0, self.flushes + 1


def test_buffered_calls_flush_after_the_warmup_and_inside_the_timed_window(monkeypatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(remote_sweep, "time", clock)  # the sweep's times, whatever the machine's load
    server = FakeBufferedServer(clock, call_s=1 / 64, flush_s=1 / 4)
    sweep = remote_sweep.points([3], [8])
    barrier, results = threading.Barrier(2), queue.Queue()

    def open_point(point: remote_sweep.Point) -> contextlib.nullcontext:
        return contextlib.nullcontext(remote_sweep.Buffered(server.call, server.flush))

    actor = threading.Thread(
        target=remote_sweep.run_actor, args=(0, open_point, sweep, 4 / 64, barrier, results)
    )
    actor.start()
    [summary] = remote_sweep.coordinate(1, sweep, barrier, results, lambda p: server.held)
    actor.join()
    assert server.flushes == 2 and server.kept == 0  # after the warmup, and after the timed calls
    assert summary["calls_per_actor"] == [4]  # until 4 / 64 s passed since the release
    assert summary["rows_received"] == summary["rows_sent"] == summary["rows_timed"] + 3 * 2 == 18
    assert summary["wall_s"] == 4 / 64 + 1 / 4  # the final flush counts in the point's wall time
    assert summary["latencies_s"].tolist() == [1 / 64] * 4  # and in no call's latency


def test_the_remote_suite_shows_gear_jax_remote_as_its_gear_jax(tmp_path, monkeypatch) -> None:
    def record(system: str, rows_per_s: float, **ratios: float) -> dict:
        latency = {f"p{p}": 1e-3 for p in display.PERCENTILES}
        return {
            "point": {"world_size": 1},
            "system": system,
            "op": ri.OP,
            "latency_s": latency,
            "throughput": {"items_per_s": rows_per_s, "bytes_per_s": rows_per_s},
            **ratios,
        }

    remote = [record(ri.GEAR_REMOTE, 2.0, speedup_vs_reverb=1.5), record(ri.REVERB, 1.0)]
    assert display.highlighted_system(remote) == ri.GEAR_REMOTE
    header, rows = display.table_cells(remote, "rows")
    assert header[-1] == "gear_jax_remote speedup" and [row[-1] for row in rows] == ["", "1.50x"]
    # a suite with a system named gear_jax prints as before
    other = [record("gear_jax", 2.0, speedup_vs_reverb=1.5), record(ri.REVERB, 1.0)]
    assert display.highlighted_system(other) == "gear_jax"
    assert display.table_cells(other, "rows")[0][-1] == "gear_jax speedup"
    figures = []
    real_subplots = plot.plt.subplots

    def subplots(*args, **kwargs):
        figures.append(real_subplots(*args, **kwargs))
        return figures[-1]

    monkeypatch.setattr(plot.plt, "subplots", subplots)
    machine = {"cpu": "cpu", "cpu_count": 2}
    report = {"plot": ri.PLOT, "records": remote, "suite": "remote", "machine": machine}
    assert plot.plot_report(report, str(tmp_path / "remote.png"))
    [(_, axes)] = figures
    lines = axes.flat[0].get_lines()
    assert {line.get_label(): line.get_linewidth() for line in lines} == {ri.GEAR_REMOTE: 2.5, ri.REVERB: 1.2}


def test_reverb_without_an_interpreter_is_a_note() -> None:
    notes: list[str] = []
    assert ri.run(tiny_args([ri.REVERB]), notes.append) == []
    assert len(notes) == 1 and "--reverb_python" in notes[0]


def test_rows_lost_on_the_way_fail_loudly() -> None:
    summary = {
        "insert_batch": 2,
        "item_bytes": 8,
        "latencies_s": [0.1, 0.1],
        "wall_s": 0.2,
        "rows_timed": 4,
        "rows_sent": 8,
        "rows_received": 7,
        "calls_per_actor": [2],
    }
    with pytest.raises(RuntimeError, match="received 7 rows, the actors sent 8"):
        ri.to_record(ri.TORCH_RPC, 1, summary)
    record = ri.to_record(ri.TORCH_RPC, 1, {**summary, "rows_received": 8})
    assert record["throughput"]["items_per_s"] == pytest.approx(4 / 0.2)


def test_flags_take_the_suites_defaults() -> None:
    p = bench_main.parser()
    args = bench_main.resolve(p.parse_args(["remote"]), p)
    assert (args.world_size, args.batch_size, args.item_bytes, args.seconds) == (
        "1,2,4,8",
        "1,32,256",
        "1024,65536",
        1.0,
    )
    assert args.systems == list(ri.SYSTEMS)
    assert ri.SYSTEMS == (
        ri.GEAR_REMOTE,
        ri.GEAR_REMOTE_ADD,
        ri.GEAR_LOCAL,
        ri.REVERB,
        ri.REVERB_BUFFERED,
        ri.TORCH_RPC,
    )
    with pytest.raises(SystemExit):
        bench_main.resolve(p.parse_args(["remote", "--seconds=0"]), p)

"""Tests of the `remote` benchmark suite (`benchmarks/remote_inserts.py`), not of speed.

A tiny sweep (1 and 2 actors, 1 and 32 rows per call, 1 KiB rows, a fifth of a second per point) of the
gear_jax systems and torch_rpc; Reverb's runs only where its interpreter is installed.
"""

from __future__ import annotations

import argparse
import itertools
import os

import pytest

from gear_jax.bench import __main__ as bench_main
from gear_jax.bench import remote_inserts as ri

REVERB_PYTHON = "/opt/reverb-venv/bin/python"
WORLD_SIZES = (1, 2)
BATCHES = (1, 32)
ITEM_BYTES = 1024


def tiny_args(systems: list[str], reverb_python: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(
        systems=systems,
        world_size=",".join(map(str, WORLD_SIZES)),
        batch_size=",".join(map(str, BATCHES)),
        item_bytes=str(ITEM_BYTES),
        seconds=0.2,
        reverb_python=reverb_python,
        reverb_timeout=120.0,
    )


def check_records(records: list[dict], systems: list[str]) -> None:
    """Every (system, point) once, in the suite's order, with counts and figures that add up."""
    expected = {(s, w, b) for s, w, b in itertools.product(systems, WORLD_SIZES, BATCHES)}
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


def test_gear_jax_and_torch_rpc_sweep() -> None:
    systems = [ri.GEAR_REMOTE, ri.GEAR_LOCAL, ri.TORCH_RPC]
    notes: list[str] = []
    records = ri.run(tiny_args(systems), notes.append)
    assert notes == []
    check_records(records, systems)
    by_key = {(r["system"], *r["point"].values()): r for r in records}
    for r in records:
        if r["system"] != ri.GEAR_REMOTE:
            assert not any(k.startswith("throughput_ratio_vs_") for k in r)
            continue
        for other in (ri.GEAR_LOCAL, ri.TORCH_RPC):
            o = by_key[(other, *r["point"].values())]
            ratio = r["throughput"]["items_per_s"] / o["throughput"]["items_per_s"]
            assert r[f"throughput_ratio_vs_{other}"] == pytest.approx(ratio)
            assert r[f"speedup_vs_{other}"] == pytest.approx(o["latency_s"]["p50"] / r["latency_s"]["p50"])


@pytest.mark.skipif(
    not os.path.exists(REVERB_PYTHON), reason=f"Reverb's interpreter {REVERB_PYTHON} is missing"
)
def test_reverb_sweep() -> None:
    notes: list[str] = []
    records = ri.run(tiny_args([ri.REVERB], REVERB_PYTHON), notes.append)
    check_records(records, [ri.REVERB])
    assert any("trajectory_writer" in n for n in notes)  # the worker says what a call is in Reverb


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
    with pytest.raises(SystemExit):
        bench_main.resolve(p.parse_args(["remote", "--seconds=0"]), p)

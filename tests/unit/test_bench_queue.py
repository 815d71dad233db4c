"""Tests of the `queue` benchmark suite (`benchmarks/queue_throughput.py`), not of speed.

The gear_jax systems run one tiny point in this process (their actors are spawned processes); Reverb's
side runs only where its interpreter is installed.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import pytest

from gear_jax.bench import __main__ as bench_main
from gear_jax.bench import queue_throughput as qt
from gear_jax.bench.common import GEAR, GEAR_HOST

REVERB_PYTHON = "/opt/reverb-venv/bin/python"
ROWS = 2000


def tiny_point(world_size: int = 1) -> dict[str, int]:
    return {
        "world_size": world_size,
        "item_bytes": 256,
        "batch_size": 64,
        "insert_batch": 8,
        "queue_size": 256,
        "rows_per_actor": ROWS,
    }


def tiny_args(systems: list[str], reverb_python: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(systems=systems, reverb_python=reverb_python, reverb_timeout=120.0)


def check_records(records: list[dict], systems: list[str], rows: int) -> None:
    assert [r["system"] for r in records] == systems
    for r in records:
        assert r["op"] == qt.OP
        assert r["rows_delivered_once"] == r["iters"] == rows
        assert r["throughput"]["items_per_s"] > 0
        assert 0 < r["latency_s"]["p50"] <= r["latency_s"]["p95"] < 60


def test_gear_jax_delivers_every_row_once() -> None:
    notes: list[str] = []
    records = qt.run_point(tiny_point(), tiny_args([GEAR, GEAR_HOST]), notes.append)
    check_records(records, [GEAR, GEAR_HOST], ROWS)
    assert notes == []


@pytest.mark.skipif(
    not os.path.exists(REVERB_PYTHON), reason=f"Reverb's interpreter {REVERB_PYTHON} is missing"
)
def test_reverb_delivers_every_row_once_and_gear_jax_gets_a_ratio() -> None:
    notes: list[str] = []
    records = qt.run_point(tiny_point(), tiny_args([GEAR, qt.REVERB], REVERB_PYTHON), notes.append)
    check_records(records, [GEAR, qt.REVERB], ROWS)
    gear, reverb = records
    ratio = gear["throughput"]["items_per_s"] / reverb["throughput"]["items_per_s"]
    assert gear["throughput_ratio_vs_reverb"] == pytest.approx(ratio)
    assert "throughput_ratio_vs_reverb" not in reverb
    assert any("client.writer" in n for n in notes)  # the worker says how Reverb wrote and read


def test_reverb_without_an_interpreter_is_a_note() -> None:
    notes: list[str] = []
    records = qt.run_point(tiny_point(), tiny_args([qt.REVERB]), notes.append)
    assert records == [] and len(notes) == 1 and "--reverb_python" in notes[0]


def test_a_row_missing_or_delivered_twice_fails_loudly() -> None:
    qt.check_once(np.array([2, 0, 1]), 3, GEAR, {})
    with pytest.raises(RuntimeError, match="1 missing"):
        qt.check_once(np.array([0, 2]), 3, GEAR, {})
    with pytest.raises(RuntimeError, match="1 more than once"):
        qt.check_once(np.array([0, 1, 2, 1]), 3, GEAR, {})
    with pytest.raises(RuntimeError, match="outside"):
        qt.check_once(np.array([0, 1, 3]), 3, GEAR, {})


def test_flags_take_the_suites_defaults() -> None:
    p = bench_main.parser()
    queue = bench_main.resolve(p.parse_args(["queue"]), p)
    assert (queue.world_size, queue.insert_batch, queue.batch_size) == ("1,2", 8, "64")
    assert (queue.rows_per_actor, queue.queue_size) == (50000, 1024)
    assert queue.systems == list(qt.SYSTEMS)
    learner = bench_main.resolve(p.parse_args(["actor_learner"]), p)
    assert (learner.world_size, learner.insert_batch) == ("1,2,4", 32)
    with pytest.raises(SystemExit):
        bench_main.resolve(p.parse_args(["queue", "--queue_size=0"]), p)

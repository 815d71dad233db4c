"""The `pool` suite: a create / first jitted call / close cycle, with a table made fresh against one
taken from the pool of closed tables (`gear_jax.pool`).

Each cycle creates a table of `table_rows` rows of `item_bytes`, inserts `batch_size` rows, runs one
jitted sample + gather (a function jitted once for the whole suite, the table its static argument) and
closes the table. `fresh_create` runs with the pool off: every create reserves (and on a CUDA machine
registers) new memory and every first call traces and compiles for a new handle. `gear_jax` runs with
the pool on, after one untimed cycle fills it: the create reuses the closed table's memory and handle,
and the first call finds the function already compiled. Ops: `create`, `first_call`, `close` and the
whole `cycle` (the insert is left out of all of them).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

import gear_jax as gj
from gear_jax.bench.common import GEAR, make_record, parse_ints
from gear_jax.bench.display import progress

DEFAULTS = {"table_rows": "65536", "item_bytes": "65536", "batch_size": "256"}
PLOT = None
FRESH = "fresh_create"
SYSTEMS = (GEAR, FRESH)
OPS = ("create", "first_call", "close", "cycle")


def _sample_gather(table: gj.Table, key: jax.Array, batch_size: int) -> Any:
    return gj.gather(table, gj.sample(table, key, batch_size))


STEP = jax.jit(_sample_gather, static_argnums=(0, 2))


def cycle(spec: gj.TableSpec, rows: np.ndarray, pin: bool) -> dict[str, float]:
    """Seconds of each op of one create / insert / first call / close cycle."""
    start = time.perf_counter()
    table = gj.Table.create(spec, pin=pin)
    created = time.perf_counter()
    table.insert({"x": rows})
    inserted = time.perf_counter()
    jax.block_until_ready(STEP(table, jax.random.key(0), len(rows)))
    called = time.perf_counter()
    table.close()
    closed = time.perf_counter()
    return {
        "create": created - start,
        "first_call": called - inserted,
        "close": closed - called,
        "cycle": (created - start) + (called - inserted) + (closed - called),
    }


def run(args: argparse.Namespace, note: Callable[[str], None]) -> list[dict[str, Any]]:
    """Records of every table size x item size x batch size, for each system and op."""
    saved = gj.pool_stats()
    records = []
    try:
        for table_rows in parse_ints(args.table_rows):
            for item_bytes in parse_ints(args.item_bytes):
                for batch_size in parse_ints(args.batch_size):
                    records += _measure(table_rows, item_bytes, min(batch_size, table_rows), args, note)
    finally:
        gj.clear_pool()
        gj.configure_pool(max_tables=saved["max_tables"], max_bytes=saved["max_bytes"])
    return records


def _measure(
    table_rows: int, item_bytes: int, batch_size: int, args: argparse.Namespace, note: Callable[[str], None]
) -> list[dict[str, Any]]:
    spec = gj.TableSpec({"x": gj.Field((item_bytes,), "uint8")}, capacity=table_rows)
    rows = np.random.default_rng(0).integers(0, 256, (batch_size, item_bytes), dtype=np.uint8)
    probe = gj.Table.create(spec, reuse=False)
    table_bytes, pinned = probe.nbytes, probe.pinned
    probe.close()
    gj.clear_pool()
    if not pinned:
        note(
            "tables are not pinned here (no CUDA device or a CPU-only build): "
            "create times leave out CUDA registration"
        )
    point = {
        "table_rows": table_rows,
        "item_bytes": item_bytes,
        "batch_size": batch_size,
        "table_bytes": table_bytes,
    }
    records = []
    for system in args.systems:
        pooled = system == GEAR
        if pooled:
            gj.configure_pool(max_tables=1, max_bytes=max(table_bytes, 1))
            cycle(spec, rows, pin=True)  # fills the pool and compiles for its handle
        else:
            gj.configure_pool(max_tables=0)
        times: dict[str, list[float]] = {op: [] for op in OPS}
        before = gj.pool_stats()
        with progress(args.iters, f"{system} cycles of a {table_bytes / 2**30:.2f} GiB table") as bar:
            for _ in range(args.iters):
                for op, seconds in cycle(spec, rows, pin=True).items():
                    times[op].append(seconds)
                bar.update()
        after = gj.pool_stats()
        # What the pool did during the timed cycles, recorded so that a reader (and the tests) can
        # check that every pooled create reused the memory and the handle, and no fresh one did.
        counts = {k: after[k] - before[k] for k in ("reused", "reused_handles", "pooled")}
        if pooled and counts["reused_handles"] < args.iters:
            note("gear_jax: some creates did not take the pooled table's handle")
        gj.clear_pool()
        for op in OPS:
            record = make_record(point, system, op, times[op], 1, table_bytes)
            record["pool_counts"] = counts
            records.append(record)
    return records

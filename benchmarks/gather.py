"""The `gather` suite: jitted uniform sample + gather of B rows (or B windows of trajectory rows)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from gear_jax.bench.common import parse_ints
from gear_jax.bench.data import Dataset, cap_rows
from gear_jax.bench.selection import measure, table_copies
from gear_jax.bench.systems import Workload

DEFAULTS = {"table_rows": "100000", "item_bytes": "1024,65536", "batch_size": "32,64,128,256,512,1024"}
PLOT = {"x": "batch_size", "y": "bytes_per_s", "label": "GB/s gathered"}


def run(args: argparse.Namespace, note: Callable[[str], None]) -> list[dict[str, Any]]:
    """Records for every table size x item size x batch size x system.

    With `--window W` the table holds trajectories of `--max_steps` steps (default 4 W) and each pick
    is a window of W steps placed uniformly inside a row; `--item_bytes` is then the bytes per step.
    Table sizes are capped so that `table_copies` copies fit in `--mem_budget_gib`.
    """
    window = args.window
    steps = max(args.max_steps or 4 * window, window) if window else 1
    batch_sizes = parse_ints(args.batch_size)
    records = []
    for requested in parse_ints(args.table_rows):
        for item_bytes in parse_ints(args.item_bytes):
            rows = cap_rows(requested, steps * item_bytes, args.mem_budget_gib, table_copies(args))
            if rows < requested:
                note(
                    f"item_bytes={item_bytes}: table_rows capped from {requested} to {rows} "
                    f"(--mem_budget_gib={args.mem_budget_gib} must hold {table_copies(args)} copies)"
                )
            work = Workload(Dataset(rows, steps, item_bytes), "uniform", window=window, collect=True)
            point = {"table_rows": rows, "item_bytes": item_bytes, "window": window}
            records += measure(work, point, "sample_gather", batch_sizes, args, note)
    return records

"""The `priorities` suite: prioritized sampling of B picks from N rows against one read of the priorities.

gear_jax runs a jitted `gj.sample(..., method="prioritized")` (no gather), which makes one pass over
the rows' state words (uint64, the priority in its low half). The reference `priority_read` reads
that state column once over the same memory path (see `references`). Both records account N x 8
bytes per step, so their GB/s compare directly, and gear_jax's records carry
`time_ratio_vs_priority_read` (its p50 / the read's p50; the target is at most 1.5).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import gear_jax as gj
from gear_jax.bench.common import GEAR, PRIORITY_READ, parse_ints
from gear_jax.bench.data import Dataset, cap_rows
from gear_jax.bench.references import STATE_BYTES
from gear_jax.bench.selection import measure
from gear_jax.bench.systems import Workload

DEFAULTS = {"table_rows": "1000000,10000000,100000000", "item_bytes": "8", "batch_size": "1024"}
PLOT = {"x": "table_rows", "y": "bytes_per_s", "label": "GB/s of the state column (8 B per row)"}
SYSTEMS = (GEAR, "jnp_take", PRIORITY_READ)  # jnp_take: device-resident cumsum + searchsorted
PROBE_ROWS = 4096


def table_bytes_per_row(item_bytes: int) -> int:
    """Bytes of shared memory one row of a one-step table of `item_bytes` items takes (its field and
    status columns), from the size of a small unpinned probe table."""
    spec = gj.TableSpec(fields={"x": gj.Field((item_bytes,), "uint8")}, capacity=PROBE_ROWS)
    with gj.Table.create(spec, pin=False) as probe:
        return -(-probe.nbytes // PROBE_ROWS)


def run(args: argparse.Namespace, note: Callable[[str], None]) -> list[dict[str, Any]]:
    """Records for every table size x item size, each system timing all batch sizes.

    Table sizes are capped so that two tables fit in `--mem_budget_gib` (one system holds its table
    at a time; the second leaves room for filling and freeing).
    """
    batch_sizes = parse_ints(args.batch_size)
    records = []
    for requested in parse_ints(args.table_rows):
        for item_bytes in parse_ints(args.item_bytes):
            rows = cap_rows(requested, table_bytes_per_row(item_bytes), args.mem_budget_gib)
            if rows < requested:
                note(
                    f"item_bytes={item_bytes}: table_rows capped from {requested} to {rows} "
                    f"(--mem_budget_gib={args.mem_budget_gib} must hold two tables)"
                )
            work = Workload(
                Dataset(rows, 1, item_bytes),
                "prioritized",
                args.priority_exponent,
                collect=False,
                scan_bytes=rows * STATE_BYTES,
            )
            point = {"table_rows": rows, "item_bytes": item_bytes}
            records += measure(work, point, "prioritized", batch_sizes, args, note)
    return records

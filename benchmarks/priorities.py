"""The `priorities` suite: prioritized sampling of B picks from N rows, against the usual ways to do it
and against one read of the priorities.

gear_jax runs a jitted `gj.sample(..., method="prioritized")` (no gather), which walks its priority
index (a sum tree per exponent kept up to date from per-row change counters). Its baselines:

- `numpy_cumsum`: numpy `cumsum` of p^a over all N rows + `searchsorted` of B targets, per step (host).
- `flashbax_sumtree`: flashbax's sum tree holding the same p^a, jitted `stratified_sample` of B.
- `jnp_take`: device-resident `jnp.cumsum` + `searchsorted`.
- `priority_read` (reference): one read of the table's state column (see `references`).

Workloads (`--workloads`): `static` (op "prioritized", the default: priorities never change) and
`update` (op "prioritized+update", a learner step: first set new priorities of the B rows the previous
step picked, then sample, so that an index must follow B changes per step). In the update workload
gear_jax passes the update as `gj.sample(..., priority_update=...)` (no JAX effect) and
`gear_jax_effect` runs the same step with `gj.update_priorities` (a JAX effect) then `sample(after=)`.
Every record accounts N x 8 bytes per step (the state column), so GB/s compare directly; gear_jax's
records carry
`speedup_vs_<system>` for each baseline and `time_ratio_vs_priority_read` (its p50 / the read's p50;
the target for the static workload is at most 1.5).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import gear_jax as gj
from gear_jax.bench.common import (
    GEAR,
    GEAR_EFFECT,
    GEAR_HOST,
    PRIORITY_READ,
    Unavailable,
    parse_ints,
    parse_names,
)
from gear_jax.bench.data import Dataset, cap_rows
from gear_jax.bench.references import STATE_BYTES, PriorityReadSystem
from gear_jax.bench.selection import measure, table_copies
from gear_jax.bench.systems import (
    FlashbaxSumTreeSystem,
    GearHostSystem,
    GearHostUpdateSystem,
    GearSystem,
    GearUpdateSystem,
    JnpCumsumUpdateSystem,
    JnpSystem,
    NumpyCumsumSystem,
    System,
    Workload,
)

DEFAULTS = {"table_rows": "1000000,10000000,100000000", "item_bytes": "8", "batch_size": "1024"}
PLOT = {"x": "table_rows", "y": "bytes_per_s", "label": "GB/s of the state column (8 B per row)"}
SYSTEMS = (
    GEAR,
    GEAR_HOST,
    GEAR_EFFECT,
    NumpyCumsumSystem.name,
    FlashbaxSumTreeSystem.name,
    "jnp_take",
    PRIORITY_READ,
)
WORKLOADS = {"static": "prioritized", "update": "prioritized+update"}  # --workloads -> op
PROBE_ROWS = 4096


def table_bytes_per_row(item_bytes: int) -> int:
    """Bytes of shared memory one row of a one-step table of `item_bytes` items takes (its field and
    status columns), from the size of a small unpinned probe table."""
    spec = gj.TableSpec(fields={"x": gj.Field((item_bytes,), "uint8")}, capacity=PROBE_ROWS)
    with gj.Table.create(spec, pin=False) as probe:
        return -(-probe.nbytes // PROBE_ROWS)


def parse_workloads(text: str) -> list[str]:
    """`"static,update"` -> ["static", "update"]; ValueError for a name not in WORKLOADS."""
    names = parse_names(text)
    unknown = [w for w in names if w not in WORKLOADS]
    if not names or unknown:
        raise ValueError(f"--workloads {text!r}: choose from {sorted(WORKLOADS)}")
    return names


def build(name: str, work: Workload, updates: bool) -> System:
    """The system `name` holding the workload's priorities, for the static or the update workload."""
    if name == PRIORITY_READ:  # one read of the priorities, whichever the workload
        return PriorityReadSystem(work)
    if name == NumpyCumsumSystem.name:
        return NumpyCumsumSystem(work, updates)
    if name == FlashbaxSumTreeSystem.name:
        return FlashbaxSumTreeSystem(work, updates)
    if name == GEAR:
        return GearUpdateSystem(work) if updates else GearSystem(work)
    if name == GEAR_HOST:
        return GearHostUpdateSystem(work) if updates else GearHostSystem(work)
    if name == GEAR_EFFECT:
        if not updates:
            raise Unavailable("the static workload updates no priority: gear_jax_effect would be gear_jax")
        return GearUpdateSystem(work, effect=True)
    if name == "jnp_take":
        return JnpCumsumUpdateSystem(work) if updates else JnpSystem(work)
    raise ValueError(f"{name} is not a system of the priorities suite")


def run(args: argparse.Namespace, note: Callable[[str], None]) -> list[dict[str, Any]]:
    """Records for every table size x item size x workload, each system timing all batch sizes.

    Table sizes are capped so that `table_copies` tables fit in `--mem_budget_gib` (two when one system
    holds its table at a time: the second leaves room for filling and freeing).
    """
    batch_sizes = parse_ints(args.batch_size)
    workloads = parse_workloads(args.workloads)
    records = []
    for requested in parse_ints(args.table_rows):
        for item_bytes in parse_ints(args.item_bytes):
            rows = cap_rows(
                requested, table_bytes_per_row(item_bytes), args.mem_budget_gib, table_copies(args)
            )
            if rows < requested:
                note(
                    f"item_bytes={item_bytes}: table_rows capped from {requested} to {rows} "
                    f"(--mem_budget_gib={args.mem_budget_gib} must hold {table_copies(args)} tables)"
                )
            work = Workload(
                Dataset(rows, 1, item_bytes),
                "prioritized",
                args.priority_exponent,
                collect=False,
                scan_bytes=rows * STATE_BYTES,
            )
            point = {"table_rows": rows, "item_bytes": item_bytes}
            for workload in workloads:
                updates = workload == "update"
                records += measure(
                    work,
                    point,
                    WORKLOADS[workload],
                    batch_sizes,
                    args,
                    note,
                    make=lambda name, work=work, updates=updates: build(name, work, updates),
                )
    return records

"""Times selection workloads (sample, or sample + gather) on every requested system, one system at a time."""

from __future__ import annotations

import argparse
import gc
from collections.abc import Callable
from typing import Any

from gear_jax.bench.common import GEAR, Unavailable, make_record
from gear_jax.bench.display import progress
from gear_jax.bench.reverb_baseline import ReverbSystem
from gear_jax.bench.systems import IN_PROCESS, System, Workload

SYSTEMS = (*IN_PROCESS, "reverb")


def build(name: str, work: Workload, args: argparse.Namespace) -> System:
    """The system `name` holding the workload's rows (raises Unavailable for a baseline that can't)."""
    if name == "reverb":
        return ReverbSystem(work, args.reverb_python, args.reverb_timeout)
    return IN_PROCESS[name](work)


def measure(
    work: Workload,
    point: dict[str, Any],
    op: str,
    batch_sizes: list[int],
    args: argparse.Namespace,
    note: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Records of every system in `args.systems` at `point` + each batch size.

    Only one system holds the rows at a time: each is built, timed and closed before the next. A
    baseline that is unavailable or fails is skipped with a note; a gear_jax failure propagates.
    """
    records = []
    for name in args.systems:
        where = f"{name} at {point} {op}"
        try:
            system = build(name, work, args)
        except Exception as e:  # noqa: BLE001 - a baseline failing is reported, not fatal
            if name == GEAR and not isinstance(e, Unavailable):
                raise
            note(f"skipped {where}: {e}")
            continue
        try:
            with progress(len(batch_sizes) * args.iters, f"{name} {op}") as bar:
                latencies = system.latencies(batch_sizes, args.warmup, args.iters, bar.update)
        except Exception as e:  # noqa: BLE001
            if name == GEAR:
                raise
            note(f"skipped {where}: {type(e).__name__}: {e}")
            continue
        finally:
            system.close()
            gc.collect()  # baselines such as torchrl's buffers hold their rows in reference cycles
        if isinstance(system, ReverbSystem):
            note(f"reverb versions: {system.versions}")
        for b in batch_sizes:
            records.append(
                make_record({**point, "batch_size": b}, name, op, latencies[b], b, b * work.bytes_per_pick())
            )
    return records

"""Times selection workloads (sample, or sample + gather) on every requested system, one system at a time."""

from __future__ import annotations

import argparse
import gc
from collections.abc import Callable
from typing import Any

from gear_jax.bench.common import GEAR, PINNED_COPY, Unavailable, make_record
from gear_jax.bench.display import progress
from gear_jax.bench.references import REFERENCE_SYSTEMS
from gear_jax.bench.reverb_baseline import ReverbSystem
from gear_jax.bench.systems import GATHER_ONLY, IN_PROCESS, System, Workload

SYSTEMS = (*IN_PROCESS, PINNED_COPY, "reverb")  # the gather suite's
SELECT_SYSTEMS = tuple(s for s in SYSTEMS if s not in (*GATHER_ONLY, PINNED_COPY))  # the sample suite's
NOTE_CHARS = 600


def build(name: str, work: Workload, args: argparse.Namespace) -> System:
    """The system `name` holding the workload's rows (raises Unavailable for a baseline that can't)."""
    if name == "reverb":
        return ReverbSystem(work, args.reverb_python, args.reverb_timeout)
    if name in REFERENCE_SYSTEMS:
        return REFERENCE_SYSTEMS[name](work)
    return IN_PROCESS[name](work)


def failure(e: Exception) -> str:
    """Why a system was skipped, as one short line (XLA errors can run to pages)."""
    text = " ".join((str(e) if isinstance(e, Unavailable) else f"{type(e).__name__}: {e}").split())
    return text if len(text) <= NOTE_CHARS else text[: NOTE_CHARS - 3] + "..."


def measure(
    work: Workload,
    point: dict[str, Any],
    op: str,
    batch_sizes: list[int],
    args: argparse.Namespace,
    note: Callable[[str], None],
    make: Callable[[str], System] | None = None,
) -> list[dict[str, Any]]:
    """Records of every system in `args.systems` at `point` + each batch size.

    Only one system holds the rows at a time: each is built, timed and closed before the next. A
    baseline that is unavailable or fails is skipped with a note; a gear_jax failure propagates. What
    a system says about where it held its rows or how it ran (`describe`) becomes a note too.
    """
    records = []
    for name in args.systems:
        where = f"{name} at {point} {op}"
        try:
            system = make(name) if make is not None else build(name, work, args)
        except Exception as e:  # noqa: BLE001 - a baseline failing is reported, not fatal
            if name == GEAR and not isinstance(e, Unavailable):
                raise
            note(f"skipped {where}: {failure(e)}")
            continue
        try:
            with progress(len(batch_sizes) * args.iters, f"{name} {op}") as bar:
                latencies = system.latencies(batch_sizes, args.warmup, args.iters, bar.update)
            detail = system.describe()
        except Exception as e:  # noqa: BLE001
            if name == GEAR:
                raise
            note(f"skipped {where}: {failure(e)}")
            continue
        finally:
            system.close()
            gc.collect()  # baselines such as torchrl's buffers hold their rows in reference cycles
        if detail:
            note(detail)
        for b in batch_sizes:
            record = make_record({**point, "batch_size": b}, name, op, latencies[b], *system.work_per_step(b))
            if system.measured_as:
                record["measured_as"] = system.measured_as
            records.append(record)
    return records

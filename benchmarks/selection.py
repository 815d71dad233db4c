"""Times selection workloads (sample, or sample + gather) on every requested system: one system at a time,
or all of them in turns (`--interleave`)."""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from gear_jax.bench.common import GEAR_SYSTEMS, PINNED_COPY, PINNED_COPY_JIT, Unavailable, make_record
from gear_jax.bench.display import progress
from gear_jax.bench.references import REFERENCE_SYSTEMS
from gear_jax.bench.reverb_baseline import ReverbSystem
from gear_jax.bench.systems import GATHER_ONLY, IN_PROCESS, Step, System, Workload

SYSTEMS = (*IN_PROCESS, PINNED_COPY, PINNED_COPY_JIT, "reverb")  # the gather suite's
SELECT_SYSTEMS = tuple(
    s for s in SYSTEMS if s not in (*GATHER_ONLY, PINNED_COPY, PINNED_COPY_JIT)
)  # the sample suite's
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


def table_copies(args: argparse.Namespace) -> int:
    """Copies of a table `--mem_budget_gib` must hold: two when the systems run one at a time (one,
    and room for filling and freeing), one per system and one more with `--interleave` (all at once)."""
    return len(args.systems) + 1 if getattr(args, "interleave", 0) else 2


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

    By default only one system holds the rows at a time: each is built, timed and closed before the
    next. With `--interleave K` every system is built first and, for each batch size, the systems take
    turns of K timed steps (in a new order each round, `turn_orders`), so that a machine whose speed
    drifts (other jobs, a noisy host) slows every system alike and the ratios hold. A baseline that is
    unavailable or fails is skipped with a note; a gear_jax failure propagates. What a system says about
    where it held its rows or how it ran (`describe`) becomes a note too.
    """

    def make_system(name: str) -> System | None:
        try:
            return make(name) if make is not None else build(name, work, args)
        except Unavailable as e:  # gear_jax too: a suite may not run it at every point
            note(_skipped(name, point, op, e))
            return None
        except Exception as e:  # noqa: BLE001 - a baseline failing is reported, not fatal
            note(_skipped_baseline(name, point, op, e))
            return None

    if getattr(args, "interleave", 0):
        return _measure_interleaved(work, point, op, batch_sizes, args, note, make_system)
    records = []
    for name in args.systems:
        system = make_system(name)
        if system is None:
            continue
        latencies = _time_alone(system, point, op, batch_sizes, args, note)
        if latencies is not None:
            records += _records(system, point, op, batch_sizes, latencies)
    return records


def _skipped(name: str, point: dict[str, Any], op: str, e: Exception) -> str:
    """The note for system `name` skipped at `point` and `op` because of `e`."""
    return f"skipped {name} at {point} {op}: {failure(e)}"


def _skipped_baseline(name: str, point: dict[str, Any], op: str, e: Exception) -> str:
    """`_skipped`'s note for a baseline; a gear_jax (or gear_jax_host) failure is no note: `e`
    propagates (call inside the `except` block)."""
    if name in GEAR_SYSTEMS:
        raise e
    return _skipped(name, point, op, e)


def _time_alone(
    system: System,
    point: dict[str, Any],
    op: str,
    batch_sizes: list[int],
    args: argparse.Namespace,
    note: Callable[[str], None],
) -> dict[int, np.ndarray] | None:
    """`system`'s latencies per batch size, timed alone, then closes it; None (and a note) when a
    baseline fails."""
    name = system.name
    try:
        with progress(len(batch_sizes) * args.iters, f"{name} {op}") as bar:
            latencies = system.latencies(batch_sizes, args.warmup, args.iters, bar.update)
        detail = system.describe()
    except Exception as e:  # noqa: BLE001
        note(_skipped_baseline(name, point, op, e))
        return None
    finally:
        system.close()
        gc.collect()  # baselines such as torchrl's buffers hold their rows in reference cycles
    if detail:
        note(detail)
    return latencies


def _records(
    system: System, point: dict[str, Any], op: str, batch_sizes: list[int], latencies: dict[int, np.ndarray]
) -> list[dict[str, Any]]:
    records = []
    for b in batch_sizes:
        record = make_record(
            {**point, "batch_size": b}, system.name, op, latencies[b], *system.work_per_step(b)
        )
        if system.measured_as:
            record["measured_as"] = system.measured_as
        records.append(record)
    return records


def turn_orders(n: int) -> list[list[int]]:
    """The orders of n steps' turns in successive rounds (used cyclically): a Williams design, in which
    every step follows every other one equally often within a round (n rounds for even n, 2n for odd
    n), so that none pays or gains more than the others for what ran before it (a baseline that leaves
    the caches cold or the allocator busy)."""
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rounds = [[(k + r) % n for k in first] for r in range(n)]
    return rounds if n % 2 == 0 else rounds + [order[::-1] for order in rounds]


def interleave_calls(
    steps: dict[str, Step], iters: int, turn: int, tick: Callable[[], None] | None = None
) -> dict[str, np.ndarray]:
    """Seconds per call, float64[iters] for each step, the steps taking turns of `turn` calls.

    Round r takes the turns in order `turn_orders(n)[r mod len]` (n steps): every step follows every
    other equally often. Each step's calls are numbered 0, 1, ... in its own order, as `time_calls`
    numbers them.
    """
    names = list(steps)
    orders = turn_orders(len(names))
    latencies = {name: np.empty(iters, np.float64) for name in names}
    done = dict.fromkeys(names, 0)
    rounds = 0
    while any(done[name] < iters for name in names):
        for k in orders[rounds % len(orders)]:
            name = names[k]
            step, times = steps[name], latencies[name]
            for _ in range(min(turn, iters - done[name])):
                start = time.perf_counter()
                step(done[name])
                times[done[name]] = time.perf_counter() - start
                done[name] += 1
                if tick is not None:
                    tick()
        rounds += 1
    return latencies


def _measure_interleaved(
    work: Workload,
    point: dict[str, Any],
    op: str,
    batch_sizes: list[int],
    args: argparse.Namespace,
    note: Callable[[str], None],
    make_system: Callable[[str], System | None],
) -> list[dict[str, Any]]:
    """`measure` with `--interleave`: every system built at once, then timed in turns."""
    built = [s for s in map(make_system, args.systems) if s is not None]
    together = [s for s in built if s.interleavable]
    alone = [s for s in built if not s.interleavable]
    latencies: dict[str, dict[int, np.ndarray]] = {s.name: {} for s in together}
    try:
        for b in batch_sizes:
            steps = {}
            for system in list(together):
                try:
                    step = system.make_step(b)
                    for i in range(args.warmup):
                        step(i)
                except Exception as e:  # noqa: BLE001
                    note(_skipped_baseline(system.name, point, op, e))
                    together.remove(system)
                    system.close()
                    continue
                steps[system.name] = _after_warmup(step, args.warmup)
            with progress(len(steps) * args.iters, f"{op} B={b}, {len(steps)} systems in turns") as bar:
                for name, times in interleave_calls(steps, args.iters, args.interleave, bar.update).items():
                    latencies[name][b] = times
        for system in together:
            if detail := system.describe():
                note(detail)
    finally:
        for system in together:
            system.close()
        gc.collect()
    records = []
    for system in together:
        records += _records(system, point, op, batch_sizes, latencies[system.name])
    for system in alone:
        note(f"{system.name} times its own steps (not in turns with the others): timed alone afterwards")
        if (alone_latencies := _time_alone(system, point, op, batch_sizes, args, note)) is not None:
            records += _records(system, point, op, batch_sizes, alone_latencies)
    return records


def _after_warmup(step: Step, warmup: int) -> Step:
    """`step` numbering its calls from `warmup` on, as `time_calls` does after its untimed calls."""
    return lambda i: step(warmup + i)

"""The `remote` suite: actor processes stream rows to a server that inserts them into a table.

After the conventions of PyTorch's RL RPC benchmark (one agent, N observers): per world size N
(`--world_size`), N actor processes each stream batches of `insert_batch` rows (`--batch_size`, a sweep)
of `item_bytes` uint8 (`--item_bytes`, a sweep) to one server over 127.0.0.1; the same rows and the same
machine for every system. Each system's processes start once per world size and run every (item size,
insert batch) point in turn (`remote_sweep.py`): per point each actor makes 2 untimed calls, meets the
others at a barrier, then times calls back to back for `--seconds` (at least one call). A call returns
once the server holds its rows. The server's table holds `CAPACITY` rows per item size, a ring: inserts
overwrite the oldest rows, and no learner reads them.
  * gear_jax_remote: `gj.serve(table, host="127.0.0.1", port=0)` (Arrow Flight over gRPC) in this
    process, one server per item size; each actor opens a `gj.remote.Writer(server.address)` per item
    size and calls `writer.insert({"x": uint8[B, item_bytes]}, timeout=)`;
  * gear_jax_local: the upper bound without a network: each actor attaches to the same tables by name
    (`gj.Table.attach`) and calls `table.insert` (shared memory);
  * reverb: `benchmarks/remote_reverb_worker.py` under `--reverb_python` (see there for what a call
    of B rows is in Reverb): a `reverb.Server` with one table per item size, and actors with a
    `reverb.Client`'s `trajectory_writer`;
  * torch_rpc: `benchmarks/remote_torch_rpc.py`: `torch.distributed.rpc` over TensorPipe's TCP transport,
    one agent process holding numpy rings, `rpc.rpc_sync(agent, insert_rows, args=(tensor,))` per call.
The gear_jax tables (and Reverb's) have a rate limiter that never waits (min size 1, Reverb's
`MinSize(1)`), which counts the rows inserted. Every table (Reverb's too) and ring is filled before the
actors start, so the timed calls overwrite rows (Reverb: remove its oldest items) as a full ring does.
The default sweep (4 systems x world sizes 1,2,4,8 x 6 points, 1 s each) takes about 3 minutes (190 s)
on the project's 2-core VM.
One record per system and point (world_size, insert_batch, item_bytes), op `remote_insert`: `latency_s`
from every actor's timed calls, `throughput` the rows (bytes) of the timed calls over the wall time from
the actors' release to the last call's return, `rows_received` the server's count over the point
(warmup included), which must equal `rows_sent`, or the run fails. gear_jax_remote records carry
`throughput_ratio_vs_<system>` (its rows/s over the other system's at the same point) and
`speedup_vs_<system>` (the other's p50 latency over its own).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import multiprocessing as mp
import os
import queue
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import gear_jax as gj
from gear_jax.bench import reverb_baseline
from gear_jax.bench.common import Unavailable, make_record, parse_ints
from gear_jax.bench.data import Dataset
from gear_jax.bench.display import progress
from gear_jax.bench.remote_sweep import BARRIER_TIMEOUT_S, Point, coordinate, points, run_actor

GEAR_REMOTE = "gear_jax_remote"
GEAR_LOCAL = "gear_jax_local"
REVERB = "reverb"
TORCH_RPC = "torch_rpc"
SYSTEMS = (GEAR_REMOTE, GEAR_LOCAL, REVERB, TORCH_RPC)
DEFAULTS = {"world_size": "1,2,4,8", "batch_size": "1,32,256", "item_bytes": "1024,65536", "seconds": 1.0}
PLOT = {"x": "world_size", "y": "items_per_s", "label": "rows/s inserted (all actors)"}
OP = "remote_insert"
HOST = "127.0.0.1"
CAPACITY = 4096  # rows per table (per item size), a ring
INSERT_TIMEOUT_S = 300.0
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "remote_reverb_worker.py")
Summary = dict[str, Any]  # remote_sweep.coordinate's per point


@dataclasses.dataclass(frozen=True)
class GearActorJob:
    """What one gear_jax actor process does: `targets` maps each item size to its table's name
    (gear_jax_local) or its server's address (gear_jax_remote)."""

    system: str
    actor: int
    targets: dict[int, str]
    sweep: list[Point]
    seconds: float


@contextlib.contextmanager
def open_inserter(system: str, target: str) -> Iterator[Callable[[dict[str, np.ndarray]], Any]]:
    """The insert call of one actor into one table: a remote writer or the attached table."""
    if system == GEAR_LOCAL:
        with gj.Table.attach(target) as table:
            yield table.insert
        return
    writer = gj.remote.Writer(target)
    try:
        yield functools.partial(writer.insert, timeout=INSERT_TIMEOUT_S)
    finally:
        writer.close()


def gear_actor_main(job: GearActorJob, barrier: Any, results: Any) -> None:
    """The body of a gear_jax actor process: opens an inserter per item size, runs every point."""
    with contextlib.ExitStack() as stack:
        inserters = {d: stack.enter_context(open_inserter(job.system, t)) for d, t in job.targets.items()}

        def open_point(point: Point) -> contextlib.AbstractContextManager[Callable[[], Any]]:
            x = payload(point, job.actor)
            insert = inserters[point["item_bytes"]]
            return contextlib.nullcontext(lambda: insert({"x": x}))

        run_actor(job.actor, open_point, job.sweep, job.seconds, barrier, results)


def payload(point: Point, actor: int) -> np.ndarray:
    """The rows an actor sends in each call of the point, uint8[insert_batch, item_bytes] (the same
    for every system: the Reverb worker and the torch observers make them alike)."""
    return Dataset(point["insert_batch"], 1, point["item_bytes"], actor).as_array()[:, 0]


class Processes:
    """Spawned processes, each `target(*args)`; `failure()` names one that exited with an error. Leaving
    the block joins them (killing any still alive after `BARRIER_TIMEOUT_S`, or at once on an error)
    and raises if one failed."""

    def __init__(self, ctx: Any, specs: list[tuple[Callable[..., None], tuple[Any, ...]]]):
        self.procs = [ctx.Process(target=target, args=args, daemon=True) for target, args in specs]

    def __enter__(self) -> Processes:
        for p in self.procs:
            p.start()
        return self

    def failure(self) -> str | None:
        dead = [p for p in self.procs if p.exitcode not in (None, 0)]
        return f"process {dead[0].pid} exited with code {dead[0].exitcode}" if dead else None

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        for p in self.procs:
            p.join(BARRIER_TIMEOUT_S if exc_type is None else 1.0)
            if p.is_alive():
                p.kill()
                p.join()
        why = self.failure()
        if exc_type is None and why is not None:
            raise RuntimeError(f"remote: {why}")


def gear_spec(item_bytes: int) -> gj.TableSpec:
    return gj.TableSpec({"x": gj.Field((item_bytes,), "uint8")}, capacity=CAPACITY)


def run_gear(system: str, world_size: int, sweep: list[Point], seconds: float, bar: Any) -> list[Summary]:
    """One gear_jax system at one world size: tables (and servers) here, actors spawned."""
    if system == GEAR_REMOTE:
        try:
            import gear_jax.remote  # noqa: F401  (it needs pyarrow, an optional dependency)
        except ImportError as e:
            raise Unavailable(f"gear_jax.remote does not import: {e}") from None
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(world_size + 1), ctx.Queue()
    summaries = []
    with contextlib.ExitStack() as stack:
        tables: dict[int, gj.Table] = {}
        targets: dict[int, str] = {}
        for d in sorted({p["item_bytes"] for p in sweep}):
            table = stack.enter_context(gj.Table.create(gear_spec(d), rate_limiter=gj.RateLimiter(1)))
            table.insert({"x": np.ones((CAPACITY, d), np.uint8)})  # every row mapped before timing
            tables[d] = table
            if system == GEAR_REMOTE:
                targets[d] = stack.enter_context(gj.serve(table, host=HOST, port=0)).address
            else:
                targets[d] = table.name
        specs = [
            (gear_actor_main, (GearActorJob(system, a, targets, sweep, seconds), barrier, results))
            for a in range(world_size)
        ]
        with Processes(ctx, specs) as procs:

            def received(point: Point) -> int:
                return tables[point["item_bytes"]].rate_limiter_counts().inserts

            for summary in coordinate(world_size, sweep, barrier, results, received, procs.failure):
                summaries.append(summary)
                bar.update(1)
    return summaries


def run_torch_rpc(world_size: int, sweep: list[Point], seconds: float, bar: Any) -> list[Summary]:
    """torch_rpc at one world size: the agent (which coordinates) and the observers spawned; the
    summaries come back over a queue."""
    try:
        from gear_jax.bench import remote_torch_rpc
    except ImportError as e:
        raise Unavailable(f"torch.distributed.rpc does not import: {e}") from None
    ctx = mp.get_context("spawn")
    barrier, results, out = ctx.Barrier(world_size + 1), ctx.Queue(), ctx.Queue()
    specs = remote_torch_rpc.process_specs(world_size, sweep, seconds, CAPACITY, barrier, results, out)
    summaries = []
    with Processes(ctx, specs) as procs:
        for _ in sweep:
            summaries.append(_get_summary(out, procs))
            bar.update(1)
    return summaries


def _get_summary(out: Any, procs: Processes) -> Summary:
    deadline = time.monotonic() + 2 * BARRIER_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            return out.get(timeout=0.5)
        except queue.Empty:
            why = procs.failure()
            if why is not None:
                raise RuntimeError(f"remote: torch_rpc {why}") from None
    raise RuntimeError(f"remote: torch_rpc's agent sent no summary within {2 * BARRIER_TIMEOUT_S:.0f} s")


def run_reverb(
    world_size: int, sweep: list[Point], seconds: float, args: argparse.Namespace, bar: Any
) -> tuple[list[Summary], dict[str, Any]]:
    """Reverb at one world size, in its worker: (the summaries, the worker's whole result)."""
    config = {"actors": world_size, "points": sweep, "seconds": seconds, "capacity": CAPACITY}
    result = reverb_baseline.run_worker(args.reverb_python, config, args.reverb_timeout, worker=WORKER)
    bar.update(len(sweep))
    return result["points"], result


def to_record(system: str, world_size: int, summary: Summary) -> dict[str, Any]:
    """The record of one summary; raises unless the server received every row sent."""
    batch, item_bytes = summary["insert_batch"], summary["item_bytes"]
    point = {"world_size": world_size, "insert_batch": batch, "item_bytes": item_bytes}
    if summary["rows_received"] != summary["rows_sent"]:
        raise RuntimeError(
            f"remote: {system} at {point}: the server received {summary['rows_received']} rows, the actors "
            f"sent {summary['rows_sent']}"
        )
    record = make_record(
        point, system, OP, summary["latencies_s"], batch, batch * item_bytes, wall_s=summary["wall_s"]
    )
    for key in ("wall_s", "rows_timed", "rows_sent", "rows_received", "calls_per_actor"):
        record[key] = summary[key]
    return record


def add_ratios(records: list[dict[str, Any]]) -> None:
    """Adds `throughput_ratio_vs_<system>` and `speedup_vs_<system>` to every gear_jax_remote record,
    against each other system's record at the same point, in place."""
    by_point: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for r in records:
        by_point.setdefault(tuple(r["point"].values()), []).append(r)
    for group in by_point.values():
        for target in (r for r in group if r["system"] == GEAR_REMOTE):
            for other in (r for r in group if r["system"] != GEAR_REMOTE):
                name = other["system"]
                target[f"throughput_ratio_vs_{name}"] = (
                    target["throughput"]["items_per_s"] / other["throughput"]["items_per_s"]
                )
                target[f"speedup_vs_{name}"] = other["latency_s"]["p50"] / target["latency_s"]["p50"]


def run(args: argparse.Namespace, note: Callable[[str], None]) -> list[dict[str, Any]]:
    """Records for every system x world size x item size x insert batch."""
    batches = parse_ints(args.batch_size)
    too_big = [b for b in batches if b > CAPACITY]
    if too_big:
        note(f"batch_size {too_big} skipped: more rows per call than the table's {CAPACITY}")
    sweep = points([b for b in batches if b <= CAPACITY], parse_ints(args.item_bytes))
    records: list[dict[str, Any]] = []
    if not sweep:
        return records
    for system in args.systems:
        for world_size in parse_ints(args.world_size):
            with progress(len(sweep), f"{system}, {world_size} actors") as bar:
                try:
                    if system == REVERB:
                        summaries, result = run_reverb(world_size, sweep, args.seconds, args, bar)
                        note(f"{REVERB} versions: {result['versions']}; {result['writer']}")
                    elif system == TORCH_RPC:
                        summaries = run_torch_rpc(world_size, sweep, args.seconds, bar)
                    else:
                        summaries = run_gear(system, world_size, sweep, args.seconds, bar)
                except Unavailable as e:
                    note(f"skipped {system}: {e}")
                    break
            records += [to_record(system, world_size, s) for s in summaries]
    order = {s: i for i, s in enumerate(SYSTEMS)}
    records.sort(
        key=lambda r: (
            r["point"]["item_bytes"],
            r["point"]["insert_batch"],
            r["point"]["world_size"],
            order[r["system"]],
        )
    )
    add_ratios(records)
    return records

"""The `remote` suite: actor processes stream rows to a server that inserts them into a table.

After the conventions of PyTorch's RL RPC benchmark (one agent, N observers): per world size N
(`--world_size`), N actor processes each stream batches of `insert_batch` rows (`--batch_size`, a sweep)
of `item_bytes` uint8 (`--item_bytes`, a sweep) to one server over 127.0.0.1; the same rows and the same
machine for every system. Each system's processes start once per world size and run every (item size,
insert batch) point in turn (`remote_sweep.py`): per point each actor makes 2 untimed calls, meets the
others at a barrier, then times calls back to back for `--seconds` (at least one call). A call returns
once the server holds its rows (but for the two buffered systems, below). The server's table holds
`CAPACITY` rows per item size, a ring: inserts overwrite the oldest rows, and no learner reads them.
A buffered system shares the processes (server and actors) of its synchronous one (`GROUPS`):
gear_jax_remote_add's points run after gear_jax_remote's in the same actors, against the same servers,
and reverb_buffered's after reverb's in the same worker (starting processes, which import jax, torch or
tensorflow, is much of the suite's time on a 2-core VM). The buffered systems run at every insert
batch, or at those of `BUFFERED_BATCHES` where it is set.
  * gear_jax_remote: `gj.serve(table, host="127.0.0.1", port=0)` (Arrow Flight over gRPC) in this
    process, one server per item size; each actor opens a `gj.remote.Writer(server.address)` per item
    size and calls `writer.insert({"x": uint8[B, item_bytes]}, timeout=)`;
  * gear_jax_remote_add: the same server and writer (the default `batch_rows`, 64), a call of B rows
    being B x `writer.add({"x": uint8[item_bytes]})` (one row, no batch axis): `add` checks and keeps
    the row and sends the kept rows in one message, synchronously, every `batch_rows` rows; at the end
    of the point one `writer.flush()`, inside the timed window (see `remote_sweep.Buffered`: its
    latencies are those of the B adds, and do not include the server's acknowledgement of the rows
    still kept);
  * gear_jax_local: the upper bound without a network: each actor attaches to the same tables by name
    (`gj.Table.attach`) and calls `table.insert` (shared memory);
  * reverb: `benchmarks/remote_reverb_worker.py` under `--reverb_python` (see there for what a call
    of B rows is in Reverb): a `reverb.Server` with one table per item size, and actors with a
    `reverb.Client`'s `trajectory_writer`;
  * reverb_buffered: Reverb's answer for small writes, the same worker with calls of B x (append +
    create_item) and no flush per call (the writer streams the items in the background); one
    `flush()` at the end of the point, inside the timed window (latencies without the acknowledgement,
    as gear_jax_remote_add's);
  * torch_rpc: `benchmarks/remote_torch_rpc.py`: `torch.distributed.rpc` over TensorPipe's TCP transport,
    one agent process holding numpy rings, `rpc.rpc_sync(agent, insert_rows, args=(tensor,))` per call.
The gear_jax tables (and Reverb's) have a rate limiter that never waits (min size 1, Reverb's
`MinSize(1)`), which counts the rows inserted. Every table (Reverb's too) and ring is filled before the
actors start, so the timed calls overwrite rows (Reverb: remove its oldest items) as a full ring does.
The default sweep (6 systems x world sizes 1,2,4,8 x 6 points, 1 s each) takes about 4 minutes (230 s)
on the project's 2-core VM (one run without the sharing above took 330 s).
One record per system and point (world_size, insert_batch, item_bytes), op `remote_insert`: `latency_s`
from every actor's timed calls, `throughput` the rows (bytes) of the timed calls over the wall time from
the actors' release to the last call's return, `rows_received` the server's count over the point
(warmup included), which must equal `rows_sent`, or the run fails. gear_jax_remote records carry
`throughput_ratio_vs_<system>` (its rows/s over every other system's at the same point) and
`speedup_vs_<system>` (the other's p50 latency over its own) against the systems whose calls wait for the
server as its own do (gear_jax_local, reverb, torch_rpc); gear_jax_remote_add records carry the same
against every other system, `speedup_vs_reverb_buffered` its only latency comparison (a buffered
call's latency leaves out the acknowledgement, so it compares only with the other buffered system's).
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
from gear_jax.bench.remote_sweep import BARRIER_TIMEOUT_S, Buffered, Point, coordinate, points, run_actor

GEAR_REMOTE = "gear_jax_remote"
GEAR_REMOTE_ADD = "gear_jax_remote_add"
GEAR_LOCAL = "gear_jax_local"
REVERB = "reverb"
REVERB_BUFFERED = "reverb_buffered"
TORCH_RPC = "torch_rpc"
SYSTEMS = (GEAR_REMOTE, GEAR_REMOTE_ADD, GEAR_LOCAL, REVERB, REVERB_BUFFERED, TORCH_RPC)
GEAR_SYSTEMS = (GEAR_REMOTE, GEAR_REMOTE_ADD)  # the records that carry ratios
BUFFERED = (GEAR_REMOTE_ADD, REVERB_BUFFERED)  # calls that return before the server acknowledges
# Systems that run in the same processes, one after the other at each world size (the buffered one second).
GROUPS = ((GEAR_REMOTE, GEAR_REMOTE_ADD), (GEAR_LOCAL,), (REVERB, REVERB_BUFFERED), (TORCH_RPC,))
# The insert batches (of --batch_size) the buffered systems run; None: every batch (the default sweep takes
# 230 s so; (1, 32), the batches the buffered calls are for, would save about 20 s).
BUFFERED_BATCHES: tuple[int, ...] | None = None
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
    (gear_jax_local) or its server's address (gear_jax_remote; its points marked buffered are
    gear_jax_remote_add's)."""

    system: str
    actor: int
    targets: dict[int, str]
    sweep: list[Point]
    seconds: float


Inserter = Callable[[np.ndarray, bool], Callable[[], Any] | Buffered]


@contextlib.contextmanager
def open_inserter(system: str, target: str) -> Iterator[Inserter]:
    """What one actor writes one table with: a function of a point's rows (uint8[B, item_bytes]) and
    whether the point is buffered, returning the point's call: `table.insert` of the attached table
    (gear_jax_local), or through a remote writer `writer.insert`, or for a buffered point
    (gear_jax_remote_add) a `Buffered` of B x `writer.add` and `writer.flush`."""
    if system == GEAR_LOCAL:
        with gj.Table.attach(target) as table:
            yield lambda x, buffered: functools.partial(table.insert, {"x": x})
        return
    writer = gj.remote.Writer(target)  # the default batch_rows

    def inserter(x: np.ndarray, buffered: bool) -> Callable[[], Any] | Buffered:
        if not buffered:
            return functools.partial(writer.insert, {"x": x}, timeout=INSERT_TIMEOUT_S)
        rows = [{"x": row} for row in x]  # B rows without the batch axis, made before timing

        def adds() -> None:
            for row in rows:
                writer.add(row)

        return Buffered(adds, functools.partial(writer.flush, timeout=INSERT_TIMEOUT_S))

    try:
        yield inserter
    finally:
        writer.close()


def gear_actor_main(job: GearActorJob, barrier: Any, results: Any) -> None:
    """The body of a gear_jax actor process: opens an inserter per item size, runs every point."""
    with contextlib.ExitStack() as stack:
        inserters = {d: stack.enter_context(open_inserter(job.system, t)) for d, t in job.targets.items()}

        def open_point(point: Point) -> contextlib.AbstractContextManager[Callable[[], Any] | Buffered]:
            inserter = inserters[point["item_bytes"]]
            return contextlib.nullcontext(inserter(payload(point, job.actor), bool(point.get("buffered"))))

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
    """One gear_jax system (gear_jax_local or gear_jax_remote, whose points marked buffered are
    gear_jax_remote_add's) at one world size: tables (and servers) here, actors spawned."""
    if system in GEAR_SYSTEMS:
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
            if system in GEAR_SYSTEMS:
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
    """Reverb at one world size, in its worker (points marked buffered: reverb_buffered's): (the
    summaries, the worker's whole result)."""
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
    """Adds to every gear_jax_remote and gear_jax_remote_add record `throughput_ratio_vs_<system>` against
    each other system's record at the same point, and `speedup_vs_<system>` against those of the same
    kind (both buffered or both not: a buffered call's latency leaves out the acknowledgement), in place."""
    by_point: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for r in records:
        by_point.setdefault(tuple(r["point"].values()), []).append(r)
    for group in by_point.values():
        for target in (r for r in group if r["system"] in GEAR_SYSTEMS):
            buffered = target["system"] in BUFFERED
            for other in (r for r in group if r["system"] != target["system"]):
                name = other["system"]
                target[f"throughput_ratio_vs_{name}"] = (
                    target["throughput"]["items_per_s"] / other["throughput"]["items_per_s"]
                )
                if (name in BUFFERED) == buffered:
                    target[f"speedup_vs_{name}"] = other["latency_s"]["p50"] / target["latency_s"]["p50"]


def run(args: argparse.Namespace, note: Callable[[str], None]) -> list[dict[str, Any]]:
    """Records for every system x world size x item size x insert batch."""
    batches = parse_ints(args.batch_size)
    too_big = [b for b in batches if b > CAPACITY]
    if too_big:
        note(f"batch_size {too_big} skipped: more rows per call than the table's {CAPACITY}")
    batches = [b for b in batches if b <= CAPACITY]
    item_bytes = parse_ints(args.item_bytes)
    buffered_batches = [b for b in batches if BUFFERED_BATCHES is None or b in BUFFERED_BATCHES]
    if any(s in BUFFERED for s in args.systems) and buffered_batches != batches:
        note(
            f"{' and '.join(s for s in args.systems if s in BUFFERED)} run at insert_batch "
            f"{buffered_batches} only (remote_inserts.BUFFERED_BATCHES)"
        )
    records: list[dict[str, Any]] = []
    for group in GROUPS:
        members = [s for s in group if s in args.systems]
        # the group's points: each member's, marked buffered for a buffered member
        sweep = [
            {**p, "buffered": int(s in BUFFERED)}
            for s in members
            for p in points(buffered_batches if s in BUFFERED else batches, item_bytes)
        ]
        if not sweep:
            continue
        for world_size in parse_ints(args.world_size):
            with progress(len(sweep), f"{'+'.join(members)}, {world_size} actors") as bar:
                try:
                    if group[0] == REVERB:
                        summaries, result = run_reverb(world_size, sweep, args.seconds, args, bar)
                        for s in members:
                            writer = result["buffered_writer" if s in BUFFERED else "writer"]
                            note(f"{s} versions: {result['versions']}; {writer}")
                    elif group[0] == TORCH_RPC:
                        summaries = run_torch_rpc(world_size, sweep, args.seconds, bar)
                    else:
                        summaries = run_gear(group[0], world_size, sweep, args.seconds, bar)
                except Unavailable as e:
                    for s in members:
                        note(f"skipped {s}: {e}")
                    break
            records += [to_record(group[summary["buffered"]], world_size, summary) for summary in summaries]
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

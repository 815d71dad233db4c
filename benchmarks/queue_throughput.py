"""The `queue` suite: N actor processes feed one learner through a queue, gear_jax against Reverb's queue.

Per world size N (`--world_size`, actor processes), each actor inserts `--rows_per_actor` rows of
`--item_bytes` bytes (uint8) plus the row's id and the time its insert call began, `--insert_batch`
rows per call, into a queue of `--queue_size` rows; one learner, in this process, consumes batches of
`--batch_size` until it holds all N x rows_per_actor rows. Writers wait while the queue is full.
  * gear_jax: a table made with `queue=True`; the actors are spawned processes attached to it by name
    (`Table.insert(..., timeout=)`, stamps uint32 microseconds since the run's start); the learner waits
    with `table.await_samples(min(B, rows left))` and runs a jitted `gj.dequeue(table, B)` (compiled
    before the actors are released);
  * gear_jax_host: the same with `gj.host.dequeue` (numpy, outside jit: a PyTorch learner's path);
  * reverb: `benchmarks/reverb_queue_worker.py` under `--reverb_python`: a `reverb.Table.queue` on a
    local server, actors spawned in that interpreter, a batched `reverb.TrajectoryDataset` (see there).
One record per system and point, op `queue`: `iters` is the rows delivered, `latency_s` the rows'
latencies (the learner's `time.perf_counter()` once it holds the batch, minus the row's insert time:
one clock for every process on Linux), `throughput.items_per_s` rows delivered over the wall time from
the actors' release to the last row's delivery. Every row must come out exactly once (ids counted; a
row missing or delivered twice raises). gear_jax records carry `throughput_ratio_vs_<system>` (its rows/s
over the other system's at the same point) beside the usual `speedup_vs_<system>` (p50 latency ratio).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

import gear_jax as gj
from gear_jax import host
from gear_jax.bench.common import GEAR, GEAR_HOST, GEAR_SYSTEMS, Unavailable, make_record, parse_ints
from gear_jax.bench.data import Dataset
from gear_jax.bench import reverb_baseline
from gear_jax.bench.display import progress

REVERB = "reverb"
SYSTEMS = (GEAR, GEAR_HOST, REVERB)
DEFAULTS = {
    "world_size": "1,2",
    "item_bytes": "1024",
    "batch_size": "64",
    "insert_batch": 8,
    "queue_size": 1024,
    "rows_per_actor": 50000,
}
PLOT = {"x": "world_size", "y": "items_per_s", "label": "rows/s delivered to the learner"}
OP = "queue"
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reverb_queue_worker.py")
BARRIER_TIMEOUT_S = 300.0
INSERT_TIMEOUT_S = 300.0  # an actor gives up (RateLimiterTimeout) when the learner stops consuming
POLL_S = 1.0  # the learner checks that its actors are alive this often while it waits


@dataclasses.dataclass(frozen=True)
class ActorJob:
    """What one gear_jax actor process does."""

    table: str
    actor: int
    rows: int
    item_bytes: int
    insert_batch: int
    seed: int
    base: float  # perf_counter of the run's start: stamps are microseconds since it


def fields(item_bytes: int) -> dict[str, gj.Field]:
    """A row: the payload, its id and its insert time (uint32 microseconds since the run's start)."""
    return {"x": gj.Field((item_bytes,), "uint8"), "id": gj.Field((), "int32"), "t": gj.Field((), "uint32")}


def payload(rows: int, item_bytes: int, seed: int) -> np.ndarray:
    """The rows an actor inserts in each call, uint8[rows, item_bytes] (reverb_queue_worker.py's too)."""
    return Dataset(rows, 1, item_bytes, seed).as_array()[:, 0]


def actor_main(job: ActorJob, barrier: Any) -> None:
    """The body of a gear_jax actor process: attach, wait at the barrier, insert every row."""
    table = gj.Table.attach(job.table)
    x = payload(job.insert_batch, job.item_bytes, job.seed + job.actor)
    ids = np.arange(job.actor * job.rows, (job.actor + 1) * job.rows, dtype=np.int32)
    barrier.wait(BARRIER_TIMEOUT_S)
    for start in range(0, job.rows, job.insert_batch):
        n = min(job.insert_batch, job.rows - start)
        stamp = np.uint32((time.perf_counter() - job.base) * 1e6)
        row = {"x": x[:n], "id": ids[start : start + n], "t": np.full(n, stamp, np.uint32)}
        table.insert(row, timeout=INSERT_TIMEOUT_S)
    table.close()


def dequeue_step(table: gj.Table, batch: int, system: str) -> Callable[[], dict[str, np.ndarray]]:
    """One learner step: up to `batch` rows out of the queue, as numpy arrays (valid, x, id, t)."""
    if system == GEAR_HOST:
        return lambda: host.dequeue(table, batch)[1]

    @jax.jit
    def step() -> dict[str, jax.Array]:
        return gj.dequeue(table, batch)[1]

    def run() -> dict[str, np.ndarray]:
        return {k: np.asarray(v) for k, v in jax.block_until_ready(step()).items()}

    return run


def await_rows(table: gj.Table, n: int, procs: list[Any]) -> None:
    """Waits until the queue holds `n` unconsumed rows; raises if an actor died meanwhile."""
    while True:
        try:
            table.await_samples(n, timeout=POLL_S)
            return
        except gj.RateLimiterTimeout:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(
                    f"queue: actor process {dead[0].pid} exited with code {dead[0].exitcode}; "
                    f"{table.unconsumed} rows wait in the queue"
                ) from None


def run_gear(point: dict[str, Any], system: str, bar: Any) -> tuple[np.ndarray, np.ndarray, float]:
    """One gear_jax run of the point: (ids and latencies of the delivered rows, wall seconds)."""
    actors, rows, batch = point["world_size"], point["rows_per_actor"], point["batch_size"]
    total = actors * rows
    spec = gj.TableSpec(fields(point["item_bytes"]), capacity=point["queue_size"])
    ctx = mp.get_context("spawn")
    with gj.Table.create(spec, queue=True) as table:
        step = dequeue_step(table, batch, system)
        step()  # compiles (the queue is empty: every pick comes back invalid)
        base = time.perf_counter()
        barrier = ctx.Barrier(actors + 1)
        procs = [
            ctx.Process(
                target=actor_main,
                args=(
                    ActorJob(table.name, a, rows, point["item_bytes"], point["insert_batch"], 0, base),
                    barrier,
                ),
                daemon=True,
            )
            for a in range(actors)
        ]
        for p in procs:
            p.start()
        ids, stamps, delivered_us = [], [], []
        delivered = 0
        try:
            barrier.wait(BARRIER_TIMEOUT_S)
            start = time.perf_counter()
            while delivered < total:
                await_rows(table, min(batch, total - delivered), procs)
                out = step()
                now = time.perf_counter()
                valid = out["valid"]
                ids.append(out["id"][valid])
                stamps.append(out["t"][valid])
                delivered_us.append(np.full(int(valid.sum()), (now - base) * 1e6))
                delivered += int(valid.sum())
                bar.update(int(valid.sum()))
            wall = time.perf_counter() - start
        finally:
            for p in procs:
                p.join(BARRIER_TIMEOUT_S if delivered >= total else 1.0)
                if p.is_alive():
                    p.kill()
        failed = [p for p in procs if p.exitcode != 0]
        if failed:
            raise RuntimeError(f"queue: actor process {failed[0].pid} exited with code {failed[0].exitcode}")
    latencies = (np.concatenate(delivered_us) - np.concatenate(stamps).astype(np.float64)) / 1e6
    return np.concatenate(ids), latencies, wall


def run_reverb(
    point: dict[str, Any], python: str | None, timeout_s: float
) -> tuple[np.ndarray, np.ndarray, float, dict[str, Any]]:
    """The point in Reverb's worker: (ids and latencies of the delivered rows, wall seconds, the worker's
    whole result)."""
    config = {
        "actors": point["world_size"],
        "rows_per_actor": point["rows_per_actor"],
        "item_bytes": point["item_bytes"],
        "insert_batch": point["insert_batch"],
        "queue_size": point["queue_size"],
        "batch_size": point["batch_size"],
        "seed": 0,
    }
    result = reverb_baseline.run_worker(python, config, timeout_s, worker=WORKER)
    ids = np.asarray(result["ids"], np.int64)
    return ids, np.asarray(result["latencies_s"], np.float64), float(result["wall_s"]), result


def check_once(ids: np.ndarray, total: int, system: str, point: dict[str, Any]) -> None:
    """Raises unless `ids` holds every id in [0, total) exactly once."""
    ids = np.asarray(ids, np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= total):
        raise RuntimeError(
            f"queue: {system} at {point} delivered ids outside [0, {total}): {ids.min()}..{ids.max()}"
        )
    counts = np.bincount(ids, minlength=total)
    missing, twice = np.flatnonzero(counts == 0), np.flatnonzero(counts > 1)
    if missing.size or twice.size:
        raise RuntimeError(
            f"queue: {system} at {point} did not deliver every row exactly once: {ids.size} rows delivered "
            f"of {total}, {missing.size} missing (first {missing[:5].tolist()}), {twice.size} more than once "
            f"(first {twice[:5].tolist()})"
        )


def run_point(
    point: dict[str, Any], args: argparse.Namespace, note: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Every system's record at one point."""
    total = point["world_size"] * point["rows_per_actor"]
    records = []
    for system in args.systems:
        with progress(total, f"{system}, {point['world_size']} actors") as bar:
            if system == REVERB:
                try:
                    ids, latencies, wall, result = run_reverb(point, args.reverb_python, args.reverb_timeout)
                except Unavailable as e:
                    note(f"skipped {REVERB} at {point}: {e}")
                    continue
                note(f"{REVERB} versions: {result['versions']}; {result['writer']}")
                bar.update(total)
            else:
                ids, latencies, wall = run_gear(point, system, bar)
        check_once(ids, total, system, point)
        record = make_record(point, system, OP, latencies, 1, point["item_bytes"], wall_s=wall)
        record["rows_delivered_once"] = int(ids.size)
        record["wall_s"] = wall
        records.append(record)
    add_throughput_ratios(records)
    return records


def add_throughput_ratios(records: list[dict[str, Any]]) -> None:
    """Adds `throughput_ratio_vs_<system>` (its rows/s over the other system's) to the gear_jax records of
    one point, in place."""
    for target in records:
        if target["system"] not in GEAR_SYSTEMS:
            continue
        for other in records:
            if other["system"] not in GEAR_SYSTEMS:
                target[f"throughput_ratio_vs_{other['system']}"] = (
                    target["throughput"]["items_per_s"] / other["throughput"]["items_per_s"]
                )


def run(args: argparse.Namespace, note: Callable[[str], None]) -> list[dict[str, Any]]:
    """Records for every world size x item size x batch size."""
    records: list[dict[str, Any]] = []
    if args.insert_batch > args.queue_size:
        note(
            f"nothing measured: insert_batch={args.insert_batch} is more than the queue's "
            f"{args.queue_size} rows"
        )
        return records
    for item_bytes, batch, actors in itertools.product(
        parse_ints(args.item_bytes), parse_ints(args.batch_size), parse_ints(args.world_size)
    ):
        if batch > args.queue_size:
            note(f"batch_size={batch} skipped: more than the queue's {args.queue_size} rows")
            continue
        point = {
            "world_size": actors,
            "item_bytes": item_bytes,
            "batch_size": batch,
            "insert_batch": args.insert_batch,
            "queue_size": args.queue_size,
            "rows_per_actor": args.rows_per_actor,
        }
        records += run_point(point, args, note)
    return records

"""The `actor_learner` suite: N actor processes insert while one learner runs jitted steps.

Each actor (a spawned process attached to the table by name) inserts batches of `--insert_batch`
random rows until the learner is done. The learner, in this process, runs `--iters` jitted steps of
prioritized sample + gather + update_priorities (new priorities computed from the gathered rows).
Per world size (number of actors) it reports the actors' insert latency and throughput and the
learner's step latency and throughput. There is no baseline here: flashbax and jnp buffers live in
one process, and a Reverb actor/learner run is not implemented.

With `--samples_per_insert` (a sweep), the table gets a `gj.RateLimiter` with that ratio,
`min_size_to_sample` = the learner's batch size and `--error_buffer` (default: batch size +
insert_batch x samples_per_insert, twice the least that keeps both sides moving). The table then starts
with `min_size_to_sample` rows instead of full (the prefill counts as inserts), actors skip their warmup
inserts and wait for the limiter, and each learner step first calls `table.await_samples(batch)`: the
latencies include the waits. Both records of a point then carry `achieved_samples_per_insert` (samples
/ inserts over the whole run, from the limiter's shared counts) beside the target in the point, and the
counts themselves (`rate_limiter`).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import gear_jax as gj
from gear_jax.bench.common import GEAR, make_record, parse_floats, parse_ints, time_calls
from gear_jax.bench.data import Dataset, cap_rows
from gear_jax.bench.display import progress
from gear_jax.bench.writers import WriterJob, Writers

DEFAULTS = {"table_rows": "100000", "item_bytes": "1024", "batch_size": "256"}
WAIT_TIMEOUT_S = 300.0  # a learner step waits at most this long for the actors
PLOT = {"x": "world_size", "y": "items_per_s", "label": "rows/s (inserted or sampled)"}


def learner_step(table: gj.Table, batch: int, exponent: float) -> Callable[[int], Any]:
    """A jitted learner step of the iteration number: sample, gather, set new priorities."""

    @jax.jit
    def run(i: jax.Array) -> jax.Array:
        key = jax.random.fold_in(jax.random.key(0), i)
        s = gj.sample(table, key, batch, method="prioritized", priority_exponent=exponent)
        rows = gj.gather(table, s, fields=("x",))
        new = rows["x"][:, :64].astype(jnp.float32).mean(axis=1) / 255.0 + 0.01
        return gj.update_priorities(table, s, jnp.where(rows["valid"], new, 0.01))

    return lambda i: jax.block_until_ready(run(i))


def rate_limited(table: gj.Table, batch: int, step: Callable[[int], Any]) -> Callable[[int], Any]:
    """`step` after `table.await_samples(batch)`, on the host: the learner's side of the rate limiter."""

    def run(i: int) -> Any:
        table.await_samples(batch, timeout=WAIT_TIMEOUT_S)
        return step(i)

    return run


def rate_limiter(point: dict[str, Any], args: argparse.Namespace) -> gj.RateLimiter | None:
    """The point's limiter (see the module docstring), or None without `samples_per_insert`."""
    ratio = point.get("samples_per_insert")
    if ratio is None:
        return None
    buffer = args.error_buffer
    if buffer is None:
        buffer = point["batch_size"] + args.insert_batch * ratio
    return gj.RateLimiter(
        min_size_to_sample=point["batch_size"], samples_per_insert=ratio, error_buffer=buffer
    )


def run_point(point: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Insert and learner-step records at one point (world size, table size, item size, batch)."""
    rows, item_bytes, batch, actors = (
        point[k] for k in ("table_rows", "item_bytes", "batch_size", "world_size")
    )
    spec = gj.TableSpec(fields={"x": gj.Field((item_bytes,), "uint8")}, capacity=rows)
    limiter = rate_limiter(point, args)
    with gj.Table.create(spec, rate_limiter=limiter) as table:
        prefill = rows if limiter is None else limiter.min_size_to_sample
        data = Dataset(prefill, 1, item_bytes)
        priorities = data.priorities()
        for start, chunk in data.chunks():
            table.insert({"x": chunk[:, 0]}, priorities=priorities[start : start + len(chunk)])
        step = learner_step(table, batch, args.priority_exponent)
        step(0)  # compiles (a sample inside jit: never counted)
        if limiter is not None:
            step = rate_limited(table, batch, step)
        warmup = args.warmup if limiter is None else 0  # warmup inserts would wait for the learner
        job = WriterJob(
            table.name, item_bytes, args.insert_batch, warmup, None, seed=1, rate_limited=limiter is not None
        )
        procs = Writers(actors, job)
        procs.start()
        with progress(args.iters, f"learner, {actors} actors") as bar:
            learner = time_calls(step, args.warmup, args.iters, bar.update)
        results = procs.finish()
        counts = table.rate_limiter_counts()
    inserts = np.concatenate([r.latencies for r in results])
    wall = max(r.end for r in results) - min(r.start for r in results)
    records = [
        make_record(
            point, GEAR, "insert", inserts, args.insert_batch, args.insert_batch * item_bytes, wall_s=wall
        ),
        make_record(point, GEAR, "learner_step", learner, batch, batch * item_bytes),
    ]
    if limiter is not None:
        for record in records:
            record["achieved_samples_per_insert"] = counts.samples / counts.inserts
            record["rate_limiter"] = {
                **dataclasses.asdict(limiter),
                "min_diff": limiter.min_diff,
                "max_diff": limiter.max_diff,
                **dataclasses.asdict(counts),
            }
    return records


def run(args: argparse.Namespace, note: Callable[[str], None]) -> list[dict[str, Any]]:
    """Records for every world size x table size x item size x batch size."""
    records = []
    sweep = itertools.product(
        parse_ints(args.table_rows),
        parse_ints(args.item_bytes),
        parse_ints(args.batch_size),
        parse_ints(args.world_size),
    )
    ratios = parse_floats(args.samples_per_insert) if args.samples_per_insert else [None]
    for (requested, item_bytes, batch, actors), ratio in itertools.product(sweep, ratios):
        rows = cap_rows(requested, item_bytes, args.mem_budget_gib)
        if rows < requested:
            note(f"item_bytes={item_bytes}: table_rows capped from {requested} to {rows}")
        point = {"table_rows": rows, "item_bytes": item_bytes, "batch_size": batch, "world_size": actors}
        if ratio is not None:
            point["samples_per_insert"] = ratio
        records += run_point(point, args)
    return records

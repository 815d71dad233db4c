"""The `episode_inserts` suite: writing variable-length episodes into a step ring against a padded table.

The same episodes as the `episodes` suite (`--lengths`: real CartPole-v1 episodes, or lognormal lengths
of mean a tenth of the longest), written two ways into each table, the two tables taking turns of
`--interleave` calls (default 10) so that both see the same load:
- `insert_episodes`: one `Table.insert(batch, lengths=...)` of B episodes (`--batch_size`), the batch
  `[B, longest of the B, step bytes]` as an actor that collected B episodes would pass it; one latency per
  call, throughput in episodes;
- `writer_steps`: one episode written step by step with an `EpisodeWriter` (`append` per step, then
  `end_episode`); the latency of a call is divided by the episode's length, so the percentiles are per
  step, and throughput is in steps.
Both tables are written full once before timing (the ring wraps, the padded table's rows are all used),
so the timed writes reuse memory already mapped: the steady state of a replay that has filled up. The
ring holds `--steps` steps (capped by `--mem_budget_gib` for the padded table), the padded table as many
episodes as the ring's steps hold on average, of `longest` steps each.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import gear_jax as gj
from gear_jax.bench.common import GEAR, make_record, parse_ints
from gear_jax.bench.display import progress
from gear_jax.bench.episodes import EpisodeData, check_lengths, episode_lengths, longest_episode

PADDED = "gear_jax_padded"
DEFAULTS = {"lengths": "cartpole,lognormal", "steps": "200000", "step_bytes": "1024", "batch_size": "1,16"}
PLOT = {"x": "batch_size", "y": "items_per_s", "label": "episodes or steps written per s"}
SYSTEMS = (GEAR, PADDED)
OPS = ("insert_episodes", "writer_steps")
TURN = 10  # calls per system per turn


def make_tables(data: EpisodeData, steps: int) -> dict[str, gj.Table]:
    """The ring of `steps` steps and the padded table of the same number of episodes on average."""
    field = {"x": gj.Field((data.step_bytes,), "uint8")}
    episodes = max(1, int(steps / data.lengths.mean()))
    ring = gj.TableSpec(field, capacity=2 * episodes, step_capacity=steps, max_steps=data.max_steps)
    padded = gj.TableSpec(field, capacity=episodes, max_steps=data.max_steps)
    return {GEAR: gj.Table.create(ring, reuse=False), PADDED: gj.Table.create(padded, reuse=False)}


def batches(data: EpisodeData, batch: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The episodes in batches of `batch`, each `[batch, longest of them, step_bytes]` with its lengths."""
    out = []
    for e in range(0, data.episodes - batch + 1, batch):
        lengths = data.lengths[e : e + batch]
        steps = np.zeros((batch, int(lengths.max()), data.step_bytes), np.uint8)
        steps[np.arange(steps.shape[1]) < lengths[:, None]] = data.steps_between(
            int(data.starts[e]), int(data.ends[e + batch - 1])
        )
        out.append((steps, lengths.astype(np.int32)))
    return out


def fill(table: gj.Table, data: EpisodeData, steps: int) -> None:
    """Writes episodes until the table has taken more than `steps` steps or every one of its rows."""
    taken, rows = 0, 0
    for chunk, lengths in data.padded_chunks():
        table.insert({"x": chunk}, lengths=lengths)
        taken, rows = taken + int(lengths.sum()), rows + len(lengths)
        if taken > steps and rows > table.capacity:
            return


def insert_step(table: gj.Table, work: list[tuple[np.ndarray, np.ndarray]]) -> Callable[[int], float]:
    def step(i: int) -> float:
        steps, lengths = work[i % len(work)]
        table.insert({"x": steps}, lengths=lengths)
        return 1.0

    return step


WRITER_EPISODES = 64  # episodes whose steps are made before timing, written in turn


def writer_episodes(data: EpisodeData) -> list[list[dict[str, np.ndarray]]]:
    """The first WRITER_EPISODES episodes as lists of steps, as an actor hands them to `append`."""
    out = []
    for e in range(min(WRITER_EPISODES, data.episodes)):
        out.append([{"x": s} for s in data.steps_between(int(data.starts[e]), int(data.ends[e]))])
    return out


def writer_step(table: gj.Table, episodes: list[list[dict[str, np.ndarray]]]) -> Callable[[int], float]:
    """One episode step by step; returns its length (the latency is divided by it)."""

    def step(i: int) -> float:
        rows = episodes[i % len(episodes)]
        with table.writer() as writer:
            for row in rows:
                writer.append(row)
            writer.end_episode()
        return float(len(rows))

    return step


def interleaved(
    steps: dict[str, Callable[[int], float]], warmup: int, iters: int, tick: Callable[[], Any]
) -> dict[str, np.ndarray]:
    """Per system: latencies in seconds of `iters` calls (each divided by what the call returned), the
    systems taking turns of TURN calls after `warmup` untimed calls each.

    Every system writes the same episodes in a turn (call i writes episode i), so the second one finds
    their steps in cache where the first read them from memory: the order of the systems is reversed
    every turn, so that each goes first in half of the turns."""
    for name, step in steps.items():
        for i in range(warmup):
            step(i)
    latencies: dict[str, list[float]] = {name: [] for name in steps}
    done, turn = 0, 0
    while done < iters:
        n = min(TURN, iters - done)
        order = list(steps.items())
        for name, step in order[::-1] if turn % 2 else order:
            for k in range(n):
                start = time.perf_counter()
                per = step(warmup + done + k)
                latencies[name].append((time.perf_counter() - start) / per)
                tick()
        done, turn = done + n, turn + 1
    return {name: np.asarray(v) for name, v in latencies.items()}


def run(args: argparse.Namespace, note: Callable[[str], None]) -> list[dict[str, Any]]:
    """Records of both tables for every length distribution x step budget x step size x op."""
    records = []
    for kind in check_lengths(args.lengths):
        max_steps = longest_episode(kind, args.max_steps)
        for steps in parse_ints(args.steps):
            for step_bytes in parse_ints(args.step_bytes):
                lengths = episode_lengths(kind, 4 * steps, max_steps)
                data = EpisodeData(lengths, step_bytes, max_steps)
                padded_bytes = int(steps / lengths.mean()) * max_steps * step_bytes
                if padded_bytes > args.mem_budget_gib * 2**30:
                    note(
                        f"lengths={kind} steps={steps}: the padded table needs {padded_bytes} bytes; skipped"
                    )
                    continue
                tables = make_tables(data, steps)
                try:
                    for name, table in tables.items():
                        if name in args.systems:
                            fill(table, data, steps)
                    chosen = {n: t for n, t in tables.items() if n in args.systems}
                    point = {"lengths": kind, "steps": steps, "step_bytes": step_bytes}
                    for batch in parse_ints(args.batch_size):
                        work = batches(data, batch)
                        with progress(len(chosen) * args.iters, f"{kind} insert B={batch}") as bar:
                            steps_of = {n: insert_step(t, work) for n, t in chosen.items()}
                            lat = interleaved(steps_of, args.warmup, args.iters, bar.update)
                        for name, latencies in lat.items():
                            records.append(
                                make_record(
                                    {**point, "batch_size": batch},
                                    name,
                                    "insert_episodes",
                                    latencies,
                                    batch,
                                    batch * float(lengths.mean()) * step_bytes,
                                )
                            )
                    episodes = writer_episodes(data)
                    with progress(len(chosen) * args.iters, f"{kind} writer") as bar:
                        steps_of = {n: writer_step(t, episodes) for n, t in chosen.items()}
                        lat = interleaved(steps_of, args.warmup, args.iters, bar.update)
                    for name, latencies in lat.items():
                        records.append(
                            make_record(
                                {**point, "batch_size": 1}, name, "writer_steps", latencies, 1, step_bytes
                            )
                        )
                finally:
                    for table in tables.values():
                        table.close()
    return records

"""Reverb's side of the `remote` suite, run by another interpreter (one with dm-reverb and tensorflow).

    /opt/reverb-venv/bin/python benchmarks/remote_reverb_worker.py < config.json > result.json

It starts a `reverb.Server` on 127.0.0.1 with one table per item size (uniform sampler, FIFO remover,
`max_size` = capacity, `MinSize(1)`: no rate limit; signature {"x": uint8[item_bytes]}), fills each
table once (so that every timed insert also removes the oldest item, as a full ring overwrites its
oldest row), spawns `actors` processes (multiprocessing, spawn), each with a `reverb.Client`, and runs
the suite's loop (`remote_sweep.py`, loaded by path: the actors time calls, this process coordinates and
counts the rows each table received through its `insert_stats.completed`). See WRITER (BUFFERED_WRITER
at a point marked buffered) for what one call of B rows is. It prints JSON to stdout:

    {"versions": {...}, "writer": WRITER, "buffered_writer": BUFFERED_WRITER, "points":
     [remote_sweep.coordinate's summary per point, its latencies as a list]}

Config keys: actors, points ([{"insert_batch", "item_bytes", "buffered" (optional, 0: the suite's
`reverb`, 1: its `reverb_buffered`)}]), seconds, capacity. This file imports
only the standard library, numpy, tensorflow, reverb, and `data.py` and `remote_sweep.py` beside it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import multiprocessing as mp
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import reverb  # noqa: E402
import tensorflow as tf  # noqa: E402

WRITER = (
    "one call of B rows: B x (trajectory_writer.append of one step, create_item of that step: one item per "
    "row, as a table holds one row per row), then flush(), which returns once the server holds the call's "
    "items; client.trajectory_writer(num_keep_alive_refs=1) opened per point, so that each row's chunk "
    "goes out as its item is made (num_keep_alive_refs=B, chunks of up to B steps, was slower)"
)
BUFFERED_WRITER = (
    "one call of B rows: B x (trajectory_writer.append of one step, create_item of that step), no flush: "
    "the writer's background worker streams the items, and the call's latency does not include the "
    "server's acknowledgement; one flush() per point, after the actor's last call and inside the timed "
    "window (the point's throughput counts it); client.trajectory_writer(num_keep_alive_refs=1) opened "
    "per point"
)
# Buffered, tried on this VM (the server and one writer in one process, 1 s, num_keep_alive_refs=1, rows/s
# at B = 1 / 32 / 256): 1 KiB rows 38.9k / 52.4k / 49.1k; 64 KiB rows 13.4k / 11.7k / 12.9k, the writer
# running ahead of the server (the final flush took 0.3-0.5 s, and Reverb logs "The number of pending
# items is alarmingly high, did you forget to call Flush?"). Bounding the run-ahead with
# flush(block_until_num_items=64) after each call (create_item's docstring: "To prevent unwanted
# runahead, `flush` must be called"): 1 KiB 26.6k / 40.5k / 41.7k, 64 KiB 21.3k / 21.2k / 18.2k.
# num_keep_alive_refs=B: about the same at B = 32, 31.1k / 14.6k at B = 256. BUFFERED_WRITER is the plain
# stream asked for (no flush but the point's last).
# Ways tried on this VM (1 actor, 1 s, rows/s at B = 1 / 32 / 256), 1 KiB rows: trajectory_writer with
# num_keep_alive_refs=B 6.6k / 30.9k / 33.1k, =1 6.6k / 33.4k / 43.2k; the deprecated client.writer
# (max_sequence_length=1, chunk_length=1) 8.0k / 35.0k / 40.7k, with chunk_length=B 8.2k / 28.9k / 9.1k.
# 64 KiB rows: num_keep_alive_refs=B 4.7k / 19.0k / 14.5k, =1 5.6k / 20.0k / 19.2k; client.writer
# 6.6k / 19.2k / 17.5k. The trajectory writer is Reverb's current API and =1 its best setting here.
KEEP_ALIVE_REFS = 1
HOST = "127.0.0.1"


def _load(filename: str) -> Any:
    """A module beside this file, loaded by path: this interpreter has no gear_jax (nor jax) installed."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), filename)
    spec = importlib.util.spec_from_file_location(f"gear_jax_bench_{filename[:-3]}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


Dataset = _load("data.py").Dataset
sweep_loop = _load("remote_sweep.py")


def table_name(item_bytes: int) -> str:
    return f"rows_{item_bytes}"


def make_table(item_bytes: int, capacity: int) -> reverb.Table:
    return reverb.Table(
        name=table_name(item_bytes),
        sampler=reverb.selectors.Uniform(),
        remover=reverb.selectors.Fifo(),
        max_size=capacity,
        rate_limiter=reverb.rate_limiters.MinSize(1),
        signature={"x": tf.TensorSpec([item_bytes], tf.uint8)},
    )


def insert_call(writer: Any, table: str, rows: np.ndarray, flush: bool = True) -> Callable[[], None]:
    """One call of `len(rows)` rows through `writer` (see WRITER; BUFFERED_WRITER without `flush`)."""

    def call() -> None:
        for row in rows:
            writer.append({"x": row})
            writer.create_item(table, 1.0, {"x": writer.history["x"][-1]})
        if flush:
            writer.flush()

    return call


def actor_main(address: str, actor: int, config: dict[str, Any], barrier: Any, results: Any) -> None:
    """One actor process: every point in turn (remote_sweep.run_actor)."""
    client = reverb.Client(address)

    @contextlib.contextmanager
    def open_point(point: dict[str, int]) -> Iterator[Any]:
        batch, item_bytes = point["insert_batch"], point["item_bytes"]
        buffered = bool(point.get("buffered", 0))
        rows = Dataset(batch, 1, item_bytes, actor).as_array()[:, 0]
        with client.trajectory_writer(num_keep_alive_refs=KEEP_ALIVE_REFS) as writer:
            call = insert_call(writer, table_name(item_bytes), rows, flush=not buffered)
            yield sweep_loop.Buffered(call, writer.flush) if buffered else call

    sweep_loop.run_actor(actor, open_point, config["points"], config["seconds"], barrier, results)


def fill(client: reverb.Client, item_bytes: int, capacity: int) -> None:
    """Inserts `capacity` rows into the item size's table, so that it is full before timing."""
    batch = min(capacity, 256)
    rows = np.ones((batch, item_bytes), np.uint8)
    with client.trajectory_writer(num_keep_alive_refs=KEEP_ALIVE_REFS) as writer:
        call = insert_call(writer, table_name(item_bytes), rows)
        for _ in range(-(-capacity // batch)):
            call()


def main() -> None:
    config = json.load(sys.stdin)
    actors, sweep, capacity = config["actors"], config["points"], config["capacity"]
    item_sizes = sorted({p["item_bytes"] for p in sweep})
    server = reverb.Server(tables=[make_table(d, capacity) for d in item_sizes], port=None)
    address = f"{HOST}:{server.port}"
    client = reverb.Client(address)
    for d in item_sizes:
        fill(client, d, capacity)

    def received(point: dict[str, int]) -> int:
        info = client.server_info()[table_name(point["item_bytes"])]
        return int(info.rate_limiter_info.insert_stats.completed)

    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(actors + 1), ctx.Queue()
    procs = [
        ctx.Process(target=actor_main, args=(address, a, config, barrier, results), daemon=True)
        for a in range(actors)
    ]
    for p in procs:
        p.start()

    def failure() -> str | None:
        dead = [p for p in procs if p.exitcode not in (None, 0)]
        return f"actor process {dead[0].pid} exited with code {dead[0].exitcode}" if dead else None

    summaries = []
    for summary in sweep_loop.coordinate(actors, sweep, barrier, results, received, failure):
        summaries.append({**summary, "latencies_s": summary["latencies_s"].tolist()})
    for p in procs:
        p.join(sweep_loop.BARRIER_TIMEOUT_S)
        if p.exitcode != 0:
            raise RuntimeError(f"actor process {p.pid} exited with code {p.exitcode}")
    writers = {"writer": WRITER, "buffered_writer": BUFFERED_WRITER}
    json.dump({"versions": _versions(), **writers, "points": summaries}, sys.stdout)
    sys.stdout.flush()
    server.stop()


def _versions() -> dict[str, Any]:
    return {"reverb": _version("dm-reverb"), "tensorflow": tf.__version__, "numpy": np.__version__}


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()

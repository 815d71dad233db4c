"""Reverb's side of the `queue` suite, run by another interpreter (one with dm-reverb and tensorflow).

    /opt/reverb-venv/bin/python benchmarks/reverb_queue_worker.py < config.json > result.json

It starts a Reverb server on 127.0.0.1 with one `reverb.Table.queue` of `queue_size` items, spawns
`actors` processes (multiprocessing, spawn) that each write `rows_per_actor` rows through a
`client.writer` (one item per row, a sequence of one step: a uint8[item_bytes] payload, the row's id
and the `time.perf_counter()` at which its insert call began), `insert_batch` rows per call, and
consumes every row in this process through one `reverb.TrajectoryDataset` batched by `batch_size` into
numpy (see WRITER for the settings and why; `max_samples` = all rows, so that the stream ends with the
last, possibly partial, batch). Writers wait (the server holds their items back) while the queue is
full. It prints JSON to stdout:

    {"versions": {...}, "writer": WRITER, "wall_s": seconds from the actors' release to the last
     row's delivery, "ids": [id of each delivered row, in delivery order], "latencies_s": [delivery
     time - insert time of each delivered row], "batches": int}

Config keys: actors, rows_per_actor, item_bytes, insert_batch, queue_size, batch_size, seed.
Row ids are actor * rows_per_actor + k for the actor's k-th row. This file imports only the standard
library, numpy, tensorflow, reverb and `data.py` beside it.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing as mp
import os
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import reverb  # noqa: E402
import tensorflow as tf  # noqa: E402

TABLE = "queue"
IN_FLIGHT_BATCHES = 2  # Reverb's rule of thumb: 2-3x the batch size in flight
MAX_IN_FLIGHT_ITEMS = 25  # client.writer's default
WRITER = (
    f"actors write with client.writer(max_sequence_length=1, chunk_length=1, max_in_flight_items="
    f"{MAX_IN_FLIGHT_ITEMS}), one item per row, streaming (no flush per call; per-call flushes and "
    "client.trajectory_writer were slower); the learner reads a TrajectoryDataset (1 worker, "
    f"max_in_flight_samples_per_worker={IN_FLIGHT_BATCHES} x batch_size) batched by batch_size"
)
BARRIER_TIMEOUT_S = 300.0


def _load_data_module() -> Any:
    """`data.py` beside this file, loaded by path: this interpreter has no gear_jax (nor jax) installed."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data.py")
    spec = importlib.util.spec_from_file_location("gear_jax_bench_data", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


Dataset = _load_data_module().Dataset


def signature(item_bytes: int) -> dict[str, tf.TensorSpec]:
    """One item per row, a sequence of one step: the payload, the row's id and its insert time
    (perf_counter seconds)."""
    return {
        "x": tf.TensorSpec([1, item_bytes], tf.uint8),
        "id": tf.TensorSpec([1], tf.int32),
        "t": tf.TensorSpec([1], tf.float64),
    }


def actor_main(address: str, actor: int, config: dict[str, Any], barrier: Any) -> None:
    """One actor process: waits at the barrier, then writes its rows, `insert_batch` per call, streaming
    (see WRITER)."""
    rows, batch = config["rows_per_actor"], config["insert_batch"]
    payload = Dataset(batch, 1, config["item_bytes"], config["seed"] + actor).as_array()[:, 0]
    first_id = actor * rows
    client = reverb.Client(address)
    with client.writer(max_sequence_length=1, chunk_length=1, max_in_flight_items=MAX_IN_FLIGHT_ITEMS) as w:
        barrier.wait(BARRIER_TIMEOUT_S)
        for start in range(0, rows, batch):
            stamp = np.float64(time.perf_counter())
            for k in range(min(batch, rows - start)):
                w.append({"x": payload[k], "id": np.int32(first_id + start + k), "t": stamp})
                w.create_item(TABLE, num_timesteps=1, priority=1.0)
        w.flush()


def learn(address: str, config: dict[str, Any], barrier: Any) -> dict[str, Any]:
    """Releases the actors and consumes every row; returns the result (see the module docstring)."""
    total = config["actors"] * config["rows_per_actor"]
    batch = config["batch_size"]
    dataset = reverb.TrajectoryDataset.from_table_signature(
        server_address=address,
        table=TABLE,
        max_in_flight_samples_per_worker=IN_FLIGHT_BATCHES * batch,
        num_workers_per_iterator=1,  # a FIFO table needs exactly one worker (Reverb's docstring)
        max_samples=total,
    ).batch(batch)
    iterator = iter(dataset)
    ids: list[np.ndarray] = []
    latencies: list[np.ndarray] = []
    barrier.wait(BARRIER_TIMEOUT_S)
    start = time.perf_counter()
    delivered = 0
    batches = 0
    while delivered < total:
        data = next(iterator).data
        got = {k: v.numpy() for k, v in data.items()}  # [B, 1, ...]: items of one step
        now = time.perf_counter()
        ids.append(got["id"][:, 0])
        latencies.append(now - got["t"][:, 0])
        delivered += len(got["id"])
        batches += 1
    wall = time.perf_counter() - start
    return {
        "wall_s": wall,
        "ids": np.concatenate(ids).tolist(),
        "latencies_s": np.concatenate(latencies).tolist(),
        "batches": batches,
    }


def main() -> None:
    config = json.load(sys.stdin)
    table = reverb.Table.queue(
        TABLE, max_size=config["queue_size"], signature=signature(config["item_bytes"])
    )
    server = reverb.Server(tables=[table], port=None)
    address = f"127.0.0.1:{server.port}"
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(config["actors"] + 1)
    procs = [
        ctx.Process(target=actor_main, args=(address, a, config, barrier), daemon=True)
        for a in range(config["actors"])
    ]
    for p in procs:
        p.start()
    result = {"versions": _versions(), "writer": WRITER, **learn(address, config, barrier)}
    for p in procs:
        p.join(BARRIER_TIMEOUT_S)
        if p.exitcode != 0:
            raise RuntimeError(f"actor process {p.pid} exited with code {p.exitcode}")
    json.dump(result, sys.stdout)
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

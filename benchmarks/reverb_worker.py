"""Reverb baseline worker, run by another interpreter (one with dm-reverb and tensorflow installed).

    /opt/reverb-venv/bin/python benchmarks/reverb_worker.py < config.json > result.json

It starts a Reverb server on 127.0.0.1, inserts the rows of the same `Dataset` the suite uses (one
item per row, or one item per window position of each row), times the inserts, then times batched
sampling through `reverb.TrajectoryDataset` for each batch size, and prints JSON to stdout:

    {"versions": {...}, "insert": {"latencies_s": [...], "rows_per_call": k},
     "sample": {"<batch size>": [seconds per batch, ...]}}

Config keys: rows, steps, item_bytes, seed, window (0: whole one-step rows), method ("uniform" or
"prioritized"), priority_exponent, batch_sizes, warmup, iters, insert_batch (rows per timed insert).
This file imports only the standard library, numpy, tensorflow, reverb and `data.py` beside it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import reverb  # noqa: E402
import tensorflow as tf  # noqa: E402


def _load_data_module() -> Any:
    """`data.py` beside this file, loaded by path: this interpreter has no gear_jax (nor jax) installed."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data.py")
    spec = importlib.util.spec_from_file_location("gear_jax_bench_data", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


Dataset = _load_data_module().Dataset

TABLE = "bench"


def make_server(config: dict[str, Any], items: int) -> reverb.Server:
    """A server with one table of `items` items, sampled with the configured method."""
    if config["method"] == "prioritized":
        sampler = reverb.selectors.Prioritized(priority_exponent=config["priority_exponent"])
    elif config["method"] == "uniform":
        sampler = reverb.selectors.Uniform()
    else:
        raise ValueError(f"method {config['method']!r} has no Reverb equivalent here")
    window, d = config["window"], config["item_bytes"]
    shape = [window, d] if window else [d]
    table = reverb.Table(
        name=TABLE,
        sampler=sampler,
        remover=reverb.selectors.Fifo(),
        max_size=items,
        rate_limiter=reverb.rate_limiters.MinSize(1),
        signature={"x": tf.TensorSpec(shape, tf.uint8)},
    )
    return reverb.Server(tables=[table], port=None)


def insert(client: reverb.Client, data: Dataset, window: int, batch: int) -> list[float]:
    """Writes every row (window items, or one item per row); returns seconds per `batch` rows,
    each timed call ending with a flush so its items are in the table."""
    priorities = data.priorities()
    latencies: list[float] = []
    with client.trajectory_writer(num_keep_alive_refs=max(window, 1)) as writer:
        pending, start = 0, time.perf_counter()
        for first, chunk in data.chunks():
            for k, row in enumerate(chunk):
                priority = float(priorities[first + k])
                for t in range(data.steps):
                    writer.append({"x": row[t]})
                    if not window:
                        writer.create_item(TABLE, priority, {"x": writer.history["x"][-1]})
                    elif t >= window - 1:
                        writer.create_item(TABLE, priority, {"x": writer.history["x"][-window:]})
                if window:
                    writer.end_episode(clear_buffers=True)
                pending += 1
                if pending == batch:
                    writer.flush()
                    latencies.append(time.perf_counter() - start)
                    pending, start = 0, time.perf_counter()
        writer.flush()
    return latencies


def sample(address: str, batch: int, warmup: int, iters: int) -> list[float]:
    """Seconds per batch of `batch` items read through a TrajectoryDataset into numpy."""
    dataset = reverb.TrajectoryDataset.from_table_signature(
        server_address=address, table=TABLE, max_in_flight_samples_per_worker=2 * batch
    ).batch(batch, drop_remainder=True)
    iterator = iter(dataset)
    latencies = []
    for i in range(warmup + iters):
        start = time.perf_counter()
        np.asarray(next(iterator).data["x"])
        if i >= warmup:
            latencies.append(time.perf_counter() - start)
    return latencies


def main() -> None:
    config = json.load(sys.stdin)
    data = Dataset(config["rows"], config["steps"], config["item_bytes"], config["seed"])
    window = config["window"]
    items = data.rows * (data.steps - window + 1 if window else 1)
    server = make_server(config, items)
    address = f"127.0.0.1:{server.port}"
    client = reverb.Client(address)
    insert_latencies = insert(client, data, window, config["insert_batch"])
    result = {
        "versions": {"reverb": _version("dm-reverb"), "tensorflow": tf.__version__, "numpy": np.__version__},
        "insert": {"latencies_s": insert_latencies, "rows_per_call": config["insert_batch"]},
        "sample": {
            str(b): sample(address, b, config["warmup"], config["iters"]) for b in config["batch_sizes"]
        },
    }
    json.dump(result, sys.stdout)
    sys.stdout.flush()
    server.stop()


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()

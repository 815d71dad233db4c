"""Reverb baseline worker, run by another interpreter (one with dm-reverb and tensorflow installed).

    /opt/reverb-venv/bin/python benchmarks/reverb_worker.py < config.json > result.json

It starts a Reverb server on 127.0.0.1, inserts the rows of the same `Dataset` the suite uses (one
item per row, or one item per window position of each row), times the inserts, then times batched
sampling through `reverb.TrajectoryDataset` for each batch size, and prints JSON to stdout:

    {"versions": {...}, "insert": {"latencies_s": [...], "rows_per_call": k},
     "sample": {"<batch size>": [seconds per batch, ...]}}

Config keys: rows, steps, item_bytes, seed, window (0: whole one-step rows), method ("uniform" or
"prioritized"), priority_exponent, batch_sizes, warmup, iters, insert_batch (rows per timed insert).

With `episode_lengths` (a list of ints) in the config, it holds variable-length episodes instead (the
episodes suite): steps of `step_bytes` bytes (pool row g % POOL_ROWS for step g of the stream, as
`EpisodeData`) appended one by one through a `TrajectoryWriter`, one item per window of `window` steps
inside an episode (every valid start; episodes shorter than the window make none), uniform sampling.
Reverb stores each step once, in chunks the items reference. The result then also holds
`"memory": {"rss_growth_bytes": ..., "items": ...}`: how much the process's resident memory grew
while its server took the episodes (VmRSS, after the TensorFlow import and before the server started).
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


_data = _load_data_module()
Dataset = _data.Dataset

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


def resident_bytes() -> int:
    """This process's resident memory (VmRSS of /proc/self/status), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmRSS line")


def insert_episodes(
    client: reverb.Client, lengths: list[int], step_bytes: int, window: int, seed: int
) -> None:
    """Appends every episode's steps and makes one item per window of `window` steps inside it."""
    pool = np.random.default_rng(seed).integers(0, 256, (_data.POOL_ROWS, step_bytes), dtype=np.uint8)
    g = 0
    with client.trajectory_writer(num_keep_alive_refs=window) as writer:
        for length in lengths:
            for t in range(length):
                writer.append({"x": pool[g % len(pool)]})
                g += 1
                if t >= window - 1:
                    writer.create_item(TABLE, 1.0, {"x": writer.history["x"][-window:]})
            writer.end_episode(clear_buffers=True)
        writer.flush()


def main_episodes(config: dict[str, Any]) -> dict[str, Any]:
    """The episodes workload (see the module's docstring)."""
    lengths = [int(n) for n in config["episode_lengths"]]
    window = config["window"]
    items = sum(max(0, n - window + 1) for n in lengths)
    before = resident_bytes()
    server = make_server({"method": "uniform", "window": window, "item_bytes": config["step_bytes"]}, items)
    address = f"127.0.0.1:{server.port}"
    client = reverb.Client(address)
    start = time.perf_counter()
    insert_episodes(client, lengths, config["step_bytes"], window, config["seed"])
    insert_s = time.perf_counter() - start
    held = client.server_info()[TABLE].current_size
    grown = resident_bytes() - before
    result = {
        "versions": _versions(),
        "insert": {"seconds": insert_s, "steps": sum(lengths)},
        "memory": {"rss_growth_bytes": grown, "items": held, "items_expected": items},
        "sample": {
            str(b): sample(address, b, config["warmup"], config["iters"]) for b in config["batch_sizes"]
        },
    }
    server.stop()
    return result


def _versions() -> dict[str, Any]:
    return {"reverb": _version("dm-reverb"), "tensorflow": tf.__version__, "numpy": np.__version__}


def main() -> None:
    config = json.load(sys.stdin)
    if "episode_lengths" in config:
        json.dump(main_episodes(config), sys.stdout)
        sys.stdout.flush()
        return
    data = Dataset(config["rows"], config["steps"], config["item_bytes"], config["seed"])
    window = config["window"]
    items = data.rows * (data.steps - window + 1 if window else 1)
    server = make_server(config, items)
    address = f"127.0.0.1:{server.port}"
    client = reverb.Client(address)
    insert_latencies = insert(client, data, window, config["insert_batch"])
    result = {
        "versions": _versions(),
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

"""The `torch` suite: handing gear_jax batches to PyTorch.

Two ops, each measured side by side in one run:
  * `handoff`: a gathered batch (B rows of `item_bytes`, already computed) made into torch tensors.
    gear_jax: `gj.torch.to_torch(x)` (DLPack, zero-copy); `numpy_from`: the common idiom
    `torch.from_numpy(np.asarray(x))`; `copy`: `torch.tensor(np.asarray(x))`, which copies.
  * `sampler`: one batch of B rows from a table of `table_rows` rows as torch tensors.
    gear_jax: `next(gj.torch.Sampler(table, B))` (jitted sample + gather, prefetching the next batch);
    torchrl: `ReplayBuffer(LazyTensorStorage(N), RandomSampler()).sample(B)` on the same data.
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

import gear_jax as gj
from gear_jax.bench.common import GEAR, Unavailable, make_record, parse_ints, time_calls
from gear_jax.bench.data import Dataset
from gear_jax.bench.systems import import_torchrl

DEFAULTS = {"table_rows": "100000", "item_bytes": "1024", "batch_size": "32,256,1024"}
PLOT = {"x": "batch_size", "y": "items_per_s", "label": "rows per second handed to PyTorch"}
SYSTEMS = (GEAR, "numpy_from", "copy", "torchrl")


def _fill(table: gj.Table, data: Dataset) -> None:
    for _, chunk in data.chunks():
        table.insert({"x": chunk.reshape(len(chunk), data.item_bytes)})


def run(args: argparse.Namespace, note: Callable[[str], None]) -> list[dict[str, Any]]:
    import torch

    import gear_jax.torch as gjt

    torch.set_num_threads(1)
    records = []
    for rows in parse_ints(args.table_rows):
        for item_bytes in parse_ints(args.item_bytes):
            data = Dataset(rows, 1, item_bytes)
            spec = gj.TableSpec({"x": gj.Field((item_bytes,), "uint8")}, capacity=rows)
            buffer = None
            if "torchrl" in args.systems:
                try:
                    buffer = _torchrl_buffer(data)
                except Unavailable as e:
                    note(f"torchrl skipped: {e}")
            with gj.Table.create(spec) as table:
                _fill(table, data)
                for b in parse_ints(args.batch_size):
                    point = {"table_rows": rows, "item_bytes": item_bytes, "batch_size": b}
                    nbytes = b * item_bytes
                    batch = jax.block_until_ready(
                        jax.jit(lambda k: gj.gather(table, gj.sample(table, k, b)))(jax.random.key(0))
                    )
                    x = batch["x"]
                    handoffs = {
                        GEAR: lambda i: gjt.to_torch(x),  # the same one array as the others
                        "numpy_from": lambda i: torch.from_numpy(np.asarray(x)),
                        "copy": lambda i: torch.tensor(np.asarray(x)),
                    }
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # from_numpy of a read-only array
                        for system, step in handoffs.items():
                            if system in args.systems:
                                lat = time_calls(step, args.warmup, args.iters)
                                records.append(make_record(point, system, "handoff", lat, b, nbytes))
                    if GEAR in args.systems:
                        sampler = gjt.Sampler(table, b)
                        lat = time_calls(lambda i: next(sampler), args.warmup, args.iters)
                        records.append(make_record(point, GEAR, "sampler", lat, b, nbytes))
                    if buffer is not None:
                        lat = time_calls(lambda i: buffer.sample(batch_size=b), args.warmup, args.iters)
                        records.append(make_record(point, "torchrl", "sampler", lat, b, nbytes))
    return records


def _torchrl_buffer(data: Dataset) -> Any:
    torch, rl = import_torchrl()
    buffer = rl.ReplayBuffer(storage=rl.LazyTensorStorage(data.rows), sampler=rl.RandomSampler())
    for _, chunk in data.chunks():
        buffer.extend(torch.from_numpy(chunk.reshape(len(chunk), data.item_bytes)))
    return buffer

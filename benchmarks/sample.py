"""The `sample` suite: selection alone with each method, over table sizes and batch sizes."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from gear_jax.bench.common import parse_ints, parse_names
from gear_jax.bench.data import Dataset
from gear_jax.bench.selection import measure
from gear_jax.bench.systems import Workload

DEFAULTS = {"table_rows": "10000,100000,1000000", "item_bytes": "8", "batch_size": "32,256,1024"}
PLOT = {"x": "batch_size", "y": "items_per_s", "label": "samples/s"}
WITH_REPLACEMENT = ("uniform", "prioritized")


def run(args: argparse.Namespace, note: Callable[[str], None]) -> list[dict[str, Any]]:
    """Records for every table size x item size x method x batch size x system.

    gear_jax, numpy and jnp_take only select; flashbax, torchrl and Reverb always return the rows too,
    which at the default 8-byte items adds little. fifo, lifo and topk need batch_size <= table_rows.
    """
    batch_sizes = parse_ints(args.batch_size)
    records = []
    for rows in parse_ints(args.table_rows):
        for item_bytes in parse_ints(args.item_bytes):
            for method in parse_names(args.methods):
                usable = [b for b in batch_sizes if b <= rows or method in WITH_REPLACEMENT]
                exponent = args.priority_exponent if method == "prioritized" else 1.0  # only it weighs
                work = Workload(Dataset(rows, 1, item_bytes), method, exponent, collect=False)
                point = {"table_rows": rows, "item_bytes": item_bytes}
                records += measure(work, point, method, usable, args, note)
    return records

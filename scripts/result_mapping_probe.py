"""What a jitted call's result of more than 32 MiB costs on the CPU: glibc maps such a block fresh for each
call (gear_jax/malloc.py), so the gather writes into pages the kernel zeroes first, while `gj.host`
reuses its buffers. Times a jitted `gj.sample_gather` and a `gj.host.Sampler` of the same rows at a batch
whose result stays below 32 MiB and at one above it, with the page faults of each call.

python scripts/result_mapping_probe.py [--batches=480,1024] [--row_kib=64] [--calls=40]
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Sequence

import numpy as np
from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_list("batches", ["480", "1024"], "batch sizes (rows per call)")
flags.DEFINE_integer("row_kib", 64, "KiB per row")
flags.DEFINE_integer("rows", 30427, "rows in the table")
flags.DEFINE_integer("calls", 40, "timed calls per path and batch, after 5 untimed ones")


def timed_calls(call, calls: int) -> tuple[float, float]:
    """(p50 seconds, p50 page faults) of `calls` calls of `call(i)`."""
    times, faults = [], []
    for i in range(calls):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        out = call(i)
        times.append(time.perf_counter() - start)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        del out
    return statistics.median(times), statistics.median(faults)


def main(argv: Sequence[str]) -> None:
    del argv
    import jax

    import gear_jax as gj

    row_bytes = FLAGS.row_kib << 10
    table = gj.Table.create(gj.TableSpec({"x": gj.Field((row_bytes,), "uint8")}, capacity=FLAGS.rows))
    try:
        for start in range(0, FLAGS.rows, 512):
            n = min(512, FLAGS.rows - start)
            table.insert({"x": np.full((n, row_bytes), start % 251, np.uint8)})
        for batch in map(int, FLAGS.batches):
            run = jax.jit(lambda k, b=batch: gj.sample_gather(table, k, b)[1]["x"])
            sampler = gj.host.Sampler(table, batch, rng=0)
            paths = {
                "jit": lambda i: jax.block_until_ready(run(jax.random.key(i))),
                "host": lambda i: sampler(),
            }
            for call in paths.values():
                for i in range(5):
                    call(i)
            for name, call in paths.items():
                seconds, faults = timed_calls(call, FLAGS.calls)
                mib = batch * row_bytes / 2**20
                print(
                    f"batch {batch} ({mib:.0f} MiB) {name}: p50 {seconds * 1e3:.2f} ms, "
                    f"{seconds * 1e6 / batch:.2f} us per row, {faults:.0f} page faults per call",
                    flush=True,
                )
    finally:
        table.close()
    logging.info("malloc tuning: %s", gj.malloc_tuning())


if __name__ == "__main__":
    app.run(main)

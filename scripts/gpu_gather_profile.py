"""Where the time of a GPU gather goes: the gather alone (no sample) of B rows of 4 KiB, rows picked at
random (uniform) or consecutive (fifo), from a small table (16 MiB) and a large one (1 GiB).

A gap between random and consecutive rows of the large table that the small table does not show points
at address translation of host memory (GPU and IOMMU page tables), not at the kernel.
Run on a GPU machine: python scripts/gpu_gather_profile.py [ROWS BATCH METHOD] (one point only, e.g. under
ncu).
"""

import sys
import time

import jax
import numpy as np

import gear_jax as gj

ITEM = 4096
BATCHES = (256, 1024, 4096)


def median_seconds(fn, *args, iters=50):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main():
    only = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]) if len(sys.argv) == 4 else None
    gpu = jax.devices("gpu" if jax.default_backend() != "cpu" else "cpu")[0]
    for rows in (only[0],) if only else (4096, 262144):
        spec = gj.TableSpec({"x": gj.Field((ITEM,), "uint8")}, capacity=rows)
        table = gj.Table.create(spec)
        chunk = 8192
        for s in range(0, rows, chunk):
            n = min(chunk, rows - s)
            table.insert({"x": np.full((n, ITEM), 7, np.uint8)})
        gather = jax.jit(lambda smp: gj.gather(table, smp)["x"])
        empty = jax.jit(lambda smp: smp.indices + 1)
        for b in (only[1],) if only else BATCHES:
            for method in (only[2],) if only else ("uniform", "fifo"):
                key = jax.device_put(jax.random.key(0), gpu)
                smp = jax.block_until_ready(jax.jit(lambda k: gj.sample(table, k, b, method=method))(key))
                t = median_seconds(gather, smp)
                floor = median_seconds(empty, smp)
                print(
                    f"rows={rows} table={rows * ITEM / 2**20:.0f}MiB B={b} {method:8s}"
                    f" gather {t * 1e6:8.1f} us ({b * ITEM / t / 1e9:6.2f} GB/s);"
                    f" empty jitted call {floor * 1e6:6.1f} us;"
                    f" gather minus floor {b * ITEM / max(t - floor, 1e-9) / 1e9:6.2f} GB/s",
                    flush=True,
                )
        table.close()


if __name__ == "__main__":
    main()

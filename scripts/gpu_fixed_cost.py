"""Where the fixed cost of a small GPU call goes: one jitted call each of an empty program, `jnp.take` from
HBM, `gj.sample` alone, `gj.gather` alone (of a sample made beforehand) and `gj.sample_gather`, for a few
batch sizes and row sizes; `sample_gather` (one custom call) against `sample` then `gather` (two); the
sample's one-block launch against its three launches (GEAR_JAX_SAMPLE_ONE_BLOCK_PICKS=0); from 16 KiB rows,
a warp per row against a block per row (GEAR_JAX_GATHER_BLOCK_ROW_BYTES). The launchers read these
variables at each launch.

Medians of interleaved rounds (each round times every variant once), so that a slow phase of the machine
weighs on all of them. Prints one line per point and writes them to --json.

Run on a GPU machine: python scripts/gpu_fixed_cost.py [--json PATH] [--iters N]
Under `ncu --metrics gpu__time_duration.sum`, `--ncu` makes a few calls of each program only, so that
the kernels' own times can be told from the dispatch around them.
"""

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import gear_jax as gj

# (row bytes, table rows, batch sizes)
POINTS = ((512, 1 << 20, (32, 1024)), (4096, 1 << 16, (32, 1024)), (65536, 4096, (32, 256)))


TUNING = ("GEAR_JAX_SAMPLE_ONE_BLOCK_PICKS", "GEAR_JAX_GATHER_BLOCK_ROW_BYTES")


def set_environment(env):
    """The launchers read these at each launch: `env`'s values, the others unset (the defaults)."""
    for name in TUNING:
        os.environ[name] = env.get(name, "")


def timed(fn, arg):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(arg))
    return time.perf_counter() - t0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--ncu", action="store_true", help="three calls of each program, no timing")
    args = parser.parse_args()
    iters = 3 if args.ncu else args.iters
    gpu = jax.devices()[0]
    print("device:", gpu.device_kind, "backend:", jax.default_backend(), flush=True)
    results = []
    for item, rows, batches in POINTS:
        spec = gj.TableSpec({"x": gj.Field((item,), "uint8")}, capacity=rows)
        table = gj.Table.create(spec)
        chunk = max(1, (64 << 20) // item)
        for s in range(0, rows, chunk):
            n = min(chunk, rows - s)
            table.insert({"x": np.full((n, item), 7, np.uint8)})
        hbm = jax.device_put(jnp.zeros((rows, item), jnp.uint8), gpu)
        for b in batches:
            key = jax.device_put(jax.random.key(0), gpu)
            smp = jax.block_until_ready(jax.jit(lambda k, b=b: gj.sample(table, k, b))(key))
            idx = jax.device_put(jnp.arange(b, dtype=jnp.int32) * 7 % rows, gpu)
            programs = {
                "empty": (jax.jit(lambda k: k + 1), idx),
                "jnp_take": (jax.jit(lambda i, hbm=hbm: jnp.take(hbm, i, axis=0)), idx),
                "sample": (jax.jit(lambda k, b=b: gj.sample(table, k, b).indices), key),
                "gather": (jax.jit(lambda s: gj.gather(table, s)["x"]), smp),
                "sample_gather": (jax.jit(lambda k, b=b: gj.sample_gather(table, k, b)[1]["x"]), key),
            }
            programs["sample_then_gather"] = (
                jax.jit(lambda k, b=b: gj.gather(table, gj.sample(table, k, b))["x"]),
                key,
            )
            # name -> (program, argument, the environment it runs under)
            variants = {name: (fn, arg, {}) for name, (fn, arg) in programs.items()}
            # The sample's three launches (claimed rows, picks, finish) instead of one block's one.
            three = {"GEAR_JAX_SAMPLE_ONE_BLOCK_PICKS": "0"}
            variants["sample_three_launches"] = (*programs["sample"], three)
            variants["sample_gather_three_launches"] = (*programs["sample_gather"], three)
            if item >= 16384:
                threshold = "GEAR_JAX_GATHER_BLOCK_ROW_BYTES"
                variants["gather_warp_per_row"] = (*programs["gather"], {threshold: str(1 << 40)})
                variants["gather_block_per_row"] = (*programs["gather"], {threshold: "1"})
            times = {name: [] for name in variants}
            for name, (fn, arg, env) in variants.items():  # compile and warm up
                set_environment(env)
                for _ in range(3):
                    timed(fn, arg)
            for _ in range(iters):
                for name, (fn, arg, env) in variants.items():
                    set_environment(env)
                    times[name].append(timed(fn, arg))
            set_environment({})
            point = {"row_bytes": item, "table_rows": rows, "batch_size": b}
            point.update({name: float(np.median(t)) * 1e6 for name, t in times.items()})
            point.update({name + "_p10": float(np.percentile(t, 10)) * 1e6 for name, t in times.items()})
            results.append(point)
            print(
                f"row {item:6d} B B={b:5d}: "
                + ", ".join(f"{name} {point[name]:8.1f} us" for name in variants)
                + f"; sample_gather / jnp_take {point['sample_gather'] / point['jnp_take']:.2f}",
                flush=True,
            )
        hbm = None  # frees the device array before the next table
        table.close()
    if args.json:
        with open(args.json, "w") as f:
            report = {"device": gpu.device_kind, "build": gj.build_info(), "points": results}
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()

"""The floor of a sharded step's collectives on this machine: what global and local mode pay for their
collectives alone, with no table, between real `jax.distributed` processes on 127.0.0.1.

A global uniform or prioritized step of `gear_jax.sharded.sample` makes two collectives, the second
depending on the first: one all_gather of every shard's (total, count), from which every device draws
the owner of each pick, then one all_to_all of the exchange's blocks (S blocks of C slots of R + 17
bytes per device, C the first capacity of `gear_jax.sharded.exchange_capacities`). A local step makes
one psum of the shards' counts. This script times those collectives alone, each as one jitted
shard_map over a mesh of one CPU device per process (as the sharded suite's `Sx1` layouts):

    empty            x + 1 (JAX's dispatch floor)
    psum             local mode's collective
    all_gather       the (total, count) pairs of global mode
    all_to_all       the exchange's blocks, of zeros
    gather_exchange  all_gather, then an all_to_all whose blocks depend on its result: global mode's

    python scripts/collective_floor.py --processes=4 --item_bytes=1024 --batch_size=256

Each process runs 20 untimed then `--iters` timed calls of each program; process 0 prints the medians
(ms) and `--json` writes them. Every process is bounded by `--timeout_s`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_integer("processes", 4, "Processes (one CPU device each): S shards.")
flags.DEFINE_integer("item_bytes", 1024, "R, bytes of each exchanged row.")
flags.DEFINE_integer("batch_size", 256, "B, picks per step (a multiple of S).")
flags.DEFINE_integer("iters", 200, "Timed calls of each program.")
flags.DEFINE_float("timeout_s", 300.0, "Each process's time limit.")
flags.DEFINE_string("json", None, "Where to write the medians (process 0's), as JSON.")
flags.DEFINE_integer("process_id", -1, "Set by the launcher: this process's id (-1: launch them).")
flags.DEFINE_integer("port", 0, "Set by the launcher: the coordinator's port.")

WARMUP = 20
PROGRAMS = ("empty", "psum", "all_gather", "all_to_all", "gather_exchange")


def run_process() -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from gear_jax import sharded

    port, me = FLAGS.port, FLAGS.process_id
    jax.distributed.initialize(
        f"127.0.0.1:{port}",
        num_processes=FLAGS.processes,
        process_id=me,
        cluster_detection_method="deactivate",
        coordinator_bind_address=f"127.0.0.1:{port}",
    )
    shards = jax.device_count()
    mesh = jax.make_mesh((shards,), ("r",))
    capacity = sharded.exchange_capacities(FLAGS.batch_size, shards, sharded.CAPACITY_FACTOR)[0]
    slot = FLAGS.item_bytes + 17  # a row, its valid byte and 16 bytes of pick fields

    def blocks_of(value: jax.Array) -> jax.Array:
        return jnp.zeros((shards, capacity, slot), jnp.uint8) + value.astype(jnp.uint8)

    def pairs(x: jax.Array) -> jax.Array:
        return lax.all_gather(jnp.stack([x[0], x[0]]), "r").sum()

    def exchange(value: jax.Array) -> jax.Array:
        return lax.all_to_all(blocks_of(value), "r", 0, 0).sum(dtype=jnp.int32)[None]

    programs = {
        "empty": lambda x: x + 1,
        "psum": lambda x: lax.psum(x[0], "r")[None],
        "all_gather": lambda x: pairs(x)[None],
        "all_to_all": lambda x: exchange(x[0]),
        "gather_exchange": lambda x: exchange(pairs(x)),
    }
    x = jax.make_array_from_callback(
        (shards,), NamedSharding(mesh, P("r")), lambda index: np.ones((1,), np.int32)
    )
    medians = {}
    for name in PROGRAMS:
        step = jax.jit(jax.shard_map(programs[name], mesh=mesh, in_specs=P("r"), out_specs=P("r")))
        for _ in range(WARMUP):
            jax.block_until_ready(step(x))
        times = []
        for _ in range(FLAGS.iters):
            start = time.perf_counter()
            jax.block_until_ready(step(x))
            times.append(time.perf_counter() - start)
        medians[name] = float(np.median(times)) * 1e3
    if me == 0:
        result = {
            "processes": FLAGS.processes,
            "item_bytes": FLAGS.item_bytes,
            "batch_size": FLAGS.batch_size,
            "block_capacity": capacity,
            "iters": FLAGS.iters,
            "median_ms": medians,
        }
        print("RESULT " + json.dumps(result), flush=True)


def launch() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1")
    flags_out = [
        f"--processes={FLAGS.processes}",
        f"--item_bytes={FLAGS.item_bytes}",
        f"--batch_size={FLAGS.batch_size}",
        f"--iters={FLAGS.iters}",
        f"--port={port}",
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, f"--process_id={p}", *flags_out],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in range(FLAGS.processes)
    ]
    outputs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=FLAGS.timeout_s)
            if p.returncode != 0:
                raise RuntimeError(f"a process failed ({p.returncode}): {err[-2000:]}")
            outputs.append(out)
    finally:
        for p in procs:
            p.kill()
    line = next(line for line in outputs[0].splitlines() if line.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    logging.info(
        "%d processes, B=%d, rows of %d B, exchange blocks of %d slots; medians of %d calls:",
        result["processes"],
        result["batch_size"],
        result["item_bytes"],
        result["block_capacity"],
        result["iters"],
    )
    for name in PROGRAMS:
        logging.info("  %-16s %8.3f ms", name, result["median_ms"][name])
    if FLAGS.json:
        with open(FLAGS.json, "w") as f:
            json.dump(result, f, indent=1)


def main(argv: list[str]) -> None:
    del argv
    if FLAGS.process_id >= 0:
        run_process()
    else:
        launch()


if __name__ == "__main__":
    app.run(main)

"""One process of the `sharded` suite: `python -m gear_jax.bench.sharded_worker PROCESS_ID CONFIG_JSON`.

The suite (benchmarks/sharded.py) starts `processes` of these with the environment already set
(`JAX_PLATFORMS=cpu`, `JAX_NUM_CPU_DEVICES=<devices per process>`), so that JAX sees that many CPU
devices when it starts. CONFIG_JSON (a JSON object, see `sharded.worker_config`) names the coordinator
port, the layout, the points and the systems (`<mode>_<method>`).

With more than one process, each joins `jax.distributed` on 127.0.0.1:PORT. Every process then builds
a 1-D mesh over every device, and for each point creates its shards of a `ShardedTable` of one uint8
field of `item_bytes`, fills them (every row, random priorities), and times `ShardedTable.sampler`'s
jitted sample + gather of `batch_size` picks for each system: one untimed first call (trace, compile,
run), `warmup` untimed calls, `iters` timed calls, each ending in `jax.block_until_ready`. The
processes meet at a barrier before each system's timed calls.

Process 0 prints `TICK <n>` after every few timed calls (the suite's progress bar). Every process
prints one line `RESULT <json>` at the end: per point and system, its latencies in seconds, or the
error that stopped that system (raised the same way on every process, so the others go on).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from typing import Any

TICK_EVERY = 10


def main(argv: list[str]) -> int:
    process_id, config = int(argv[0]), json.loads(argv[1])
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    import gear_jax as gj

    processes, devices = config["processes"], config["devices_per_process"]
    if processes > 1:
        port = config["port"]
        jax.distributed.initialize(
            f"127.0.0.1:{port}",
            num_processes=processes,
            process_id=process_id,
            cluster_detection_method="deactivate",
            coordinator_bind_address=f"127.0.0.1:{port}",
            initialization_timeout=config.get("init_timeout_s", 60),
        )
    shards = processes * devices
    if jax.device_count() != shards or jax.local_device_count() != devices:
        raise RuntimeError(
            f"process {process_id} sees {jax.device_count()} devices ({jax.local_device_count()} local); "
            f"the layout needs {shards} ({devices} local): is JAX_NUM_CPU_DEVICES set?"
        )
    mesh = jax.make_mesh((shards,), ("replay",))
    ticks = 0

    def tick() -> None:
        nonlocal ticks
        ticks += 1
        if process_id == 0 and ticks % TICK_EVERY == 0:
            print(f"TICK {TICK_EVERY}", flush=True)

    out: list[dict[str, Any]] = []
    for p, point in enumerate(config["points"]):
        rows, item_bytes, batch = point["table_rows"], point["item_bytes"], point["batch_size"]
        spec = gj.TableSpec({"x": gj.Field((item_bytes,), "uint8")}, capacity=rows)
        with gj.ShardedTable.create(spec, mesh, axis="replay") as table:
            for s, shard in table.local_shards.items():
                rng = np.random.default_rng(1000 * p + s)
                data = rng.integers(0, 256, (rows, item_bytes), dtype=np.uint8)
                shard.insert({"x": data}, priorities=rng.uniform(0.1, 2.0, rows))
            multihost_utils.sync_global_devices(f"filled {p}")
            results: dict[str, Any] = {}
            for system in config["systems"]:
                mode, method = system.split("_", 1)
                results[system] = measure(table, mode, method, batch, config, tick)
                multihost_utils.sync_global_devices(f"done {p} {system}")
        out.append({"point": point, "systems": results})
    if process_id == 0 and ticks % TICK_EVERY:
        print(f"TICK {ticks % TICK_EVERY}", flush=True)
    print("RESULT " + json.dumps({"process": process_id, "points": out}), flush=True)
    return 0


def measure(table: Any, mode: str, method: str, batch: int, config: dict[str, Any], tick: Any) -> dict:
    """First-call seconds and timed latencies of one system, or the error it raised."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    warmup, iters = config["warmup"], config["iters"]
    keys = [np.asarray(jax.random.key_data(jax.random.key(i))) for i in range(warmup + iters + 1)]
    # "globalfull": global mode with full-size exchange blocks (every device sends S x B / S rows), as
    # every global step did before the compact exchange: the baseline of the same run.
    options = {"capacity_factor": None} if mode == "globalfull" else {}
    try:
        sampler = table.sampler(
            batch,
            method=method,
            mode="global" if mode == "globalfull" else mode,
            priority_exponent=config["priority_exponent"] if method == "prioritized" else 1.0,
            **options,
        )
        start = time.perf_counter()
        jax.block_until_ready(sampler(keys[0]))
        first_call = time.perf_counter() - start
        for i in range(warmup):
            jax.block_until_ready(sampler(keys[1 + i]))
    except Exception as e:  # noqa: BLE001 - reported to the suite as a note; raised alike on every process
        return {"error": f"{type(e).__name__}: {e}"[:2000], "traceback": traceback.format_exc()[-4000:]}
    multihost_utils.sync_global_devices(f"timed {mode} {method}")
    latencies = []
    for i in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(sampler(keys[1 + warmup + i]))
        latencies.append(time.perf_counter() - start)
        tick()
    return {
        "first_call_s": first_call,
        "latencies_s": latencies,
        "exchange_capacities": exchange_capacities(
            table, sampler, mode, batch, keys[1 + warmup :][:EXCHANGE_STEPS]
        ),
    }


EXCHANGE_STEPS = 20  # timed keys replayed (untimed) to see which exchange capacity each step took


def exchange_capacities(table: Any, sampler: Any, mode: str, batch: int, keys: list) -> list[int] | None:
    """The block capacity of global mode's exchange in the steps of `keys` (the same on every device:
    from the picks' owners), or None for local mode."""
    if not mode.startswith("global"):
        return None
    import numpy as np
    from jax.experimental import multihost_utils

    from gear_jax import sharded

    shards = table.num_shards
    capacities = sharded.exchange_capacities(
        batch, shards, None if mode == "globalfull" else sharded.CAPACITY_FACTOR
    )
    taken = []
    for key in keys:
        smp, _ = sampler(key)
        owners = np.asarray(multihost_utils.process_allgather(smp.indices, tiled=True)) // table.capacity
        taken.append(capacities[int(sharded.exchange_branch(owners, shards, capacities))])
    return taken


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

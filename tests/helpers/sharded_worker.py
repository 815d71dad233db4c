"""One process of a sharded-table test: `python tests/helpers/sharded_worker.py SCENARIO PROCESS_ID
NUM_PROCESSES DEVICES_PER_PROCESS PORT`. Prints one line `RESULT <json>` that
tests/multiprocess/test_sharded.py reads.

Each process starts JAX with DEVICES_PER_PROCESS CPU devices (and, with NUM_PROCESSES > 1,
`jax.distributed` on 127.0.0.1:PORT), builds a 1-D mesh over every device, creates its shards of a
sharded table and fills them: shard s holds ROWS[s] rows whose field `id` is the row's global id and
whose priority is PRIORITY(s, row) (an integer). A scenario then samples and reports what it saw.
"""

import json
import os
import sys
import time

SCENARIO, PROCESS_ID, NUM_PROCESSES, DEVICES, PORT = (
    sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
)
os.environ["JAX_NUM_CPU_DEVICES"] = str(DEVICES)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import gear_jax as gj  # noqa: E402
from gear_jax import sharded  # noqa: E402

if NUM_PROCESSES > 1:
    jax.distributed.initialize(
        f"127.0.0.1:{PORT}", num_processes=NUM_PROCESSES, process_id=PROCESS_ID,
        cluster_detection_method="deactivate", coordinator_bind_address=f"127.0.0.1:{PORT}",
        initialization_timeout=60,
    )

CAPACITY = 64
SHARDS = NUM_PROCESSES * DEVICES
# Shards of different sizes; with more than one shard, shard 1 is empty.
ROWS = [0 if (s == 1 and SHARDS > 1) else min(CAPACITY, 5 + 7 * s) for s in range(SHARDS)]


def priority(shard, row):
    return float(1 + (shard * 3 + row) % 5)


def spec(max_steps=1):
    fields = {"id": gj.Field((), "int32"), "x": gj.Field((3,), "float32")}
    return gj.TableSpec(fields, capacity=CAPACITY, max_steps=max_steps)


def fill(table, max_steps=1):
    for s, shard in table.local_shards.items():
        n = ROWS[s]
        if n == 0:
            continue
        ids = table.global_rows(s, np.arange(n)).astype(np.int32)
        if max_steps == 1:
            data = {"id": ids, "x": np.stack([ids, 2 * ids, -ids], 1).astype(np.float32)}
            shard.insert(data, priorities=[priority(s, r) for r in range(n)])
        else:
            steps = np.arange(max_steps)
            id_steps = ids[:, None] * 100 + steps[None, :]
            data = {"id": id_steps.astype(np.int32),
                    "x": np.stack([id_steps, 2 * id_steps, -id_steps], -1).astype(np.float32)}
            shard.insert(data, priorities=[priority(s, r) for r in range(n)], lengths=np.full(n, max_steps))


def weights(exponent):
    """Every row's weight in shard-major order (one table holding every shard's rows)."""
    return np.concatenate([[priority(s, r) ** exponent for r in range(ROWS[s])] for s in range(SHARDS)])


def global_ids():
    return np.concatenate([np.arange(ROWS[s]) + s * CAPACITY for s in range(SHARDS)])


def gathered(x):
    """This process's part of a global array sharded along the axis, then every process's together."""
    parts = sorted(x.addressable_shards, key=lambda s: s.index[0].start)
    local = np.concatenate([np.asarray(s.data) for s in parts])
    return np.asarray(multihost_utils.process_allgather(local, tiled=True))


def main():
    mesh = jax.make_mesh((SHARDS,), ("replay",))
    out = {}
    if SCENARIO == "errors":
        out.update(errors(mesh))
    elif SCENARIO == "spec_mismatch":
        try:
            gj.ShardedTable.create(spec(max_steps=1 + PROCESS_ID), mesh, name="gear_jax_test_mismatch")
            out["error"] = None
        except gj.InvalidArgumentError as e:
            out["error"] = str(e)
    elif SCENARIO == "bad_arguments":
        out.update(bad_arguments(mesh))
    elif SCENARIO.startswith("checkpoint_"):
        out.update(globals()[SCENARIO](mesh, os.environ["GEAR_JAX_TEST_CHECKPOINT"]))
    else:
        max_steps = 4 if SCENARIO in ("windows", "exchange_windows") else 1
        with gj.ShardedTable.create(spec(max_steps), mesh, axis="replay") as table:
            fill(table, max_steps)
            multihost_utils.sync_global_devices("filled")
            out.update(globals()["scenario_" + SCENARIO](table))
            multihost_utils.sync_global_devices("done")
    print("RESULT " + json.dumps(out), flush=True)


def scenario_exact(table):
    """Global prioritized (exponent 1, integer priorities) and uniform picks, contents and the
    one-table reference: the same uniforms searched in the cumulative weights of every row."""
    out = {}
    b = 8 * SHARDS
    for method, exponent in (("prioritized", 1.0), ("uniform", 0.0)):
        sampler = table.sampler(b, method=method, mode="global")
        key = jax.random.key(7)
        smp, batch = sampler(key)
        indices = gathered(smp.indices)
        select_key, _ = jax.random.split(key)
        w = weights(exponent)
        totals = np.asarray(
            [sum(priority(s, r) ** exponent for r in range(ROWS[s])) for s in range(SHARDS)], np.float32
        )
        whole = np.cumsum(totals, dtype=np.float32)[-1]
        u = np.asarray(jax.random.uniform(select_key, (b,), jnp.float32))
        targets = np.minimum(u * whole, np.nextafter(whole, np.float32(0)))
        ref = global_ids()[np.minimum(np.searchsorted(np.cumsum(w), targets, side="right"), len(w) - 1)]
        out[method] = {
            "indices": indices.tolist(),
            "reference": ref.tolist(),
            "ids": gathered(batch["id"]).tolist(),
            "x_ok": bool(np.array_equal(gathered(batch["x"])[:, 1], 2 * gathered(batch["id"]))),
            "valid": gathered(batch["valid"]).tolist(),
            "probabilities": gathered(smp.probabilities).tolist(),
            "expected_probabilities": (w[np.searchsorted(global_ids(), ref)] / w.sum()).tolist(),
            "selectable": int(np.asarray(smp.selectable)),
        }
    return out


def scenario_exchange(table):
    """One key through the exchange's every capacity (full-size blocks, the default, a tiny factor whose
    first blocks overflow): the picks, rows and probabilities of each, and the branch each took."""
    out = {}
    trajectories = table.spec.max_steps > 1  # scenario exchange_windows: windows of 2 steps
    window = 2 if trajectories else None
    factors = (None, gj.sharded.CAPACITY_FACTOR, 0.01)
    for method in ("uniform", "prioritized", "fifo", "lifo", "topk"):
        # fifo, lifo, topk: at most the rows the shards hold (50 with four shards, 5 with two)
        if method in ("uniform", "prioritized"):
            b = (12 if trajectories else 32) * SHARDS
        else:
            b = min(12 * SHARDS, sum(ROWS) // SHARDS * SHARDS)
        runs = {}
        # fifo, lifo, topk: full-size blocks and the overflowing factor (each sampler compiles anew)
        for factor in factors if method in ("uniform", "prioritized") else (None, 0.01):
            sampler = table.sampler(b, method=method, mode="global", capacity_factor=factor, window=window)
            smp, batch = sampler(jax.random.key(11))
            ids = gathered(batch["id"])
            runs[str(factor)] = {
                "indices": gathered(smp.indices).tolist(),
                "probabilities": gathered(smp.probabilities).tolist(),
                "starts": gathered(smp.starts).tolist(),
                "ids": (ids[:, 0] // 100 if trajectories else ids).tolist(),
                "steps": (ids % 100 if trajectories else np.zeros_like(ids)).tolist(),
                "valid": gathered(batch["valid"]).reshape(len(ids), -1)[:, 0].tolist(),
            }
        owners = np.asarray(runs["None"]["indices"]) // table.capacity
        capacities = {str(f): gj.sharded.exchange_capacities(b, SHARDS, f) for f in (None, 0.01)}
        branches = {f: int(gj.sharded.exchange_branch(owners, SHARDS, c)) for f, c in capacities.items()}
        out[method] = {"runs": runs, "branches": branches}
    return out


def scenario_exchange_windows(table):
    return scenario_exchange(table)


def scenario_counts(table):
    """Row counts of many global draws (uniform and prioritized, exponent 0.5), for a chi-square test."""
    out = {}
    b = 16 * SHARDS
    for method, exponent in (("uniform", 0.0), ("prioritized", 0.5)):  # 0.0: every row weighs alike
        options = {"priority_exponent": exponent} if method == "prioritized" else {}
        sampler = table.sampler(b, method=method, mode="global", **options)
        counts = np.zeros(SHARDS * CAPACITY, np.int64)
        invalid = 0
        for i in range(4000 // b + 1):
            smp, batch = sampler(jax.random.key(1000 + i))
            idx = gathered(smp.indices)
            ok = gathered(batch["valid"])
            invalid += int((~ok).sum())
            np.add.at(counts, idx, 1)
        w = weights(exponent)
        out[method] = {"counts": counts[global_ids()].tolist(), "expected": (w / w.sum()).tolist(),
                       "outside": int(counts.sum() - counts[global_ids()].sum()), "invalid": invalid}
    return out


def scenario_local(table):
    """Local mode: where each device's picks come from, their probabilities, importance weights."""
    b = 4 * SHARDS
    nonempty = [s for s in range(SHARDS) if ROWS[s] > 0]
    fill_empty_shard(table)  # local mode needs every shard non-empty

    def body(key_data, beta):  # beta traced: annealed inside a jitted step
        smp, batch = sharded.sample(table, jax.random.wrap_key_data(key_data), b, method="prioritized",
                                    mode="local", priority_exponent=1.0)
        return smp, batch["id"], sharded.importance_weights(table, smp, beta)

    row = P("replay")
    f = jax.jit(jax.shard_map(body, mesh=table.mesh, in_specs=(P(), P()),
                              out_specs=(sharded.ShardedSample(row, row, row, row, P()), row, row),
                              check_vma=False))
    smp, ids, iw = f(np.asarray(jax.random.key_data(jax.random.key(3))), np.float32(0.4))
    return {"indices": gathered(smp.indices).tolist(), "ids": gathered(ids).tolist(),
            "probabilities": gathered(smp.probabilities).tolist(), "weights": gathered(iw).tolist(),
            "selectable": int(np.asarray(smp.selectable)), "nonempty": nonempty}


def fill_empty_shard(table):
    """Gives shard 1 (empty with several shards) three rows of priorities 2, 3, 5, on its owner."""
    if 1 in table.local_shards and ROWS[1] == 0:
        ids = table.global_rows(1, np.arange(3)).astype(np.int32)
        table.shard(1).insert({"id": ids, "x": np.zeros((3, 3), np.float32)}, priorities=[2.0, 3.0, 5.0])
    multihost_utils.sync_global_devices("refilled")


def refilled_rows():
    """Every shard's rows after fill_empty_shard, as (global id, priority) in row order."""
    rows = []
    for s in range(SHARDS):
        if s == 1 and ROWS[1] == 0:
            rows.append([(CAPACITY + r, p) for r, p in enumerate([2.0, 3.0, 5.0])])
        else:
            rows.append([(s * CAPACITY + r, priority(s, r)) for r in range(ROWS[s])])
    return rows


def one_table_answer(method, b, order):
    """The ids `method` picks from one table into which `order` (a list of (id, priority)) was inserted
    one row at a time."""
    one = gj.Table.create(spec())
    try:
        for gid, p in order:
            one.insert({"id": np.asarray([gid], np.int32), "x": np.zeros((1, 3), np.float32)}, priorities=[p])
        smp = gj.sample(one, jax.random.key(0), b, method=method)
        return np.asarray(gj.gather(one, smp)["id"]).tolist()
    finally:
        one.close()


def scenario_ordered(table):
    """Decentralized fifo, lifo and topk against one table holding every shard's rows: topk's rows in
    shard-major order (ties go to the lower global id), fifo's and lifo's committed round-robin (the k-th
    row of every shard, in shard order, before the (k+1)-th). Also local fifo, and too few rows."""
    fill_empty_shard(table)
    rows = refilled_rows()
    total = sum(len(r) for r in rows)
    shard_major = [row for shard in rows for row in shard]
    round_robin = [shard[k] for k in range(max(len(r) for r in rows)) for shard in rows if k < len(shard)]
    out = {}
    for b in (2 * SHARDS, total // SHARDS * SHARDS):
        for method in ("fifo", "lifo", "topk"):
            smp, batch = table.sampler(b, method=method, mode="global")(jax.random.key(2))
            out[f"{method}_{b}"] = {
                "indices": gathered(smp.indices).tolist(),
                "ids": gathered(batch["id"]).tolist(),
                "valid": gathered(batch["valid"]).tolist(),
                "reference": one_table_answer(method, b, shard_major if method == "topk" else round_robin),
            }
    smp, _ = table.sampler(2 * SHARDS, method="fifo", mode="local")(jax.random.key(2))
    out["local_fifo"] = gathered(smp.indices).tolist()
    try:
        too_many = (total // SHARDS + 1) * SHARDS
        jax.block_until_ready(table.sampler(too_many, method="fifo", mode="global")(jax.random.key(2)))
        out["too_few"] = None
    except gj.EXECUTION_ERRORS as e:
        out["too_few"] = str(e)
    return out


def scenario_updates(table):
    """Priorities written through a sharded sample reach the owning shard; stale ones are ignored."""
    b = 8 * SHARDS
    fill_empty_shard(table)
    sampler = table.sampler(b, method="uniform", mode="global")
    update = table.updater()
    smp, _ = sampler(jax.random.key(11))
    indices = gathered(smp.indices)
    # Shard 0 overwrites its rows (insert until the ring wraps): updates of its old rows are stale.
    if 0 in table.local_shards:
        shard = table.shard(0)
        n = CAPACITY
        ids = np.full(n, -1, np.int32)
        shard.insert({"id": ids, "x": np.zeros((n, 3), np.float32)}, priorities=np.full(n, 1.0))
    multihost_utils.sync_global_devices("overwritten")
    new = jax.jit(lambda i: (i % 97 + 10).astype(jnp.float32))(smp.indices)
    jax.block_until_ready(update(smp, new))
    status = {s: t.row_status()["priority"].tolist() for s, t in table.local_shards.items()}
    return {"indices": indices.tolist(), "status": {str(s): p for s, p in status.items()}}


WRITER = """
import sys, time, numpy as np, gear_jax as gj
t = gj.ShardedTable.attach_shard(sys.argv[1], int(sys.argv[2]))
print("attached", flush=True)
rng = np.random.default_rng(0)
while True:
    ids = rng.integers(0, 10**6, 8).astype(np.int32)
    t.insert({"id": ids, "x": np.stack([ids, 2 * ids, -ids], 1).astype(np.float32)},
             priorities=rng.uniform(0.5, 2.0, 8))
    time.sleep(0.002)  # 4,000 rows/s: the 64-row ring turns over every 16 ms, during the learner's calls
"""


def scenario_writer(table):
    """An actor process attached by name to each local shard inserts without pause while the learner
    samples: every row marked valid must be whole (x == [id, 2 id, -id])."""
    import subprocess

    writers = [subprocess.Popen([sys.executable, "-c", WRITER, table.name, str(s)], stdout=subprocess.PIPE,
                                text=True) for s in table.local_shards]
    try:
        for w in writers:
            assert w.stdout.readline().strip() == "attached"
        multihost_utils.sync_global_devices("writers started")
        # The default exchange and one whose first blocks overflow (a later branch runs), in turns.
        samplers = [table.sampler(32 * SHARDS, method="prioritized", mode="global", capacity_factor=f)
                    for f in (gj.sharded.CAPACITY_FACTOR, 0.01)]
        torn = valid = 0
        for i in range(60):
            smp, batch = samplers[i % 2](jax.random.key(i))
            ok = gathered(batch["valid"])
            ids = gathered(batch["id"]).astype(np.float32)
            x = gathered(batch["x"])
            whole = (x[:, 0] == ids) & (x[:, 1] == 2 * ids) & (x[:, 2] == -ids)
            torn += int((ok & ~whole).sum())
            valid += int(ok.sum())
        return {"torn": torn, "valid": valid, "alive": [w.poll() is None for w in writers]}
    finally:
        for w in writers:
            w.kill()
            w.wait()


def scenario_windows(table):
    """Windows of trajectory rows in every mode, moved to their consumers (shard 1 gets three rows first,
    so that local mode finds every shard non-empty)."""
    if 1 in table.local_shards and ROWS[1] == 0:
        id_steps = table.global_rows(1, np.arange(3))[:, None] * 100 + np.arange(4)[None, :]
        table.shard(1).insert({"id": id_steps.astype(np.int32),
                               "x": np.zeros((3, 4, 3), np.float32)}, priorities=[2.0, 3.0, 5.0],
                              lengths=np.full(3, 4))
    multihost_utils.sync_global_devices("refilled")
    b = 2 * SHARDS  # local lifo takes B / S distinct rows from each shard; shard 1 has 3
    out = {}
    for method, mode in (("uniform", "global"), ("prioritized", "local"), ("fifo", "global"),
                         ("topk", "global"), ("lifo", "local")):
        sampler = table.sampler(b, method=method, mode=mode, window=2)
        smp, batch = sampler(jax.random.key(5))
        out[f"{method}_{mode}"] = {
            "indices": gathered(smp.indices).tolist(), "starts": gathered(smp.starts).tolist(),
            "ids": gathered(batch["id"]).tolist(), "valid": gathered(batch["valid"]).tolist()}
    return out


def errors(mesh):
    out = {}
    try:
        gj.ShardedTable.create(spec(), mesh, axis="data")
    except gj.InvalidArgumentError as e:
        out["axis"] = str(e)
    with gj.ShardedTable.create(spec(), mesh, axis="replay") as table:
        try:
            table.sampler(SHARDS * 4 + 1)(jax.random.key(0))
        except gj.InvalidArgumentError as e:
            out["batch"] = str(e)
        try:
            jax.block_until_ready(table.sampler(SHARDS * 2)(jax.random.key(0)))
            out["empty"] = None
        except gj.EXECUTION_ERRORS as e:
            out["empty"] = str(e)
        multihost_utils.sync_global_devices("errors done")
    return out


def bad_arguments(mesh):
    """Process 1 passes a name of the wrong type: every process gets a gear_jax error at once."""
    t0 = time.monotonic()
    try:
        gj.ShardedTable.create(spec(), mesh, name=123 if PROCESS_ID == 1 else "gear_jax_test_bad_arguments")
        error = None
    except gj.InvalidArgumentError as e:
        error = str(e)
    return {"error": error, "seconds": time.monotonic() - t0}


def picks_and_rows(table):
    """A global prioritized sample's ids (the same key every time) and each local shard's rows."""
    smp, batch = table.sampler(SHARDS * 4, method="prioritized")(jax.random.key(3))
    rows = {}
    for s, shard in table.local_shards.items():
        status = shard.row_status()
        n = shard.size
        rows[s] = {"size": n, "priority": status["priority"][:n].tolist(),
                   "generation": status["generation"][:n].tolist()}
    return gathered(batch["id"]).tolist(), rows


def checkpoint_save(mesh, path):
    """Fills, saves twice (the second replaces the first), reports what a sample sees."""
    with gj.ShardedTable.create(spec(), mesh, name="gear_jax_test_ckpt_save") as table:
        fill(table)
        table.save(path)
        for s, shard in table.local_shards.items():  # a change the second save must carry
            shard.insert({"id": np.full(1, 10_000 + s, np.int32), "x": np.zeros((1, 3), np.float32)},
                         priorities=[7.0])
        table.save(path, metadata={"step": 2, "note": "second"})
        picks, rows = picks_and_rows(table)
        saves = sorted(os.listdir(path))
        try:
            table.save(path, metadata={"step": (1, 2)} if PROCESS_ID == 1 else {"step": 3})
            refused = None
        except (gj.InvalidArgumentError, gj.CheckpointError) as e:
            refused = f"{type(e).__name__}: {e}"
        multihost_utils.sync_global_devices("saved")
    return {"picks": picks, "rows": rows, "saves": saves, "refused": refused}


def checkpoint_load(mesh, path):
    """Loads what checkpoint_save saved (any layout of as many shards), reports what a sample sees, then
    inserts into the loaded shards and samples again."""
    with gj.ShardedTable.load(path, mesh, name="gear_jax_test_ckpt_load") as table:
        picks, rows = picks_and_rows(table)
        for shard in table.local_shards.values():
            shard.insert({"id": np.full(2, -1, np.int32), "x": np.zeros((2, 3), np.float32)})
        after = sum(shard.size for shard in table.local_shards.values())
        multihost_utils.sync_global_devices("loaded")
        metadata = table.checkpoint_metadata
    return {"picks": picks, "rows": rows, "size_after_insert": after, "metadata": metadata}


def checkpoint_refused(mesh, path):
    """Loads a checkpoint of another number of shards: refused on every process."""
    try:
        gj.ShardedTable.load(path, mesh, name="gear_jax_test_ckpt_refused")
        return {"error": None}
    except gj.CheckpointError as e:
        return {"error": str(e)}


def checkpoint_orbax(mesh, path):
    """The sharded table as an item of an orbax CheckpointManager step, beside a train state: two steps
    saved (a row added between them), the newest restored into new shards; what a sample sees."""
    import orbax.checkpoint as ocp

    import gear_jax.orbax as gjo

    state = {"step": np.zeros((), np.int32), "w": np.arange(3, dtype=np.float32)}
    with gj.ShardedTable.create(spec(), mesh, name="gear_jax_test_ckpt_orbax") as table:
        fill(table)
        manager = ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(max_to_keep=1))
        for step in (1, 2):
            for s, shard in table.local_shards.items():
                shard.insert({"id": np.full(1, 20_000 + 10 * step + s, np.int32),
                              "x": np.zeros((1, 3), np.float32)}, priorities=[3.0])
            state = {"step": np.full((), step, np.int32), "w": state["w"] + 1}
            manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), replay=gjo.ShardedTableSave(table, {"step": step})))
            manager.wait_until_finished()
        before = picks_and_rows(table)
    replay = gjo.ShardedTableRestore(mesh, name="gear_jax_test_orbax_restored")
    restored = manager.restore(manager.latest_step(), args=ocp.args.Composite(
        state=ocp.args.StandardRestore(state), replay=replay))
    with restored.replay as table:
        after = picks_and_rows(table)
        metadata = table.checkpoint_metadata
        multihost_utils.sync_global_devices("restored")
    manager.close()
    return {"before": before, "after": after, "metadata": metadata, "steps": manager.all_steps(),
            "state_step": int(restored.state["step"])}


LOOP_ROWS = 8  # rows each shard takes per round of checkpoint_loop


def loop_spec():
    return gj.TableSpec({"round": gj.Field((), "int32"), "x": gj.Field((1024,), "uint8")}, capacity=4096)


def checkpoint_loop(mesh, path):
    """Round k: every shard takes LOOP_ROWS rows stamped k, then the table is saved and process 0
    prints SAVED k. Runs until the test kills every process."""
    table = gj.ShardedTable.create(loop_spec(), mesh, name=f"gear_jax_test_ckpt_loop_{PORT}")
    for k in range(100_000):
        for shard in table.local_shards.values():
            shard.insert({"round": np.full(LOOP_ROWS, k, np.int32),
                          "x": np.full((LOOP_ROWS, 1024), k % 251, np.uint8)})
        table.save(path)
        print(f"SAVED {k}", flush=True)
    return {}


def checkpoint_verify(mesh, path):
    """Loads what checkpoint_loop left and reports each local shard's rounds and whether every row's
    bytes match its round."""
    with gj.ShardedTable.load(path, mesh, name="gear_jax_test_ckpt_verify") as table:
        out = {}
        for s, shard in table.local_shards.items():
            n = shard.size
            _, batch = gj.host.sample_gather(shard, np.random.default_rng(0), n, method="fifo")
            rounds = np.asarray(batch["round"])
            exact = bool(np.all(np.asarray(batch["x"]) == (rounds % 251)[:, None].astype(np.uint8)))
            out[str(s)] = {"size": n, "rounds": sorted(set(rounds.tolist())), "exact": exact}
        multihost_utils.sync_global_devices("verified")
    return out


def scenario_epochs(table):
    """Local epochs: every device visits each of its shard's rows once per epoch (its ids, in a shuffled
    order, failed picks after them), then `sharded.retire` makes them unselectable."""
    mb = 8

    def body(key_data):
        key = jax.random.wrap_key_data(key_data)
        smp, batch = sharded.epoch(table, key, mb, num_rows=CAPACITY, drop_last=False)
        retired = sharded.retire(table, smp)
        return smp, batch["id"], batch["valid"], retired[None]

    row = P("replay")
    f = jax.jit(jax.shard_map(body, mesh=table.mesh, in_specs=P(),
                              out_specs=(sharded.ShardedSample(row, row, row, row, P()), row, row, row),
                              check_vma=False))
    smp, ids, valid, retired = jax.block_until_ready(f(np.asarray(jax.random.key_data(jax.random.key(5)))))
    selectable_after = [int(np.asarray(gj.total_weight(t, 0.0)[1])) for t in table.local_shards.values()]
    per_device = CAPACITY // mb
    return {"indices": gathered(smp.indices).reshape(SHARDS, per_device * mb).tolist(),
            "ids": gathered(ids).reshape(SHARDS, per_device * mb).tolist(),
            "valid": gathered(valid).reshape(SHARDS, per_device * mb).tolist(),
            "retired": gathered(retired).tolist(), "selectable": int(np.asarray(smp.selectable)),
            "selectable_after": selectable_after}


if __name__ == "__main__":
    main()

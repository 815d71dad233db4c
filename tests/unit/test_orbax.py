"""gear_jax/orbax.py: tables as items of orbax-checkpoint's CheckpointManager, beside a train state."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import gear_jax as gj

ocp = pytest.importorskip("orbax.checkpoint")
gjo = pytest.importorskip("gear_jax.orbax")


def fill(table, rng, n=12):
    data = {"obs": rng.normal(size=(n, 3)).astype(np.float32), "action": np.arange(n, dtype=np.int32)}
    table.insert(data, priorities=rng.uniform(0.5, 2.0, n).astype(np.float32))


def contents(table):
    status = table.row_status()
    batch = gj.host.gather(table, gj.host.sample(table, np.random.default_rng(0), table.size, method="fifo"))
    return {
        "size": table.size,
        "priority": status["priority"].tolist(),
        "generation": status["generation"].tolist(),
        "obs": np.asarray(batch["obs"]).tolist(),
        "action": np.asarray(batch["action"]).tolist(),
    }


def test_a_table_and_a_train_state_in_one_manager_step(make_table, tmp_path):
    table = make_table(capacity=16)
    rng = np.random.default_rng(1)
    state = {"w": jnp.arange(4.0), "count": jnp.int32(0)}
    manager = ocp.CheckpointManager(tmp_path / "ck", options=ocp.CheckpointManagerOptions(max_to_keep=2))
    saved = {}
    for step in (1, 2, 3):  # the ring wraps on the way: generations and cursors change
        fill(table, rng)
        state = {"w": state["w"] + 1, "count": jnp.int32(step)}
        manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                   replay=gjo.TableSave(table)))
        manager.wait_until_finished()
        saved[step] = (contents(table), jax.device_get(state))
    assert manager.all_steps() == [2, 3]  # orbax's retention
    for step in (2, 3):
        restored = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(state), replay=gjo.TableRestore()))
        try:
            assert contents(restored.replay) == saved[step][0]
            assert int(restored.state["count"]) == step
            np.testing.assert_array_equal(restored.state["w"], saved[step][1]["w"])
            restored.replay.insert({"obs": np.zeros((1, 3), np.float32), "action": np.zeros(1, np.int32)})
        finally:
            restored.replay.close()
    manager.close()


def test_a_sharded_table_with_its_metadata(tmp_path):
    mesh = Mesh(np.array(jax.devices()[:1]), ("replay",))
    spec = gj.TableSpec({"id": gj.Field((), "int32")}, capacity=32)
    with gj.ShardedTable.create(spec, mesh) as table:
        priorities = np.arange(1, 8, dtype=np.float32)
        table.shard(0).insert({"id": np.arange(7, dtype=np.int32)}, priorities=priorities)
        manager = ocp.CheckpointManager(tmp_path / "ck")
        manager.save(5, args=ocp.args.Composite(replay=gjo.ShardedTableSave(table, metadata={"step": 5})))
        manager.wait_until_finished()
        restored = manager.restore(5, args=ocp.args.Composite(replay=gjo.ShardedTableRestore(mesh)))
        with restored.replay as loaded:
            assert loaded.checkpoint_metadata == {"step": 5}
            np.testing.assert_array_equal(loaded.shard(0).row_status()["priority"][:7], np.arange(1, 8))
            assert loaded.shard(0).size == 7
        manager.close()


def test_wrong_arguments_are_refused_by_name(make_table, tmp_path):
    table = make_table()
    with pytest.raises(gj.InvalidArgumentError, match="ShardedTableSave"):
        gjo.ShardedTableCheckpointHandler().save(tmp_path / "x", gjo.ShardedTableSave(table))
    with pytest.raises(gj.InvalidArgumentError, match="metadata"):
        mesh = Mesh(np.array(jax.devices()[:1]), ("replay",))
        with gj.ShardedTable.create(table.spec, mesh) as sharded:
            not_json = gjo.ShardedTableSave(sharded, {"a": {1, 2}})
            gjo.ShardedTableCheckpointHandler().save(tmp_path / "y", not_json)

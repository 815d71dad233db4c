"""Paths of the latest rounds that no GPU had run: epochs and retire in a GPU program, remote writers
into a pinned table read by a GPU program, checkpoints of a sharded table of pinned shards, and the
sharded exchange sized to the picks over a GPU mesh (one GPU: a mesh of one device).

Tests marked `gpu` skip where jax sees no GPU.
"""

import secrets

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gear_jax as gj

IDS = {"id": gj.Field((), "int32"), "obs": gj.Field((5,), "float32")}


def rows(ids):
    ids = np.asarray(ids, np.int32)
    return {"id": ids, "obs": ids[:, None].astype(np.float32) * np.arange(1, 6, dtype=np.float32)}


@pytest.mark.gpu
@pytest.mark.parametrize("drop_last", [True, False])
def test_a_gpu_epoch_gives_every_selectable_row_once_and_retire_ends_them(gpu, make_table, drop_last):
    table = make_table(fields=IDS, capacity=64)
    table.insert(rows(np.arange(20)))  # 20 rows, minibatches of 8

    def epoch_and_rows(key):
        picks = gj.epoch(table, key, 8, num_rows=20, drop_last=drop_last)
        batch = gj.gather(table, jax.tree_util.tree_map(jnp.ravel, picks))  # every minibatch at once
        return picks, jax.tree_util.tree_map(lambda x: x.reshape(picks.indices.shape + x.shape[1:]), batch)

    run = jax.jit(epoch_and_rows, device=gpu)
    orders = []
    for seed in range(3):
        picks, batch = run(jax.random.key(seed))
        valid = np.asarray(batch["valid"])
        ids = np.asarray(batch["id"])[valid]
        assert valid.shape == ((2, 8) if drop_last else (3, 8))
        if drop_last:
            assert len(ids) == 16 and len(set(ids.tolist())) == 16  # no row twice, 4 random ones left out
        else:
            assert sorted(ids.tolist()) == list(range(20))  # every row once, the tail failed picks
        np.testing.assert_array_equal(np.asarray(batch["obs"])[valid], rows(ids)["obs"])
        orders.append(tuple(ids.tolist()))
    assert len(set(orders)) == 3  # each key its own permutation
    # Retire the rollout on the GPU: no later sample finds its rows.
    picks, _ = run(jax.random.key(7))
    retired = jax.jit(lambda s: gj.retire(table, s), device=gpu)(picks)
    assert int(retired) == (16 if drop_last else 20)
    table.insert(rows(np.arange(100, 104)))
    smp = jax.jit(lambda k: gj.gather(table, gj.sample(table, k, 256)), device=gpu)(jax.random.key(1))
    left = set(np.asarray(smp["id"])[np.asarray(smp["valid"])].tolist())
    kept = set(range(20)) - set(np.asarray(picks.indices).ravel().tolist()) if drop_last else set()
    assert left <= set(range(100, 104)) | kept and set(range(100, 104)) <= left


@pytest.mark.gpu
def test_rows_written_by_a_remote_writer_are_read_by_a_gpu_program(gpu, make_table):
    pytest.importorskip("pyarrow.flight")
    table = make_table(fields=IDS, capacity=256)
    token = secrets.token_hex(8)
    with gj.serve(table, token=token) as server, gj.remote.Writer(server.address, token=token) as writer:
        ids = writer.insert(rows(np.arange(40)))
        assert np.asarray(ids).tolist() == list(range(40))
        for i in range(40, 100):
            writer.add({"id": np.int32(i), "obs": np.float32(i) * np.arange(1, 6, dtype=np.float32)})
        writer.flush()
    assert table.size == 100
    out = jax.jit(lambda k: gj.gather(table, gj.sample(table, k, 512)), device=gpu)(jax.random.key(3))
    valid = np.asarray(out["valid"])
    got = np.asarray(out["id"])[valid]
    assert valid.all() and len(set(got.tolist())) > 90  # 512 uniform picks of 100 rows
    np.testing.assert_array_equal(np.asarray(out["obs"])[valid], rows(got)["obs"])


def gpu_mesh(gpu):
    return jax.sharding.Mesh(np.array([gpu]), ("replay",))


@pytest.mark.gpu
def test_a_sharded_table_of_pinned_shards_saves_and_loads_on_a_gpu_mesh(gpu, tmp_path):
    spec = gj.TableSpec(IDS, capacity=128)
    mesh = gpu_mesh(gpu)
    with gj.ShardedTable.create(spec, mesh) as table:
        table.shard(0).insert(rows(np.arange(50)), priorities=np.arange(1, 51, dtype=np.float32))
        table.save(tmp_path / "ckpt", metadata={"step": 11})
        # Read before the table closes (dispatch is asynchronous; a call that runs after the close fails).
        before = jax.device_get(table.sampler(64, method="prioritized", mode="global")(jax.random.key(5)))
    with gj.ShardedTable.load(tmp_path / "ckpt", mesh) as loaded:
        assert loaded.checkpoint_metadata == {"step": 11}
        assert loaded.shard(0).size == 50
        after = loaded.sampler(64, method="prioritized", mode="global")(jax.random.key(5))
        np.testing.assert_array_equal(np.asarray(after[0].indices), np.asarray(before[0].indices))
        np.testing.assert_array_equal(np.asarray(after[1]["obs"]), np.asarray(before[1]["obs"]))
        assert np.asarray(after[1]["valid"]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["uniform", "prioritized", "fifo", "topk"])
def test_the_exchange_gives_the_same_picks_at_every_capacity_on_a_gpu_mesh(gpu, method):
    spec = gj.TableSpec(IDS, capacity=256)
    with gj.ShardedTable.create(spec, gpu_mesh(gpu)) as table:
        table.shard(0).insert(rows(np.arange(200)), priorities=np.linspace(0.5, 3.0, 200, dtype=np.float32))
        got = {
            factor: table.sampler(64, method=method, capacity_factor=factor)(jax.random.key(9))
            for factor in (None, 0.01, 2.0)
        }
        full_smp, full = got[None]
        assert np.asarray(full["valid"]).all()
        np.testing.assert_array_equal(np.asarray(full["obs"]), rows(np.asarray(full["id"]))["obs"])
        for factor in (0.01, 2.0):
            smp, batch = got[factor]
            np.testing.assert_array_equal(np.asarray(smp.indices), np.asarray(full_smp.indices))
            np.testing.assert_array_equal(np.asarray(batch["obs"]), np.asarray(full["obs"]))
            assert jnp.allclose(smp.probabilities, full_smp.probabilities)

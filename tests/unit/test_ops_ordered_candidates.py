"""gear_jax.ops.ordered_candidates (the candidates of sharded fifo, lifo and topk) and the count N that
every `gj.sample` returns in `Sample.selectable`."""

import jax
import numpy as np
import pytest

import gear_jax as gj
from gear_jax.ops import ordered_candidates
from tests.helpers.tables import transitions

NO_CANDIDATE = 2**64 - 1


def keys64(order_keys):
    k = np.asarray(order_keys).astype(np.uint64)
    return k[:, 0] | (k[:, 1] << np.uint64(32))


def run_candidates(table, batch, method, key=0, **kwargs):
    fn = jax.jit(lambda k: ordered_candidates(table, k, batch, method, **kwargs))
    s, keys = jax.block_until_ready(fn(jax.random.key(key)))
    return s, keys64(keys)


def expected_keys(table, rows, method):
    status = table.row_status()
    bits = status["priority"].astype(np.float32).view(np.uint32).astype(np.uint64)
    seq = status["insert_seq"].astype(np.uint64)
    rows = np.asarray(rows, np.int64)
    if method == "fifo":
        return seq[rows]
    if method == "lifo":
        return ~seq[rows]
    return ((~bits[rows] & np.uint64(0xFFFFFFFF)) << np.uint64(32)) | rows.astype(np.uint64)


@pytest.mark.parametrize("method", ["fifo", "lifo", "topk"])
def test_candidates_are_the_sample_with_its_keys(make_table, method):
    table = make_table(capacity=32)
    priorities = np.random.default_rng(0).choice([0.0, 1.0, 2.0, 3.0], 40).astype(np.float32)  # ties
    table.insert(transitions(40), priorities=priorities)  # the ring wrapped: commit order != row order
    selectable = int(np.count_nonzero(table.row_status()["priority"] > 0))
    for batch in (1, 5, selectable):
        s, keys = run_candidates(table, batch, method)
        ref = gj.sample(table, jax.random.key(0), batch, method=method)
        np.testing.assert_array_equal(np.asarray(s.indices), np.asarray(ref.indices))
        np.testing.assert_array_equal(np.asarray(s.generations), np.asarray(ref.generations))
        np.testing.assert_array_equal(keys, expected_keys(table, np.asarray(s.indices), method))
        assert np.all(np.diff(keys.astype(np.float64)) >= 0) and len(set(keys.tolist())) == batch


@pytest.mark.parametrize("method", ["fifo", "lifo", "topk"])
def test_fewer_rows_than_the_batch_give_markers_not_errors(make_table, method):
    table = make_table(capacity=16)
    table.insert(transitions(5), priorities=np.array([1, 0, 3, 2, 5], np.float32))  # row 1 not selectable
    s, keys = run_candidates(table, 8, method)
    indices, generations = np.asarray(s.indices), np.asarray(s.generations)
    assert sorted(indices[:4].tolist()) == [0, 2, 3, 4]
    assert np.all(generations[:4] % 2 == 0) and np.all(generations[4:] == 1)
    assert np.all(indices[4:] == 0) and np.all(np.asarray(s.probabilities)[4:] == 0)
    assert keys[4:].tolist() == [NO_CANDIDATE] * 4
    assert not np.asarray(gj.gather(table, s)["valid"])[4:].any()
    empty = make_table(capacity=4)
    s, keys = run_candidates(empty, 3, method)
    assert np.all(np.asarray(s.generations) == 1) and keys.tolist() == [NO_CANDIDATE] * 3


def test_candidates_place_windows(make_table):
    table = make_table(capacity=8, max_steps=6)
    table.insert({"obs": np.zeros((3, 6, 3), np.float32), "action": np.zeros((3, 6), np.int32)},
                 lengths=np.array([6, 2, 4]))
    s, _ = run_candidates(table, 4, "fifo", window=3)
    starts, indices = np.asarray(s.starts), np.asarray(s.indices)
    lengths = np.array([6, 2, 4])
    for row, start in zip(indices[:3], starts[:3]):
        assert 0 <= start <= max(lengths[row] - 3, 0)
    assert s.window == 3 and starts[3] == 0


def test_candidates_refuse_bad_arguments(make_table):
    table = make_table()
    with pytest.raises(gj.InvalidArgumentError, match="method='uniform' is not one of"):
        ordered_candidates(table, jax.random.key(0), 4, "uniform")
    with pytest.raises(gj.InvalidArgumentError, match=r"batch_size=0 must be an int in \[1, 2\*\*31 - 1\]"):
        ordered_candidates(table, jax.random.key(0), 0, "fifo")
    with pytest.raises(gj.InvalidArgumentError, match="window"):
        ordered_candidates(table, jax.random.key(0), 2, "fifo", window=2)


@pytest.mark.parametrize("method", ["uniform", "prioritized", "fifo", "lifo", "topk"])
def test_every_sample_carries_the_selectable_count(make_table, method):
    table = make_table(capacity=64)
    table.insert(transitions(50), priorities=np.where(np.arange(50) % 5 == 0, 0.0, 1.0 + np.arange(50) % 3))
    with table.writer() as held:  # row 50, being written: not selectable
        held.append({"obs": np.zeros(3, np.float32), "action": np.int32(0)})
        s = jax.jit(lambda k: gj.sample(table, k, 8, method=method))(jax.random.key(1))
        assert int(s.selectable) == 40 and s.selectable.dtype == np.int32
        if method == "uniform":
            np.testing.assert_allclose(np.asarray(s.probabilities), 1 / 40)
    # Priority 0 for the 10 oldest selectable rows: N drops by 10.
    oldest = jax.jit(lambda k: gj.sample(table, k, 10, method="fifo"))(jax.random.key(3))
    jax.block_until_ready(jax.jit(lambda s: gj.update_priorities(table, s, jax.numpy.zeros(10)))(oldest))
    s = jax.jit(lambda k: gj.sample(table, k, 8, method=method))(jax.random.key(2))
    assert int(s.selectable) == 30

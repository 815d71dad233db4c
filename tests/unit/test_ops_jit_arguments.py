"""A Table as an ordinary argument of a jitted function, and the method spellings of sample, gather and
update_priorities."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gear_jax as gj
from tests.helpers.tables import transitions


def test_a_table_is_a_jit_argument_and_reuses_the_compiled_function(make_table):
    table = make_table(capacity=32)
    table.insert(transitions(20))
    traces = []

    @jax.jit
    def step(t, key):
        traces.append(1)
        smp, batch = t.sample_batch(key, 8, method="uniform")
        return smp, batch

    smp, batch = step(table, jax.random.key(0))
    ref = gj.gather(table, gj.sample(table, jax.random.key(0), 8))
    np.testing.assert_array_equal(np.asarray(batch["obs"]), np.asarray(ref["obs"]))
    assert np.asarray(batch["valid"]).all() and int(smp.selectable) == 20
    step(table, jax.random.key(1))
    assert len(traces) == 1  # the same table: no new trace
    other = make_table(capacity=32)
    other.insert(transitions(5, start=100))
    _, batch = step(other, jax.random.key(0))
    assert len(traces) == 2  # another table: traced for it
    assert set(np.asarray(batch["action"]).tolist()) <= set(range(100, 105))


def test_a_table_argument_inside_scan_and_vmap_free_pytrees(make_table):
    table = make_table(capacity=32)
    table.insert(transitions(10))
    assert jax.tree_util.tree_leaves(table) == []
    assert jax.tree_util.tree_leaves({"replay": table, "x": jnp.ones(2)})[0].shape == (2,)

    @jax.jit
    def run(state):
        def body(carry, key):
            smp = carry["replay"].sample(key, 4, method="fifo")
            return carry, carry["replay"].gather(smp)["action"]

        return jax.lax.scan(body, state, jax.random.split(jax.random.key(0), 3))[1]

    actions = run({"replay": table})
    np.testing.assert_array_equal(np.asarray(actions), np.tile(np.arange(4), (3, 1)))


def test_method_update_priorities_and_a_closed_table_argument(make_table):
    table = make_table(capacity=16)
    table.insert(transitions(6))

    @jax.jit
    def learn(t, key):
        smp = t.sample(key, 3, method="topk")
        return t.update_priorities(smp, jnp.full(3, 7.0))

    assert int(learn(table, jax.random.key(0))) == 3
    assert (table.row_status()["priority"][:6] == 7.0).sum() == 3
    table.close()
    with pytest.raises(gj.EXECUTION_ERRORS, match="is closed"):  # compiled: raises, reads nothing
        learn(table, jax.random.key(0))
    with pytest.raises(gj.TableClosedError, match="is closed"):  # a new trace refuses it at once
        jax.jit(lambda t, k: t.sample(k, 2))(table, jax.random.key(0))


def test_the_key_threaded_through_a_jitted_step(make_table):
    """The pattern of the README: the key is an argument of the jitted step, split inside, returned."""
    table = make_table(capacity=64)
    table.insert(transitions(64))
    traces = []

    @jax.jit
    def step(t, key):
        traces.append(1)
        key, sample_key = jax.random.split(key)
        _, batch = t.sample_batch(sample_key, 16)
        return key, batch["action"]

    key, draws = jax.random.key(0), []
    for _ in range(4):
        key, actions = step(table, key)
        draws.append(tuple(np.asarray(actions).tolist()))
    assert len(traces) == 1 and len(set(draws)) == 4  # one compile; every step a new sample
    key0, first = step(table, jax.random.key(0))
    assert tuple(np.asarray(first).tolist()) == draws[0]  # the same key gives the same sample


@pytest.mark.parametrize("key", [0, 1.5, None, "key", np.zeros(3, np.uint32)])
def test_a_key_that_is_not_a_prng_key_is_refused_with_the_fix(make_table, key):
    table = make_table()
    table.insert(transitions(4))
    for call in (lambda: gj.sample(table, key, 2), lambda: jax.jit(lambda t: t.sample(key, 2))(table)):
        with pytest.raises(
            gj.InvalidArgumentError, match=r"sample: key must be a JAX PRNG key.*jax\.random\.key"
        ):
            call()
    with pytest.raises(gj.InvalidArgumentError, match="sample_at: key must be a JAX PRNG key"):
        gj.sample_at(table, key, jnp.zeros(2, jnp.float32))


def test_inserting_traced_values_inside_jit_is_refused_with_the_fix(make_table):
    table = make_table()

    @jax.jit
    def learner_step(t, obs):
        t.insert({"obs": obs, "action": jnp.zeros(2, jnp.int32)})
        return obs

    with pytest.raises(
        gj.InvalidArgumentError, match=r"batch\['obs'\] is a value traced by jax.jit.*insert it after"
    ):
        learner_step(table, jnp.ones((2, 3)))
    with pytest.raises(gj.InvalidArgumentError, match=r"row\['obs'\] is a value traced by jax.jit"):
        jax.jit(lambda t, o: t.add({"obs": o, "action": 1}))(table, jnp.ones(3))
    assert table.size == 0


@pytest.mark.parametrize("bad", ["float indices", "int64 indices", "float generations"])
def test_a_hand_built_sample_of_other_dtypes_is_refused_not_truncated(make_table, bad):
    table = make_table()
    table.insert(transitions(4))
    generations = table.row_status()["generation"][:2]
    fields = {
        "indices": np.array([1.7, 0.2], np.float32) if bad == "float indices" else np.array([1, 0], np.int32),
        "generations": generations.astype(np.float32) if bad == "float generations" else generations,
        "probabilities": np.ones(2, np.float32),
        "starts": np.zeros(2, np.int32),
    }
    if bad == "int64 indices":
        fields["indices"] = np.array([2**32 + 1, 0], np.int64)  # would wrap to row 1 in 32 bits
    smp = gj.Sample(**fields)
    with pytest.raises(gj.InvalidArgumentError, match="must be integers of at most 32 bits"):
        gj.gather(table, smp)
    with pytest.raises(gj.InvalidArgumentError, match="must be integers of at most 32 bits"):
        gj.update_priorities(table, smp, np.ones(2, np.float32))
    assert (table.row_status()["priority"][:4] == 1).all()


def test_vmap_runs_each_call_once_per_element_in_order(make_table):
    """Under jax.vmap the custom calls run once per element, one after another (vmap_method
    "sequential"): the picks of each key are those of the key alone, and effects land in element order."""
    table = make_table(fields={"x": gj.Field((), "float32")}, capacity=64)
    table.insert({"x": np.arange(64, dtype=np.float32)})
    keys = jax.random.split(jax.random.key(0), 3)
    for method in ("uniform", "prioritized", "topk"):
        s, batch = jax.jit(jax.vmap(lambda k, m=method: gj.sample_gather(table, k, 4, method=m)))(keys)
        for i, key in enumerate(keys):
            alone = gj.sample(table, key, 4, method=method)
            np.testing.assert_array_equal(s.indices[i], alone.indices)
            np.testing.assert_array_equal(batch["x"][i], np.asarray(alone.indices, np.float32))
    ids = jax.jit(jax.vmap(lambda v: gj.insert(table, {"x": v})))(100 + jnp.arange(6.0).reshape(3, 2))
    np.testing.assert_array_equal(ids, [[0, 1], [2, 3], [4, 5]])
    np.testing.assert_array_equal(table.columns["x"][:6, 0], 100 + np.arange(6.0))
    picks = gj.Sample(
        jnp.arange(6, dtype=jnp.int32).reshape(3, 2),
        jnp.asarray(table.row_status()["generation"][:6]).reshape(3, 2),
        jnp.ones((3, 2)),
        jnp.zeros((3, 2), jnp.int32),
    )
    update = jax.vmap(lambda s, p: gj.update_priorities(table, s, p))
    counts = update(picks, jnp.arange(1.0, 7.0).reshape(3, 2))
    np.testing.assert_array_equal(counts, [2, 2, 2])
    np.testing.assert_array_equal(table.row_status()["priority"][:6], np.arange(1.0, 7.0))
    queue = make_table(fields={"x": gj.Field((), "float32")}, capacity=8, queue=True)
    queue.insert({"x": np.arange(6, dtype=np.float32)})
    # Each call of a dequeue runs for every element before its next call does: the 3 dequeues pick the
    # same 2 oldest rows, as 3 consumers at once would, and exactly one of them takes each. (A call that
    # takes nothing batched is not batched by vmap at all: it runs once, its results broadcast.)
    _, batches = jax.vmap(lambda a: gj.dequeue(queue, 2, after=a))(jnp.arange(3))
    valid = np.asarray(batches["valid"])
    assert valid.tolist() == [[True, True], [False, False], [False, False]]
    assert np.asarray(batches["x"])[valid].tolist() == [0, 1] and queue.unconsumed == 4

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gear_jax as gj
from tests.helpers.tables import transitions


@pytest.mark.parametrize("method", ["uniform", "prioritized", "fifo", "lifo", "topk"])
def test_sample_gather_equals_sample_then_gather(make_table, method):
    table = make_table(capacity=100)
    table.insert(transitions(60), priorities=np.linspace(0.5, 3.0, 60, dtype=np.float32))
    batch_size = 16 if method in ("fifo", "lifo", "topk") else 256

    exponent = 0.7 if method == "prioritized" else 1.0  # only prioritized picks weigh by it

    @jax.jit
    def fused(key):
        return gj.sample_gather(table, key, batch_size, method=method, priority_exponent=exponent)

    @jax.jit
    def separate(key):
        s = gj.sample(table, key, batch_size, method=method, priority_exponent=exponent)
        return s, gj.gather(table, s)

    for seed in range(3):
        (s1, b1), (s2, b2) = fused(jax.random.key(seed)), separate(jax.random.key(seed))
        for name in ("indices", "generations", "probabilities", "starts", "selectable"):
            np.testing.assert_array_equal(np.asarray(getattr(s1, name)), np.asarray(getattr(s2, name)))
        assert set(b1) == set(b2) == {"obs", "action", "valid"}
        for name in b1:
            np.testing.assert_array_equal(np.asarray(b1[name]), np.asarray(b2[name]))
        expected = transitions(60)
        np.testing.assert_array_equal(np.asarray(b1["obs"]), expected["obs"][np.asarray(s1.indices)])
        assert bool(b1["valid"].all())
        assert s1.table_handle == table.handle


def test_sample_gather_windows_and_field_subset(make_table):
    table = make_table(
        fields={"x": gj.Field((2,), "int16"), "t": gj.Field((), "int32")}, capacity=4, max_steps=6
    )
    steps = np.arange(6, dtype=np.int32)
    data = {
        "x": np.stack([np.stack([steps, -steps], 1)] * 2).astype(np.int16),
        "t": np.stack([steps, steps + 10]),
    }
    table.insert(data, lengths=[6, 3])
    s, batch = gj.sample_gather(table, jax.random.key(1), 200, fields=("t",), window=4)
    assert set(batch) == {"t", "valid"} and batch["t"].shape == (200, 4) and s.window == 4
    s2 = gj.sample(table, jax.random.key(1), 200, window=4)
    np.testing.assert_array_equal(np.asarray(s.starts), np.asarray(s2.starts))
    ref = gj.gather(table, s2, fields=("t",))
    np.testing.assert_array_equal(np.asarray(batch["t"]), np.asarray(ref["t"]))
    np.testing.assert_array_equal(np.asarray(batch["valid"]), np.asarray(ref["valid"]))
    assert not bool(batch["valid"].all())  # row 1 holds 3 steps: its windows are padded


def test_sample_gather_refuses_bad_arguments_by_name(make_table):
    table = make_table()
    table.insert(transitions(4))
    with pytest.raises(gj.InvalidArgumentError, match="sample_gather: batch_size"):
        gj.sample_gather(table, jax.random.key(0), 0)
    with pytest.raises(gj.InvalidArgumentError, match="sample_gather: method"):
        gj.sample_gather(table, jax.random.key(0), 4, method="newest")
    with pytest.raises(gj.InvalidArgumentError, match="sample_gather: fields"):
        gj.sample_gather(table, jax.random.key(0), 4, fields=("nope",))
    with pytest.raises(gj.InvalidArgumentError, match="sample_gather: priority_exponent"):
        gj.sample_gather(table, jax.random.key(0), 4, priority_exponent=-1.0)
    with pytest.raises(gj.InvalidArgumentError, match="sample_gather: key"):
        gj.sample_gather(table, 3, 4)


def test_sample_gather_of_an_empty_table_raises_at_run_time(make_table):
    table = make_table()
    with pytest.raises(gj.EXECUTION_ERRORS, match="sample"):
        jax.block_until_ready(gj.sample_gather(table, jax.random.key(0), 4))


def test_sample_gather_orders_after_an_update(make_table):
    table = make_table(capacity=8)
    table.insert(transitions(8), priorities=np.ones(8, np.float32))

    @jax.jit
    def step(key):
        s = gj.sample(table, key, 8, method="fifo")
        count = gj.update_priorities(table, s, jnp.where(jnp.arange(8) == 3, 0.0, 1.0))
        return gj.sample_gather(table, key, 64, after=count)

    s, batch = step(jax.random.key(0))
    picked = np.asarray(s.indices)
    assert 3 not in picked and bool(batch["valid"].all())


def test_a_method_given_where_fields_go_is_refused_with_the_keyword(make_table):
    """sample_gather's fourth argument is `fields` (sample's is `method`): a method name there is refused
    with the keyword to use, jitted and on the host."""
    table = make_table(capacity=8)
    table.insert(transitions(8))
    hint = r"fields \['prioritized'\] are not among .*pass method='prioritized'"
    with pytest.raises(gj.InvalidArgumentError, match=hint):
        gj.sample_gather(table, jax.random.key(0), 4, "prioritized")
    with pytest.raises(gj.InvalidArgumentError, match=hint):
        gj.host.sample_gather(table, np.random.default_rng(0), 4, "prioritized")
    with pytest.raises(gj.InvalidArgumentError, match=r"fields \['reward'\] are not among .*\]$"):
        gj.sample_gather(table, jax.random.key(0), 4, "reward")  # no hint for a name that is no method

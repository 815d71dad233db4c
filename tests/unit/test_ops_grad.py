"""gear_jax calls inside a function that jax.grad differentiates: they run in the forward pass and carry no
gradient (their operands are data, never parameters)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gear_jax as gj
from tests.helpers.tables import transitions


def _prioritized_loss(table):
    """A DQN-like loss that writes |td| + 0.5 back as the sampled rows' priorities inside the loss."""

    def loss(w, key):
        s, batch = gj.sample_gather(table, key, 8, method="prioritized")
        td = batch["obs"].sum(-1) * w - batch["action"].astype(jnp.float32)
        count = gj.update_priorities(table, s, jnp.abs(td) + 0.5)
        return jnp.mean(td**2), (s, td, count)

    return loss


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "jit"])
def test_update_priorities_in_a_differentiated_loss_writes_priorities_and_grad_is_exact(make_table, compiled):
    table = make_table(capacity=16)
    table.insert(transitions(16))
    before = table.row_status()["priority"].copy()
    s_ref, batch = gj.sample_gather(table, jax.random.key(3), 8, method="prioritized")  # before the update
    grad_fn = jax.value_and_grad(_prioritized_loss(table), has_aux=True)
    if compiled:
        grad_fn = jax.jit(grad_fn)
    (value, (s, td, count)), grad = grad_fn(jnp.float32(0.25), jax.random.key(3))
    jax.effects_barrier()

    np.testing.assert_array_equal(np.asarray(s.indices), np.asarray(s_ref.indices))  # the same picks
    x, a = np.asarray(batch["obs"]).sum(-1), np.asarray(batch["action"], np.float32)
    td_ref = x * 0.25 - a
    assert float(value) == pytest.approx(np.mean(td_ref**2), rel=1e-5)
    assert float(grad) == pytest.approx(np.mean(2 * td_ref * x), rel=1e-5)  # d/dw mean(td^2)
    assert int(count) == 8
    after = table.row_status()["priority"]
    rows = np.asarray(s.indices)
    expected = before.copy()
    expected[rows] = np.abs(td_ref) + 0.5  # a row picked twice gets the same value both times
    np.testing.assert_allclose(after, expected, rtol=1e-6)


def test_insert_and_sample_at_inside_grad_run_in_the_forward_pass(make_table):
    table = make_table(capacity=16)
    table.insert(transitions(4))

    def loss(w):
        rows = gj.insert(table, {"obs": jnp.ones((2, 3)) * w, "action": jnp.arange(2, dtype=jnp.int32)})
        s = gj.sample_at(table, jax.random.key(0), jnp.asarray([0.1, 0.9]) * w, after=rows)
        return w**2 + 0.0 * s.probabilities.sum(), rows

    grad, rows = jax.grad(loss, has_aux=True)(jnp.float32(3.0))
    jax.effects_barrier()
    assert float(grad) == pytest.approx(6.0)  # only w**2 carries a gradient
    assert table.size == 6
    np.testing.assert_array_equal(table.columns["obs"][np.asarray(rows), 0], np.full((2, 3), 3.0))

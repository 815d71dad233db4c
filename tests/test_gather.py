import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gear_jax as gj
from conftest import transitions


def test_gather_returns_the_sampled_rows(make_table):
    table = make_table(capacity=100)
    table.insert(transitions(100))

    @jax.jit
    def step(key):
        s = gj.sample(table, key, 256)
        return s, gj.gather(table, s)

    s, batch = step(jax.random.key(3))
    idx = np.asarray(s.indices)
    expected = transitions(100)
    np.testing.assert_array_equal(np.asarray(batch["obs"]), expected["obs"][idx])
    np.testing.assert_array_equal(np.asarray(batch["action"]), expected["action"][idx])
    assert batch["obs"].shape == (256, 3) and batch["obs"].dtype == jnp.float32
    assert batch["valid"].shape == (256,) and bool(batch["valid"].all())


def test_gather_subset_of_fields(make_table):
    table = make_table()
    table.insert(transitions(4))
    s = gj.sample(table, jax.random.key(0), 8)
    batch = gj.gather(table, s, fields=("action",))
    assert set(batch) == {"action", "valid"}
    np.testing.assert_array_equal(np.asarray(batch["action"]), np.asarray(s.indices))


def test_trajectory_windows_are_padded_and_masked(make_table):
    table = make_table(
        fields={"x": gj.Field((2,), "int16"), "t": gj.Field((), "int32")}, capacity=4, max_steps=6
    )
    steps = np.arange(6, dtype=np.int32)
    data = {
        "x": np.stack([np.stack([steps, -steps], 1)] * 2).astype(np.int16),
        "t": np.stack([steps, steps + 10]),
    }
    table.insert(data, lengths=[6, 3])  # row 0 full, row 1 three steps
    s = gj.sample(table, jax.random.key(0), 200, window=4)
    batch = gj.gather(table, s)
    assert batch["x"].shape == (200, 4, 2) and batch["valid"].shape == (200, 4)
    for i in range(200):
        row, start = int(s.indices[i]), int(s.starts[i])
        length = [6, 3][row]
        n = min(4, length - start)
        np.testing.assert_array_equal(np.asarray(batch["t"][i, :n]), data["t"][row, start : start + n])
        np.testing.assert_array_equal(np.asarray(batch["t"][i, n:]), 0)  # padding is zero
        np.testing.assert_array_equal(np.asarray(batch["valid"][i]), np.arange(4) < n)
        np.testing.assert_array_equal(np.asarray(batch["x"][i, :n, 1]), -data["x"][row, start : start + n, 0])


def test_whole_rows_without_window(make_table):
    table = make_table(fields={"t": gj.Field((), "int32")}, capacity=2, max_steps=5)
    table.insert({"t": np.array([[1, 2, 3]], np.int32)})
    s = gj.sample(table, jax.random.key(0), 2)
    batch = gj.gather(table, s)
    np.testing.assert_array_equal(np.asarray(batch["t"]), [[1, 2, 3, 0, 0]] * 2)
    np.testing.assert_array_equal(np.asarray(batch["valid"]), [[True] * 3 + [False] * 2] * 2)


def test_overwritten_row_comes_back_invalid_and_zeroed(make_table):
    table = make_table(capacity=4)
    table.insert(transitions(4))
    s = gj.sample(table, jax.random.key(0), 4, method="fifo")  # rows 0, 1, 2, 3
    table.insert(transitions(1, start=50))  # overwrites row 0
    batch = gj.gather(table, s)
    np.testing.assert_array_equal(np.asarray(batch["valid"]), [False, True, True, True])
    np.testing.assert_array_equal(np.asarray(batch["obs"][0]), 0)
    np.testing.assert_array_equal(np.asarray(batch["action"][1:]), [1, 2, 3])


def test_row_being_written_is_never_sampled_and_gathers_invalid(make_table):
    table = make_table(capacity=4, max_steps=3)
    table.insert({"obs": np.ones((4, 3, 3), np.float32), "action": np.ones((4, 3), np.int32)})
    s = gj.sample(table, jax.random.key(0), 4, method="fifo")
    writer = table.writer()
    writer.append({"obs": np.zeros(3, np.float32), "action": 0})  # claims row 0: odd generation
    held = writer._row
    assert table.row_status()["generation"][held] % 2 == 1
    for method in gj.METHODS:
        picks = np.asarray(gj.sample(table, jax.random.key(1), 3, method=method).indices)
        assert held not in picks
    batch = gj.gather(table, s)  # sampled before the claim: now torn
    assert not bool(batch["valid"][held].any()) and bool(batch["valid"][1:].all())
    writer.end_episode()
    again = gj.gather(table, s)
    assert not bool(again["valid"][held].any())  # a new trajectory, not the sampled one
    writer.close()


def test_sampling_an_empty_table_raises(make_table):
    table = make_table()
    for method in gj.METHODS:
        with pytest.raises(gj.EXECUTION_ERRORS, match="no selectable rows"):
            jax.block_until_ready(gj.sample(table, jax.random.key(0), 4, method=method).indices)
    table.insert(transitions(2), priorities=[0.0, 0.0])
    with pytest.raises(gj.EXECUTION_ERRORS, match="no selectable rows"):
        jax.block_until_ready(gj.sample(table, jax.random.key(0), 4, method="prioritized").indices)


def test_fifo_with_fewer_rows_than_batch_raises(make_table):
    table = make_table()
    table.insert(transitions(2))
    with pytest.raises(gj.EXECUTION_ERRORS, match="fewer than batch_size 3"):
        jax.block_until_ready(gj.sample(table, jax.random.key(0), 3, method="fifo").indices)


def test_compiled_function_after_close_raises_not_crashes(make_table):
    table = make_table()
    table.insert(transitions(4))
    step = jax.jit(lambda k: gj.gather(table, gj.sample(table, k, 2)))
    jax.block_until_ready(step(jax.random.key(0)))
    table.close()
    with pytest.raises(gj.EXECUTION_ERRORS, match="closed"):
        jax.block_until_ready(step(jax.random.key(0)))
    with pytest.raises(gj.TableClosedError):  # tracing anew with a closed table
        gj.sample(table, jax.random.key(0), 2)


def test_compiled_function_keeps_working_while_others_attach_and_close(make_table):
    table = make_table()
    table.insert(transitions(4))
    step = jax.jit(lambda k: gj.sample(table, k, 2).indices)
    other = gj.Table.attach(table.name)
    other.close()
    assert step(jax.random.key(0)).shape == (2,)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch_size=0), "batch_size"),
        (dict(batch_size=-3), "batch_size"),
        (dict(batch_size=2.0), "batch_size"),
        (dict(batch_size=2, method="random"), "method"),
        (dict(batch_size=2, priority_exponent=-1.0), "priority_exponent"),
        (dict(batch_size=2, window=6), "longer than the table's max_steps=5"),
        (dict(batch_size=2, window=0), "window"),
    ],
)
def test_sample_argument_errors(make_table, kwargs, message):
    table = make_table(max_steps=5)
    with pytest.raises(gj.InvalidArgumentError, match=message):
        gj.sample(table, jax.random.key(0), **kwargs)


def test_gather_and_update_argument_errors(make_table):
    table = make_table(max_steps=5)
    table.insert({"obs": np.ones((2, 5, 3), np.float32), "action": np.ones((2, 5), np.int32)})
    s = gj.sample(table, jax.random.key(0), 2)
    with pytest.raises(gj.InvalidArgumentError, match="not among the table's fields"):
        gj.gather(table, s, fields=("obs", "reward"))
    with pytest.raises(gj.InvalidArgumentError, match="max_steps=5"):
        gj.gather(table, s, window=9)
    with pytest.raises(gj.InvalidArgumentError, match="Sample"):
        gj.gather(table, {"indices": s.indices})
    with pytest.raises(gj.InvalidArgumentError, match=r"shape \(3,\), expected \(2,\)"):
        gj.update_priorities(table, s, jnp.ones(3))
    with pytest.raises(gj.InvalidArgumentError, match="gear_jax.Table"):
        gj.sample("table", jax.random.key(0), 2)


def test_gather_rejects_out_of_range_rows(make_table):
    table = make_table(capacity=4)
    table.insert(transitions(4))
    s = gj.Sample(jnp.array([0, 4]), jnp.array([2, 2], jnp.uint32), jnp.ones(2), jnp.zeros(2, jnp.int32))
    with pytest.raises(gj.EXECUTION_ERRORS, match=r"indices\[1\] = 4 is outside \[0, 4\)"):
        jax.block_until_ready(gj.gather(table, s)["valid"])


def test_malformed_samples_are_refused(make_table):
    table = make_table(capacity=4)
    table.insert(transitions(4))
    s = gj.Sample(
        jnp.zeros(1 << 16, jnp.int32), jnp.zeros(1, jnp.uint32), jnp.zeros(1 << 16), jnp.zeros(1, jnp.int32)
    )
    with pytest.raises(gj.InvalidArgumentError, match=r"shape \(B,\)"):
        gj.gather(table, s)
    with pytest.raises(gj.InvalidArgumentError, match=r"shape \(B,\)"):
        gj.update_priorities(table, s, jnp.ones(1 << 16))

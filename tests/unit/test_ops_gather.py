import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gear_jax as gj
from tests.helpers.tables import held_row, transitions


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
    held = held_row(table)
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


@pytest.mark.parametrize("window", [-5, 9, 2.5, True])
def test_a_sample_with_a_window_no_table_row_has_is_refused(make_table, window):
    # Sample(window=-5) gave gather negative output shapes, and a window past max_steps was accepted
    # silently (issue 32's probe); both calls and the host calls now refuse it by name.
    table = make_table(capacity=4, max_steps=8)
    table.insert({"obs": np.zeros((4, 8, 3), np.float32), "action": np.zeros((4, 8), np.int32)},
                 lengths=np.full(4, 8))
    zeros = jnp.zeros(2, jnp.int32)
    s = gj.Sample(zeros, jnp.zeros(2, jnp.uint32), jnp.ones(2), zeros, window=window)
    for call in (lambda: gj.gather(table, s), lambda: gj.host.gather(table, s),
                 lambda: gj.update_priorities(table, s, jnp.ones(2))):
        with pytest.raises(gj.InvalidArgumentError, match=r"Sample's window=.* must be an int in \[0, 8\]"):
            call()


def test_a_sample_of_another_table_is_refused(make_table):
    """Row ids of one table mean nothing in another: gather and update_priorities refuse such a sample,
    eagerly and inside jit, and change nothing."""
    first, second = make_table(capacity=8), make_table(capacity=8)
    first.insert(transitions(8))
    second.insert(transitions(8, start=100))
    before = second.row_status()
    s = gj.sample(first, jax.random.key(0), 4)
    assert s.table_handle == first.handle
    with pytest.raises(gj.InvalidArgumentError, match="picked from another table"):
        gj.gather(second, s)
    with pytest.raises(gj.InvalidArgumentError, match="picked from another table"):
        gj.update_priorities(second, s, jnp.full(4, 5.0))
    with pytest.raises(gj.InvalidArgumentError, match="picked from another table"):
        jax.jit(lambda a, b, key: gj.gather(b, gj.sample(a, key, 4)))(first, second, jax.random.key(1))
    ordered, _ = gj.ordered_candidates(first, jax.random.key(0), 2, "fifo")
    with pytest.raises(gj.InvalidArgumentError, match="picked from another table"):
        gj.gather(second, ordered)
    at = gj.sample_at(first, jax.random.key(0), jnp.array([0.5, 1.5]))
    with pytest.raises(gj.InvalidArgumentError, match="picked from another table"):
        gj.update_priorities(second, at, jnp.ones(2))
    after = second.row_status()
    assert all(np.array_equal(before[k], after[k]) for k in ("generation", "priority", "length"))
    # The table it came from still takes it, and so does a detached (hand-built) copy.
    assert bool(gj.gather(first, s)["valid"].all())
    assert int(gj.update_priorities(first, s, jnp.full(4, 2.0))) == 4
    assert gj.gather(second, s.detached())["obs"].shape == (4, 3)


@pytest.mark.parametrize("op", ["sample", "sample_batch", "ordered_candidates"])
def test_batch_sizes_beyond_memory_are_refused_at_trace_time(make_table, op):
    """A batch whose results cannot fit fails with an error naming the operation and the sizes, before
    anything is allocated. Traced with eval_shape: nothing would run either way."""
    table = make_table(capacity=8)
    table.insert(transitions(8))
    key = jax.random.key(0)
    calls = {
        "sample": lambda: gj.sample(table, key, 2**31 - 1),
        "sample_batch": lambda: table.sample_batch(key, 2**31 - 1),
        "ordered_candidates": lambda: gj.ordered_candidates(table, key, 2**31 - 1, "fifo"),
    }
    with pytest.raises(gj.InvalidArgumentError, match=r"GiB of results, more than the .* GiB the cpu device"):
        jax.eval_shape(calls[op])
    with pytest.raises(gj.InvalidArgumentError, match=r"batch_size=2147483648 must be an int in \[1, 2"):
        gj.sample(table, key, 2**31)


def test_gather_beyond_memory_is_refused_before_it_runs(make_table, monkeypatch):
    """With the device's available memory pinned low, a gather (and a sample) that would exceed it raises
    the clear error when called, and a smaller one still runs."""
    import gear_jax._args

    table = make_table(capacity=8)
    table.insert(transitions(8))
    monkeypatch.setattr(gear_jax._args, "device_memory_available", lambda: 20480)
    s = gj.sample(table, jax.random.key(0), 1024)  # 20 KiB of picks (5 numbers each): fits
    twice = gj.Sample(
        *(jnp.concatenate([a, a]) for a in (s.indices, s.generations, s.probabilities, s.starts))
    )
    with pytest.raises(gj.InvalidArgumentError, match=r"gather: 2048 picks x 1 steps of 2 fields need"):
        gj.gather(table, twice)  # 34 KiB: valid, obs and action
    with pytest.raises(gj.InvalidArgumentError, match="sample: batch_size=8192 picks need"):
        gj.sample(table, jax.random.key(0), 8192)
    assert gj.gather(table, s, fields="action")["action"].shape == (1024,)

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import gear_jax as gj
from tests.helpers.sampling import (
    P_THRESHOLD,
    assert_mass_in_tail,
    assert_prioritized,
    draw_counts,
    prioritized_table,
)
from tests.helpers.tables import transitions


def test_uniform_matches_exact_distribution_and_skips_unselectable_rows(make_table):
    table = make_table(capacity=64)
    priorities = np.ones(40, np.float32)
    priorities[[3, 17, 29]] = 0.0  # stored but not selectable
    table.insert(transitions(40), priorities=priorities)
    held = table.writer()
    held.append({"obs": np.zeros(3, np.float32), "action": 0})  # row 40, mid-write
    counts, _, s = draw_counts(table, 64, "uniform")
    assert counts[[3, 17, 29]].sum() == 0 and counts[40:].sum() == 0
    selectable = priorities > 0
    expected = np.full(selectable.sum(), counts.sum() / selectable.sum())
    assert stats.chisquare(counts[:40][selectable], expected).pvalue > P_THRESHOLD
    np.testing.assert_allclose(np.asarray(s.probabilities), 1 / 37)
    held.close()


def test_uniform_exact_fallback_when_rejection_fails(make_table):
    # 2 selectable rows out of 4096 claimed: rejection sampling almost always falls back to the scan.
    table = make_table(fields={"x": gj.Field((), "int32")}, capacity=4096)
    priorities = np.zeros(4096, np.float32)
    priorities[[5, 4000]] = 1.0
    table.insert({"x": np.arange(4096, dtype=np.int32)}, priorities=priorities)
    counts, _, s = draw_counts(table, 4096, "uniform", draws=4000, batch=500)
    assert set(np.flatnonzero(counts)) == {5, 4000}
    assert stats.chisquare(counts[[5, 4000]]).pvalue > P_THRESHOLD
    np.testing.assert_allclose(np.asarray(s.probabilities), 0.5)


@pytest.mark.parametrize("exponent", [0.0, 0.5, 1.0, 2.0])
def test_prioritized_matches_exact_distribution(make_table, exponent):
    table, priorities = prioritized_table(make_table)
    counts, _, s = draw_counts(table, 32, "prioritized", priority_exponent=exponent)
    assert_prioritized(counts, s, priorities, exponent)


def test_prioritized_over_many_blocks(make_table):
    # More rows than one block of the two-pass walk (4096), with the mass concentrated at the end.
    rows = 10_000
    table = make_table(fields={"x": gj.Field((), "int32")}, capacity=rows)
    priorities = np.full(rows, 1e-3, np.float32)
    priorities[-10:] = 100.0
    table.insert({"x": np.arange(rows, dtype=np.int32)}, priorities=priorities)
    counts, _, _ = draw_counts(table, rows, "prioritized", draws=20_000)
    assert_mass_in_tail(counts, priorities)


def test_window_starts_are_uniform_over_valid_positions(make_table):
    table = make_table(fields={"x": gj.Field((), "int32")}, capacity=4, max_steps=10)
    table.insert({"x": np.zeros((1, 10), np.int32)}, lengths=[10])
    _, starts, s = draw_counts(table, 4, "uniform", window=4, draws=14_000)
    assert s.window == 4
    counts = np.bincount(starts, minlength=7)
    assert len(counts) == 7  # starts only in [0, 6]
    assert stats.chisquare(counts).pvalue > P_THRESHOLD


def test_window_longer_than_row_starts_at_zero(make_table):
    table = make_table(fields={"x": gj.Field((), "int32")}, capacity=4, max_steps=10)
    table.insert({"x": np.zeros((1, 3), np.int32)})
    s = gj.sample(table, jax.random.key(0), 64, window=8)
    np.testing.assert_array_equal(np.asarray(s.starts), 0)


def test_fifo_lifo_topk_exact(make_table):
    table = make_table(capacity=8)
    table.insert(transitions(8), priorities=[5, 1, 7, 7, 0, 2, 9, 3])
    table.insert(transitions(3, start=100), priorities=[4, 4, 6])  # overwrites rows 0, 1, 2
    key = jax.random.key(0)
    # commit order now: rows 3, 4, 5, 6, 7, 0, 1, 2 (row 4 has priority 0: never selected)
    fifo = gj.sample(table, key, 3, method="fifo")
    np.testing.assert_array_equal(np.asarray(fifo.indices), [3, 5, 6])
    lifo = gj.sample(table, key, 3, method="lifo")
    np.testing.assert_array_equal(np.asarray(lifo.indices), [2, 1, 0])
    topk = gj.sample(table, key, 4, method="topk")
    np.testing.assert_array_equal(np.asarray(topk.indices), [6, 3, 2, 0])  # 9, 7, 6, 4 (tie to lower id)
    np.testing.assert_array_equal(np.asarray(topk.probabilities), 1.0)
    status = table.row_status()
    np.testing.assert_array_equal(np.asarray(topk.generations), status["generation"][[6, 3, 2, 0]])


def test_options_that_change_nothing_are_refused_or_warned_about_inside_jit(make_table):
    table = make_table(capacity=16)
    table.insert(transitions(8))
    key = jax.random.key(0)
    with pytest.raises(gj.InvalidArgumentError, match="short_episodes='skip' needs a window"):
        jax.jit(lambda k: gj.sample(table, k, 4, short_episodes="skip"))(key)
    with pytest.raises(gj.InvalidArgumentError, match="short_episodes='skip' needs a window"):
        jax.jit(lambda k: gj.sample_gather(table, k, 4, short_episodes="skip"))(key)
    for call in (gj.sample, gj.sample_gather):
        with pytest.warns(
            UserWarning, match="priority_exponent=0.5 has no effect with method='fifo'"
        ) as seen:
            jax.jit(lambda k, call=call: call(table, k, 4, method="fifo", priority_exponent=0.5))(key)
        assert seen[0].filename == __file__  # the warning names the caller's line
    # Defaults given explicitly, and an exponent where it weighs, pass without a word.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jax.jit(lambda k: gj.sample(table, k, 4, method="fifo", priority_exponent=1.0, short_episodes="pad"))(
            key
        )
        jax.jit(lambda k: gj.sample(table, k, 4, method="prioritized", priority_exponent=0.5))(key)


@pytest.mark.parametrize("method", ["fifo", "lifo", "topk"])
def test_defer_capacity_check_traces_a_batch_above_the_capacity_that_fails_at_run_time(make_table, method):
    """What the sharded layer's global fifo, lifo and topk rely on: a shard's sample of more rows than it
    can hold is refused at trace time by default; with defer_capacity_check it traces (in a branch that
    may never run, as in sharded.sample's lax.cond) and fails at run time with the single-table error."""
    table = make_table(capacity=8)
    table.insert(transitions(8))
    key = jax.random.key(0)
    with pytest.raises(gj.InvalidArgumentError, match=r"batch_size=10 exceeds the table's capacity \(8\)"):
        gj.sample(table, key, 10, method=method)
    with pytest.raises(gj.InvalidArgumentError, match=r"sample: defer_capacity_check='yes' must be True"):
        gj.sample(table, key, 10, method=method, defer_capacity_check="yes")

    def deferred(k, batch_size=10):
        return gj.sample(table, k, batch_size, method=method, defer_capacity_check=True)

    assert jax.eval_shape(deferred, key).indices.shape == (10,)
    with pytest.raises(gj.EXECUTION_ERRORS, match="holds 8 selectable rows, fewer than batch_size 10"):
        jax.block_until_ready(jax.jit(deferred)(key).indices)
    # Traced but not taken: the branch that can be filled runs, and gives the usual picks.
    chosen = jax.jit(
        lambda k, fill: jax.lax.cond(
            fill, lambda: gj.sample(table, k, 8, method=method).indices, lambda: deferred(k).indices[:8]
        )
    )
    usual = gj.sample(table, key, 8, method=method).indices
    np.testing.assert_array_equal(np.asarray(chosen(key, True)), np.asarray(usual))
    with pytest.raises(gj.EXECUTION_ERRORS, match="fewer than batch_size 10"):
        jax.block_until_ready(chosen(key, False))
    # Within the capacity the option changes nothing.
    np.testing.assert_array_equal(np.asarray(deferred(key, 8).indices), np.asarray(usual))


def test_same_key_same_sample_and_different_keys_differ(make_table):
    table = make_table(capacity=1000)
    table.insert(transitions(1000), priorities=np.linspace(0.1, 2, 1000))
    for method in gj.METHODS:
        fn = jax.jit(lambda k, m=method: gj.sample(table, k, 64, method=m))
        a, b = fn(jax.random.key(7)), fn(jax.random.key(7))
        eager = gj.sample(table, jax.random.key(7), 64, method=method)
        np.testing.assert_array_equal(np.asarray(a.indices), np.asarray(b.indices))
        np.testing.assert_array_equal(np.asarray(a.indices), np.asarray(eager.indices))
        if method in ("uniform", "prioritized"):
            c = fn(jax.random.key(8))
            assert not np.array_equal(np.asarray(a.indices), np.asarray(c.indices))


def test_times_sampled_counts_picks(make_table):
    table = make_table(capacity=8)
    table.insert(transitions(8))
    s = gj.sample(table, jax.random.key(0), 100)
    np.testing.assert_array_equal(
        table.row_status()["times_sampled"], np.bincount(np.asarray(s.indices), minlength=8)
    )


def test_update_priorities_changes_the_distribution_and_orders_with_after(make_table):
    table = make_table(capacity=4)
    table.insert(transitions(4))

    @jax.jit
    def step(key):
        s = gj.sample(table, key, 4, method="topk")
        updated = gj.update_priorities(table, s, jnp.array([0.0, 0.0, 0.0, 5.0]))
        # ordered after the update through `after`: sees the new priorities
        return updated, gj.sample(table, key, 1, method="topk", after=updated)

    updated, second = step(jax.random.key(0))
    assert int(updated) == 4
    np.testing.assert_array_equal(table.row_status()["priority"], [0, 0, 0, 5])
    assert int(second.indices[0]) == 3
    counts, _, _ = draw_counts(table, 4, "prioritized", draws=2000, batch=1000)
    np.testing.assert_array_equal(counts, [0, 0, 0, 2000])


def test_update_priorities_skips_overwritten_rows(make_table):
    table = make_table(capacity=2)
    table.insert(transitions(2))
    s = gj.sample(table, jax.random.key(0), 2, method="fifo")
    table.insert(transitions(1, start=50), priorities=[3.0])  # overwrites row 0
    updated = gj.update_priorities(table, s, jnp.array([9.0, 9.0]))
    assert int(updated) == 1
    np.testing.assert_array_equal(table.row_status()["priority"], [3.0, 9.0])  # row 0 keeps its new priority


@pytest.mark.parametrize("bad", [np.nan, np.inf, -1.0])
def test_update_priorities_rejects_bad_values_and_changes_nothing(make_table, bad):
    table = make_table(capacity=2)
    table.insert(transitions(2))
    s = gj.sample(table, jax.random.key(0), 2, method="fifo")
    with pytest.raises(gj.EXECUTION_ERRORS, match=r"priorities\[1\].*finite and >= 0"):
        jax.block_until_ready(gj.update_priorities(table, s, jnp.array([2.0, bad])))
    np.testing.assert_array_equal(table.row_status()["priority"], [1.0, 1.0])


def test_zero_priority_rows_come_back_after_update(make_table):
    table = make_table(capacity=2)
    table.insert(transitions(2), priorities=[0.0, 1.0])
    assert int(gj.sample(table, jax.random.key(0), 1, method="fifo").indices[0]) == 1
    generations = table.row_status()["generation"]
    s = gj.Sample(jnp.array([0]), jnp.asarray(generations[:1]), jnp.ones(1), jnp.zeros(1, jnp.int32))
    assert int(gj.update_priorities(table, s, jnp.array([1.0]))) == 1
    assert int(gj.sample(table, jax.random.key(0), 1, method="fifo").indices[0]) == 0


@pytest.mark.parametrize("batch", [1, 7, 100, 333])
def test_fifo_lifo_topk_match_a_reference_on_larger_tables(make_table, batch):
    rows = 2000
    table = make_table(fields={"x": gj.Field((), "int32")}, capacity=rows)
    rng = np.random.default_rng(batch)
    priorities = rng.integers(0, 20, rows).astype(np.float32)  # many ties, some zeros
    table.insert({"x": np.zeros(rows, np.int32)}, priorities=priorities)
    table.insert(
        {"x": np.zeros(500, np.int32)}, priorities=rng.integers(0, 20, 500)
    )  # wrap: rows 0..499 newest
    status = table.row_status()
    selectable = np.flatnonzero(status["priority"] > 0)
    seq = status["insert_seq"][selectable]
    prio = status["priority"][selectable]
    expected = {
        "fifo": selectable[np.argsort(seq)][:batch],
        "lifo": selectable[np.argsort(-seq.astype(np.int64))][:batch],
        "topk": selectable[np.lexsort((selectable, -prio))][:batch],
    }
    for method, rows_expected in expected.items():
        got = gj.sample(table, jax.random.key(0), batch, method=method)
        np.testing.assert_array_equal(np.asarray(got.indices), rows_expected, err_msg=method)


def test_prioritized_weight_overflow_is_an_error_not_a_silent_collapse(make_table):
    table = make_table(capacity=4)
    table.insert(transitions(3), priorities=[1e30, 1.0, 1.0])
    s = gj.sample(table, jax.random.key(0), 8, method="prioritized", priority_exponent=2.0)
    np.testing.assert_array_equal(np.asarray(s.indices), 0)  # 1e60 fits a double
    with pytest.raises(gj.EXECUTION_ERRORS, match="overflows"):
        jax.block_until_ready(
            gj.sample(table, jax.random.key(0), 8, method="prioritized", priority_exponent=11.0).indices
        )


def _expected_after_update(priorities, sample, new):
    """The table's priorities after `update_priorities(sample, new)`: for a row picked twice, the later
    entry wins."""
    expected = np.array(priorities, np.float32)
    for row, value in zip(np.asarray(sample.indices), np.asarray(new, np.float32)):
        expected[row] = value
    return expected


def test_a_priority_update_passed_to_sample_is_applied_before_the_picks(make_table):
    """`sample(..., priority_update=(previous, p))` writes p as update_priorities would, then picks what a
    plain sample picks from the updated table with the same key; the jitted step has no JAX effect."""
    table, priorities = prioritized_table(make_table)
    previous = gj.sample(table, jax.random.key(1), 16, method="prioritized")
    new = np.random.default_rng(3).uniform(0.5, 4.0, 16).astype(np.float32)

    def step(key, previous, new):
        return gj.sample(table, key, 64, method="prioritized", priority_update=(previous, new))

    assert jax.make_jaxpr(step)(jax.random.key(2), previous, new).effects == set()
    fused = jax.jit(step)(jax.random.key(2), previous, new)
    expected = _expected_after_update(priorities, previous, new)
    np.testing.assert_array_equal(table.row_status()["priority"][:30], expected)
    plain = jax.jit(lambda k: gj.sample(table, k, 64, method="prioritized"))(jax.random.key(2))
    for name in ("indices", "generations", "probabilities", "starts", "selectable"):
        np.testing.assert_array_equal(np.asarray(getattr(fused, name)), np.asarray(getattr(plain, name)))
    # The effectful call, for comparison: it makes the step effectful.
    effectful = jax.make_jaxpr(
        lambda k, p, n: gj.sample(table, k, 4, after=gj.update_priorities(table, p, n))
    )
    assert effectful(jax.random.key(2), previous, new).effects != set()


def test_priority_updates_chained_through_a_scan_follow_the_distribution(make_table):
    """A learner loop in `lax.scan`: each step samples with the previous step's picks and new priorities.
    The final priorities are the updates in order, and picks made after them follow p / sum p."""
    table = make_table(capacity=40)
    table.insert(transitions(40), priorities=np.ones(40, np.float32))
    first = gj.sample(table, jax.random.key(0), 8, method="prioritized")
    news = jnp.asarray(np.random.default_rng(5).uniform(0.1, 3.0, (12, 8)).astype(np.float32))

    @jax.jit
    def learn(first, news):
        def body(previous, xs):
            i, new = xs
            s = gj.sample(
                table,
                jax.random.fold_in(jax.random.key(1), i),
                8,
                method="prioritized",
                priority_update=(previous, new),
            )
            return s, s.indices

        return jax.lax.scan(body, first, (jnp.arange(12), news))

    last, picked = learn(first, news)
    expected = np.ones(40, np.float32)
    previous_rows = np.asarray(first.indices)
    for step in range(12):  # step k's update is of the rows step k - 1 picked
        for row, value in zip(previous_rows, np.asarray(news[step])):
            expected[row] = value
        previous_rows = np.asarray(picked[step])
    np.testing.assert_array_equal(table.row_status()["priority"], expected)
    np.testing.assert_array_equal(np.asarray(last.indices), previous_rows)
    counts, _, s = draw_counts(table, 40, "prioritized", draws=20000, batch=1000)
    assert_prioritized(counts, s, expected, 1.0)


def test_sample_gather_takes_a_priority_update(make_table):
    table = make_table(fields={"x": gj.Field((), "int32")}, capacity=16)
    table.insert({"x": np.arange(16, dtype=np.int32) * 10}, priorities=np.ones(16, np.float32))
    previous = gj.sample(table, jax.random.key(0), 4, method="fifo")  # rows 0-3
    s, batch = jax.jit(
        lambda k, p: gj.sample_gather(
            table, k, 2, method="topk", priority_update=(p, jnp.array([0.0, 0.0, 7.0, 9.0]))
        )
    )(jax.random.key(1), previous)
    np.testing.assert_array_equal(np.asarray(s.indices), [3, 2])  # the two new highest priorities
    np.testing.assert_array_equal(np.asarray(batch["x"]), [30, 20])
    status = table.row_status()["priority"]
    np.testing.assert_array_equal(status[:4], [0, 0, 7, 9])


def test_a_bad_priority_update_is_refused_by_name(make_table):
    table = make_table(capacity=8)
    other = make_table(capacity=8)
    table.insert(transitions(8))
    other.insert(transitions(8))
    previous = gj.sample(table, jax.random.key(0), 4)
    key = jax.random.key(1)
    with pytest.raises(gj.InvalidArgumentError, match="priority_update must be a pair .* got a Sample"):
        gj.sample(table, key, 2, priority_update=previous)
    with pytest.raises(gj.InvalidArgumentError, match="priority_update must be a pair .* got a tuple of 3"):
        gj.sample(table, key, 2, priority_update=(previous, jnp.ones(4), None))
    with pytest.raises(gj.InvalidArgumentError, match=r"`priority_update\[0\]` must be a gear_jax.Sample"):
        gj.sample(table, key, 2, priority_update=(np.arange(4), jnp.ones(4)))
    with pytest.raises(
        gj.InvalidArgumentError,
        match=r"sample: priority_update\[1\] has shape \(3,\), expected \(4,\) to match priority_update\[0\]",
    ):
        gj.sample(table, key, 2, priority_update=(previous, jnp.ones(3)))
    with pytest.raises(gj.InvalidArgumentError, match=r"priority_update\[1\] has dtype bool"):
        gj.sample(table, key, 2, priority_update=(previous, np.ones(4, bool)))
    # Refused after the update's own checks passed: nothing is written (outside jit the update would
    # run at once).
    with pytest.raises(gj.InvalidArgumentError, match="fields"):
        gj.sample_gather(table, key, 2, fields=["typo"], priority_update=(previous, jnp.full(4, 5.0)))
    with pytest.raises(gj.InvalidArgumentError, match="sample_gather: the sample was picked from another"):
        gj.sample_gather(other, key, 2, priority_update=(previous, jnp.ones(4)))
    with pytest.raises(gj.EXECUTION_ERRORS, match=r"priorities\[1\].*finite and >= 0"):
        jax.block_until_ready(
            gj.sample(table, key, 2, priority_update=(previous, jnp.array([1.0, -1, 1, 1])))
        )
    np.testing.assert_array_equal(table.row_status()["priority"], np.ones(8))


def test_a_priority_update_runs_after_the_samples_after_and_each_loop_iteration(make_table):
    """`after=` orders the update too; and an update whose operands do not change across a scan's
    iterations still runs in every iteration, before that iteration's picks (XLA hoists effect-free calls
    with loop-invariant operands out of loops: the update also takes the sample's seed)."""
    table = make_table(capacity=8)
    table.insert(transitions(8), priorities=np.ones(8, np.float32))
    first4 = gj.sample(table, jax.random.key(0), 4, method="fifo")  # rows 0-3
    to_row_3 = jnp.array([0.0, 0.0, 0.0, 9.0])
    to_row_0 = jnp.array([9.0, 0.0, 0.0, 0.0])

    @jax.jit
    def ordered(previous):
        count = gj.update_priorities(table, previous, to_row_0)
        # `after=count`: the effectful update first, then this one, then the picks.
        return gj.sample(
            table, jax.random.key(1), 1, method="topk", after=count, priority_update=(previous, to_row_3)
        )

    assert int(ordered(first4).indices[0]) == 3

    @jax.jit
    def loop(previous):
        def body(carry, i):
            s = gj.sample(
                table,
                jax.random.fold_in(jax.random.key(2), i),
                1,
                method="topk",
                priority_update=(previous, to_row_3),
            )  # the same operands every iteration
            count = gj.update_priorities(table, previous, to_row_0, after=s.indices)
            return carry + count, s.indices[0]

        return jax.lax.scan(body, jnp.zeros((), jnp.int32), jnp.arange(4))[1]

    np.testing.assert_array_equal(np.asarray(loop(first4)), [3, 3, 3, 3])
    np.testing.assert_array_equal(table.row_status()["priority"][:4], [9, 0, 0, 0])


def test_a_priority_update_spread_over_many_change_groups_gives_exact_probabilities(make_table):
    """100,000 rows (98 groups of 1,024 under two of 65,536, the last partial): updates of rows all over
    the table reach the priority index, and the picks' probabilities are the exact p / sum p."""
    rows = 100_000
    table = make_table(fields={"x": gj.Field((), "int32")}, capacity=rows)
    rng = np.random.default_rng(11)
    priorities = rng.uniform(0.5, 2.0, rows).astype(np.float32)
    table.insert({"x": np.arange(rows, dtype=np.int32)}, priorities=priorities)
    step = jax.jit(lambda k, p, v: gj.sample(table, k, 512, method="prioritized", priority_update=(p, v)))
    previous = gj.sample(table, jax.random.key(0), 512, method="prioritized")
    for i in range(6):
        new = rng.uniform(0.1, 50.0, 512).astype(np.float32)
        priorities = _expected_after_update(priorities, previous, new)
        previous = step(jax.random.key(i + 1), previous, new)
        exact = priorities.astype(np.float64) / priorities.astype(np.float64).sum()
        np.testing.assert_allclose(
            np.asarray(previous.probabilities), exact[np.asarray(previous.indices)], rtol=2e-4
        )
    np.testing.assert_array_equal(table.row_status()["priority"][:rows], priorities)

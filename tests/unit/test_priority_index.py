"""The priority index behind prioritized sampling: it follows every change of the rows (inserts, the ring
wrapping, priority updates, writers in other processes) and samples the exact law p^a / sum p^a."""

import multiprocessing as mp

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import gear_jax as gj
from gear_jax import ops
from tests.helpers.sampling import P_THRESHOLD, assert_prioritized, draw_counts

X = {"x": gj.Field((), "int32")}


def priorities_of(table):
    """Each row's priority as the table holds it now (0 for rows that are not selectable)."""
    status = table.row_status()
    p = np.asarray(status["priority"], np.float64)
    return np.where(status["generation"] % 2 == 0, p, 0.0).astype(np.float32)


def exact_total(priorities, exponent):
    selectable = priorities > 0
    return float(np.sum(priorities[selectable].astype(np.float64) ** exponent))


def total_weight(table, exponent):
    total, count = jax.jit(lambda: ops.total_weight(table, exponent))()
    return float(total), int(count)


@pytest.mark.parametrize("exponent", [0.6, 1.0, 2.0])
def test_sampling_follows_inserts_wraps_and_updates(make_table, exponent):
    rng = np.random.default_rng(0)
    table = make_table(fields=X, capacity=3000)
    table.insert(
        {"x": np.arange(2000, dtype=np.int32)}, priorities=rng.uniform(0.1, 2.0, 2000).astype(np.float32)
    )
    key = jax.random.key(0)
    sample = jax.jit(lambda k: gj.sample(table, k, 512, method="prioritized", priority_exponent=exponent))
    update = jax.jit(lambda s, p: gj.update_priorities(table, s, p))
    for step in range(6):  # the index is built by the first sample, then follows the changes
        key, k1 = jax.random.split(key)
        s = sample(k1)
        new = rng.choice([0.0, 0.5, 3.0, 10.0], 512).astype(np.float32)  # zeros leave the selectable set
        update(s, jnp.asarray(new))
        table.insert(
            {"x": np.arange(700, dtype=np.int32)}, priorities=rng.uniform(0.1, 5.0, 700).astype(np.float32)
        )
    priorities = priorities_of(table)
    total, count = total_weight(table, exponent)
    assert count == int(np.sum(priorities > 0))
    assert total == pytest.approx(exact_total(priorities, exponent), rel=1e-6)
    counts, _, last = draw_counts(table, 3000, "prioritized", priority_exponent=exponent)
    assert_prioritized(counts, last, priorities, exponent)


def test_many_exponents_take_turns(make_table):
    # More exponents than the CPU keeps indexes for: each comes back exact after it gave way.
    table = make_table(fields=X, capacity=500)
    rng = np.random.default_rng(1)
    table.insert(
        {"x": np.arange(500, dtype=np.int32)}, priorities=rng.uniform(0.5, 4.0, 500).astype(np.float32)
    )
    exponents = [0.25, 0.5, 0.75, 1.0, 1.5, 2.0]
    for round_ in range(2):
        for exponent in exponents:
            total, _ = total_weight(table, exponent)
            assert total == pytest.approx(exact_total(priorities_of(table), exponent), rel=1e-6)
        table.insert(
            {"x": np.arange(100, dtype=np.int32)}, priorities=rng.uniform(0.5, 4.0, 100).astype(np.float32)
        )


def test_same_key_same_sample(make_table):
    table = make_table(fields=X, capacity=1000)
    rng = np.random.default_rng(2)
    table.insert(
        {"x": np.arange(1000, dtype=np.int32)}, priorities=rng.uniform(0.5, 4.0, 1000).astype(np.float32)
    )
    first = gj.sample(table, jax.random.key(5), 256, method="prioritized", priority_exponent=0.7)
    with gj.Table.attach(table.name) as other:  # another open builds its own index from the rows
        again = gj.sample(other, jax.random.key(5), 256, method="prioritized", priority_exponent=0.7)
    np.testing.assert_array_equal(np.asarray(first.indices), np.asarray(again.indices))
    np.testing.assert_array_equal(np.asarray(first.probabilities), np.asarray(again.probabilities))


def test_sample_at_is_the_row_order_prefix_rule(make_table):
    # Integer priorities: every partial sum is exact, so the tree's walk and a prefix sum over the rows
    # agree on every target, boundaries included.
    table = make_table(fields=X, capacity=300)
    rng = np.random.default_rng(3)
    priorities = rng.integers(0, 5, 300).astype(np.float32)
    table.insert({"x": np.arange(300, dtype=np.int32)}, priorities=priorities)
    prefix = np.cumsum(priorities.astype(np.float64))
    targets = np.concatenate([prefix[:-1][priorities[1:] > 0], rng.uniform(0, prefix[-1], 200)]).astype(
        np.float32
    )
    got = jax.jit(lambda t: ops.sample_at(table, jax.random.key(0), t))(jnp.asarray(targets))
    expected = np.searchsorted(prefix, targets.astype(np.float64), side="right")
    np.testing.assert_array_equal(np.asarray(got.indices), expected)


def _churn(name, seconds, seed):
    """Inserts rows and rewrites priorities of random rows in another process for `seconds`."""
    import time

    rng = np.random.default_rng(seed)
    with gj.Table.attach(name) as table:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            n = int(rng.integers(1, 64))
            table.insert(
                {"x": np.arange(n, dtype=np.int32)},
                priorities=rng.choice([0.0, 0.5, 1.0, 8.0], n).astype(np.float32),
            )


def test_index_follows_writers_in_other_processes(make_table):
    table = make_table(fields=X, capacity=4000)
    rng = np.random.default_rng(4)
    table.insert(
        {"x": np.arange(4000, dtype=np.int32)}, priorities=rng.uniform(0.5, 2.0, 4000).astype(np.float32)
    )
    sample = jax.jit(lambda k: gj.sample(table, k, 256, method="prioritized", priority_exponent=0.6))
    update = jax.jit(lambda s, p: gj.update_priorities(table, s, p))
    ctx = mp.get_context("spawn")
    writers = [ctx.Process(target=_churn, args=(table.name, 4.0, seed)) for seed in (10, 11)]
    for w in writers:
        w.start()
    key = jax.random.key(1)
    steps = 0
    try:
        while any(w.is_alive() for w in writers):
            key, k = jax.random.split(key)
            s = sample(k)
            update(s, jnp.asarray(rng.uniform(0.1, 3.0, 256).astype(np.float32)))
            steps += 1
    finally:
        for w in writers:
            w.join(timeout=60)
    assert all(w.exitcode == 0 for w in writers)
    assert steps > 5
    # Every change reached the index: its total and count are those of the rows, and it samples their law.
    priorities = priorities_of(table)
    total, count = total_weight(table, 0.6)
    assert count == int(np.sum(priorities > 0))
    assert total == pytest.approx(exact_total(priorities, 0.6), rel=1e-6)
    counts, _, last = draw_counts(table, 4000, "prioritized", priority_exponent=0.6)
    assert_prioritized(counts, last, priorities, 0.6)


def test_rows_changed_behind_the_index_are_never_returned_as_seen(make_table):
    # A state word changed without its change counters (a forged file): the walk that lands on it sees a
    # state the index did not, and draws again; the row is never returned with its old generation.
    table = make_table(fields=X, capacity=64)
    table.insert({"x": np.arange(64, dtype=np.int32)}, priorities=np.ones(64, np.float32))
    gj.sample(table, jax.random.key(0), 8, method="prioritized")  # builds the index
    layout = table.native.layout()
    state = np.memmap(f"/dev/shm/{table.name}", np.uint64, "r+", layout["state"], (table.capacity,))
    before = state.copy()
    low, generation = before[:32] & np.uint64(0xFFFFFFFF), before[:32] >> np.uint64(32)
    state[:32] = low | ((generation + np.uint64(2)) << np.uint64(32))  # a newer even generation
    state.flush()
    s = gj.sample(table, jax.random.key(1), 4000, method="prioritized")
    indices = np.asarray(s.indices)
    generations = np.asarray(s.generations)
    live = generations % 2 == 0
    assert live.mean() > 0.95
    assert np.all(indices[live] >= 32)
    counts = np.bincount(indices[live], minlength=64)[32:]
    assert stats.chisquare(counts).pvalue > P_THRESHOLD

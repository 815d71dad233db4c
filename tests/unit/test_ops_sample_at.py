"""gear_jax.ops.total_weight and gear_jax.ops.sample_at: the single-table building blocks of sharded
prioritized sampling, against numpy references (kernels/sample_at.h states their semantics)."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import gear_jax as gj
from gear_jax.ops import sample_at, total_weight
from tests.helpers.sampling import P_THRESHOLD
from tests.helpers.tables import transitions

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def reference_weights(table, exponent):
    """float64 weights of every row (0 for rows that are not selectable) and the selectable mask."""
    status = table.row_status()
    priority = status["priority"].astype(np.float64)
    selectable = (status["generation"] % 2 == 0) & (status["priority"] > 0)
    weights = np.where(selectable, priority**exponent, 0.0)
    return weights, selectable, status


def reference_picks(table, targets, exponent=1.0):
    """(rows, generations, probabilities) by np.searchsorted over the cumulative weights, -1 rows for the
    failed-pick marker."""
    weights, _, status = reference_weights(table, exponent)
    rows = np.flatnonzero(weights > 0)
    targets = np.asarray(targets, np.float32)
    picked = np.full(targets.shape, -1, np.int64)
    if rows.size:
        cumulative = np.cumsum(weights[rows])
        at = np.clip(np.searchsorted(cumulative, targets.astype(np.float64), side="right"), 0, rows.size - 1)
        mine = targets >= 0  # False for NaN
        picked[mine] = rows[at[mine]]
    total = weights.sum()
    generations = np.where(picked >= 0, status["generation"][np.maximum(picked, 0)], 1).astype(np.uint32)
    probabilities = np.where(picked >= 0, weights[np.maximum(picked, 0)] / max(total, 1e-300), 0.0)
    return picked, generations, probabilities.astype(np.float32)


def run_sample_at(table, targets, key=0, **kwargs):
    fn = jax.jit(lambda k, t: sample_at(table, k, t, **kwargs))
    return jax.block_until_ready(fn(jax.random.key(key), jnp.asarray(targets, jnp.float32)))


def run_total(table, exponent=1.0):
    total, count = jax.jit(lambda: total_weight(table, exponent))()
    return float(total), int(count)


def assert_picks(s, table, targets, exponent=1.0):
    rows, generations, probabilities = reference_picks(table, targets, exponent)
    marker = rows < 0
    np.testing.assert_array_equal(np.asarray(s.indices), np.where(marker, 0, rows))
    np.testing.assert_array_equal(np.asarray(s.generations), generations)
    np.testing.assert_allclose(np.asarray(s.probabilities), probabilities, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(s.probabilities)[marker], 0.0)
    np.testing.assert_array_equal(np.asarray(s.starts), 0)


@pytest.fixture
def mixed_table(make_table):
    """16 rows: 20 inserted (rows 0-3 overwritten once), some of priority 0, row 4 being written (held by
    the writer while the test runs)."""
    table = make_table(capacity=16)
    priorities = np.random.default_rng(3).uniform(0.2, 4.0, 20).astype(np.float32)
    priorities[[6, 9, 17]] = 0.0  # rows 6, 9 and 1 (17 overwrote row 1)
    table.insert(transitions(20), priorities=priorities)
    with table.writer() as writer:
        writer.append({"obs": np.zeros(3, np.float32), "action": np.int32(0)})  # claims row 4
        status = table.row_status()
        # the kinds of rows the test is about are all there
        assert status["generation"][4] % 2 == 1  # being written
        assert (status["generation"][:4] > status["generation"][5]).all()  # overwritten (a pooled table's
        # generations do not start at 0)
        assert (status["priority"][[1, 6, 9]] == 0).all()  # committed, priority 0
        yield table


@pytest.mark.parametrize("exponent", [0.0, 0.5, 1.0, 2.0])
def test_total_weight_matches_numpy(mixed_table, exponent):
    weights, selectable, _ = reference_weights(mixed_table, exponent)
    total, count = run_total(mixed_table, exponent)
    assert count == selectable.sum() == 12  # 16 rows less the held one and three of priority 0
    assert total == pytest.approx(np.float32(weights.sum()), rel=1e-6)
    if exponent == 0.0:
        assert total == count


def test_total_weight_types_and_after(make_table):
    table = make_table(capacity=8)
    table.insert(transitions(4), priorities=np.array([1.0, 2.0, 3.0, 4.0], np.float32))

    @jax.jit
    def step():
        s = gj.sample(table, jax.random.key(0), 2, method="fifo")  # rows 0 and 1
        done = gj.update_priorities(table, s, jnp.array([5.0, 0.0]))
        before = total_weight(table)
        after = total_weight(table, after=done)
        return before, after

    (_, _), (total, count) = step()
    assert total.dtype == jnp.float32 and total.shape == () and count.dtype == jnp.int32 and count.shape == ()
    assert (float(total), int(count)) == (12.0, 3)  # 5 + 0 + 3 + 4: the update ran first


def test_total_weight_of_a_table_without_selectable_rows(make_table):
    table = make_table(capacity=8)
    assert run_total(table) == (0.0, 0)
    table.insert(transitions(3), priorities=np.zeros(3, np.float32))
    assert run_total(table, 0.0) == (0.0, 0)


def test_sample_at_matches_searchsorted(mixed_table):
    # integer priorities, so the cumulative weights and their boundaries are exact
    table = mixed_table
    status = table.row_status()
    sample = gj.Sample(
        jnp.arange(16, dtype=jnp.int32),
        jnp.asarray(status["generation"]),
        jnp.zeros(16),
        jnp.zeros(16, jnp.int32),
    )
    integers = np.random.default_rng(4).integers(1, 6, 16).astype(np.float32)
    integers[[1, 6, 9]] = 0.0
    assert int(jax.jit(lambda: gj.update_priorities(table, sample, jnp.asarray(integers)))()) == 15
    weights, _, _ = reference_weights(table, 1.0)
    cumulative = np.cumsum(weights[weights > 0])
    total = cumulative[-1]
    targets = np.concatenate(
        [
            cumulative,  # exact boundaries: the next row
            cumulative - 0.5,
            np.nextafter(cumulative.astype(np.float32), np.float32(0)),  # just below: this row
            [0.0, -0.0, total, total + 3, 1e30, np.inf],  # past the total: the last row
            [-1.0, -1e-30, np.nan, -np.inf],  # not this table's
            np.random.default_rng(5).uniform(0, total, 40),
        ]
    ).astype(np.float32)
    s = run_sample_at(table, targets)
    assert_picks(s, table, targets)
    assert s.indices.dtype == jnp.int32 and s.generations.dtype == jnp.uint32
    assert s.probabilities.dtype == jnp.float32 and s.starts.dtype == jnp.int32 and s.window == 0
    picked = np.asarray(s.indices)[np.asarray(s.generations) % 2 == 0]
    assert not np.isin(picked, [1, 4, 6, 9]).any()  # never a row of priority 0 or being written
    assert np.asarray(s.indices)[len(cumulative) * 3 + 2] == np.flatnonzero(weights)[-1]  # target = total


@pytest.mark.parametrize("exponent", [0.0, 0.5, 2.0])
def test_sample_at_with_exponents(mixed_table, exponent):
    weights, _, _ = reference_weights(mixed_table, exponent)
    total = weights.sum()
    # away from the boundaries, so float32 rounding of the targets cannot move a pick
    cumulative = np.cumsum(weights[weights > 0])
    lower = np.concatenate([[0.0], cumulative[:-1]])
    targets = (lower + 0.37 * (cumulative - lower)).astype(np.float32)
    s = run_sample_at(mixed_table, np.append(targets, [total * 2, -1.0]), priority_exponent=exponent)
    assert_picks(s, mixed_table, np.append(targets, [total * 2, -1.0]).astype(np.float32), exponent)
    np.testing.assert_array_equal(np.asarray(s.indices)[:-2], np.flatnonzero(weights > 0))


def test_sample_at_of_a_table_without_selectable_rows_gives_markers(make_table):
    table = make_table(capacity=8)
    targets = np.array([0.0, 1.0, 1e9, -1.0], np.float32)
    for _ in range(2):
        s = run_sample_at(table, targets, window=None)
        np.testing.assert_array_equal(np.asarray(s.indices), 0)
        np.testing.assert_array_equal(np.asarray(s.generations), 1)
        np.testing.assert_array_equal(np.asarray(s.probabilities), 0.0)
        np.testing.assert_array_equal(np.asarray(s.starts), 0)
        assert not bool(jax.jit(lambda s: gj.gather(table, s))(s)["valid"].any())
        table.insert(transitions(2), priorities=np.zeros(2, np.float32))  # committed, but priority 0


def test_markers_are_skipped_by_gather_and_update(make_table):
    table = make_table(capacity=8)
    table.insert(transitions(4))
    before = table.row_status()
    g = before["generation"]
    assert g[0] % 2 == 0  # a committed row 0, which the markers must not reach
    s = run_sample_at(table, np.array([-1.0, 0.5, np.nan, 3.5], np.float32))
    np.testing.assert_array_equal(np.asarray(s.indices), [0, 0, 0, 3])
    np.testing.assert_array_equal(np.asarray(s.generations), [1, g[0], 1, g[3]])
    valid = np.asarray(jax.jit(lambda s: gj.gather(table, s))(s)["valid"])
    np.testing.assert_array_equal(valid, [False, True, False, True])
    updated = jax.jit(lambda s: gj.update_priorities(table, s, jnp.full((4,), 7.0)))(s)
    assert int(updated) == 2
    np.testing.assert_array_equal(table.row_status()["priority"][:4], [7.0, 1.0, 1.0, 7.0])
    sampled = table.row_status()["times_sampled"][:4] - before["times_sampled"][:4]
    np.testing.assert_array_equal(sampled, [1, 0, 0, 1])  # real picks only


@pytest.mark.parametrize("exponent", [1.0, 0.5])
def test_sample_at_with_uniform_targets_follows_the_weights(make_table, exponent):
    table = make_table(capacity=32)
    priorities = np.random.default_rng(0).uniform(0.1, 3.0, 30).astype(np.float32)
    priorities[7] = 0.0
    table.insert(transitions(30), priorities=priorities)
    total, _ = jax.jit(lambda: total_weight(table, exponent))()

    @jax.jit
    def draw(key):
        u = jax.random.uniform(key, (2000,), jnp.float32)
        return sample_at(table, key, u * total, priority_exponent=exponent)

    counts = np.zeros(32, np.int64)
    for i in range(20):
        s = draw(jax.random.key(100 + i))
        counts += np.bincount(np.asarray(s.indices), minlength=32)
    weights = np.where(priorities > 0, priorities.astype(np.float64) ** exponent, 0.0)
    exact = weights / weights.sum()
    assert counts[30:].sum() == 0 and counts[7] == 0
    keep = exact > 0
    assert stats.chisquare(counts[:30][keep], exact[keep] * counts.sum()).pvalue > P_THRESHOLD
    np.testing.assert_allclose(np.asarray(s.probabilities), exact[np.asarray(s.indices)], rtol=1e-6)


def test_windows_are_valid_and_gather_returns_them(make_table):
    fields = {"t": gj.Field((), "int32")}
    table = make_table(fields=fields, capacity=16, max_steps=9)
    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 10, 12).astype(np.int32)
    lengths[:3] = [9, 4, 2]  # a full row, one exactly a window long, one shorter than the window
    steps = np.arange(9, dtype=np.int32)
    table.insert({"t": np.stack([steps + 100 * r for r in range(12)])}, lengths=lengths)
    targets = np.concatenate([np.arange(12) + 0.5, rng.uniform(0, 12, 200), [-1.0]]).astype(np.float32)
    s = run_sample_at(table, targets, key=7, window=4)
    assert s.window == 4
    rows, starts = np.asarray(s.indices), np.asarray(s.starts)
    np.testing.assert_array_equal(rows[:12], np.arange(12))
    mine = np.asarray(s.generations) % 2 == 0
    assert mine[:-1].all() and not mine[-1] and starts[-1] == 0
    assert (starts >= 0).all() and (starts[mine] <= np.maximum(lengths[rows[mine]] - 4, 0)).all()
    assert len(set(starts[rows == 0])) > 1  # starts are drawn, not fixed
    batch = jax.jit(lambda s: gj.gather(table, s))(s)
    valid, t = np.asarray(batch["valid"]), np.asarray(batch["t"])
    assert valid.shape == (len(targets), 4)
    offsets = starts[:, None] + np.arange(4)
    expected_valid = mine[:, None] & (offsets < lengths[rows][:, None])
    np.testing.assert_array_equal(valid, expected_valid)
    np.testing.assert_array_equal(t[valid], (100 * rows[:, None] + offsets)[valid])
    assert valid[mine].any(axis=1).all()  # every real pick's window holds at least one step
    # the same key draws the same starts
    np.testing.assert_array_equal(np.asarray(run_sample_at(table, targets, key=7, window=4).starts), starts)


def test_arguments_are_checked_at_trace_time(make_table):
    table = make_table(capacity=8, max_steps=3)
    key = jax.random.key(0)
    good = jnp.zeros((4,), jnp.float32)
    with pytest.raises(gj.InvalidArgumentError, match=r"sample_at: targets must be a float32 array"):
        sample_at(table, key, jnp.zeros((4,), jnp.int32))
    with pytest.raises(gj.InvalidArgumentError, match=r"sample_at: targets must be a float32 array"):
        sample_at(table, key, jnp.zeros((2, 2), jnp.float32))
    with pytest.raises(gj.InvalidArgumentError, match=r"sample_at: targets must be a float32 array"):
        sample_at(table, key, [0.0, 1.0])
    for bad in (-1.0, float("nan"), float("inf"), "x"):
        with pytest.raises(gj.InvalidArgumentError, match=r"sample_at: priority_exponent=.* must be finite"):
            sample_at(table, key, good, priority_exponent=bad)
        with pytest.raises(
            gj.InvalidArgumentError, match=r"total_weight: priority_exponent=.* must be finite"
        ):
            total_weight(table, bad)
    with pytest.raises(gj.InvalidArgumentError, match=r"sample_at: window=0 must be None or a positive int"):
        sample_at(table, key, good, window=0)
    with pytest.raises(
        gj.InvalidArgumentError, match=r"sample_at: window=4 is longer than the table's max_steps"
    ):
        sample_at(table, key, good, window=4)
    with pytest.raises(gj.InvalidArgumentError, match=r"total_weight: `table` must be a gear_jax.Table"):
        total_weight("table")
    table.close()
    with pytest.raises(gj.TableClosedError, match="sample_at: table .* is closed"):
        sample_at(table, key, good)
    with pytest.raises(gj.TableClosedError, match="total_weight: table .* is closed"):
        total_weight(table)


def test_overflows_are_errors(make_table):
    table = make_table(capacity=8)
    table.insert(transitions(2), priorities=np.full(2, 1e30, np.float32))
    assert run_total(table, 1.0)[0] == pytest.approx(2e30)
    with pytest.raises(gj.EXECUTION_ERRORS, match="gear_jax.total_weight: the sum .* overflows a float32"):
        run_total(table, 2.0)  # 2e60 fits a double, not a float32
    with pytest.raises(gj.EXECUTION_ERRORS, match="gear_jax.sample_at: the sum .* overflows a double"):
        run_sample_at(table, np.array([0.0], np.float32), priority_exponent=20.0)


def shard_map_check():
    """sample_at and total_weight inside jax.shard_map over 2 CPU devices, the same table captured in
    both shards: each shard answers its half of the targets as a single call would. Returns the number of
    checks made (needs 2 CPU devices)."""
    from jax.sharding import NamedSharding, PartitionSpec

    devices = jax.devices("cpu")[:2]
    mesh = jax.make_mesh((2,), ("x",), devices=devices)
    table = gj.Table.create(
        gj.TableSpec({"obs": gj.Field((3,), "float32"), "action": gj.Field((), "int32")}, capacity=64)
    )
    try:
        table.insert(transitions(50), priorities=np.arange(1, 51, dtype=np.float32) % 7)
        targets = np.random.default_rng(0).uniform(-50, 1100, 64).astype(np.float32)

        def body(t):
            s = sample_at(table, jax.random.key(0), t)
            total, count = total_weight(table)
            return s.indices, s.generations, s.probabilities, total[None], count[None]

        fn = jax.jit(
            jax.shard_map(
                body,
                mesh=mesh,
                in_specs=PartitionSpec("x"),
                out_specs=(PartitionSpec("x"),) * 5,
            )
        )
        sharded = jax.device_put(jnp.asarray(targets), NamedSharding(mesh, PartitionSpec("x")))
        indices, generations, probabilities, totals, counts = fn(sharded)
        single = jax.jit(lambda t: sample_at(table, jax.random.key(0), t))(jnp.asarray(targets))
        np.testing.assert_array_equal(np.asarray(indices), np.asarray(single.indices))
        np.testing.assert_array_equal(np.asarray(generations), np.asarray(single.generations))
        np.testing.assert_array_equal(np.asarray(probabilities), np.asarray(single.probabilities))
        rows, _, _ = reference_picks(table, targets)
        np.testing.assert_array_equal(np.asarray(indices), np.where(rows < 0, 0, rows))
        weights, selectable, _ = reference_weights(table, 1.0)
        np.testing.assert_array_equal(np.asarray(totals), [weights.sum()] * 2)
        np.testing.assert_array_equal(np.asarray(counts), [selectable.sum()] * 2)
        return 7
    finally:
        table.close()


def test_works_inside_shard_map():
    if len(jax.devices("cpu")) >= 2:
        assert shard_map_check() == 7
        return
    code = (
        "import json; from tests.unit import test_ops_sample_at as t; "
        "print(json.dumps({'checks': t.shard_map_check()}))"
    )
    env = dict(os.environ, JAX_NUM_CPU_DEVICES="2", JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"checks": 7}

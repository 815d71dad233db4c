"""Epochs without replacement (gj.epoch, gj.retire, gj.host.epoch, gj.host.retire, gj.torch.EpochSampler):
each selectable row once per epoch, the order a uniform permutation (chi-square), failed picks only after
the real ones, and retired rows never drawn again."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import gear_jax as gj
from tests.helpers.sampling import P_THRESHOLD

FIELDS = {"id": gj.Field((), "int32")}


def make(kind, capacity=16, rows=10, first_id=0):
    """A table of `kind` ("transitions", "padded" or "ring") holding `rows` rows whose ids are
    first_id.. (a trajectory row's steps are id * 100 + step)."""
    if kind == "transitions":
        table = gj.Table.create(gj.TableSpec(FIELDS, capacity=capacity))
    else:
        ring = capacity * 4 if kind == "ring" else None
        table = gj.Table.create(gj.TableSpec(FIELDS, capacity=capacity, max_steps=4, step_capacity=ring))
    fill(table, rows, first_id)
    return table


def fill(table, rows, first_id=0):
    ids = np.arange(first_id, first_id + rows, dtype=np.int32)
    if table.spec.is_trajectory:
        lengths = 1 + ids % 4
        steps = (ids[:, None] * 100 + np.arange(4)[None, :]).astype(np.int32)
        table.insert({"id": steps}, lengths=lengths)
    else:
        table.insert({"id": ids})


def ids_of(batch, trajectory):
    ids = np.asarray(batch["id"])
    return ids[..., 0] // 100 if trajectory else ids


def flat(x):
    """[M, mb, ...] -> [M * mb, ...]."""
    x = np.asarray(x)
    return x.reshape(-1, *x.shape[2:])


def jit_epoch(table, key, mb, **kwargs):
    """One epoch through jit: the picks and the gathered minibatches ([M, mb] ids and valid)."""
    return epoch_runner(table, mb, **kwargs)(key)


def epoch_runner(table, mb, **kwargs):
    """A jitted key -> (picks, ids, valid) of one epoch."""

    def run(k):
        picks = gj.epoch(table, k, mb, **kwargs)

        def step(carry, s):
            b = gj.gather(table, s)
            return carry, (b["id"], b["valid"])

        _, (ids, valid) = jax.lax.scan(step, 0, picks)
        return picks, ids, valid

    return jax.jit(run)


@pytest.mark.parametrize("kind", ["transitions", "padded", "ring"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_an_epoch_visits_each_row_once_in_minibatches(kind, drop_last):
    trajectory = kind != "transitions"
    with make(kind) as table:
        picks, ids, valid = jit_epoch(table, jax.random.key(0), 4, drop_last=drop_last)
        minibatches = 4 if drop_last else 4  # 16 rows by default: 16 // 4 == ceil(16 / 4)
        assert picks.indices.shape == (minibatches, 4)
        valid = flat(valid)
        if trajectory:
            valid = valid[:, 0]  # a whole row: step 0 is valid for every real pick
        got = ids_of({"id": flat(ids)}, trajectory)[valid]
        assert sorted(got.tolist()) == list(range(10))  # 10 rows, each once
        assert valid[:10].all() and not valid[10:].any()  # failed picks after the real ones
        assert (np.asarray(picks.generations).reshape(-1)[10:] % 2 == 1).all()
        assert got.tolist() != sorted(got.tolist())
        # Two keys, two orders; the same key, the same order.
        _, again, _ = jit_epoch(table, jax.random.key(0), 4, drop_last=drop_last)
        _, other, _ = jit_epoch(table, jax.random.key(1), 4, drop_last=drop_last)
        assert np.array_equal(np.asarray(again), np.asarray(ids))
        assert not np.array_equal(np.asarray(other), np.asarray(ids))


def test_drop_last_drops_random_rows_and_keeps_full_minibatches():
    with make("transitions", capacity=16, rows=10) as table:
        dropped = set()
        run = epoch_runner(table, 4, num_rows=10, drop_last=True)
        for seed in range(40):
            picks, ids, valid = run(jax.random.key(seed))
            assert picks.indices.shape == (2, 4) and np.asarray(valid).all()
            seen = np.asarray(ids).reshape(-1)
            assert len(set(seen.tolist())) == 8
            dropped |= set(range(10)) - set(seen.tolist())
        assert dropped == set(range(10))  # every row is dropped in some epoch
        picks, ids, valid = jit_epoch(table, jax.random.key(0), 4, num_rows=10, drop_last=False)
        assert picks.indices.shape == (3, 4) and np.asarray(valid).sum() == 10


def test_the_order_is_a_uniform_permutation():
    """Over 4 rows, each of the 24 orders is equally likely (chi-square over 4,800 epochs)."""
    with make("transitions", capacity=4, rows=4) as table:
        orders = jax.jit(lambda keys: jax.lax.map(lambda k: gj.epoch(table, k, 4).indices[0], keys))(
            jax.random.split(jax.random.key(7), 4800)
        )
        perms = {p: i for i, p in enumerate(itertools.permutations(range(4)))}
        counts = np.bincount([perms[tuple(o)] for o in np.asarray(orders).tolist()], minlength=24)
        assert stats.chisquare(counts).pvalue > P_THRESHOLD, counts


def test_num_rows_takes_the_newest_rows_the_latest_rollout():
    with make("transitions", capacity=32, rows=10) as table:
        fill(table, 6, first_id=100)  # the latest rollout: 6 rows
        _, ids, valid = jit_epoch(table, jax.random.key(0), 3, num_rows=6)
        assert np.asarray(valid).all() and sorted(np.asarray(ids).reshape(-1).tolist()) == list(
            range(100, 106)
        )
        host = gj.host.epoch(table, np.random.default_rng(0), 3, num_rows=6)
        got = np.concatenate([np.asarray(gj.host.gather(table, s)["id"]) for s in host])
        assert sorted(got.tolist()) == list(range(100, 106))


@pytest.mark.parametrize("kind", ["transitions", "ring"])
def test_retired_rows_are_never_drawn_again_and_the_next_rollout_takes_their_place(kind):
    trajectory = kind != "transitions"
    with make(kind, capacity=8, rows=8) as table:
        retired = jax.jit(lambda k: gj.retire(table, gj.epoch(table, k, 4)))(jax.random.key(0))
        assert int(retired) == 8 and (table.row_status()["priority"] == 0).all()
        with pytest.raises(gj.EXECUTION_ERRORS):
            jax.block_until_ready(jax.jit(lambda k: gj.sample(table, k, 1))(jax.random.key(0)))
        _, _, valid = jit_epoch(table, jax.random.key(1), 4)
        assert not np.asarray(valid).any()  # an epoch over no selectable row: every pick failed
        fill(table, 5, first_id=50)
        _, ids, valid = jit_epoch(table, jax.random.key(2), 4, drop_last=False)
        valid, ids = flat(valid), ids_of({"id": flat(ids)}, trajectory)
        if trajectory:
            valid = valid[:, 0]
        assert sorted(ids[valid].tolist()) == list(range(50, 55))


def test_a_stale_retire_leaves_a_row_written_since_alone():
    with make("transitions", capacity=4, rows=4) as table:
        picks = jax.jit(lambda k: gj.epoch(table, k, 4))(jax.random.key(0))
        fill(table, 2, first_id=10)  # rows 0 and 1 rewritten
        assert int(jax.jit(lambda s: gj.retire(table, s))(picks)) == 2
        status = table.row_status()
        assert (status["priority"][:2] > 0).all() and (status["priority"][2:] == 0).all()
        assert gj.host.retire(table, gj.host.epoch(table, np.random.default_rng(0), 2)) == 2
        assert (table.row_status()["priority"] == 0).all()


@pytest.mark.parametrize("kind", ["transitions", "padded", "ring"])
def test_host_epochs_visit_each_row_once_with_windows_inside_the_rows(kind):
    trajectory = kind != "transitions"
    window = 2 if trajectory else None
    with make(kind) as table:
        rng = np.random.default_rng(0)
        epoch = gj.host.epoch(table, rng, 3, drop_last=False, window=window)
        assert len(epoch) == math.ceil(16 / 3) and all(s.indices.shape == (3,) for s in epoch)
        batches = [gj.host.gather(table, s) for s in epoch]
        valid = np.concatenate([b["valid"] for b in batches])
        ids = np.concatenate([b["id"] for b in batches])
        if trajectory:
            steps = ids
            starts = np.concatenate([s.starts for s in epoch])
            lengths = 1 + (steps[:, 0] // 100) % 4
            real = valid[:, 0]
            # A window lies inside its row: it starts at or before length - window (0 when shorter).
            assert (starts[real] <= np.maximum(lengths[real] - window, 0)).all()
            assert (steps[real, 0] % 100 == starts[real]).all()
            ids, valid = steps[:, 0] // 100, real
        assert sorted(ids[valid].tolist()) == list(range(10)) and valid[:10].all() and not valid[10:].any()
        # Windows cover every start over many epochs (row 7: length 4, window 2: starts 0, 1, 2).
        if trajectory:
            seen = set()
            for _ in range(30):
                for s in gj.host.epoch(table, rng, 16, window=window):
                    seen |= set(s.starts[s.indices == held_row_of(table, 7)].tolist())
            assert seen == {0, 1, 2}


@pytest.mark.parametrize("kind", ["transitions", "padded", "ring"])
def test_host_epochs_take_samples_of_a_limited_table_as_jitted_epochs_do(kind):
    """With max_times_sampled=2 each row is in two epochs, then retired, whichever way the epochs run."""
    trajectory = kind != "transitions"
    window = 2 if trajectory else None
    max_steps = 4 if trajectory else 1
    ring = 64 if kind == "ring" else None
    spec = gj.TableSpec(FIELDS, capacity=16, max_steps=max_steps, step_capacity=ring)
    for jitted in (False, True):
        with gj.Table.create(spec, max_times_sampled=2) as table:
            fill(table, 10)
            rng = np.random.default_rng(1)
            seen = []
            for e in range(3):
                if jitted:
                    picks, ids, valid = jit_epoch(table, jax.random.key(e), 4, drop_last=False, window=window)
                    ids, valid = flat(ids), flat(valid)
                    starts = flat(picks.starts)
                else:
                    epoch = gj.host.epoch(table, rng, 4, drop_last=False, window=window)
                    batches = [gj.host.gather(table, s) for s in epoch]
                    ids = np.concatenate([b["id"] for b in batches])
                    valid = np.concatenate([b["valid"] for b in batches])
                    starts = np.concatenate([s.starts for s in epoch])
                if trajectory:
                    real = valid[:, 0]
                    lengths = 1 + (ids[:, 0] // 100) % 4
                    assert (starts[real] <= np.maximum(lengths[real] - window, 0)).all()
                    assert (ids[real, 0] % 100 == starts[real]).all()
                    ids, valid = ids[:, 0] // 100, real
                seen.append(sorted(ids[valid].tolist()))
            assert seen == [list(range(10)), list(range(10)), []], (jitted, seen)
            status = table.row_status()
            assert (status["times_sampled"][status["length"] > 0] == 2).all()
            assert (status["priority"] == 0).all()


def held_row_of(table, row_id):
    """The row that holds the trajectory whose id is row_id."""
    for row in range(table.capacity):
        batch = gj.host.gather(
            table,
            gj.Sample(
                np.array([row], np.int32),
                table.row_status()["generation"][[row]],
                np.ones(1, np.float32),
                np.zeros(1, np.int32),
            ),
        )
        if batch["valid"][0, 0] and batch["id"][0, 0] // 100 == row_id:
            return row
    raise AssertionError(f"no row holds {row_id}")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"minibatch_size": 0}, r"minibatch_size=0 must be an int"),
        ({"minibatch_size": 4, "num_rows": 17}, r"num_rows=17 is more than the table's 16 rows"),
        ({"minibatch_size": 4, "num_rows": 0}, r"num_rows=0 must be an int >= 1"),
        ({"minibatch_size": 4, "drop_last": 1}, r"drop_last=1 must be True or False"),
        ({"minibatch_size": 8, "num_rows": 4}, r"minibatch_size=8 is more than num_rows=4"),
        ({"minibatch_size": 4, "window": 9}, r"epoch: window=9"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, message):
    with make("padded") as table:
        with pytest.raises(gj.InvalidArgumentError, match=message):
            jax.jit(lambda k: gj.epoch(table, k, **kwargs))(jax.random.key(0))
        with pytest.raises(gj.InvalidArgumentError, match=message):
            gj.host.epoch(table, np.random.default_rng(0), **kwargs)


def test_torch_epoch_sampler_gives_each_row_once_per_epoch_and_retires_them():
    torch = pytest.importorskip("torch")
    with make("transitions") as table:
        sampler = gj.torch.EpochSampler(table, 4, num_rows=10, drop_last=False, seed=3)
        assert len(sampler) == 3
        orders = []
        for _ in range(2):
            batches = list(sampler)
            assert len(batches) == 3 and all(isinstance(b["id"], torch.Tensor) for b in batches)
            ids = torch.cat([b["id"][b["valid"]] for b in batches]).tolist()
            assert sorted(ids) == list(range(10))
            orders.append(ids)
        assert orders[0] != orders[1]  # a fresh permutation per epoch
        assert sampler.retire() == 10
        assert not any(b["valid"].any() for b in sampler)
        with pytest.raises(gj.InvalidArgumentError, match="no epoch was drawn yet"):
            gj.torch.EpochSampler(table, 4).retire()


def test_an_epoch_inside_a_jitted_step_runs_after_the_insert_it_names():
    """A rollout inserted inside jit, then its epoch (after=): the epoch sees the rows just written."""
    with gj.Table.create(gj.TableSpec(FIELDS, capacity=8)) as table:

        def step(ids, key):
            written = gj.insert(table, {"id": ids})
            picks = gj.epoch(table, key, 4, after=written)
            return gj.gather(table, jax.tree_util.tree_map(jnp.ravel, picks))["id"]

        got = jax.jit(step)(jnp.arange(8, dtype=jnp.int32) + 20, jax.random.key(0))
        assert sorted(np.asarray(got).tolist()) == list(range(20, 28))


@pytest.mark.parametrize("shuffle", ["native", "by_sort"])
def test_both_shuffles_put_real_picks_first_in_a_uniform_order(shuffle):
    """The CPU's native shuffle and the sort path GPUs take: over 4 real picks among 6 (two failed, at
    positions 1 and 4), each of the 24 orders of the real ones equally likely (chi-square over 4,800
    keys), the failed ones after them."""
    from gear_jax import epochs

    fn = epochs.shuffle_real_first if shuffle == "native" else epochs.shuffle_by_sort
    generations = jnp.asarray([2, 1, 4, 6, 3, 8], jnp.uint32)
    orders = np.asarray(
        jax.jit(lambda keys: jax.lax.map(lambda k: fn(k, generations), keys))(
            jax.random.split(jax.random.key(3), 4800)
        )
    )
    assert (np.sort(orders[:, 4:], axis=1) == [1, 4]).all()
    perms = {p: i for i, p in enumerate(itertools.permutations([0, 2, 3, 5]))}
    counts = np.bincount([perms[tuple(o)] for o in orders[:, :4].tolist()], minlength=24)
    assert stats.chisquare(counts).pvalue > P_THRESHOLD, counts


def test_a_bad_key_or_sample_is_refused_by_name():
    with make("transitions") as table:
        with pytest.raises(gj.InvalidArgumentError, match="key must be a JAX PRNG key"):
            gj.epoch(table, 0, 4)
        for bad in (None, {"indices": np.zeros(2, np.int32)}):
            with pytest.raises(gj.InvalidArgumentError, match="retire: sample must be a gear_jax.Sample"):
                gj.retire(table, bad)
            with pytest.raises(gj.InvalidArgumentError, match="samples must be a gear_jax.Sample or a list"):
                gj.host.retire(table, bad)
        # numpy's bools are bools
        assert len(gj.host.epoch(table, np.random.default_rng(0), 4, drop_last=np.bool_(True))) == 4


def test_a_host_retire_of_a_list_checks_every_sample_before_it_retires_any():
    with make("transitions") as table:
        good = gj.host.sample(table, np.random.default_rng(0), 3, method="fifo")
        with pytest.raises(gj.InvalidArgumentError, match="must be a gear_jax.Sample, got int"):
            gj.host.retire(table, [good, 5])
        assert (table.row_status()["priority"][:10] == 1).all()  # nothing retired
        assert gj.host.retire(table, [good]) == 3
        assert (table.row_status()["priority"][good.indices] == 0).sum() == 3

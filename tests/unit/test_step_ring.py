"""Step-ring trajectory tables: episodes back to back in one ring of steps, with an index of episodes.

The ring is checked against a numpy reference model of the ring and its index (`RingModel`), driven by
hypothesis sequences of inserts, step-by-step writers (ended or abandoned), one-step adds and samples;
every sampling law with windows against its exact distribution (chi-square); and the API around it:
refusals, jit inserts with lengths, priorities, the pool, the rate limiter, the host calls and torch.
"""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

import gear_jax as gj
from gear_jax.errors import InvalidArgumentError, SpecError

from ..helpers.sampling import P_THRESHOLD

FIELDS = {"episode": gj.Field((), "int32"), "step": gj.Field((), "int32"), "obs": gj.Field((3,), "float32")}


def ring_spec(capacity, step_capacity, max_steps=None):
    return gj.TableSpec(FIELDS, capacity=capacity, step_capacity=step_capacity, max_steps=max_steps)


def episode_steps(episode, length):
    """The steps of episode `episode`: each step names its episode and its index."""
    steps = np.arange(length, dtype=np.int32)
    obs = np.stack([np.full(length, episode), steps, np.full(length, -1)], axis=1).astype(np.float32)
    return {"episode": np.full(length, episode, np.int32), "step": steps, "obs": obs}


def padded_batch(episodes, lengths):
    """A [B, T] batch of the episodes, padded to the longest."""
    longest = max(lengths)
    out = {name: np.zeros((len(episodes), longest, *f.shape), f.dtype) for name, f in FIELDS.items()}
    for i, (episode, length) in enumerate(zip(episodes, lengths)):
        for name, values in episode_steps(episode, length).items():
            out[name][i, :length] = values
    return out


class RingModel:
    """What a step ring holds after a sequence of writes by one process: the row cursor, the step
    cursor and the retirement of xla_ffi/step_ring.cc (chunks of episodes, a sixteenth of slack)."""

    def __init__(self, capacity, step_capacity):
        self.capacity, self.ring = capacity, step_capacity
        self.next_row = 0
        self.next_step = 0
        self.retired_below = 0
        self.insert_seq = 0
        self.rows = [None] * capacity  # row -> (episode id, first step, length, priority, insert_seq)
        self.steps = {name: np.zeros((step_capacity, *f.shape), f.dtype) for name, f in FIELDS.items()}

    def insert(self, episodes, lengths, priorities):
        max_rows = max(1, min(256, self.capacity // 8))
        max_steps = max(1, self.ring // 4)
        b = 0
        while b < len(episodes):
            want, want_steps = 1, lengths[b]
            while (
                want < max_rows and b + want < len(episodes) and want_steps + lengths[b + want] <= max_steps
            ):
                want_steps += lengths[b + want]
                want += 1
            rows = [(self.next_row + k) % self.capacity for k in range(want)]
            self.next_row += want
            for row in rows:
                self.rows[row] = None
            start, total = self.next_step, sum(lengths[b : b + want])
            self.next_step += total
            end = start + total
            if end > self.ring and self.retired_below < end - self.ring:
                target = min(end - self.ring + self.ring // 16, start)
                for row, held in enumerate(self.rows):
                    if held is not None and held[1] < target:
                        self.rows[row] = None
                self.retired_below = max(self.retired_below, target)
            first = start
            for k, row in enumerate(rows):
                episode, length = episodes[b + k], lengths[b + k]
                for name, values in episode_steps(episode, length).items():
                    slots = (first + np.arange(length)) % self.ring
                    self.steps[name][slots] = values
                self.insert_seq += 1
                self.rows[row] = (episode, first, length, priorities[b + k], self.insert_seq)
                first += length
            b += want

    def live(self):
        return {row: held for row, held in enumerate(self.rows) if held is not None}


def assert_matches(table, model):
    status = table.row_status()
    live = model.live()
    for row in range(model.capacity):
        assert status["generation"][row] % 2 == 0
        if row in live:
            episode, first, length, priority, seq = live[row]
            assert status["length"][row] == length, (row, live[row])
            assert status["first_step"][row] == first
            assert status["priority"][row] == np.float32(priority)
            assert status["insert_seq"][row] == seq
        else:
            assert status["length"][row] == 0 and status["priority"][row] == 0
    for name in FIELDS:
        np.testing.assert_array_equal(table.columns[name], model.steps[name])
    assert table.size == len(live)


def check_windows(table, model, sample, batch, window, short_episodes):
    """Every pick is a window of a live episode that never leaves it, with that episode's data."""
    live = model.live()
    starts, rows = np.asarray(sample.starts), np.asarray(sample.indices)
    for i, row in enumerate(rows):
        episode, first, length, priority, seq = live[int(row)]
        start = int(starts[i])
        assert int(np.asarray(sample.lengths)[i]) == length
        if short_episodes == "skip":
            assert length >= window and 0 <= start <= length - window
        else:
            assert 0 <= start <= max(length - window, 0)
        steps = min(window, length - start)
        valid = np.asarray(batch["valid"][i])
        assert valid[:steps].all() and not valid[steps:].any()
        np.testing.assert_array_equal(np.asarray(batch["episode"][i, :steps]), episode)
        np.testing.assert_array_equal(np.asarray(batch["step"][i, :steps]), np.arange(start, start + steps))
        np.testing.assert_array_equal(np.asarray(batch["episode"][i, steps:]), 0)


operations = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.lists(st.integers(1, 12), min_size=1, max_size=6)),
        st.tuples(st.just("write"), st.integers(1, 12), st.booleans()),  # steps, end (else abandon)
        st.tuples(st.just("add"), st.integers(1, 4)),  # Table.add of a whole episode
        st.tuples(st.just("sample"), st.integers(1, 6), st.sampled_from(["pad", "skip"])),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    capacity=st.integers(2, 12),
    step_capacity=st.integers(12, 48),
    ops=operations,
    seed=st.integers(0, 2**31 - 1),
)
def test_ring_matches_reference_model(capacity, step_capacity, ops, seed):
    """Exact ring contents and index after every write, and every sampled window a window of a live
    episode with its own data, for any sequence of inserts, writers and samples."""
    model = RingModel(capacity, step_capacity)
    priorities = np.random.default_rng(seed)
    next_episode = 1
    with gj.Table.create(ring_spec(capacity, step_capacity, max_steps=12), reuse=False) as table:
        for op in ops:
            if op[0] == "insert":
                lengths = op[1]
                episodes = list(range(next_episode, next_episode + len(lengths)))
                next_episode += len(lengths)
                p = priorities.uniform(0.5, 2.0, len(lengths)).astype(np.float32)
                table.insert(padded_batch(episodes, lengths), lengths=np.array(lengths), priorities=p)
                model.insert(episodes, lengths, list(p))
            elif op[0] == "write":
                steps, end = op[1], op[2]
                writer = table.writer()
                for name_values in [episode_steps(next_episode, steps)]:
                    for k in range(steps):
                        writer.append({name: values[k] for name, values in name_values.items()})
                if end:
                    row = writer.end_episode(priority=1.5)
                    model.insert([next_episode], [steps], [1.5])
                    assert model.rows[row][0] == next_episode
                writer.close()
                next_episode += 1
            elif op[0] == "add":
                table.add(episode_steps(next_episode, op[1]), priority=0.75)
                model.insert([next_episode], [op[1]], [0.75])
                next_episode += 1
            else:
                window, short = op[1], op[2]
                eligible = [h for h in model.live().values() if short == "pad" or h[2] >= window]
                if not eligible:
                    continue
                key = jax.random.key(int(priorities.integers(2**31)))
                sample, batch = gj.sample_gather(table, key, 16, window=window, short_episodes=short)
                check_windows(table, model, sample, batch, window, short)
            assert_matches(table, model)


# -- sampling laws ----------------------------------------------------------------------------------


def filled_ring(lengths, priorities=None, step_capacity=4096, capacity=256):
    table = gj.Table.create(ring_spec(capacity, step_capacity, max_steps=max(lengths)), reuse=False)
    table.insert(
        padded_batch(list(range(len(lengths))), lengths), lengths=np.array(lengths), priorities=priorities
    )
    return table


LENGTHS = [1, 3, 5, 7, 8, 9, 12, 16, 20, 25, 31, 40]


def window_counts(table, window, draws, method="uniform", short_episodes="pad", host=False, **kwargs):
    """How often each (episode, start) was drawn, from the gathered steps themselves."""
    counts = {}
    batch_size = 2000
    fn = jax.jit(
        lambda k: gj.sample_gather(
            table, k, batch_size, method=method, window=window, short_episodes=short_episodes, **kwargs
        )[1]
    )
    for i in range(draws // batch_size):
        if host:
            rng = np.random.default_rng(i)
            batch = gj.host.sample_gather(
                table, rng, batch_size, method=method, window=window, short_episodes=short_episodes, **kwargs
            )[1]
        else:
            batch = fn(jax.random.key(i))
        for episode, step in zip(np.asarray(batch["episode"][:, 0]), np.asarray(batch["step"][:, 0])):
            counts[(int(episode), int(step))] = counts.get((int(episode), int(step)), 0) + 1
    return counts


def chi_square(counts, exact):
    """p-value of the counts against the exact law {(episode, start): probability}; no draw outside it."""
    assert set(counts) <= set(exact), set(counts) - set(exact)
    keys = sorted(exact)
    observed = np.array([counts.get(k, 0) for k in keys])
    expected = np.array([exact[k] for k in keys]) * observed.sum()
    return stats.chisquare(observed, expected).pvalue


@pytest.mark.parametrize("short_episodes", ["pad", "skip"])
@pytest.mark.parametrize("host", [False, True], ids=["jit", "host"])
def test_uniform_windows_are_uniform_over_every_valid_start(short_episodes, host):
    """As a slice sampler over steps: every valid window of the table equally likely; episodes shorter
    than the window give one padded window ("pad") or none ("skip")."""
    window = 8
    with filled_ring(LENGTHS) as table:
        windows = []
        for episode, length in enumerate(LENGTHS):
            if length >= window:
                windows += [(episode, s) for s in range(length - window + 1)]
            elif short_episodes == "pad":
                windows.append((episode, 0))
        exact = {w: 1 / len(windows) for w in windows}
        counts = window_counts(table, window, 60_000, short_episodes=short_episodes, host=host)
        assert chi_square(counts, exact) > P_THRESHOLD


def test_prioritized_windows_pick_the_episode_by_priority_then_a_uniform_start():
    window, exponent = 6, 0.7
    priorities = np.random.default_rng(3).uniform(0.2, 3.0, len(LENGTHS)).astype(np.float32)
    with filled_ring(LENGTHS, priorities=priorities) as table:
        weights = priorities.astype(np.float64) ** exponent
        exact = {}
        for episode, length in enumerate(LENGTHS):
            starts = max(length - window, 0) + 1
            for s in range(starts):
                exact[(episode, s)] = weights[episode] / weights.sum() / starts
        counts = window_counts(table, window, 60_000, method="prioritized", priority_exponent=exponent)
        assert chi_square(counts, exact) > P_THRESHOLD


def test_uniform_without_a_window_picks_episodes_uniformly():
    with filled_ring(LENGTHS) as table:
        fn = jax.jit(lambda k: gj.sample(table, k, 4000))
        counts = sum(np.bincount(np.asarray(fn(jax.random.key(i)).indices), minlength=256) for i in range(10))
        n = len(LENGTHS)
        assert counts[n:].sum() == 0
        assert stats.chisquare(counts[:n]).pvalue > P_THRESHOLD


@pytest.mark.parametrize("method", ["fifo", "lifo", "topk"])
def test_ordered_methods_skip_short_episodes(method):
    priorities = np.arange(1, len(LENGTHS) + 1, dtype=np.float32)[::-1].copy()
    window = 10
    with filled_ring(LENGTHS, priorities=priorities) as table:
        long_enough = [e for e, length in enumerate(LENGTHS) if length >= window]
        order = {"fifo": long_enough, "lifo": long_enough[::-1]}
        order["topk"] = sorted(long_enough, key=lambda e: -priorities[e])
        s = gj.sample(table, jax.random.key(0), 3, method=method, window=window, short_episodes="skip")
        assert list(np.asarray(s.indices)) == order[method][:3]
        padded = gj.sample(table, jax.random.key(0), 3, method=method, window=window)
        everyone = {"fifo": list(range(len(LENGTHS))), "lifo": list(range(len(LENGTHS)))[::-1]}
        everyone["topk"] = sorted(range(len(LENGTHS)), key=lambda e: -priorities[e])
        assert list(np.asarray(padded.indices)) == everyone[method][:3]


@pytest.mark.parametrize("method", ["uniform", "prioritized", "fifo", "lifo", "topk"])
def test_samples_carry_the_length_of_each_picked_episode(method):
    with filled_ring(LENGTHS) as table:
        s = gj.sample(table, jax.random.key(0), 8, method=method, window=5)
        np.testing.assert_array_equal(np.asarray(s.lengths), np.array(LENGTHS)[np.asarray(s.indices)])
        host = gj.host.sample(table, np.random.default_rng(0), 8, method=method, window=5)
        np.testing.assert_array_equal(host.lengths, np.array(LENGTHS)[host.indices])
        fused, _ = gj.sample_gather(table, jax.random.key(1), 8, method=method, window=5)
        np.testing.assert_array_equal(np.asarray(fused.lengths), np.array(LENGTHS)[np.asarray(fused.indices)])
        draw = gj.host.Sampler(table, 8, method=method, window=5)
        picked, _ = draw()
        np.testing.assert_array_equal(picked.lengths, np.array(LENGTHS)[picked.indices])


def test_prioritized_skip_is_refused_by_name():
    with filled_ring(LENGTHS) as table:
        with pytest.raises(InvalidArgumentError, match="priority 0"):
            gj.sample(table, jax.random.key(0), 4, method="prioritized", window=4, short_episodes="skip")
        with pytest.raises(InvalidArgumentError, match="short_episodes"):
            gj.sample(table, jax.random.key(0), 4, window=4, short_episodes="drop")


# -- writing ----------------------------------------------------------------------------------------


def test_spec_of_a_step_ring():
    spec = ring_spec(capacity=10, step_capacity=100)
    assert spec.step_ring and spec.is_trajectory and spec.max_steps == 100
    assert gj.TableSpec.from_json(spec.to_json()) == spec
    padded = gj.TableSpec(FIELDS, capacity=10, max_steps=5)
    assert not padded.step_ring and "step_capacity" not in padded.to_json()
    with pytest.raises(SpecError, match="at most step_capacity"):
        ring_spec(capacity=10, step_capacity=100, max_steps=101)
    with pytest.raises(SpecError, match="step_capacity"):
        ring_spec(capacity=10, step_capacity=0)


def test_memory_is_the_ring_and_the_index_not_capacity_times_max_steps():
    step_capacity, capacity = 1 << 16, 1024
    spec = gj.TableSpec({"x": gj.Field((256,), "float32")}, capacity=capacity, step_capacity=step_capacity)
    padded = gj.TableSpec(
        {"x": gj.Field((256,), "float32")}, capacity=capacity, max_steps=step_capacity // 16
    )
    with gj.Table.create(spec, reuse=False) as ring, gj.Table.create(padded, reuse=False) as rows:
        steps = step_capacity * 1024
        assert steps <= ring.nbytes <= 1.01 * steps + 64 * capacity + (1 << 20)
        assert rows.nbytes >= 4 * steps  # padded: capacity x max_steps steps


def test_an_episode_longer_than_max_steps_is_refused_and_nothing_is_written():
    with gj.Table.create(ring_spec(capacity=4, step_capacity=32, max_steps=8), reuse=False) as table:
        with pytest.raises(InvalidArgumentError, match="max_steps"):
            table.insert(padded_batch([1, 2], [3, 9]), lengths=np.array([3, 9]))
        with pytest.raises(InvalidArgumentError, match="max_steps"):
            table.insert(padded_batch([1], [9]))
        assert table.size == 0 and not table.columns["episode"].any()
        writer = table.writer()
        for k in range(8):
            writer.append({n: v[k] for n, v in episode_steps(5, 8).items()})
        with pytest.raises(InvalidArgumentError, match="max_steps"):
            writer.append({n: v[0] for n, v in episode_steps(5, 1).items()})
        writer.end_episode()
        assert table.size == 1


def test_episode_writer_takes_every_kind_of_value():
    with gj.Table.create(ring_spec(capacity=4, step_capacity=32), reuse=False) as table:
        with table.writer() as writer:
            writer.append({"episode": 7, "step": 0, "obs": [7.0, 0.0, -1.0]})  # Python values
            writer.append(
                {"episode": np.int64(7), "step": np.int32(1), "obs": np.array([7, 1, -1], np.float32)}
            )
            writer.append(_Mapping({"episode": 7, "step": 2, "obs": np.float64([7, 2, -1])}))
            assert writer.steps == 3
            row = writer.end_episode(priority=2.0)
        status = table.row_status()
        assert status["length"][row] == 3 and status["priority"][row] == 2.0
        np.testing.assert_array_equal(table.columns["step"][:3], [0, 1, 2])
        np.testing.assert_array_equal(table.columns["obs"][2], [7, 2, -1])


class _Mapping(dict):
    """A mapping that is not exactly a dict: the writer's general path."""


def test_an_abandoned_episode_leaves_nothing_behind():
    with gj.Table.create(ring_spec(capacity=4, step_capacity=32), reuse=False) as table:
        writer = table.writer()
        for k in range(5):
            writer.append({n: v[k] for n, v in episode_steps(1, 5).items()})
        writer.close()
        assert table.size == 0 and not table.columns["episode"].any()
        assert table.native.cursors() == (0, 0)
        writer = table.writer()
        writer.append({n: v[0] for n, v in episode_steps(2, 1).items()})
        assert writer.end_episode() == 0 and table.row_status()["first_step"][0] == 0


def test_jit_insert_with_lengths_writes_episodes_into_the_ring():
    with gj.Table.create(ring_spec(capacity=8, step_capacity=64, max_steps=10), reuse=False) as table:
        batch = {n: jnp.asarray(v) for n, v in padded_batch([1, 2, 3], [4, 10, 2]).items()}
        rows = jax.jit(lambda b: gj.insert(table, b, lengths=jnp.array([4, 10, 2])))(batch)
        rows = np.asarray(rows)
        status = table.row_status()
        np.testing.assert_array_equal(status["length"][rows], [4, 10, 2])
        np.testing.assert_array_equal(status["first_step"][rows], [0, 4, 14])
        np.testing.assert_array_equal(table.columns["episode"][:16], [1] * 4 + [2] * 10 + [3] * 2)


def test_update_priorities_ignores_windows_of_retired_episodes():
    with gj.Table.create(ring_spec(capacity=8, step_capacity=40, max_steps=16), reuse=False) as table:
        table.insert(padded_batch([1, 2], [16, 16]), lengths=np.array([16, 16]))
        s = gj.sample(table, jax.random.key(0), 2, method="fifo", window=4)
        np.testing.assert_array_equal(np.asarray(s.indices), [0, 1])
        table.insert(padded_batch([3], [16]), lengths=np.array([16]))  # steps 32..47 retire episode 1
        batch = gj.gather(table, s)
        np.testing.assert_array_equal(np.asarray(batch["valid"]).all(axis=1), [False, True])
        assert not np.asarray(batch["episode"][0]).any()  # an invalid window comes back zeroed
        gj.update_priorities(table, s, jnp.full((2,), 5.0))
        np.testing.assert_array_equal(table.row_status()["priority"][:3], [0.0, 5.0, 1.0])


def test_windows_wrap_the_end_of_the_ring():
    with gj.Table.create(ring_spec(capacity=8, step_capacity=20, max_steps=10), reuse=False) as table:
        table.insert(padded_batch([1, 2], [8, 8]), lengths=np.array([8, 8]))
        table.insert(padded_batch([3], [10]), lengths=np.array([10]))  # steps 16..25: slots 16..19, 0..5
        row = int(np.flatnonzero(table.row_status()["first_step"] == 16)[0])
        s = gj.Sample(
            indices=jnp.array([row], jnp.int32),
            generations=jnp.array([table.row_status()["generation"][row]], jnp.uint32),
            probabilities=jnp.ones((1,), jnp.float32),
            starts=jnp.array([2], jnp.int32),
        )
        batch = gj.gather(table, s, window=8)
        np.testing.assert_array_equal(np.asarray(batch["episode"][0]), 3)
        np.testing.assert_array_equal(np.asarray(batch["step"][0]), np.arange(2, 10))
        host = gj.host.gather(table, s, window=8)
        np.testing.assert_array_equal(host["step"][0], np.arange(2, 10))
        subset = gj.gather(table, s, fields=["step"], window=8)  # a subset of the fields
        assert set(subset) == {"step", "valid"} and np.asarray(subset["valid"]).all()
        np.testing.assert_array_equal(np.asarray(subset["step"][0]), np.arange(2, 10))


def test_pool_reuse_gives_an_empty_ring():
    spec = ring_spec(capacity=8, step_capacity=64)
    first = gj.Table.create(spec)
    first.insert(padded_batch([1, 2], [30, 30]), lengths=np.array([30, 30]))
    first.close()
    with gj.Table.create(spec) as again:
        assert again.size == 0 and again.native.cursors()[0] == 0
        again.insert(padded_batch([3], [5]), lengths=np.array([5]))
        assert again.row_status()["first_step"][0] == 0
        s, batch = gj.sample_gather(again, jax.random.key(0), 4, window=5)
        np.testing.assert_array_equal(np.asarray(batch["episode"]), 3)


def test_rate_limiter_counts_episodes_of_a_ring():
    limiter = gj.RateLimiter(min_size_to_sample=2)
    with gj.Table.create(ring_spec(capacity=8, step_capacity=64), reuse=False, rate_limiter=limiter) as table:
        assert not table.can_sample(1)
        with table.writer() as writer:
            writer.append({n: v[0] for n, v in episode_steps(1, 1).items()})
            writer.end_episode()
        table.insert(padded_batch([2], [3]), lengths=np.array([3]))
        assert table.rate_limiter_counts().inserts == 2 and table.can_sample(1)


def test_torch_sampler_gives_windows_of_a_ring():
    torch = pytest.importorskip("torch")
    with filled_ring(LENGTHS) as table:
        sampler = gj.torch.Sampler(table, 32, window=8, short_episodes="skip")
        batch = next(iter(sampler))
        assert isinstance(batch["step"], torch.Tensor) and tuple(batch["step"].shape) == (32, 8)
        steps = batch["step"].numpy()
        assert (np.diff(steps, axis=1) == 1).all() and batch["valid"].numpy().all()
        # Where each window lies in its episode: starts and lengths, beside the fields.
        np.testing.assert_array_equal(batch["starts"].numpy(), steps[:, 0])
        lengths = table.row_status()["length"][batch["indices"].numpy()]
        np.testing.assert_array_equal(batch["lengths"].numpy(), lengths)
        assert (batch["starts"].numpy() + 8 <= lengths).all()
        assert "starts" not in next(iter(gj.torch.Sampler(table, 4)))  # without a window: whole episodes
    fields = {"starts": gj.Field((), "int32"), "x": gj.Field((), "float32")}
    with gj.Table.create(gj.TableSpec(fields, capacity=4, step_capacity=64), reuse=False) as table:
        clash = r"field 'starts' would be replaced .* 'starts': the int32 step of"
        with pytest.raises(gj.InvalidArgumentError, match=clash):
            gj.torch.Sampler(table, 4, window=2)
        gj.torch.Sampler(table, 4, window=2, fields=["x"])  # left out: no clash
        gj.torch.Sampler(table, 4)  # no window, no starts key


SHARDED = """
    import json, sys
    import jax, numpy as np, gear_jax as gj
    from jax.sharding import Mesh, PartitionSpec as P
    from gear_jax import sharded

    ring = sys.argv[1] == "ring"
    mesh = Mesh(np.array(jax.devices()), ("d",))
    spec = gj.TableSpec({"t": gj.Field((), "int32")}, capacity=32, max_steps=40,
                        **({"step_capacity": 256} if ring else {}))
    st = sharded.ShardedTable.create(spec, mesh, "d")
    for s, lengths in enumerate(json.loads(sys.argv[2])):
        lengths = np.array(lengths)
        t = np.zeros((len(lengths), 40), np.int32)
        for i, length in enumerate(lengths):
            t[i, :length] = 1000 * (10 * s + i) + np.arange(length)
        st.shard(s).insert({"t": t}, lengths=lengths)

    def draw(method, mode, short_episodes, calls):
        def body(key):
            smp, batch = sharded.sample(st, key, 64, method=method, mode=mode, window=6,
                                        short_episodes=short_episodes)
            return batch["t"], batch["valid"], smp.probabilities
        mapped = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=(P("d"),) * 3))
        out = [mapped(jax.random.key(k)) for k in range(calls)]
        return [np.concatenate([np.asarray(o[n]) for o in out]) for n in range(3)]

    for method, mode, short in [("uniform", "local", "skip"), ("prioritized", "global", "pad"),
                                ("uniform", "global", "skip"), ("uniform", "global", "pad")]:
        t, valid, probabilities = draw(method, mode, short, 1 if mode == "local" else 150)
        for row, ok in zip(t, valid):
            n = ok.sum()
            assert ok[:n].all() and n >= (6 if short == "skip" else 5)
            assert (np.diff(row[:n]) == 1).all() and len(set(row[:n] // 1000)) == 1
        assert (probabilities > 0).all()
        print(method, mode, short, "shards", sorted(set((t[valid] // 10000).tolist())))
        if method == "uniform" and mode == "global":  # (shard, episode, start) of every window
            print("windows", short, json.dumps(np.unique(t[:, 0], return_counts=True)[1].tolist()),
                  json.dumps(np.unique(t[:, 0]).tolist()))
"""

SHARD_LENGTHS = [[5, 12, 20], [30, 8]]  # episodes of each of two shards; windows of 6 steps


def window_law(lengths, short_episodes, ring):
    """{first step's value: probability} of one table holding every shard's episodes: every valid
    window start equally likely in a step ring, rows uniform then a start in a padded table."""
    cells = {}
    rows = [
        (s, i, n)
        for s, shard in enumerate(lengths)
        for i, n in enumerate(shard)
        if short_episodes == "pad" or n >= 6
    ]
    windows = sum(max(n - 5, 1) for _, _, n in rows)
    for s, i, n in rows:
        for start in range(max(n - 5, 1)):
            cells[1000 * (10 * s + i) + start] = 1 / windows if ring else 1 / len(rows) / max(n - 5, 1)
    return cells


@pytest.mark.parametrize("kind", ["ring", "padded"])
def test_sharded_uniform_windows_follow_the_one_table_law(kind):
    """A ShardedTable of two shards: local uniform windows and global prioritized windows stay inside
    episodes and come from both shards; global uniform windows (a step ring's law: every valid window
    start of every shard equally likely; short_episodes="skip" on padded rows: rows with a window
    uniform, then a start) follow the law of one table holding both shards, by chi-square."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SHARDED), kind, json.dumps(SHARD_LENGTHS)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for label in (
        "uniform local skip",
        "prioritized global pad",
        "uniform global skip",
        "uniform global pad",
    ):
        assert f"{label} shards [0, 1]" in done.stdout, done.stdout
    for short in ("skip", "pad"):
        if kind == "padded" and short == "pad":
            law = window_law(SHARD_LENGTHS, short, ring=False)  # rows uniform: today's global draw
        else:
            law = window_law(SHARD_LENGTHS, short, ring=kind == "ring")
        line = next(x for x in done.stdout.splitlines() if x.startswith(f"windows {short} "))
        counts_text, values_text = line.split(" ", 2)[2].rsplit(" [", 1)
        observed = dict(zip(json.loads("[" + values_text), json.loads(counts_text)))
        assert set(observed) <= set(law), sorted(set(observed) - set(law))
        keys = sorted(law)
        counts = np.array([observed.get(k, 0) for k in keys])
        expected = np.array([law[k] for k in keys]) * counts.sum()
        assert stats.chisquare(counts, expected).pvalue > P_THRESHOLD, (short, counts, expected.round(1))


@pytest.mark.parametrize("short_episodes", ["pad", "skip"])
def test_total_weight_of_uniform_windows_counts_them(short_episodes):
    """`total_weight(window=W)`: a ring's count of valid window starts (a short episode 1 under "pad",
    0 under "skip") and its rows of positive weight; a padded table's rows offering a window under
    "skip"; an episode of priority 0 counts in neither."""
    window = 8
    with filled_ring(LENGTHS) as ring:
        total, count = jax.jit(lambda: gj.total_weight(ring, window=window, short_episodes=short_episodes))()
        weights = [max(n - window + 1, 0 if short_episodes == "skip" else 1) for n in LENGTHS]
        assert float(total) == sum(weights) and int(count) == sum(w > 0 for w in weights)
    priorities = np.ones(len(LENGTHS), np.float32)
    priorities[-1] = 0.0  # the longest episode is not selectable
    with filled_ring(LENGTHS, priorities=priorities) as ring:
        total, count = jax.jit(lambda: gj.total_weight(ring, window=window, short_episodes=short_episodes))()
        assert float(total) == sum(weights[:-1]) and int(count) == sum(w > 0 for w in weights[:-1])
    spec = gj.TableSpec(FIELDS, capacity=32, max_steps=max(LENGTHS))
    with gj.Table.create(spec, reuse=False) as padded:
        padded.insert(padded_batch(list(range(len(LENGTHS))), LENGTHS), lengths=np.array(LENGTHS))
        total, count = jax.jit(
            lambda: gj.total_weight(padded, window=window, short_episodes=short_episodes)
        )()
        rows = sum(n >= window for n in LENGTHS) if short_episodes == "skip" else len(LENGTHS)
        assert float(total) == rows and int(count) == rows


def test_total_weight_refuses_a_bad_window_by_name():
    with filled_ring(LENGTHS) as ring:
        with pytest.raises(InvalidArgumentError, match="window=100"):
            gj.total_weight(ring, window=100)
        with pytest.raises(InvalidArgumentError, match="short_episodes='drop'"):
            gj.total_weight(ring, window=4, short_episodes="drop")

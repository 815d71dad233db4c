"""gear_jax.transitions: n-step transitions read from trajectory tables, observations stored once.

A numpy reference computes every transition's n-step return, discount and next observation from whole
episodes; `nstep_transitions` over every window of every row must give exactly these, each transition
once. Sampling through `sample_transitions` (eager, jitted, inside lax.scan) picks transitions
uniformly, and a real gymnasium CartPole loop round-trips through `TransitionWriter`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import gear_jax as gj
from gear_jax.transitions import (
    TransitionWriter,
    nstep_transitions,
    sample_transitions,
    transition_table_spec,
)
from tests.helpers.sampling import P_THRESHOLD

GAMMA = 0.9
MAX_STEPS = 12
OBS = gj.Field((3,), "float32")
ACTION = gj.Field((), "int32")


def make_episodes(n_step, seed=0):
    """Episodes ending by termination, by truncation (and both flags at once), of lengths around the
    row's capacity (max_steps - n_step transitions), so that some rows are cut. Observation t of
    episode e is [1000 e + t, -(1000 e + t), e]: every observation, final ones included, is distinct."""
    rng = np.random.default_rng(seed)
    cap = MAX_STEPS - n_step
    lengths = [1, 2, cap - 1, cap, cap + 1, 2 * cap, 2 * cap + 1, 3 * cap + 2, *rng.integers(1, 30, 8)]
    episodes = []
    for e, length in enumerate(lengths, start=1):
        ids = 1000 * e + np.arange(length + 1)
        ending = ("terminated", "truncated", "both")[e % 3]
        episodes.append(
            {
                "obs": np.stack([ids, -ids, np.full_like(ids, e)], axis=1).astype(np.float32),
                "action": rng.integers(0, 5, length).astype(np.int32),
                "reward": rng.normal(size=length).astype(np.float32),
                "terminated": ending in ("terminated", "both"),
                "truncated": ending in ("truncated", "both"),
            }
        )
    return episodes


def write(table, episodes, n_step, **names):
    with TransitionWriter(table, n_step, **names) as writer:
        for ep in episodes:
            length = len(ep["action"])
            for t in range(length):
                last = t == length - 1
                writer.add(
                    ep["obs"][t],
                    ep["action"][t],
                    float(ep["reward"][t]),
                    last and ep["terminated"],
                    last and ep["truncated"],
                    ep["obs"][t + 1],
                )
        assert writer.steps == 0
        assert writer.transitions == sum(len(ep["action"]) for ep in episodes)
        return writer.rows


def reference(episodes, n_step, gamma, row_transitions):
    """{observation id: (action, reward, discount, next_obs)} by a plain loop over each episode.

    A transition's horizon stops at the episode's last transition and at a row cut: rows hold
    `row_transitions` transitions, so transition t of an episode is cut when (t + 1) is a multiple."""
    out = {}
    for ep in episodes:
        length = len(ep["action"])
        for t in range(length):
            ret, k = 0.0, n_step
            for i in range(n_step):
                j = t + i
                ret += gamma**i * float(ep["reward"][j])
                if j == length - 1 or (j + 1) % row_transitions == 0:
                    k = i + 1
                    break
            terminal = t + k - 1 == length - 1 and ep["terminated"]
            discount = 0.0 if terminal else gamma**k
            out[int(ep["obs"][t, 0])] = (int(ep["action"][t]), ret, discount, ep["obs"][t + k])
    return out


def every_window(table, n_step, window=None):
    """A hand-built Sample of every window start of every committed row (each transition once)."""
    status = table.row_status()
    rows = np.flatnonzero((status["length"] > 0) & (status["generation"] % 2 == 0))
    counts = status["length"][rows] - n_step
    np.testing.assert_array_equal(status["priority"][rows], counts)  # priority = transitions in the row
    indices = np.repeat(rows, counts).astype(np.int32)
    starts = np.concatenate([np.arange(c) for c in counts]).astype(np.int32)
    return gj.Sample(
        jnp.asarray(indices),
        jnp.asarray(status["generation"][indices]),
        jnp.ones(len(indices), jnp.float32),
        jnp.asarray(starts),
        window=window or n_step + 1,
    )


def assert_matches_reference(out, expected, exactly_once=False):
    out = jax.tree_util.tree_map(np.asarray, out)
    assert out["valid"].all()
    ids = out["obs"][:, 0].astype(np.int64)
    if exactly_once:
        assert sorted(ids) == sorted(expected)
    for i, oid in enumerate(ids):
        action, ret, discount, next_obs = expected[oid]
        assert out["action"][i] == action, oid
        np.testing.assert_allclose(out["reward"][i], ret, rtol=1e-5, atol=1e-6, err_msg=str(oid))
        np.testing.assert_allclose(out["discount"][i], discount, rtol=1e-6, err_msg=str(oid))
        assert (out["discount"][i] == 0) == (discount == 0), oid
        np.testing.assert_array_equal(out["next_obs"][i], next_obs, err_msg=str(oid))
    assert out["reward"].dtype == np.float32 and out["discount"].dtype == np.float32


def table_of(make_table, capacity, max_steps, obs=OBS):
    """A table of transition_table_spec's fields, closed when the test ends."""
    spec = transition_table_spec(obs, ACTION, capacity, max_steps)
    return make_table(spec.fields, capacity=capacity, max_steps=max_steps)


@pytest.fixture
def transition_table(make_table):
    def make(n_step, seed=0, capacity=64):
        table = table_of(make_table, capacity, MAX_STEPS)
        episodes = make_episodes(n_step, seed)
        write(table, episodes, n_step)
        return table, episodes

    return make


@pytest.mark.parametrize("n_step", [1, 3, 5])
def test_every_window_matches_the_numpy_reference(transition_table, n_step):
    table, episodes = transition_table(n_step)
    cap = MAX_STEPS - n_step
    assert max(len(ep["action"]) for ep in episodes) > 3 * cap  # rows are cut
    expected = reference(episodes, n_step, GAMMA, cap)
    smp = every_window(table, n_step)
    assert len(smp.indices) == len(expected) == sum(len(ep["action"]) for ep in episodes)
    out = nstep_transitions(gj.gather(table, smp), n_step, GAMMA)
    assert_matches_reference(out, expected, exactly_once=True)
    discounts = np.asarray(out["discount"])
    assert (discounts == 0).any() and (discounts > 0).any()
    # Longer windows give the same transitions (only steps 0..k are read).
    if n_step + 2 <= MAX_STEPS:
        longer = nstep_transitions(gj.gather(table, smp, window=n_step + 2), n_step, GAMMA)
        for name in ("obs", "action", "reward", "discount", "next_obs", "valid"):
            np.testing.assert_array_equal(np.asarray(longer[name]), np.asarray(out[name]))


def test_nstep_transitions_by_hand():
    # Windows of 4 steps, n_step 3, gamma 0.5, rewards 1, 2, 4, 8: a flag ends the horizon at its step
    # (rewards after it are left out), flags at step n_step or later are not read, and `valid` needs
    # steps 0 and k.
    flags = np.zeros((7, 4), bool)
    term, trunc = flags.copy(), flags.copy()
    trunc[1, 1] = True  # horizon 2, bootstrapped
    term[2, 0] = True  # horizon 1, terminal
    term[3, 3] = True  # outside the horizon
    term[4, 2] = trunc[4, 2] = True  # both flags: terminal
    trunc[5, 1] = trunc[6, 1] = True
    valid = np.ones((7, 4), bool)
    valid[5, 2] = False  # step k = 2 invalid
    valid[6, 3] = False  # a step after k: no matter
    obs = np.arange(28, dtype=np.float32).reshape(7, 4, 1) * np.array([1, -1], np.float32)
    batch = {
        "obs": obs, "action": np.arange(28).reshape(7, 4), "reward": np.tile([1.0, 2.0, 4.0, 8.0], (7, 1)),
        "terminated": term, "truncated": trunc, "valid": valid,
    }
    out = jax.tree_util.tree_map(np.asarray, jax.jit(lambda b: nstep_transitions(b, 3, 0.5))(batch))
    k = np.array([3, 2, 1, 3, 3, 2, 2])
    np.testing.assert_allclose(out["reward"], [3.0, 2.0, 1.0, 3.0, 3.0, 2.0, 2.0])
    np.testing.assert_allclose(out["discount"], [0.125, 0.25, 0.0, 0.125, 0.0, 0.25, 0.25])
    np.testing.assert_array_equal(out["next_obs"], obs[np.arange(7), k])
    np.testing.assert_array_equal(out["obs"], obs[:, 0])
    np.testing.assert_array_equal(out["action"], np.arange(0, 28, 4))
    np.testing.assert_array_equal(out["valid"], [True] * 5 + [False, True])
    # gamma 1 and gamma 0.
    np.testing.assert_allclose(np.asarray(nstep_transitions(batch, 3, 1.0)["reward"]), [7, 3, 1, 7, 7, 3, 3])
    np.testing.assert_allclose(np.asarray(nstep_transitions(batch, 3, 0.0)["discount"]), 0.0)


def test_windows_past_a_row_or_failed_picks_are_invalid(make_table):
    # A row not written by TransitionWriter (no final step): a window whose step k lies past the row's
    # length is invalid, and so is the failed-pick marker (index 0, generation 1).
    table = table_of(make_table, 4, 6)
    fields = table.spec.fields
    (row,) = table.insert({k: np.zeros((1, 3, *f.shape), f.dtype) for k, f in fields.items()})
    g = int(table.row_status()["generation"][row])  # even: published (a pooled table's count goes on)
    assert g % 2 == 0
    smp = gj.Sample(
        jnp.array([row, row, row, 0], jnp.int32), jnp.array([g, g, g, 1], jnp.uint32),
        jnp.ones(4, jnp.float32), jnp.array([0, 1, 2, 0], jnp.int32), window=3,
    )
    out = nstep_transitions(gj.gather(table, smp), 2, GAMMA)
    np.testing.assert_array_equal(np.asarray(out["valid"]), [True, False, False, False])


def test_rows_hold_runs_with_their_final_observation_and_padding(transition_table):
    n_step = 3
    table, episodes = transition_table(n_step)
    cap = MAX_STEPS - n_step
    status = table.row_status()
    rows = np.flatnonzero(status["length"] > 0)
    assert len(rows) == sum(-(-len(ep["action"]) // cap) for ep in episodes)  # one row per run
    whole = gj.Sample(
        jnp.asarray(rows, jnp.int32), jnp.asarray(status["generation"][rows]),
        jnp.ones(len(rows), jnp.float32), jnp.zeros(len(rows), jnp.int32),
    )
    data = jax.tree_util.tree_map(np.asarray, gj.gather(table, whole))  # whole rows, [R, max_steps, ...]
    covered = 0
    for r in range(len(rows)):
        length = int(status["length"][rows[r]])
        count = length - n_step
        e, t0 = divmod(int(data["obs"][r, 0, 0]), 1000)
        ep = episodes[e - 1]
        left = len(ep["action"]) - t0
        assert count == min(cap, left)
        assert status["priority"][rows[r]] == count
        np.testing.assert_array_equal(data["obs"][r, :count], ep["obs"][t0 : t0 + count])
        np.testing.assert_array_equal(data["action"][r, :count], ep["action"][t0 : t0 + count])
        np.testing.assert_array_equal(data["reward"][r, :count], ep["reward"][t0 : t0 + count])
        ends = count == left  # the episode's end, else a cut
        flags_before = data["terminated"][r, : count - 1] | data["truncated"][r, : count - 1]
        assert not flags_before.any()  # only the run's last transition ends it
        assert data["terminated"][r, count - 1] == (ends and ep["terminated"])
        assert data["truncated"][r, count - 1] == (not ends or ep["truncated"])
        # The final observation, then n_step - 1 copies of it; action, reward and flags zero.
        final = np.repeat(ep["obs"][None, t0 + count], n_step, axis=0)
        np.testing.assert_array_equal(data["obs"][r, count:length], final)
        for name in ("action", "reward", "terminated", "truncated"):
            assert not data[name][r, count:length].any()
        assert data["valid"][r, :length].all() and not data["valid"][r, length:].any()
        covered += count
    assert covered == sum(len(ep["action"]) for ep in episodes)


def test_jit_with_table_argument_and_scan_equal_eager(transition_table):
    n_step = 3
    table, episodes = transition_table(n_step)
    expected = reference(episodes, n_step, GAMMA, MAX_STEPS - n_step)
    key = jax.random.key(7)

    eager = sample_transitions(table, key, 64, n_step, GAMMA)
    assert_matches_reference(eager, expected)
    jitted = jax.jit(lambda tb, k, g: sample_transitions(tb, k, 64, n_step, g))(table, key, GAMMA)
    for name in eager:
        np.testing.assert_allclose(np.asarray(jitted[name]), np.asarray(eager[name]), rtol=1e-6)

    keys = jax.random.split(jax.random.key(11), 4)

    def body(total, k):
        out = sample_transitions(table, k, 32, n_step, GAMMA)
        return total + jnp.sum(jnp.where(out["valid"], out["reward"], 0.0)), out

    total, scanned = jax.jit(lambda ks: jax.lax.scan(body, jnp.float32(0), ks))(keys)
    firsts = set()
    for i in range(len(keys)):
        one = sample_transitions(table, keys[i], 32, n_step, GAMMA)
        assert_matches_reference(one, expected)
        firsts.add(float(one["obs"][0, 0]))
        for name in one:
            np.testing.assert_allclose(np.asarray(scanned[name][i]), np.asarray(one[name]), rtol=1e-6)
    assert len(firsts) > 1  # the keys really differ
    np.testing.assert_allclose(float(total), float(np.asarray(scanned["reward"]).sum()), rtol=1e-5)

    # vmap over stacked batches equals batch by batch.
    batches = [gj.gather(table, gj.sample(table, k, 16, window=n_step + 1)) for k in keys]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *batches)
    mapped = jax.vmap(lambda b: nstep_transitions(b, n_step, GAMMA))(stacked)
    for i, b in enumerate(batches):
        one = nstep_transitions(b, n_step, GAMMA)
        for name in one:
            np.testing.assert_allclose(np.asarray(mapped[name][i]), np.asarray(one[name]), rtol=1e-6)


def test_every_stored_transition_is_equally_likely(transition_table):
    n_step = 3
    table, episodes = transition_table(n_step, seed=3)
    ids = sorted(int(ep["obs"][t, 0]) for ep in episodes for t in range(len(ep["action"])))
    position = {oid: i for i, oid in enumerate(ids)}
    fn = jax.jit(lambda k: sample_transitions(table, k, 2000, n_step, GAMMA))
    counts = np.zeros(len(ids), np.int64)
    for i in range(30):
        out = fn(jax.random.key(100 + i))
        assert np.asarray(out["valid"]).all()
        counts += np.bincount([position[int(o)] for o in np.asarray(out["obs"][:, 0])], minlength=len(ids))
    assert (counts > 0).all()
    assert stats.chisquare(counts).pvalue > P_THRESHOLD
    # The test has power: rows drawn uniformly (not by their transition counts) fail it.
    uniform = np.zeros(len(ids), np.int64)
    for i in range(30):
        smp = gj.sample(table, jax.random.key(100 + i), 2000, window=n_step + 1)
        out = nstep_transitions(gj.gather(table, smp), n_step, GAMMA)
        uniform += np.bincount([position[int(o)] for o in np.asarray(out["obs"][:, 0])], minlength=len(ids))
    assert stats.chisquare(uniform).pvalue < 1e-9


@pytest.mark.parametrize("n_step", [1, 3])
def test_gymnasium_cartpole_round_trip(make_table, n_step):
    gym = pytest.importorskip("gymnasium")
    env = gym.make("CartPole-v1", max_episode_steps=25)  # random episodes end both ways
    env.action_space.seed(0)
    max_steps = 16  # rows of 16 - n_step transitions: longer runs are cut
    table = table_of(make_table, 256, max_steps, obs=gj.Field((4,), "float32"))
    steps = []  # (obs, action, reward, terminated, truncated, next_obs) as the env gave them
    obs, _ = env.reset(seed=0)
    with TransitionWriter(table, n_step) as writer:
        while len(steps) < 300 or writer.steps:  # a few hundred steps, to the end of an episode
            action = env.action_space.sample()
            next_obs, reward, terminated, truncated, _ = env.step(action)
            writer.add(obs, int(action), reward, terminated, truncated, next_obs)
            steps.append((obs, int(action), reward, terminated, truncated, next_obs))
            obs = next_obs
            if terminated or truncated:
                obs, _ = env.reset()
        assert writer.transitions == len(steps)
    env.close()
    assert any(s[3] for s in steps) and any(s[4] and not s[3] for s in steps)

    # The reference, from the env's own records: horizons stop at episode ends and at row cuts.
    by_obs = {s[0].tobytes(): i for i, s in enumerate(steps)}
    assert len(by_obs) == len(steps)  # observations identify the steps
    ends, run = [], 0
    for s in steps:
        run += 1
        ends.append(s[3] or s[4] or run == max_steps - n_step)
        run = 0 if ends[-1] else run
    assert sum(ends) > sum(s[3] or s[4] for s in steps)  # some runs were cut

    sample = jax.jit(lambda tb, k: sample_transitions(tb, k, 256, n_step, GAMMA))
    seen = set()
    for seed in range(3):
        out = jax.tree_util.tree_map(np.asarray, sample(table, jax.random.key(seed)))
        assert out["valid"].all()
        for i in range(len(out["valid"])):
            t = by_obs[out["obs"][i].tobytes()]
            seen.add(t)
            k, ret = 0, 0.0
            while True:
                ret += GAMMA**k * steps[t + k][2]
                k += 1
                if ends[t + k - 1] or k == n_step:
                    break
            last = steps[t + k - 1]
            assert out["action"][i] == steps[t][1]
            np.testing.assert_allclose(out["reward"][i], ret, rtol=1e-5)
            # Discount 0 exactly where the env terminated; truncations and cuts bootstrap.
            if last[3]:
                assert out["discount"][i] == 0
            else:
                np.testing.assert_allclose(out["discount"][i], GAMMA**k, rtol=1e-6)
            # next_obs is the env's observation after the horizon's last step (the terminal one too).
            np.testing.assert_array_equal(out["next_obs"][i], last[5])
    # Terminal transitions and their final observations (stored only as rows' final steps) were checked.
    assert len(seen) > 100 and any(steps[t][3] for t in seen)


def test_field_names_can_be_changed(make_table):
    fields = {
        "o": gj.Field((3,), "float32"), "a": ACTION, "r": gj.Field((), "float32"),
        "done": gj.Field((), "bool"), "cut": gj.Field((), "bool"),
    }
    table = make_table(fields, capacity=64, max_steps=MAX_STEPS)
    n_step = 3
    episodes = make_episodes(n_step)
    names = {"obs": "o", "action": "a", "reward": "r", "terminated": "done", "truncated": "cut"}
    write(table, episodes, n_step, **names)
    expected = reference(episodes, n_step, GAMMA, MAX_STEPS - n_step)
    batch = gj.gather(table, every_window(table, n_step))
    assert_matches_reference(nstep_transitions(batch, n_step, GAMMA, **names), expected, exactly_once=True)
    sampled = sample_transitions(table, jax.random.key(0), 64, n_step, GAMMA, **names)
    assert_matches_reference(sampled, expected)


def test_overwritten_rows_come_back_invalid(make_table):
    n_step = 2
    table = table_of(make_table, 4, MAX_STEPS)
    write(table, make_episodes(n_step)[:4], n_step)
    smp = every_window(table, n_step)
    write(table, make_episodes(n_step, seed=1)[:2], n_step)  # two rows: overwrites two of the four
    out = nstep_transitions(gj.gather(table, smp), n_step, GAMMA)
    valid = np.asarray(out["valid"])
    assert valid.any() and not valid.all()
    status = table.row_status()
    still = status["generation"][np.asarray(smp.indices)] == np.asarray(smp.generations)
    np.testing.assert_array_equal(valid, still)


def test_close_abandons_an_unfinished_run(make_table):
    table = table_of(make_table, 8, MAX_STEPS)
    writer = TransitionWriter(table, 2)
    obs = np.zeros(3, np.float32)
    assert writer.add(obs, 1, 1.0, False, False, obs + 1) is None
    row = writer.add(obs + 1, 1, 1.0, True, False, obs + 2)
    assert row is not None and writer.rows == 1 and writer.transitions == 2
    writer.add(obs + 2, 1, 1.0, False, False, obs + 3)
    assert writer.steps == 1
    writer.close()
    assert table.size == 1 and writer.transitions == 2 and writer.steps == 0
    # A bad next_obs is refused before anything is written.
    with TransitionWriter(table, 2) as w:
        with pytest.raises(gj.InvalidArgumentError, match="next_obs has shape"):
            w.add(obs, 1, 1.0, True, False, np.zeros(4, np.float32))
        assert w.steps == 0
        assert w.add(obs, 1, 1.0, True, False, obs) is not None
    assert table.size == 2
    # A next_obs the table refuses when it ends a run: the run is abandoned, the writer goes on.
    with TransitionWriter(table, 2) as w:
        w.add(obs, 1, 1.0, False, False, obs + 1)
        with pytest.raises(gj.InvalidArgumentError, match="run's 2 transitions .* abandoned"):
            w.add(obs + 1, 1, 1.0, False, True, np.array(["a", "b", "c"]))
        assert w.steps == 0 and w.transitions == 0 and table.size == 2
        assert w.add(obs, 1, 1.0, True, False, obs) is not None and w.transitions == 1
    assert table.size == 3


def test_errors_name_the_fix(make_table):
    spec = transition_table_spec(OBS, ACTION, 8, 4)
    table = make_table(spec.fields, capacity=8, max_steps=4)
    with pytest.raises(gj.InvalidArgumentError, match=r"max_steps=4 is too small for n_step=4.*at least"):
        TransitionWriter(table, 4)
    with pytest.raises(gj.InvalidArgumentError, match="max_steps=4 is too small for n_step=5"):
        sample_transitions(table, jax.random.key(0), 8, 5, GAMMA)
    with pytest.raises(gj.InvalidArgumentError, match="n_step=0 must be an int >= 1"):
        TransitionWriter(table, 0)

    no_reward = make_table({"obs": OBS, "action": ACTION, "terminated": gj.Field((), "bool"),
                            "truncated": gj.Field((), "bool")}, max_steps=4)
    with pytest.raises(gj.InvalidArgumentError, match=r"no field for reward='reward'.*transition_table_spec"):
        TransitionWriter(no_reward, 2)
    with pytest.raises(gj.InvalidArgumentError, match="no field for reward='reward'"):
        sample_transitions(no_reward, jax.random.key(0), 8, 2, GAMMA)
    vector_reward = make_table({**spec.fields, "reward": gj.Field((2,), "float32")}, max_steps=4)
    with pytest.raises(gj.InvalidArgumentError, match=r"reward field 'reward' is \(2,\) float32.*Field\("):
        TransitionWriter(vector_reward, 2)
    int_flags = make_table({**spec.fields, "terminated": gj.Field((), "int32")}, max_steps=4)
    with pytest.raises(gj.InvalidArgumentError, match="terminated field 'terminated' is.*'bool'"):
        TransitionWriter(int_flags, 2)
    extra = make_table({**spec.fields, "info": gj.Field((), "int32")}, max_steps=4)
    with pytest.raises(gj.InvalidArgumentError, match=r"fields \['info'\] beyond the five"):
        TransitionWriter(extra, 2)
    one_step = make_table(spec.fields, max_steps=1)
    with pytest.raises(gj.InvalidArgumentError, match="max_steps=1 is too small"):
        TransitionWriter(one_step, 1)
    with pytest.raises(gj.InvalidArgumentError, match="unknown keyword arguments"):
        sample_transitions(table, jax.random.key(0), 8, 2, GAMMA, observation="obs")

    with TransitionWriter(table, 2) as writer:
        with pytest.raises(gj.InvalidArgumentError, match="terminated must be a bool scalar"):
            writer.add(np.zeros(3), 0, 0.0, np.array([True, False]), False, np.zeros(3))
        with pytest.raises(gj.InvalidArgumentError, match="reward must be a real scalar"):
            writer.add(np.zeros(3), 0, np.zeros(2), False, False, np.zeros(3))
        assert writer.steps == 0
    assert table.size == 0

    # nstep_transitions: windows too short, missing keys, whole rows of a transition table.
    table.insert({k: np.zeros((1, 4, *f.shape), f.dtype) for k, f in spec.fields.items()})
    short = gj.gather(table, gj.sample(table, jax.random.key(0), 4, window=2))
    with pytest.raises(gj.InvalidArgumentError, match=r"windows of 2 steps are too short.*window=3"):
        nstep_transitions(short, 2, GAMMA)
    batch = gj.gather(table, gj.sample(table, jax.random.key(0), 4, window=3))
    with pytest.raises(gj.InvalidArgumentError, match=r"batch has no \['reward'\]"):
        nstep_transitions({k: v for k, v in batch.items() if k != "reward"}, 2, GAMMA)
    with pytest.raises(gj.InvalidArgumentError, match=r"batch has no \['valid'\]"):
        nstep_transitions({k: v for k, v in batch.items() if k != "valid"}, 2, GAMMA)
    with pytest.raises(gj.InvalidArgumentError, match=r"expected \[B, W\]"):
        nstep_transitions({k: v[:, 0] for k, v in batch.items()}, 2, GAMMA)
    with pytest.raises(gj.InvalidArgumentError, match=r"gamma=1.5 must lie in \[0, 1\]"):
        nstep_transitions(batch, 2, 1.5)
    with pytest.raises(gj.InvalidArgumentError, match="obs must be a gear_jax.Field"):
        transition_table_spec((3,), ACTION, 8, 4)

"""What a user porting a single-file DQN (CleanRL, SB3) meets first (issue 36): `Table.add` of a batch of
one, `add(priority="max")`, static arguments passed as traced values, and `transition_table_spec` sized in
transitions and made from gymnasium spaces."""

import functools

import gymnasium
import jax
import numpy as np
import pytest

import gear_jax as gj
from gear_jax.transitions import TransitionWriter, sample_transitions, transition_table_spec

# -- Table.add of a batch of one --------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::UserWarning")  # lists take the general path, with a warning
def test_add_stores_a_batch_of_one_as_its_row(make_table):
    """A vector environment of one environment hands out (1, 4) observations and (1,) actions."""
    table = make_table()
    row = table.add({"obs": np.array([[1.0, 2.0, 3.0]]), "action": np.array([7])})
    assert table.size == 1
    np.testing.assert_array_equal(table.columns["obs"][row, 0], [1.0, 2.0, 3.0])
    assert table.columns["action"][row, 0] == 7
    # Lists and numpy scalars in a batch of one, through the general path.
    row = table.add({"obs": [[4.0, 5.0, 6.0]], "action": [np.int64(8)]})
    np.testing.assert_array_equal(table.columns["obs"][row, 0], [4.0, 5.0, 6.0])
    assert table.columns["action"][row, 0] == 8 and table.size == 2


def test_add_of_a_batch_of_one_into_a_trajectory_table(make_table):
    table = make_table(max_steps=4)
    obs = np.arange(9, dtype=np.float32).reshape(1, 3, 3)  # one row of 3 steps, with a batch axis
    row = table.add({"obs": obs, "action": np.array([[1, 2, 3]])})
    assert table.row_status()["length"][row] == 3
    np.testing.assert_array_equal(table.columns["obs"][row, :3], obs[0])
    np.testing.assert_array_equal(table.columns["action"][row, :3], [1, 2, 3])


def test_add_refuses_larger_batches_and_mixed_batch_axes_naming_the_fix(make_table):
    table = make_table()
    with pytest.raises(gj.InvalidArgumentError, match=r"(?s)batch axis.*table\.insert\(batch\).*v\[i\]"):
        table.add({"obs": np.zeros((2, 3)), "action": np.array([1, 2])})
    with pytest.raises(gj.InvalidArgumentError, match=r"(?s)\(\['action'\]\).*v\[0\].*table\.insert"):
        table.add({"obs": np.zeros((1, 3)), "action": 1})  # only obs has the batch axis
    with pytest.raises(gj.InvalidArgumentError, match=r"has shape \(4,\), expected \(3,\)") as info:
        table.add({"obs": np.zeros(4), "action": 1})  # no batch axis at all: the plain message
    assert "insert" not in str(info.value)
    assert table.size == 0  # nothing written by any refusal


# -- Table.add(priority="max") --------------------------------------------------------------------


def test_add_priority_max_is_inserts(make_table):
    table = make_table()
    first = table.add({"obs": np.zeros(3, np.float32), "action": 0}, priority="max")
    assert table.row_status()["priority"][first] == 1.0  # 1 while no row had a priority
    table.add({"obs": np.zeros(3, np.float32), "action": 1}, priority=5.0)
    row = table.add({"obs": np.ones(3, np.float32), "action": 2}, priority="max")
    assert table.row_status()["priority"][row] == table.max_priority == 5.0
    # The same in a trajectory table (no short path) and through the general path (a list).
    trajectories = make_table(max_steps=2)
    trajectories.add({"obs": np.zeros((2, 3)), "action": [0, 1]}, priority=3.0)
    row = trajectories.add({"obs": np.zeros((1, 3)), "action": [2]}, priority="max")
    assert trajectories.row_status()["priority"][row] == 3.0
    row = table.add({"obs": [1.0, 2.0, 3.0], "action": 3}, priority="max")
    assert table.row_status()["priority"][row] == 5.0


def test_add_refuses_other_priority_names(make_table):
    table = make_table()
    with pytest.raises(gj.InvalidArgumentError, match=r"priority='min'.*a number.*\"max\""):
        table.add({"obs": np.zeros(3, np.float32), "action": 0}, priority="min")
    assert table.size == 0


# -- static arguments passed as traced values ----------------------------------------------------


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda t, k, v: gj.sample(t, k, v), "batch_size"),
        (lambda t, k, v: gj.sample_gather(t, k, v), "batch_size"),
        (lambda t, k, v: gj.sample(t, k, 4, window=v), "window"),
        (lambda t, k, v: gj.gather(t, gj.sample(t, k, 4), window=v), "window"),
        (
            lambda t, k, v: gj.sample(t, k, 4, method="prioritized", priority_exponent=v * 0.5),
            "priority_exponent",
        ),
        (
            lambda t, k, v: gj.insert(
                t, {"obs": np.zeros((2, 2, 3)), "action": np.zeros((2, 2))}, time_major=v > 0
            ),
            "time_major",
        ),
    ],
)
def test_a_traced_static_argument_is_refused_naming_static_argnames(make_table, call, name):
    table = make_table(max_steps=4)
    table.insert({"obs": np.zeros((4, 4, 3), np.float32), "action": np.zeros((4, 4), np.int32)})
    step = jax.jit(functools.partial(call, table))
    with pytest.raises(gj.InvalidArgumentError) as info:
        step(jax.random.key(0), 2)
    message = str(info.value)
    assert f"{name} is a traced value" in message and "static Python value" in message
    assert f"static_argnames=('{name}',)" in message and "close over it" in message


def test_the_fix_the_message_names_works(make_table):
    table = make_table()
    table.insert({"obs": np.zeros((8, 3), np.float32), "action": np.arange(8)})
    step = jax.jit(
        lambda k, batch_size: gj.sample_gather(table, k, batch_size)[1], static_argnames=("batch_size",)
    )
    assert step(jax.random.key(0), batch_size=5)["obs"].shape == (5, 3)


def test_a_traced_n_step_is_refused_by_the_transition_helpers():
    spec = transition_table_spec(gj.Field((2,), "float32"), gj.Field((), "int32"), transitions=64)
    with gj.Table.create(spec) as table:
        with pytest.raises(gj.InvalidArgumentError, match=r"n_step is a traced value.*static_argnames"):
            jax.jit(lambda k, n: sample_transitions(table, k, 4, n_step=n, gamma=0.9))(jax.random.key(0), 1)


# -- transition_table_spec: in transitions, from spaces ------------------------------------------


def test_transition_table_spec_from_spaces():
    env = gymnasium.make("CartPole-v1")
    spec = transition_table_spec(env.observation_space, env.action_space, capacity=8, max_steps=16)
    assert spec.fields["obs"] == gj.Field((4,), "float32")
    assert spec.fields["action"] == gj.Field((), "int32")  # Discrete is int64: narrowed, as from_spaces
    assert transition_table_spec(env.observation_space, env.action_space, 8, 16, narrow=False).fields[
        "action"
    ] == gj.Field((), "int64")
    assert (spec.capacity, spec.max_steps, spec.step_ring) == (8, 16, False)  # the original form, in rows
    with pytest.raises(gj.InvalidArgumentError, match=r"obs must be a gear_jax.Field or a gymnasium"):
        transition_table_spec((4,), env.action_space, transitions=100)


def test_transition_table_spec_in_transitions_holds_them():
    """transitions=N (a DQN's buffer_size): a step ring that keeps the latest N transitions of CartPole."""
    env = gymnasium.make("CartPole-v1")
    n = 1_000
    spec = transition_table_spec(env.observation_space, env.action_space, transitions=n, n_step=3)
    assert spec.step_ring and spec.capacity == n // 16 and spec.max_steps == n + 3
    obs, _ = env.reset(seed=0)
    env.action_space.seed(0)
    with gj.Table.create(spec) as table, TransitionWriter(table, n_step=3) as episode_writer:
        for _ in range(3 * n):  # the ring fills and retires its oldest runs
            action = env.action_space.sample()
            next_obs, reward, terminated, truncated, _ = env.step(action)
            episode_writer.add(obs, action, reward, terminated, truncated, next_obs)
            obs = env.reset()[0] if terminated or truncated else next_obs
        held = int(table.row_status()["priority"].sum())  # a run's priority: its transitions
        assert n <= held <= spec.step_capacity  # at least N
        t = jax.jit(lambda k: sample_transitions(table, k, 256, n_step=3, gamma=0.99))(jax.random.key(0))
        assert np.asarray(t["valid"]).all()


def test_transition_table_spec_sizes_are_refused_naming_the_fix():
    obs, action = gj.Field((2,), "float32"), gj.Field((), "int32")
    with pytest.raises(gj.InvalidArgumentError, match=r"transitions=N \(as a DQN's buffer_size\)"):
        transition_table_spec(obs, action)
    with pytest.raises(gj.InvalidArgumentError, match=r"both size the table"):
        transition_table_spec(obs, action, 10, 4, transitions=100)
    with pytest.raises(gj.InvalidArgumentError, match=r"transitions=0 must be an int >= 1"):
        transition_table_spec(obs, action, transitions=0)
    spec = transition_table_spec(obs, action, transitions=100, episodes=50, max_steps=20)
    assert (spec.capacity, spec.step_capacity, spec.max_steps) == (50, (100 + 50 + 20) * 16 // 15 + 1, 20)

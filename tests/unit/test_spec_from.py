"""Specs from what users have: gymnasium and gymnax spaces (`TableSpec.from_spaces`, `Field.from_space`)
and one example step (`TableSpec.from_example`), compared with the hand-written specs."""

import gymnasium
import gymnax
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from gymnasium import spaces

import gear_jax as gj

CARTPOLE = gj.TableSpec(
    {
        "obs": gj.Field((4,), "float32"),
        "action": gj.Field((), "int32"),
        "reward": gj.Field((), "float32"),
        "done": gj.Field((), "bool"),
    },
    capacity=1000,
)
SCALARS = {"reward": gj.Field(), "done": gj.Field(dtype="bool")}


def test_field_defaults_read_short():
    assert gj.Field() == gj.Field((), "float32")
    assert gj.Field(dtype="bool") == gj.Field((), np.bool_)
    assert gj.Field((3,)) == gj.Field((3,), "float32")
    assert gj.Field(2, "int8").shape == (2,)  # the positional order (shape, dtype) is unchanged


def test_from_spaces_of_gymnasium_cartpole():
    env = gymnasium.make("CartPole-v1")
    assert env.action_space.dtype == np.int64  # what narrow turns into int32
    spec = gj.TableSpec.from_spaces(
        {"obs": env.observation_space, "action": env.action_space, **SCALARS}, capacity=1000
    )
    assert spec == CARTPOLE
    assert list(spec.fields) == ["obs", "action", "reward", "done"]
    env.close()


def test_from_spaces_of_an_atari_layout():
    spec = gj.TableSpec.from_spaces(
        {
            "obs": spaces.Box(0, 255, (84, 84, 4), np.uint8),
            "action": spaces.Discrete(18),
            **SCALARS,
        },
        capacity=1_000_000,
    )
    hand = gj.TableSpec(
        {
            "obs": gj.Field((84, 84, 4), "uint8"),
            "action": gj.Field((), "int32"),
            "reward": gj.Field((), "float32"),
            "done": gj.Field((), "bool"),
        },
        capacity=1_000_000,
    )
    assert spec == hand


@pytest.mark.parametrize(
    "space, narrow, field",
    [
        (spaces.Box(-1.0, 1.0, (3,), np.float64), True, gj.Field((3,), "float32")),
        (spaces.Box(-1.0, 1.0, (3,), np.float64), False, gj.Field((3,), "float64")),
        (spaces.Box(0, 10, (2, 2), np.int64), True, gj.Field((2, 2), "int32")),
        (spaces.Discrete(18), False, gj.Field((), "int64")),
        (spaces.Discrete(5, start=-2), True, gj.Field((), "int32")),
        (spaces.MultiDiscrete([3, 4, 5]), True, gj.Field((3,), "int32")),
        (spaces.MultiDiscrete([[2, 3], [4, 5]]), False, gj.Field((2, 2), "int64")),
        (spaces.MultiBinary(6), True, gj.Field((6,), "int8")),
        (spaces.MultiBinary([2, 3]), True, gj.Field((2, 3), "int8")),
        (gj.Field((7,), "uint16"), True, gj.Field((7,), "uint16")),
    ],
)
def test_field_from_gymnasium_spaces(space, narrow, field):
    assert gj.Field.from_space(space, narrow=narrow) == field


def test_from_spaces_of_gymnax_cartpole():
    env, params = gymnax.make("CartPole-v1")
    obs_space, action_space = env.observation_space(params), env.action_space(params)
    assert action_space.dtype == np.int32  # gymnax 1.0.1: Discrete is int32, Box carries jnp.float32
    spec = gj.TableSpec.from_spaces({"obs": obs_space, "action": action_space, **SCALARS}, capacity=1000)
    assert spec == CARTPOLE
    # narrow=False keeps gymnax's own 32-bit dtypes
    assert gj.TableSpec.from_spaces(
        {"obs": obs_space, "action": action_space, **SCALARS}, capacity=1000, narrow=False
    ) == CARTPOLE


def test_from_spaces_of_gymnax_minatar_breakout():
    env, params = gymnax.make("Breakout-MinAtar")
    spec = gj.TableSpec.from_spaces(
        {"obs": env.observation_space(params), "action": env.action_space(params), **SCALARS},
        capacity=500,
        max_steps=8,
    )
    hand = gj.TableSpec(
        {
            "obs": gj.Field((10, 10, 4), "float32"),
            "action": gj.Field((), "int32"),
            "reward": gj.Field((), "float32"),
            "done": gj.Field((), "bool"),
        },
        capacity=500,
        max_steps=8,
    )
    assert spec == hand
    # the space describes what reset hands out
    obs, _ = env.reset(jax.random.key(0), params)
    assert spec.fields["obs"] == gj.Field(obs.shape, obs.dtype)


def test_a_gymnax_space_method_without_params_is_refused_with_a_hint():
    env, _ = gymnax.make("CartPole-v1")
    with pytest.raises(gj.SpecError, match=r"field 'obs'.*env.observation_space\(params\)"):
        gj.TableSpec.from_spaces({"obs": env.observation_space}, capacity=10)


def cartpole_step():
    env = gymnasium.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    action = env.action_space.sample()
    next_obs, reward, terminated, truncated, _ = env.step(action)
    env.close()
    assert isinstance(action, np.int64) and type(reward) is float and type(terminated) is bool
    return {"obs": obs, "action": action, "reward": reward, "done": terminated}


def test_from_example_of_a_gymnasium_cartpole_step():
    assert gj.TableSpec.from_example(cartpole_step(), capacity=1000) == CARTPOLE


def test_from_example_narrow_false_keeps_64_bit_arrays_but_not_python_scalars():
    step = cartpole_step()
    step["obs"] = step["obs"].astype(np.float64)
    step["value"] = np.float64(0.5)
    step["count"] = np.uint64(3)
    spec = gj.TableSpec.from_example(step, capacity=1000, narrow=False)
    assert {n: f.dtype.name for n, f in spec.fields.items()} == {
        "obs": "float64",
        "action": "int64",
        "reward": "float32",  # a Python float is float32 whatever narrow says
        "done": "bool",
        "value": "float64",
        "count": "uint64",
    }
    narrowed = gj.TableSpec.from_example(step, capacity=1000)
    assert [f.dtype.name for f in narrowed.fields.values()] == [
        "float32", "int32", "float32", "bool", "float32", "uint32"
    ]


def test_from_example_reads_every_kind_of_value_in_order():
    import torch

    example = {
        "pixels": jnp.zeros((8, 8, 3), jnp.uint8),
        "embedding": torch.zeros(5, dtype=torch.bfloat16),
        "mask": torch.ones(2, dtype=torch.bool),
        "flag": np.bool_(True),
        "step": 3,
        "goal": [1.0, 2.0],
        "ids": [[1, 2, 3], [4, 5, 6]],
        "onehot": [True, False],
        "half": np.zeros((), np.float16),
    }
    spec = gj.TableSpec.from_example(example, capacity=10)
    assert list(spec.fields) == list(example)
    assert spec.fields == {
        "pixels": gj.Field((8, 8, 3), "uint8"),
        "embedding": gj.Field((5,), ml_dtypes.bfloat16),
        "mask": gj.Field((2,), "bool"),
        "flag": gj.Field((), "bool"),
        "step": gj.Field((), "int32"),
        "goal": gj.Field((2,), "float32"),
        "ids": gj.Field((2, 3), "int32"),
        "onehot": gj.Field((2,), "bool"),
        "half": gj.Field((), "float16"),
    }


def test_from_example_batched_drops_the_batch_axis():
    batch = {
        "obs": np.zeros((32, 4), np.float32),
        "action": np.zeros((32,), np.int64),
        "reward": jnp.zeros((32,), jnp.float32),
        "done": np.zeros((32,), bool),
    }
    assert gj.TableSpec.from_example(batch, capacity=1000, batched=True) == CARTPOLE
    with pytest.raises(gj.SpecError, match="different sizes"):
        gj.TableSpec.from_example({**batch, "obs": np.zeros((31, 4))}, capacity=10, batched=True)
    with pytest.raises(gj.SpecError, match="field 'reward' has no batch axis"):
        gj.TableSpec.from_example({**batch, "reward": 1.0}, capacity=10, batched=True)


def test_from_example_with_max_steps_makes_a_trajectory_spec():
    spec = gj.TableSpec.from_example(cartpole_step(), capacity=100, max_steps=50)
    assert spec.is_trajectory and spec.max_steps == 50
    assert spec == gj.TableSpec(CARTPOLE.fields, capacity=100, max_steps=50)
    batched = {k: np.stack([np.asarray(v)] * 4) for k, v in cartpole_step().items()}
    assert gj.TableSpec.from_example(batched, capacity=100, max_steps=50, batched=True) == spec


@pytest.mark.parametrize(
    "value, message",
    [
        ({"position": np.zeros(3), "velocity": np.zeros(3)}, "give each entry of 'obs' its own field"),
        ("left", "field 'obs' holds str values"),
        (np.array(["a", "b"]), "field 'obs' holds ndarray values"),
        (None, "field 'obs' holds NoneType"),
        (np.zeros(3, np.complex64), "field 'obs': dtype .* is not supported"),
        ([], "field 'obs': Field shape"),
    ],
)
def test_from_example_errors_name_the_field(value, message):
    with pytest.raises(gj.SpecError, match=message):
        gj.TableSpec.from_example({"action": 1, "obs": value}, capacity=10)


@pytest.mark.parametrize(
    "space, message",
    [
        (
            spaces.Dict({"image": spaces.Box(0, 1, (2,)), "pos": spaces.Discrete(3)}),
            r"field 'obs' is a Dict space .*'obs_image': obs_space\['image'\]",
        ),
        (spaces.Text(12), "field 'obs': a Text space holds strings"),
        (spaces.Tuple((spaces.Discrete(2), spaces.Discrete(3))), "field 'obs' is a Tuple space of 2"),
        (spaces.Sequence(spaces.Discrete(2)), "field 'obs': a Sequence space"),
        (spaces.Graph(spaces.Box(0, 1, (2,)), None), "field 'obs': a Graph space"),
        (
            gymnax.environments.spaces.Dict({"a": gymnax.environments.spaces.Discrete(2)}),
            "field 'obs' is a Dict space",
        ),
        ({"a": spaces.Discrete(2)}, "field 'obs' is a mapping"),
        ((4,), "field 'obs': tuple is not a space gear_jax reads"),
        (spaces.Discrete(2**40), "field 'obs': Discrete values 0 .. 1099511627775 do not fit int32"),
        (spaces.Box(0, 2**40, (2,), np.int64), "field 'obs': Box bounds 0 .. 1099511627776 do not fit int32"),
    ],
)
def test_from_spaces_errors_name_the_field(space, message):
    with pytest.raises(gj.SpecError, match=message):
        gj.TableSpec.from_spaces({"action": spaces.Discrete(2), "obs": space}, capacity=10)


def test_field_from_space_errors_without_a_field_name():
    with pytest.raises(gj.SpecError, match="space: a Text space"):
        gj.Field.from_space(spaces.Text(5))
    # a Discrete too large for int32 is fine when kept int64
    assert gj.Field.from_space(spaces.Discrete(2**40), narrow=False) == gj.Field((), "int64")
    # an integer Box narrows when its bounds fit, and keeps int64 when asked
    assert gj.Field.from_space(spaces.Box(-5, 255, (2,), np.int64)) == gj.Field((2,), "int32")
    assert gj.Field.from_space(spaces.Box(0, 2**40, (2,), np.int64), narrow=False) == gj.Field((2,), "int64")


def test_a_spec_from_spaces_makes_a_table_that_stores_a_gymnasium_transition():
    env = gymnasium.make("CartPole-v1")
    spec = gj.TableSpec.from_spaces(
        {"obs": env.observation_space, "action": env.action_space, **SCALARS}, capacity=16
    )
    step = cartpole_step()
    # arrays already of the spec's dtypes: the table's casting policy is not what this test is about
    batch = {
        name: np.asarray(step[name]).astype(field.dtype)[None] for name, field in spec.fields.items()
    }
    table = gj.Table.create(spec)
    try:
        rows = table.insert(batch)
        assert rows.tolist() == [0] and table.size == 1
        _, got = table.sample_batch(jax.random.key(0), 2)
        for name, field in spec.fields.items():
            assert got[name].dtype == field.dtype and got[name].shape == (2, *field.shape)
            np.testing.assert_array_equal(np.asarray(got[name]), np.repeat(batch[name], 2, axis=0))
    finally:
        table.close()
    env.close()

"""The casting policy of insert, add and episode writers (gear_jax.casting), and the short path of one-row
writes (xla_ffi/row_writer.h), which must store and refuse exactly what the general path does."""

import itertools
import warnings
import types

import gymnasium
import hypothesis.extra.numpy as hnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gear_jax as gj

CARTPOLE = {
    "obs": gj.Field((4,), "float32"),
    "action": gj.Field((), "int32"),
    "reward": gj.Field((), "float32"),
    "next_obs": gj.Field((4,), "float32"),
    "terminated": gj.Field((), "bool"),
}
ATARI = {
    "obs": gj.Field((84, 84, 4), "uint8"),
    "action": gj.Field((), "int32"),
    "reward": gj.Field((), "float32"),
    "terminated": gj.Field((), "bool"),
    "truncated": gj.Field((), "bool"),
}


def stored(table, row):
    return {name: column[row, 0].copy() for name, column in table.columns.items()}


def assert_unchanged(table, before):
    after = table.row_status()
    for column in before:
        np.testing.assert_array_equal(after[column], before[column], err_msg=column)


# Every dtype a gymnasium CartPole loop hands out: observations float32 (or float64 from wrappers),
# actions int64 from action_space.sample(), int32 / Python int from a greedy policy, rewards Python
# float, numpy float64 or float32, flags Python bool or numpy bool_.
OBS = [np.float32, np.float64]
ACTIONS = [np.int64, np.int32, int]
REWARDS = [float, np.float64, np.float32]
FLAGS = [bool, np.bool_]


@pytest.mark.parametrize(
    "obs_t, action_t, reward_t, flag_t", list(itertools.product(OBS, ACTIONS, REWARDS, FLAGS))
)
def test_every_cartpole_dtype_combination_inserts(make_table, obs_t, action_t, reward_t, flag_t):
    table = make_table(fields=CARTPOLE, capacity=8)
    env = gymnasium.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    action = env.action_space.sample()
    next_obs, reward, terminated, _, _ = env.step(action)
    row = {
        "obs": obs.astype(obs_t),
        "action": action_t(action),
        "reward": reward_t(reward),
        "next_obs": next_obs.astype(obs_t),
        "terminated": flag_t(terminated),
    }
    one = table.add(row)
    batch = table.insert({k: np.asarray(v)[None] for k, v in row.items()})
    writer_table = make_table(fields=CARTPOLE, capacity=2, max_steps=3)
    with writer_table.writer() as writer:
        writer.append(row)
        episode = writer.end_episode()
    for got in (
        stored(table, one),
        stored(table, batch[0]),
        {k: c[episode, 0] for k, c in writer_table.columns.items()},
    ):
        np.testing.assert_array_equal(got["obs"], obs.astype(np.float32))
        np.testing.assert_array_equal(got["next_obs"], next_obs.astype(np.float32))
        assert got["action"] == action and got["action"].dtype == np.int32
        assert got["reward"] == np.float32(reward) and got["terminated"] == terminated
    env.close()


@pytest.mark.parametrize("obs_t", [np.uint8, np.int64, np.int32])
@pytest.mark.parametrize("action_t", [np.int64, int])
def test_atari_like_observations_insert_when_they_fit(make_table, obs_t, action_t):
    table = make_table(fields=ATARI, capacity=4)
    space = gymnasium.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    space.seed(0)
    frame = space.sample()
    row = {
        "obs": frame.astype(obs_t),
        "action": action_t(17),
        "reward": 1.0,
        "terminated": False,
        "truncated": True,
    }
    np.testing.assert_array_equal(stored(table, table.add(row))["obs"], frame)
    np.testing.assert_array_equal(
        stored(table, table.insert({k: np.asarray(v)[None] for k, v in row.items()})[0])["obs"], frame
    )
    too_bright = frame.astype(np.int64)
    too_bright[3, 4, 1] = 256
    before = table.row_status()
    with pytest.raises(
        gj.InvalidArgumentError, match=r"row\['obs'\] holds values in \[\d+, 256\], outside uint8"
    ):
        table.add({**row, "obs": too_bright})
    assert_unchanged(table, before)


def test_one_message_names_every_refused_field_and_nothing_is_written(make_table):
    table = make_table(fields=CARTPOLE, capacity=8)
    table.add({"obs": np.zeros(4), "action": 1, "reward": 0.5, "next_obs": np.zeros(4), "terminated": False})
    bad = {
        "obs": np.zeros(4, np.int64),  # integers into a float field: another kind
        "action": 2.5,  # a float into an integer field
        "reward": 1e300,  # overflows float32
        "next_obs": np.zeros(3, np.float32),  # wrong shape
        "terminated": 2,  # an integer into a bool field
    }
    before = table.row_status()
    for call in (
        lambda: table.add(bad),
        lambda: table.add(types.MappingProxyType(bad)),  # not a dict: the general path only
        lambda: table.insert({k: np.asarray(v)[None] for k, v in bad.items()}),
    ):
        with pytest.raises(gj.InvalidArgumentError) as info:
            call()
        message = str(info.value)
        assert message.startswith("5 fields can not be stored (casting='fit')"), message
        for name in bad:
            assert f"['{name}']" in message
        assert "floats are not stored as integers" in message and "beyond float32's range" in message
        assert_unchanged(table, before)
    assert table.size == 1


def test_strict_casting_refuses_typed_values_that_change_dtype(make_table):
    table = make_table(fields=CARTPOLE, capacity=8)
    table.casting = "strict"
    row = {
        "obs": np.zeros(4, np.float32),
        "action": np.int64(1),
        "reward": np.float64(0.5),
        "next_obs": np.zeros(4, np.float64),
        "terminated": False,
    }
    before = table.row_status()
    with pytest.raises(
        gj.InvalidArgumentError, match="2 fields can not be stored \\(casting='strict'\\)"
    ) as info:
        table.add(row)
    assert "row['action'] has dtype int64" in str(info.value) and "row['next_obs']" in str(info.value)
    assert "row['reward']" not in str(info.value)  # np.float64 is a Python float: it carries no precision
    assert_unchanged(table, before)
    # Python scalars and safe casts are stored under strict too.
    ok = table.add(
        {
            "obs": np.zeros(4, np.float16),
            "action": 3,
            "reward": 0.25,
            "next_obs": [0, 1, 2, 3],
            "terminated": True,
        }
    )
    assert stored(table, ok)["action"] == 3 and stored(table, ok)["next_obs"].tolist() == [0, 1, 2, 3]
    with pytest.raises(gj.InvalidArgumentError, match="casting="):
        table.casting = "unsafe"
    table.casting = "fit"
    assert stored(table, table.add(row))["action"] == 1
    strict = gj.Table.attach(table.name, casting="strict")
    try:
        with pytest.raises(gj.InvalidArgumentError, match="casting='strict'"):
            strict.insert({k: np.asarray(v)[None] for k, v in row.items()})
    finally:
        strict.close()


def test_float_and_integer_edges(make_table):
    table = make_table(fields={"f": gj.Field((), "float32"), "u": gj.Field((), "uint8")}, capacity=8)
    for f, u in (
        (np.inf, 0),
        (-np.inf, 255),
        (np.nan, np.int64(7)),
        (2**24, np.uint64(200)),
        (-3.4e38, True),
    ):
        got = stored(table, table.add({"f": f, "u": u}))
        np.testing.assert_array_equal(got["f"], np.float32(f))
        assert got["u"] == int(u)
    for f, u, message in (
        (2**24 + 1, 0, "does not represent exactly"),
        (3.5e38, 0, "beyond float32's range"),
        (0.0, 256, "outside uint8's range"),
        (0.0, -1, "outside uint8's range"),
        (0.0, np.int16(-1), "outside uint8's range"),
        (0.0, 2**70, "outside uint8's range"),
    ):
        with pytest.raises(gj.InvalidArgumentError, match=message):
            table.add({"f": f, "u": u})
    assert table.size == 5


# -- the short path and the general path store and refuse the same ----------------------------------

FIELD_DTYPES = [
    "bool",
    "int8",
    "uint8",
    "int16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
]
VALUE_DTYPES = [np.dtype(d) for d in FIELD_DTYPES if d != "bfloat16"]


def values(shape):
    arrays = st.sampled_from(VALUE_DTYPES).flatmap(
        lambda dtype: hnp.arrays(
            dtype,
            st.sampled_from([shape, (), (2,)]),
            elements=hnp.from_dtype(dtype, allow_nan=True, allow_infinity=True),
        )
    )
    python = st.one_of(
        st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True)
    )
    scalars = arrays.map(lambda a: a.reshape(-1)[0] if a.size else a)  # numpy scalars
    return st.one_of(
        arrays,
        scalars,
        python if shape == () else st.nothing(),
        st.lists(st.integers(-300, 300), min_size=2, max_size=2),
    )


@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    data=st.data(),
    dtype=st.sampled_from(FIELD_DTYPES),
    shape=st.sampled_from([(), (2,)]),
    strict=st.booleans(),
)
def test_the_short_path_stores_and_refuses_what_the_general_path_does(data, dtype, shape, strict):
    spec = gj.TableSpec(fields={"x": gj.Field(shape, dtype), "y": gj.Field((), "int32")}, capacity=4)
    value = data.draw(values(shape))
    with gj.Table.create(spec, casting="strict" if strict else "fit") as table:
        outcomes = []
        for row in ({"x": value, "y": 1}, types.MappingProxyType({"x": value, "y": 1})):
            try:
                outcomes.append(stored(table, table.add(row))["x"].tobytes())
            except gj.InvalidArgumentError as e:
                outcomes.append(f"refused: {e}")
        assert outcomes[0] == outcomes[1], (value, outcomes)
        assert table.size == (0 if isinstance(outcomes[0], str) else 2)


def test_bfloat16_fields_take_the_general_path(make_table):
    table = make_table(fields={"x": gj.Field((2,), "bfloat16")}, capacity=4)
    row = table.add({"x": np.array([1.5, -2.0], np.float32)})
    assert table.columns["x"][row, 0].astype(np.float32).tolist() == [1.5, -2.0]
    assert table.columns["x"].dtype == np.dtype(ml_dtypes.bfloat16)


def test_add_to_a_closed_table_and_bad_priorities(make_table):
    table = make_table(fields=CARTPOLE, capacity=4)
    row = {
        "obs": np.zeros(4, np.float32),
        "action": 0,
        "reward": 0.0,
        "next_obs": np.zeros(4, np.float32),
        "terminated": False,
    }
    for priority in (-1.0, float("nan"), float("inf"), 1e39, "high"):
        with pytest.raises(gj.InvalidArgumentError, match="priority"):
            table.add(row, priority=priority)
    assert table.size == 0
    added = table.add(row, priority=2.5)
    assert table.row_status()["priority"][added] == 2.5
    with pytest.raises(gj.InvalidArgumentError, match=r"must map every field .*; got unknown \['extra'\]$"):
        table.add({**row, "extra": 1})
    missing = next(iter(row))
    with pytest.raises(gj.InvalidArgumentError, match=rf"got missing \['{missing}'\]; unknown \['extra'\]$"):
        table.add({**{k: v for k, v in row.items() if k != missing}, "extra": 1})
    with pytest.raises(gj.InvalidArgumentError, match="must map field names"):
        table.add([1, 2])
    table.close()
    with pytest.raises(gj.TableClosedError):
        table.add(row)


def test_add_to_a_trajectory_table_writes_one_row_of_t_steps(make_table):
    table = make_table(fields={"x": gj.Field((), "int32")}, capacity=4, max_steps=5)
    row = table.add({"x": np.arange(3, dtype=np.int64)}, priority=3.0)
    assert table.row_status()["length"][row] == 3
    assert table.columns["x"][row, :3].tolist() == [0, 1, 2]


def test_python_ints_never_wrap_in_64_bit_fields(make_table):
    table = make_table(fields={"u": gj.Field((), "uint64"), "i": gj.Field((), "int64")}, capacity=4)
    for u, i in ((-1, 0), (0, 2**63), (2**64, 0), (0, -(2**63) - 1)):
        for call in (lambda: table.add({"u": u, "i": i}), lambda: table.insert({"u": [u], "i": [i]})):
            with pytest.raises(gj.InvalidArgumentError, match="range"):
                call()
    row = table.add({"u": 2**64 - 1, "i": -(2**63)})
    assert int(table.columns["u"][row, 0]) == 2**64 - 1 and int(table.columns["i"][row, 0]) == -(2**63)
    assert table.size == 1


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    data=st.data(),
    dtype=st.sampled_from(FIELD_DTYPES),
    shape=st.sampled_from([(), (2,)]),
    strict=st.booleans(),
)
def test_the_native_batch_casts_store_and_refuse_what_the_general_path_does(data, dtype, shape, strict):
    # A dict of numpy arrays takes the native paths (a batch of one: the one-row short path; more rows:
    # Batches.ready and the native insert's casts); a read-only mapping of the same arrays takes
    # Batches.host (numpy's casts and the policy's checks). Both must store or refuse the same.
    spec = gj.TableSpec(fields={"x": gj.Field(shape, dtype), "y": gj.Field((), "int32")}, capacity=4)
    value_dtype = data.draw(st.sampled_from(VALUE_DTYPES))
    n = data.draw(st.sampled_from([1, 2]))  # a batch of one takes the one-row short path
    value = data.draw(
        hnp.arrays(value_dtype, (n, *shape), elements=hnp.from_dtype(value_dtype, allow_nan=True))
    )
    y = np.arange(1, n + 1, dtype=np.int32)
    with gj.Table.create(spec, casting="strict" if strict else "fit") as table:
        outcomes = []
        for batch in ({"x": value, "y": y}, types.MappingProxyType({"x": value, "y": y})):
            try:
                rows = table.insert(batch)
                outcomes.append(np.stack([stored(table, r)["x"] for r in rows]).tobytes())
            except gj.InvalidArgumentError as e:
                outcomes.append(f"refused: {e}")
        assert outcomes[0] == outcomes[1], (value, outcomes)
        assert table.size == (0 if isinstance(outcomes[0], str) else 2 * n)


GYMNASIUM_DQN = {  # the SB3 / CleanRL convention: done as float32, so that a learner computes 1 - done
    "obs": gj.Field((4,), "float32"),
    "action": gj.Field((), "int32"),
    "reward": gj.Field((), "float32"),
    "next_obs": gj.Field((4,), "float32"),
    "done": gj.Field((), "float32"),
}


def gymnasium_batch(n):
    # What a gymnasium vector env hands out: float32 observations, int64 actions, float64 rewards, bool
    # flags.
    return {
        "obs": np.full((n, 4), 0.5, np.float32),
        "action": np.arange(n, dtype=np.int64) % 2,
        "reward": np.ones(n, np.float64),
        "next_obs": np.full((n, 4), 0.25, np.float32),
        "done": np.arange(n) % 2 == 1,
    }


def test_gymnasium_values_take_the_native_short_path(make_table, recwarn):
    table = make_table(fields=GYMNASIUM_DQN, capacity=16)
    batch = gymnasium_batch(3)
    checked = table._batches.ready(batch, "fit")
    assert checked is not None  # no detour through numpy's casts: the native insert converts
    arrays, rows, steps = checked
    assert (rows, steps) == (3, 1) and [a.dtype for a in arrays] == [a.dtype for a in batch.values()]
    assert table._batches.native_types == "f4i4f4f4f4"
    inserted = table.insert(batch)
    assert table.columns["action"][inserted, 0].tolist() == [0, 1, 0]
    assert table.columns["done"][inserted, 0].tolist() == [0.0, 1.0, 0.0]
    assert table.columns["reward"][inserted, 0].dtype == np.float32
    # One-row writes: a Python bool or a numpy bool into the float32 `done` field, numpy int64 actions.
    for done in (True, np.bool_(False)):
        row = {"obs": batch["obs"][0], "action": np.int64(1), "reward": 1.0, "next_obs": batch["obs"][0]}
        row["done"] = done
        assert table._row_writer.pack(row, False)  # the native short path takes it
        r = table.add(row)
        assert table.columns["done"][r, 0] == float(bool(done)) and table.columns["action"][r, 0] == 1
    assert not [w for w in recwarn if issubclass(w.category, gj.SlowPathWarning)]
    # Under "strict" an int64 action is refused by name, on both paths.
    table.casting = "strict"
    with pytest.raises(gj.InvalidArgumentError, match="action"):
        table.insert(batch)
    assert table._batches.ready(batch, "strict") is None
    assert table.size == 5


def test_int64_actions_out_of_range_are_refused_on_the_short_path_too(make_table):
    table = make_table(fields=GYMNASIUM_DQN, capacity=16)
    batch = gymnasium_batch(2)
    batch["action"] = np.array([1, 2**40], np.int64)
    # The native insert finds the value that does not fit before anything is claimed; the general path
    # then refuses it by name.
    with pytest.raises(gj.InvalidArgumentError, match=r"batch\['action'\].*range"):
        table.insert(batch)
    with pytest.raises(OverflowError, match="field 1"):
        arrays, rows, steps = table._batches.ready(batch, "fit")
        table._native.insert(arrays, rows, steps, None, None, None, True, table._batches.native_types)
    assert table.size == 0
    batch["action"] = np.array([1, 2**31 - 1], np.int64)  # the edge fits
    table.insert(batch)
    assert table.columns["action"][:2, 0].tolist() == [1, 2**31 - 1]


def test_the_general_path_warns_once_per_field_naming_the_fix(make_table):
    table = make_table(fields=GYMNASIUM_DQN, capacity=16)
    batch = gymnasium_batch(2)
    batch["obs"] = batch["obs"].tolist()  # a list: only the general path takes it
    with pytest.warns(gj.SlowPathWarning, match=r"batch\['obs'\] is a builtins.list; pass numpy arrays"):
        table.insert(batch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", gj.SlowPathWarning)
        table.insert(batch)  # warned once: silent now
    row = {k: v[0] for k, v in gymnasium_batch(1).items()}
    row["next_obs"] = row["next_obs"].tolist()  # a list of a shaped field: only the general path takes it
    with pytest.warns(gj.SlowPathWarning, match=r"row\['next_obs'\] is a builtins.list"):
        table.add(row)
    assert table.size == 5


@pytest.mark.parametrize("ring", [False, True], ids=["padded", "step_ring"])
def test_every_general_path_warning_names_the_callers_line(make_table, ring):
    fields = {"x": gj.Field((2,), np.float32)}
    table = make_table(fields=fields, capacity=8)
    ring_steps = {"step_capacity": 16} if ring else {}
    episodes = gj.Table.create(gj.TableSpec(fields, capacity=4, max_steps=4, **ring_steps))
    listed = [1.0, 2.0]  # a list of a shaped field: the general path
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", gj.SlowPathWarning)
        table.insert({"x": [[1.0, 2.0]]})
        table.add({"x": listed})
        writer = episodes.writer()
        writer.append({"x": listed})
        writer.end_episode()
    episodes.close()
    assert len(caught) == 3 and [w.filename for w in caught] == [__file__] * 3
    assert [str(w.message).split("[")[0] for w in caught] == ["batch", "row", "step"]


def test_a_batch_of_one_row_takes_the_one_row_short_path(make_table, monkeypatch):
    table = make_table(fields=GYMNASIUM_DQN, capacity=16)
    calls = []
    monkeypatch.setattr(table._batches, "ready", lambda *a: calls.append(a) or None)  # must not be reached
    rows = table.insert(gymnasium_batch(1), priorities=0.0)
    assert rows.dtype == np.int32 and rows.tolist() == [0] and not calls
    assert table.row_status()["priority"][0] == 0.0  # a priority of 0 is kept, not replaced by the default
    assert table.columns["done"][0, 0] == 0.0 and table.columns["action"][0, 0] == 0
    monkeypatch.undo()
    # A Python scalar beside batch-of-one arrays is no batch: refused by name, nothing written.
    batch = gymnasium_batch(1)
    batch["reward"] = 1.0
    with pytest.raises(gj.InvalidArgumentError, match=r"batch\['reward'\]"):
        table.insert(batch)
    assert table.size == 1


def test_integers_a_float_field_cannot_hold_exactly_are_refused(make_table):
    # numpy calls int64 -> float64 safe, but 2**53 + 1 rounds; and an integer that overflows a float16
    # becomes an infinity (whose way back to int64 can even give the integer back). Neither is stored.
    table = make_table(fields={"f": gj.Field((), "float64"), "h": gj.Field((), "float16")}, capacity=8)
    for casting in ("fit", "strict"):
        table.casting = casting
        with pytest.raises(gj.InvalidArgumentError, match=r"batch\['f'\] holds integers that float64"):
            table.insert({"f": np.array([1, 2**53 + 1], np.int64), "h": np.zeros(2, np.float16)})
        with pytest.raises(gj.InvalidArgumentError, match=r"row\['f'\] holds integers that float64"):
            table.add({"f": 2**53 + 1, "h": 0.0})
        with pytest.raises(gj.InvalidArgumentError, match=r"row\['h'\] holds"):
            table.add({"f": 0.0, "h": -(2**63)})
        table.insert({"f": np.array([2**53, -(2**53)], np.int64), "h": np.zeros(2, np.float16)})
        table.add({"f": 2**60, "h": -2048})  # exactly representable: stored
    assert table.size == 6
    assert table.columns["f"][:, 0].tolist()[:3] == [2.0**53, -(2.0**53), 2.0**60]
    assert table.columns["h"][2, 0] == -2048


def test_torch_int64_tensors_a_float64_field_cannot_hold_exactly_are_refused(make_table):
    torch = pytest.importorskip("torch")
    table = make_table(fields={"f": gj.Field((), "float64")}, capacity=4)
    with pytest.raises(gj.InvalidArgumentError, match=r"batch\['f'\] holds integers that float64"):
        table.insert({"f": torch.tensor([1, 2**53 + 1], dtype=torch.int64)})
    table.insert({"f": torch.tensor([3, 2**53], dtype=torch.int64)})
    assert table.columns["f"][:, 0].tolist()[:2] == [3.0, 2.0**53] and table.size == 2


def test_a_mapping_or_none_as_a_fields_value_is_refused_with_what_to_do(make_table):
    """A nested observation (a Dict space's value) or None, which numpy would make an object array, is
    refused as what it is, in inserts and episode writers, and nothing is written."""
    table = make_table(capacity=8, max_steps=4)
    nested = {"obs": {"pos": np.zeros((1, 4, 3), np.float32)}, "action": np.zeros((1, 4), np.int32)}
    with pytest.raises(gj.InvalidArgumentError, match=r"batch\['obs'\] is a mapping \(keys \['pos'\]\)"):
        table.insert(nested)
    with table.writer() as writer:
        with pytest.raises(gj.InvalidArgumentError, match=r"step\['obs'\] is a mapping .*one field per key"):
            writer.append({"obs": {"pos": np.zeros(3, np.float32)}, "action": 1})
        with pytest.raises(gj.InvalidArgumentError, match=r"step\['obs'\] is None; give a value"):
            writer.append({"obs": None, "action": 1})
        assert writer.steps == 0
    assert table.size == 0


def test_a_vector_envs_strided_observations_take_the_short_path(make_table):
    """gymnasium's CartPole vector env hands out observations that are not C-contiguous (a transposed
    state): inserts, rows and episode steps of them are copied into C order for the short path, without
    a SlowPathWarning, and stored exactly."""
    gymnasium = pytest.importorskip("gymnasium")
    env = gymnasium.make_vec("CartPole-v1", num_envs=4)
    obs, _ = env.reset(seed=0)
    assert not obs.flags.c_contiguous  # what this test is about
    fields = {"obs": gj.Field((4,), np.float32), "action": gj.Field((), np.int32)}
    table = make_table(fields=fields, capacity=16)
    episodes = make_table(fields=fields, capacity=4, max_steps=4)
    actions = np.arange(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", gj.SlowPathWarning)
        rows = table.insert({"obs": obs, "action": actions})
        row = table.add({"obs": obs[1], "action": 7})
        with episodes.writer() as writer:
            for i in range(4):
                writer.append({"obs": obs[i], "action": i})
            episode = writer.end_episode()
    np.testing.assert_array_equal(table.columns["obs"][rows, 0], obs)
    np.testing.assert_array_equal(table.columns["obs"][row, 0], obs[1])
    np.testing.assert_array_equal(episodes.columns["obs"][episode], obs)
    env.close()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_strided_values_of_every_shape_are_gathered_in_c_order_by_the_short_path(make_table, dtype):
    """The native short path gathers a strided row or step (a transposed 2-D value, a column of a batch
    of one, another dtype to convert) in C order: the values stored are numpy's, with no warning."""
    fields = {"m": gj.Field((2, 3), np.float32), "x": gj.Field((), np.int32)}
    table = make_table(fields=fields, capacity=8)
    episodes = make_table(fields=fields, max_steps=4)
    base = np.arange(24, dtype=dtype).reshape(4, 3, 2)
    transposed = base[1].T  # (2, 3), strides of a transpose
    batch_of_one = base[2:3].transpose(0, 2, 1)  # (1, 2, 3), a batch of one of a transposed value
    assert not transposed.flags.c_contiguous and not batch_of_one.flags.c_contiguous
    with warnings.catch_warnings():
        warnings.simplefilter("error", gj.SlowPathWarning)
        rows = [table.add({"m": transposed, "x": 1}), table.add({"m": batch_of_one, "x": np.array([2])})]
        with episodes.writer() as writer:
            writer.append({"m": transposed, "x": 3})
            episode = writer.end_episode()
    np.testing.assert_array_equal(table.columns["m"][rows[0], 0], transposed.astype(np.float32))
    np.testing.assert_array_equal(table.columns["m"][rows[1], 0], batch_of_one[0].astype(np.float32))
    np.testing.assert_array_equal(episodes.columns["m"][episode, 0], transposed.astype(np.float32))

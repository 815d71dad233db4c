"""Bad arguments that used to escape as raw Python or native errors (TypeError, AttributeError,
std::bad_alloc) or were accepted silently: each is refused with a gear_jax error naming the argument."""

import jax
import numpy as np
import pytest

import gear_jax as gj


@pytest.fixture
def table(make_table):
    t = make_table(fields={"x": gj.Field((), "float32")}, capacity=8)
    t.insert({"x": np.zeros(4, np.float32)})
    return t


@pytest.mark.parametrize("path", [None, 5, b"/tmp/a-checkpoint", ""])
def test_checkpoint_paths_that_are_not_paths(table, path):
    with pytest.raises(gj.InvalidArgumentError, match=r"Table.save: path=.* must be a non-empty str"):
        table.save(path)
    with pytest.raises(gj.InvalidArgumentError, match=r"Table.load: path=.* must be a non-empty str"):
        gj.Table.load(path)


def test_a_save_under_a_missing_parent_names_it(table, tmp_path):
    path = tmp_path / "missing" / "ckpt"
    with pytest.raises(gj.CheckpointError, match=r"its parent directory '.*missing' does not exist"):
        table.save(path)
    assert not (tmp_path / "missing").exists()


def test_counts_casting_specs_and_pool_limits(table):
    with pytest.raises(gj.InvalidArgumentError, match=r"await_samples: n=9223372036854775808 is beyond"):
        table.await_samples(2**63)
    with pytest.raises(gj.InvalidArgumentError, match=r"casting=array\(\['fit'\]"):
        table.casting = np.array(["fit"])  # compares equal elementwise: once stored as the policy
    assert table.casting == "fit"
    with pytest.raises(gj.InvalidArgumentError, match=r"Table.attach: spec=5 must be a gear_jax.TableSpec"):
        gj.Table.attach(table.name, spec=5)
    before = gj.pool_stats()
    with pytest.raises(gj.InvalidArgumentError, match=r"configure_pool: max_bytes=18446744073709551616"):
        gj.configure_pool(max_bytes=2**64)
    assert gj.pool_stats()["max_bytes"] == before["max_bytes"]


@pytest.mark.parametrize("method", ["fifo", "lifo", "topk"])
def test_distinct_picks_beyond_the_capacity_are_refused_by_name(table, method):
    # These methods pick distinct rows: 2**28 of them from 8 rows once ended in std::bad_alloc.
    with pytest.raises(gj.InvalidArgumentError, match=r"batch_size=268435456 exceeds the table's capacity"):
        gj.sample(table, jax.random.key(0), 2**28, method=method)
    with pytest.raises(gj.InvalidArgumentError, match=r"batch_size=9 exceeds the table's capacity \(8\)"):
        gj.host.sample(table, 0, 9, method=method)
    assert np.asarray(gj.sample(table, jax.random.key(0), 4, method=method).indices).shape == (4,)


def test_inserts_into_a_table_whose_rows_are_all_held_raise_all_rows_held(make_table):
    # Every row held by a writer: the insert raised a raw RuntimeError (issue 32's probe); now a gear_jax
    # error (still a RuntimeError) naming the table and the fix, from every way of inserting.
    table = make_table(fields={"x": gj.Field((), "int32")}, capacity=2, max_steps=4)
    writers = [table.writer(), table.writer()]
    for i, writer in enumerate(writers):
        writer.append({"x": np.int32(i)})
    calls = {
        "insert": lambda: table.insert({"x": np.zeros((1, 4), np.int32)}, lengths=[1]),
        "writer": lambda: table.writer().append({"x": np.int32(3)}),
        "add": lambda: table.add({"x": np.zeros(4, np.int32)}),
    }
    for name, call in calls.items():
        with pytest.raises(gj.AllRowsHeldError, match=f"every row of table '{table.name}' is being written"):
            call()
    assert issubclass(gj.AllRowsHeldError, RuntimeError) and table.size == 0
    for writer in writers:
        writer.end_episode()
    assert table.size == 2
    (row,) = table.insert({"x": np.zeros((1, 4), np.int32)}, lengths=[1])  # rows free again
    assert table.row_status()["length"][row] == 1


@pytest.mark.parametrize("flag", [np.array([True, False]), "yes", 1, None])
def test_flags_are_true_or_false(make_table, flag):
    # An array as a flag escaped as numpy's "truth value of an array is ambiguous" (issue 32's probe).
    spec = gj.TableSpec({"x": gj.Field((), "float32")}, capacity=4, max_steps=2)
    for name in ("pin", "reuse", "outlive_creator"):
        with pytest.raises(gj.InvalidArgumentError, match=rf"Table.create: {name}=.* must be True or False"):
            gj.Table.create(spec, **{name: flag})
    table = make_table(fields={"x": gj.Field((), "float32")}, capacity=4, max_steps=2)
    with pytest.raises(gj.InvalidArgumentError, match=r"Table.attach: pin=.* must be True or False"):
        gj.Table.attach(table.name, pin=flag)
    with pytest.raises(gj.InvalidArgumentError, match=r"insert: time_major=.* must be True or False"):
        gj.insert(table, {"x": np.ones((2, 1), np.float32)}, time_major=flag)
    assert table.size == 0
    # np.bool_ is a flag, and a traced one is refused with the way to make it static.
    gj.insert(table, {"x": np.ones((2, 1), np.float32)}, time_major=np.bool_(True))
    assert table.size == 1
    with pytest.raises(gj.InvalidArgumentError, match=r"time_major is a traced value .* static_argnames"):
        jax.jit(lambda tm: gj.insert(table, {"x": np.ones((2, 1), np.float32)}, time_major=tm))(True)


def test_priorities_whose_weights_underflow_are_named(make_table):
    # Weights p^a that underflow a double reported "the table holds no selectable rows" (issue 32's probe).
    table = make_table(fields={"x": gj.Field((), "float32")}, capacity=8)
    table.insert({"x": np.zeros(8, np.float32)}, priorities=np.full(8, 1e-30, np.float32))
    for sample in (
        lambda: gj.sample(table, jax.random.key(0), 4, method="prioritized", priority_exponent=20.0),
        lambda: gj.host.sample(
            table, np.random.default_rng(0), 4, method="prioritized", priority_exponent=20.0
        ),
    ):
        with pytest.raises(
            (gj.GearJaxError, *gj.EXECUTION_ERRORS), match=r"holds 8 selectable rows, but every"
        ):
            jax.block_until_ready(sample())
    # The same priorities under a smaller exponent sample; an empty table is still called empty.
    picks = gj.sample(table, jax.random.key(0), 4, method="prioritized", priority_exponent=2.0)
    assert np.isin(np.asarray(picks.indices), np.arange(8)).all()
    empty = make_table(fields={"x": gj.Field((), "float32")}, capacity=8)
    with pytest.raises(gj.EXECUTION_ERRORS, match=r"holds no selectable rows"):
        jax.block_until_ready(gj.sample(empty, jax.random.key(0), 4, method="prioritized"))


def test_exponents_after_and_hand_made_samples_that_escaped_as_raw_errors(table):
    rng = np.random.default_rng(0)
    for call in (
        lambda: gj.sample(table, jax.random.key(0), 2, method="prioritized", priority_exponent=1e39),
        lambda: gj.host.sample(table, rng, 2, method="prioritized", priority_exponent=1e39),
    ):
        with pytest.raises(gj.InvalidArgumentError, match=r"priority_exponent=1e\+39 .*\(at most 3.4e38"):
            call()
    with pytest.raises(gj.InvalidArgumentError, match=r"after= must be an array .* got str"):
        gj.sample(table, jax.random.key(0), 2, after="abc")
    with pytest.raises(gj.InvalidArgumentError, match=r"the Sample's indices is a list"):
        gj.gather(table, gj.Sample([1, 0], [2, 2], [1.0, 1.0], [0, 0]))
    wraps = gj.Sample(
        np.array([2**31, 0], np.uint32),
        np.array([2, 2], np.uint32),
        np.ones(2, np.float32),
        np.zeros(2, np.int32),
    )
    for call in (lambda: gj.host.gather(table, wraps), lambda: gj.gather(table, wraps)):
        with pytest.raises(gj.InvalidArgumentError, match=r"indices have dtype uint32; they must be signed"):
            call()


def test_no_window_long_enough_to_skip_to_is_named(make_table):
    table = make_table(fields={"x": gj.Field((), "float32")}, capacity=8, max_steps=4)
    table.insert({"x": np.ones((3, 4), np.float32)}, lengths=[1, 1, 1])  # 3 rows of priority 1
    with pytest.raises(gj.EXECUTION_ERRORS, match=r'no selectable rows .*short_episodes="skip" is shorter'):
        jax.block_until_ready(gj.sample(table, jax.random.key(0), 2, window=3, short_episodes="skip"))
    with pytest.raises(gj.NotEnoughRowsError, match=r'short_episodes="skip" is shorter than the window'):
        gj.host.sample(table, np.random.default_rng(0), 2, window=3, short_episodes="skip")

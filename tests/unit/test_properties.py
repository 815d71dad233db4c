"""Property tests: any spec, any batch, any window — what goes in comes back out."""

import jax
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh

import gear_jax as gj

DTYPES = ["bool", "int8", "uint16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


def random_values(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype == "bfloat16":
        return rng.normal(size=shape).astype(ml_dtypes.bfloat16)
    if np.dtype(dtype).kind == "f":
        return rng.normal(size=shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), shape).astype(dtype)


@st.composite
def table_cases(draw):
    num_fields = draw(st.integers(1, 3))
    fields = {
        f"f{i}": gj.Field(tuple(draw(st.lists(st.integers(1, 5), max_size=2))), draw(st.sampled_from(DTYPES)))
        for i in range(num_fields)
    }
    max_steps = draw(st.integers(1, 6))
    capacity = draw(st.integers(1, 12))
    rows = draw(st.integers(1, 20))
    steps = draw(st.integers(1, max_steps))
    window = draw(st.one_of(st.none(), st.integers(1, max_steps)))
    return fields, capacity, max_steps, rows, steps, window, draw(st.integers(0, 2**31))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=table_cases())
def test_insert_then_gather_round_trips(case):
    fields, capacity, max_steps, rows, steps, window, seed = case
    rng = np.random.default_rng(seed)
    spec = gj.TableSpec(fields, capacity=capacity, max_steps=max_steps)
    with gj.Table.create(spec) as table:
        lead = (rows, steps) if spec.is_trajectory else (rows,)
        data = {n: random_values(rng, (*lead, *f.shape), f.dtype.name) for n, f in fields.items()}
        lengths = rng.integers(1, steps + 1, rows)
        ids = table.insert(data, lengths=lengths if spec.is_trajectory else None)
        # The ring keeps the last `capacity` rows: row id -> the batch row that wrote it last.
        last = {int(r): b for b, r in enumerate(ids)}
        assert table.size == len(last)
        s = gj.sample(table, jax.random.key(seed), 16, window=window if spec.is_trajectory else None)
        batch = gj.gather(table, s)
        w = (window or max_steps) if spec.is_trajectory else 1
        for i, row in enumerate(np.asarray(s.indices)):
            b = last[int(row)]
            start = int(s.starts[i])
            n = min(w, lengths[b] - start) if spec.is_trajectory else 1
            assert n >= 1
            for name in fields:
                got = np.asarray(batch[name][i])
                if spec.is_trajectory:
                    np.testing.assert_array_equal(got[:n], data[name][b, start : start + n])
                    assert not got[n:].astype(bool).any()
                else:
                    np.testing.assert_array_equal(got, data[name][b])
            valid = np.asarray(batch["valid"][i])
            np.testing.assert_array_equal(valid, np.arange(w) < n if spec.is_trajectory else True)


# -- any argument, well formed or not: a correct result or a gear_jax error -------------------------------

import contextlib  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import tempfile  # noqa: E402

import jax.numpy as jnp  # noqa: E402

# What a call may raise: gear_jax's own errors (bad arguments, found at trace time) and the runtime
# errors of its custom calls (an empty table, a NaN priority found while running: JaxRuntimeError, or
# ValueError from JAX's fast dispatch path), whose messages name the gear_jax operation. Anything else -- a
# TypeError, KeyError, IndexError from inside the library, a crash or a hang -- fails the test.
ALLOWED = (gj.GearJaxError, *gj.EXECUTION_ERRORS)  # the runtime ones must name a gear_jax operation
CALL_TIMEOUT_S = 60


@contextlib.contextmanager
def no_hang(what):
    """Fails the example if the calls inside take more than CALL_TIMEOUT_S."""

    def expired(*_):
        raise AssertionError(f"{what} did not return within {CALL_TIMEOUT_S} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(CALL_TIMEOUT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def result_or_gear_jax_error(what, call):
    """(True, result) or (False, the gear_jax error); anything else propagates and fails the test."""
    try:
        result = True, jax.block_until_ready(call())
        event(f"{what}: done")
        return result
    except ALLOWED as e:
        assert isinstance(e, gj.GearJaxError) or "gear_jax" in str(e), f"not a gear_jax error: {e!r}"
        event(f"{what}: {type(e).__name__} {str(e)[:70]}")
        return False, e


ODD_INTS = st.sampled_from([-(2**63), -(2**31), -1, 0, 1, 2, 3, 7, 2**31 - 1, 2**31, 2**40])
ODD_FLOATS = st.sampled_from([float("nan"), float("inf"), -float("inf"), -1.0, -0.0, 0.0, 0.5, 1.0, 3e38])


def mostly(draw, valid, invalid):
    """A value from `valid` four times in five, else from `invalid`."""
    return draw(invalid) if draw(st.integers(0, 4)) == 4 else draw(valid)


@st.composite
def call_cases(draw):
    """A table, a batch to insert (possibly malformed), and arguments for sample, gather and
    update_priorities, each well formed four times in five."""
    fields = {
        f"f{i}": gj.Field(tuple(draw(st.lists(st.integers(1, 4), max_size=2))), draw(st.sampled_from(DTYPES)))
        for i in range(draw(st.integers(1, 2)))
    }
    max_steps, capacity = draw(st.integers(1, 5)), draw(st.integers(1, 10))
    rows = mostly(draw, st.integers(1, 12), st.just(0))
    steps = mostly(draw, st.integers(1, max_steps), st.sampled_from([0, max_steps + 1]))
    batch_dtype = mostly(draw, st.none(), st.sampled_from(["float64", "int64", "bool", "uint8", "object"]))
    lengths = mostly(
        draw,
        st.one_of(st.none(), st.lists(st.integers(1, steps or 1), min_size=rows, max_size=rows)),
        st.lists(st.one_of(st.integers(1, max_steps), ODD_INTS), min_size=rows, max_size=rows),
    )
    priorities = mostly(
        draw,
        st.one_of(st.none(), st.lists(st.floats(0.01, 10), min_size=rows, max_size=rows)),
        st.lists(st.one_of(st.floats(0, 10), ODD_FLOATS), min_size=rows, max_size=rows),
    )
    return {
        "fields": fields,
        "capacity": capacity,
        "max_steps": max_steps,
        "rows": rows,
        "steps": steps,
        "batch_dtype": batch_dtype,
        "lengths": lengths,
        "priorities": priorities,
        "batch_size": mostly(
            draw, st.integers(1, 40), st.one_of(ODD_INTS, st.sampled_from([2.0, "4", None]))
        ),
        "method": mostly(
            draw,
            st.sampled_from(["uniform", "prioritized", "fifo", "lifo", "topk"]),
            st.sampled_from(["random", 1]),
        ),
        "exponent": mostly(draw, st.floats(0, 3), ODD_FLOATS),
        "window": mostly(draw, st.one_of(st.none(), st.integers(1, max_steps)), ODD_INTS),
        "key": mostly(draw, st.just("key"), st.sampled_from(["old_key", "int", "uint32_pair", "none"])),
        "gather_fields": mostly(
            draw, st.sampled_from([None, "f0"]), st.sampled_from([("f0", "missing"), (), 5])
        ),
        "new_priorities": mostly(
            draw,
            st.sampled_from(["good", "ints"]),
            st.sampled_from(["nan", "negative", "wrong_shape", "strings"]),
        ),
        "seed": draw(st.integers(0, 2**31)),
    }


def make_key(kind, seed):
    return {
        "key": lambda: jax.random.key(seed),
        "old_key": lambda: jax.random.PRNGKey(seed),
        "int": lambda: seed,
        "uint32_pair": lambda: np.array([seed, 1], np.uint32),
        "none": lambda: None,
    }[kind]()


def check_sample(table, s, batch_size):
    indices = np.asarray(s.indices)
    assert indices.shape == (batch_size,) and ((indices >= 0) & (indices < table.capacity)).all()
    probabilities = np.asarray(s.probabilities)
    assert np.isfinite(probabilities).all() and (probabilities > 0).all() and (probabilities <= 1).all()
    status = table.row_status()
    picked = status["generation"][indices]
    assert (picked % 2 == 0).all() and (status["length"][indices] > 0).all()
    assert (np.asarray(s.generations) == picked).all()


def check_gather(table, s, out, names):
    status = table.row_status()
    valid = np.asarray(out["valid"])
    for i, row in enumerate(np.asarray(s.indices)):
        start, n = int(s.starts[i]), int(status["length"][row])
        for name in names:
            got = np.asarray(out[name][i])
            stored = table.columns[name][row]
            if table.spec.is_trajectory:
                w = got.shape[0]
                want = np.arange(w) + start < n
                np.testing.assert_array_equal(valid[i], want)
                np.testing.assert_array_equal(got[want], stored[start : start + int(want.sum())])
                assert not got[~want].astype(bool).any()
            else:
                assert valid[i]
                np.testing.assert_array_equal(got, stored[0])


# Random exponents go with every method: the warning that one changes nothing is expected here.
@pytest.mark.filterwarnings("ignore:sample.*has no effect with method:UserWarning")
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=call_cases())
def test_any_arguments_give_a_correct_result_or_a_gear_jax_error(case):
    rng = np.random.default_rng(case["seed"])
    spec = gj.TableSpec(case["fields"], capacity=case["capacity"], max_steps=case["max_steps"])
    with gj.Table.create(spec) as table, no_hang("the calls"):
        lead = (case["rows"], case["steps"]) if spec.is_trajectory else (case["rows"],)
        data = {}
        for name, field in spec.fields.items():
            values = random_values(rng, (*lead, *field.shape), field.dtype.name)
            data[name] = values if case["batch_dtype"] is None else values.astype(case["batch_dtype"])
        before = table.row_status()
        inserted, result = result_or_gear_jax_error(
            "insert", lambda: table.insert(data, priorities=case["priorities"], lengths=case["lengths"])
        )
        if not inserted:  # refused: nothing was written
            after = table.row_status()
            assert all(np.array_equal(before[k], after[k]) for k in before), "a refused insert changed rows"
        else:
            assert len(result) == case["rows"] and table.size == len(set(result.tolist()))
        if table.size == 0:  # something to sample from: a well-formed batch of 3 rows
            lead = (3, case["max_steps"]) if spec.is_trajectory else (3,)
            table.insert(
                {n: random_values(rng, (*lead, *f.shape), f.dtype.name) for n, f in spec.fields.items()}
            )

        key = make_key(case["key"], case["seed"])
        window = case["window"] if spec.is_trajectory else None
        sampled, s = result_or_gear_jax_error(
            "sample",
            lambda: gj.sample(
                table,
                key,
                case["batch_size"],
                method=case["method"],
                priority_exponent=case["exponent"],
                window=window,
            ),
        )
        if not sampled:
            return
        check_sample(table, s, case["batch_size"])

        gathered, out = result_or_gear_jax_error(
            "gather", lambda: gj.gather(table, s, fields=case["gather_fields"])
        )
        if gathered:
            names = [n for n in out if n != "valid"]
            assert names and set(names) <= set(spec.fields)
            check_gather(table, s, out, names)

        b = len(s.indices)
        new = {
            "good": lambda: jnp.asarray(rng.uniform(0, 5, b), jnp.float32),
            "nan": lambda: jnp.full(b, jnp.nan),
            "negative": lambda: jnp.full(b, -1.0),
            "wrong_shape": lambda: jnp.ones(b + 1),
            "ints": lambda: jnp.arange(b),
            "strings": lambda: np.array(["a"] * b),
        }
        before = table.row_status()
        updated, count = result_or_gear_jax_error(
            "update_priorities", lambda: gj.update_priorities(table, s, new[case["new_priorities"]]())
        )
        after = table.row_status()
        if not updated:
            assert np.array_equal(before["priority"], after["priority"]), (
                "a refused update changed priorities"
            )
        else:
            assert int(count) == b and case["new_priorities"] in ("good", "ints")
            assert (after["priority"] >= 0).all() and np.isfinite(after["priority"]).all()


# -- the rest of the public API: rate limiter, inserts inside jit, checkpoints, sharded tables ------

TIMEOUTS = st.sampled_from([0.0, 0.01])  # never None: a limiter that cannot admit would wait for good
ODD_TIMEOUTS = st.sampled_from([-1.0, float("nan"), "1", np.array([1.0])])  # no long waits
ODD_VALUES = st.sampled_from([None, "x", -1, 0, 2.5, float("nan"), np.array([1, 2]), 2**70])


@st.composite
def api_cases(draw):
    """A small trajectory or transition table, and arguments for the calls beyond sample and gather,
    each well formed four times in five."""
    max_steps, capacity = draw(st.integers(1, 4)), draw(st.integers(2, 8))
    rows = draw(st.integers(1, 6))
    return {
        "max_steps": max_steps,
        "capacity": capacity,
        "ring": draw(st.booleans()) and max_steps > 1,
        "rows": rows,
        "limiter": mostly(
            draw,
            st.one_of(
                st.none(),
                st.tuples(st.integers(1, capacity), st.none(), st.none()),
                st.tuples(st.integers(1, capacity), st.floats(0.5, 4), st.floats(50, 1000)),
            ),
            st.tuples(
                st.one_of(st.integers(1, capacity), ODD_INTS, ODD_VALUES),
                st.one_of(st.floats(0.5, 4), ODD_FLOATS, ODD_VALUES),
                st.one_of(st.floats(50, 1000), ODD_FLOATS, ODD_VALUES),
            ),
        ),
        "timeout": mostly(draw, TIMEOUTS, ODD_TIMEOUTS),
        "await_n": mostly(draw, st.integers(1, 4), st.one_of(ODD_INTS, ODD_VALUES)),
        "jit_lengths": mostly(
            draw,
            st.one_of(st.none(), st.lists(st.integers(1, max_steps), min_size=rows, max_size=rows)),
            st.one_of(st.lists(ODD_INTS, min_size=rows, max_size=rows), ODD_VALUES),
        ),
        "jit_priorities": mostly(
            draw,
            st.one_of(st.none(), st.just("max"), st.floats(0, 5)),
            st.one_of(ODD_FLOATS, st.just("min"), ODD_VALUES),
        ),
        "time_major": mostly(draw, st.booleans(), ODD_VALUES),
        "path": mostly(draw, st.just("fresh"), st.sampled_from(["none", "int", "empty", "missing_parent"])),
        "load_name": mostly(draw, st.none(), st.sampled_from(["bad name/", 5, ""])),
        "load_casting": mostly(draw, st.just("fit"), st.sampled_from(["loose", None, 3])),
        "axis": mostly(draw, st.just("replay"), st.sampled_from(["other", 5, None])),
        "sharded_batch": mostly(draw, st.integers(1, 8), st.one_of(ODD_INTS, ODD_VALUES)),
        "mode": mostly(draw, st.sampled_from(["global", "local"]), st.sampled_from(["everywhere", 1])),
        "method": mostly(
            draw, st.sampled_from(["uniform", "prioritized", "fifo", "lifo", "topk"]), st.just("random")
        ),
        "seed": draw(st.integers(0, 2**31)),
    }


def checkpoint_path(kind, tmp):
    return {
        "fresh": lambda: os.path.join(tmp, "ckpt"),
        "none": lambda: None,
        "int": lambda: 5,
        "empty": lambda: "",
        "missing_parent": lambda: os.path.join(tmp, "missing", "ckpt"),
    }[kind]()


def assert_holds_what_was_inserted(table, case, rows):
    """A padded table holds the newest min(rows, capacity) rows. A step ring that wrapped retires a
    sixteenth of the ring more than it needs (one scan of the index serves many inserts), so it holds
    the newest episodes, at most step_capacity steps and at least step_capacity - step_capacity // 16
    - (max_steps - 1) of them (the episode that straddles the retirement goes too)."""
    capacity, max_steps = case["capacity"], case["max_steps"]
    written = rows * max_steps
    ring = table.spec.step_capacity
    if not case["ring"] or written <= ring:
        assert table.size == min(rows, capacity)
        return
    status = table.row_status()
    held = (status["generation"] % 2 == 0) & (status["length"] > 0)
    held_steps = int(status["length"][held].sum())
    assert 1 <= table.size <= min(rows, capacity)
    assert ring - ring // 16 - (max_steps - 1) <= held_steps <= ring, (held_steps, ring)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=api_cases())
def test_any_arguments_to_the_rest_of_the_api_give_a_correct_result_or_a_gear_jax_error(case):
    rng = np.random.default_rng(case["seed"])
    max_steps, rows = case["max_steps"], case["rows"]
    fields = {"x": gj.Field((2,), "float32")}
    spec = gj.TableSpec(
        fields,
        capacity=case["capacity"],
        max_steps=max_steps,
        step_capacity=case["capacity"] * max_steps if case["ring"] else None,
    )
    limiter = None
    if case["limiter"] is not None:
        made, limiter = result_or_gear_jax_error("RateLimiter", lambda: gj.RateLimiter(*case["limiter"]))
        if not made:
            limiter = None
    created, table = result_or_gear_jax_error("create", lambda: gj.Table.create(spec, rate_limiter=limiter))
    if not created:
        return
    with table, no_hang("the calls"):
        lead = (rows, max_steps) if spec.is_trajectory else (rows,)
        data = {"x": rng.normal(size=(*lead, 2)).astype(np.float32)}

        # A host insert under the limiter: admitted and counted, refused (bad timeout) or timed out,
        # and then nothing written.
        inserted, ids = result_or_gear_jax_error(
            "insert(timeout)", lambda: table.insert(data, timeout=case["timeout"])
        )
        assert_holds_what_was_inserted(table, case, rows if inserted else 0)
        if limiter is not None:
            assert table.rate_limiter_counts().inserts == (rows if inserted else 0)
        admitted, _ = result_or_gear_jax_error(
            "await_samples", lambda: table.await_samples(case["await_n"], timeout=case["timeout"])
        )
        if limiter is not None:
            assert table.rate_limiter_counts().samples == (case["await_n"] if admitted else 0)

        # An insert inside jit: refused at trace time, refused at run time (nothing written), or
        # written, with the ids it returns holding the rows.
        jit_data = {"x": jnp.asarray(data["x"])}
        if case["time_major"] is True and spec.is_trajectory:
            jit_data = {"x": jnp.swapaxes(jit_data["x"], 0, 1)}
        before = table.row_status()
        written, jit_ids = result_or_gear_jax_error(
            "insert in jit",
            lambda: jax.jit(
                lambda d: gj.insert(
                    table,
                    d,
                    priorities=case["jit_priorities"],
                    lengths=case["jit_lengths"],
                    time_major=case["time_major"],
                )
            )(jit_data),
        )
        status = table.row_status()
        if not written:
            assert all(np.array_equal(before[k], status[k]) for k in before), "a refused insert wrote"
        else:
            jit_ids = np.asarray(jit_ids)
            assert jit_ids.shape == (rows,) and ((jit_ids >= 0) & (jit_ids < table.capacity)).all()
            assert (status["generation"][jit_ids[-1]] % 2 == 0) and status["length"][jit_ids[-1]] > 0

        # A checkpoint: refused by path, or a round trip that gives back every row.
        with tempfile.TemporaryDirectory() as tmp:
            path = checkpoint_path(case["path"], tmp)
            saved, _ = result_or_gear_jax_error("save", lambda: table.save(path))
            if saved:
                loaded, copy = result_or_gear_jax_error(
                    "load",
                    lambda: gj.Table.load(path, name=case["load_name"], casting=case["load_casting"]),
                )
                good_arguments = case["load_name"] is None and case["load_casting"] == "fit"
                assert loaded or not good_arguments, f"a checkpoint just saved does not load: {copy}"
                if loaded:
                    with copy:
                        assert copy.size == table.size and copy.spec == table.spec
                        ours, theirs = table.row_status(), copy.row_status()
                        committed = (ours["generation"] % 2 == 0) & (ours["length"] > 0)
                        assert committed.sum() == ((theirs["length"] > 0).sum())

        # A sharded table of one shard over this process's first device.
        mesh = Mesh(np.array(jax.devices()[:1]), ("replay",))
        created, sharded = result_or_gear_jax_error(
            "ShardedTable.create", lambda: gj.ShardedTable.create(spec, mesh, axis=case["axis"])
        )
        if created:
            try:
                sharded.shard(0).insert(data)
                drawn, out = result_or_gear_jax_error(
                    "sharded sampler",
                    lambda: sharded.sampler(case["sharded_batch"], mode=case["mode"], method=case["method"])(
                        jax.random.key(case["seed"])
                    ),
                )
                if drawn:
                    picks, batch = out
                    rows_out = np.asarray(picks.indices)
                    assert rows_out.shape == (case["sharded_batch"],)
                    assert ((rows_out >= 0) & (rows_out < sharded.capacity)).all()
                    assert np.asarray(batch["valid"]).any()
            finally:
                sharded.close()

"""`gj.insert` inside jitted programs: byte-exact rows, lax.scan, ordering with sample and
update_priorities, the largest priority so far, concurrent writers in other processes, and bad input."""


import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import gear_jax as gj
from tests.helpers.processes import hold_a_row, read_while_uniform_writers_write, start_python
from tests.helpers.tables import held_row, transitions

TIMEOUT = 120

FIELDS = {
    "obs": gj.Field((3,), "float32"),
    "action": gj.Field((), "int32"),
    "pixels": gj.Field((2, 5), "uint8"),
    "bits": gj.Field((4,), "bfloat16"),
    "count": gj.Field((), "int32"),
}


def random_batch(rng, b, steps=None):
    """A batch of every FIELDS field, with arbitrary bit patterns in the floats (NaNs included)."""
    lead = (b,) if steps is None else (b, steps)
    return {
        "obs": rng.integers(0, 2**32, (*lead, 3), dtype=np.uint32).view(np.float32),
        "action": rng.integers(-(2**31), 2**31, lead, dtype=np.int64).astype(np.int32),
        "pixels": rng.integers(0, 256, (*lead, 2, 5), dtype=np.uint8),
        "bits": rng.integers(0, 2**16, (*lead, 4), dtype=np.uint16).view(ml_dtypes.bfloat16),
        "count": rng.integers(-(2**15), 2**15, lead, dtype=np.int64).astype(np.int16),  # cast to int32
    }


def stored(table, name, rows):
    """The bytes of field `name` of `rows`, read from the table's memory."""
    return np.asarray(table.columns[name][np.asarray(rows)])


def as_bytes(array):
    return np.ascontiguousarray(array).view(np.uint8)


def test_round_trip_is_byte_exact(make_table):
    table = make_table(fields=FIELDS, capacity=64)
    batch = random_batch(np.random.default_rng(0), 10)
    rows = jax.jit(lambda b: gj.insert(table, b, priorities=jnp.arange(1.0, 11.0)))(batch)
    rows = np.asarray(rows)
    np.testing.assert_array_equal(rows, np.arange(10))
    for name, value in batch.items():
        expected = value.astype(FIELDS[name].dtype) if name == "count" else value
        got = stored(table, name, rows)[:, 0]
        np.testing.assert_array_equal(as_bytes(got), as_bytes(expected), err_msg=name)
    status = table.row_status()
    np.testing.assert_array_equal(status["priority"][:10], np.arange(1.0, 11.0))
    np.testing.assert_array_equal(status["length"][:10], 1)
    assert (status["generation"][:10] % 2 == 0).all() and (status["generation"][:10] > 0).all()
    assert table.size == 10 and table.max_priority == 10.0
    # gj.gather reads back what gj.insert wrote.
    s = gj.sample(table, jax.random.key(1), 10, method="fifo")
    got = gj.gather(table, s)
    assert np.asarray(got["valid"]).all()
    np.testing.assert_array_equal(as_bytes(np.asarray(got["pixels"])), as_bytes(batch["pixels"]))


def test_trajectory_rows_with_lengths(make_table):
    table = make_table(fields=FIELDS, capacity=16, max_steps=6)
    batch = random_batch(np.random.default_rng(1), 4, steps=5)
    lengths = np.array([5, 1, 3, 4], np.int32)
    rows = np.asarray(jax.jit(lambda b, n: gj.insert(table, b, lengths=n))(batch, lengths))
    status = table.row_status()
    np.testing.assert_array_equal(status["length"][rows], lengths)
    for name in FIELDS:
        column = stored(table, name, rows)
        expected = batch[name].astype(FIELDS[name].dtype)
        for i, n in enumerate(lengths):
            np.testing.assert_array_equal(as_bytes(column[i, :n]), as_bytes(expected[i, :n]), err_msg=name)
    s = gj.Sample(jnp.asarray(rows), jnp.asarray(status["generation"][rows]), jnp.ones(4), jnp.zeros(4, int))
    valid = np.asarray(gj.gather(table, s, window=6)["valid"])
    np.testing.assert_array_equal(valid, np.arange(6)[None, :] < lengths[:, None])


def test_lengths_beyond_int32_are_refused_never_wrapped(make_table):
    # 2**32 + 1 wraps to 1 as int32: a length that looks valid. Host values are refused at trace time,
    # traced int64 ones (with x64 on) are clipped so that the handler refuses them as outside [1, T].
    table = make_table(fields=FIELDS, capacity=16, max_steps=6)
    batch = random_batch(np.random.default_rng(2), 2, steps=5)
    wide = np.array([3, 2**32 + 1], np.int64)
    with pytest.raises(gj.InvalidArgumentError, match=r"insert: lengths hold 4294967297, outside int32"):
        jax.jit(lambda b: gj.insert(table, b, lengths=wide))(batch)
    with jax.enable_x64(True):
        with pytest.raises(gj.EXECUTION_ERRORS, match="length"):
            rows = jax.jit(lambda b, n: gj.insert(table, b, lengths=n))(batch, jnp.asarray(wide))
            jax.block_until_ready(rows)
    assert table.size == 0


def test_inserts_inside_lax_scan_run_every_iteration_in_order(make_table):
    table = make_table(fields={"x": gj.Field((2,), "float32"), "i": gj.Field((), "int32")}, capacity=1000)
    per_step, steps = 7, 20

    @jax.jit
    def fill(start):
        def body(carry, i):
            base = start + i * per_step
            ids = jnp.arange(per_step, dtype=jnp.int32) + base
            rows = gj.insert(table, {"x": jnp.stack([ids, -ids], 1).astype(jnp.float32), "i": ids})
            return carry + rows.sum(), rows

        return jax.lax.scan(body, jnp.int32(0), jnp.arange(steps))

    _, rows = fill(jnp.int32(0))
    rows = np.asarray(rows).reshape(-1)
    np.testing.assert_array_equal(rows, np.arange(steps * per_step))
    status = table.row_status()
    np.testing.assert_array_equal(stored(table, "i", rows)[:, 0], np.arange(steps * per_step))
    # Each iteration's rows were committed after the previous iteration's.
    np.testing.assert_array_equal(np.argsort(status["insert_seq"][rows], kind="stable"), np.arange(len(rows)))
    assert table.size == steps * per_step


def test_sample_after_insert_sees_the_rows_and_updates_order_with_inserts(make_table):
    """Insert, sample and update_priorities interleaved in one scanned program, ordered by `after=`.

    Each iteration inserts rows with the largest priority so far, samples the newest rows (lifo, after
    the insert: they must be the rows just written), sets a new priority on them that exceeds every
    earlier one, and the next iteration's insert (after the update) must give its rows that priority.
    """
    table = make_table(fields={"i": gj.Field((), "int32")}, capacity=4096)
    b, iterations = 8, 12

    @jax.jit
    def run(key):
        def body(carry, i):
            count, key = carry
            key, k = jax.random.split(key)
            ids = jnp.arange(b, dtype=jnp.int32) + i * b
            rows = gj.insert(table, {"i": ids}, priorities="max", after=count)
            s = gj.sample(table, k, b, method="lifo", after=rows)
            got = gj.gather(table, s)["i"]
            count = gj.update_priorities(table, s, jnp.full((b,), 2.0, jnp.float32) + i, after=got)
            return (count, key), (rows, s.indices, got)

        return jax.lax.scan(body, (jnp.int32(0), key), jnp.arange(iterations))

    (count, _), (rows, picked, got) = run(jax.random.key(0))
    rows, picked, got = map(np.asarray, (rows, picked, got))
    assert int(count) == b
    for i in range(iterations):
        assert sorted(picked[i]) == sorted(rows[i]), f"iteration {i} sampled rows it had not just inserted"
        assert sorted(got[i]) == list(range(i * b, (i + 1) * b))
    status = table.row_status()
    # Iteration 0 inserted at 1 (no priority yet), iteration i > 0 at the previous update's 2 + (i - 1);
    # then iteration i's update set 2 + i on its own rows.
    np.testing.assert_array_equal(
        status["priority"][rows.reshape(-1)], np.repeat(2.0 + np.arange(iterations), b)
    )
    assert table.max_priority == 2.0 + iterations - 1


def test_largest_priority_so_far(make_table):
    table = make_table(fields={"i": gj.Field((), "int32")}, capacity=64)
    insert_max = jax.jit(lambda i: gj.insert(table, {"i": i}, priorities="max"))
    assert table.max_priority == 0.0
    rows = np.asarray(insert_max(jnp.arange(3, dtype=jnp.int32)))
    np.testing.assert_array_equal(table.row_status()["priority"][rows], 1.0)  # none yet: 1
    host = table.insert({"i": np.array([9, 9], np.int32)}, priorities="max")  # host inserts take it too
    np.testing.assert_array_equal(table.row_status()["priority"][host], 1.0)
    with pytest.raises(gj.InvalidArgumentError, match="priorities='top'"):
        table.insert({"i": np.array([9], np.int32)}, priorities="top")
    table.insert({"i": np.array([9], np.int32)}, priorities=[5.5])  # a host insert raises it too
    rows = np.asarray(insert_max(jnp.arange(3, dtype=jnp.int32)))
    np.testing.assert_array_equal(table.row_status()["priority"][rows], 5.5)
    s = gj.Sample(
        jnp.asarray(rows[:1]),
        jnp.asarray(table.row_status()["generation"][rows[:1]]),
        jnp.ones(1),
        jnp.zeros(1, jnp.int32),
    )
    assert int(gj.update_priorities(table, s, jnp.array([0.25]))) == 1
    assert table.max_priority == 5.5  # lowering a row's priority never lowers the largest so far
    assert int(gj.update_priorities(table, s, jnp.array([8.0]))) == 1
    rows = np.asarray(insert_max(jnp.zeros(2, jnp.int32)))
    np.testing.assert_array_equal(table.row_status()["priority"][rows], 8.0)
    host = table.insert({"i": np.array([9, 9], np.int32)}, priorities="max")
    np.testing.assert_array_equal(table.row_status()["priority"][host], 8.0)
    # Scalars and arrays of given priorities.
    rows = np.asarray(jax.jit(lambda i: gj.insert(table, {"i": i}, priorities=0.5))(jnp.zeros(2, jnp.int32)))
    np.testing.assert_array_equal(table.row_status()["priority"][rows], 0.5)
    other = gj.Table.attach(table.name)
    try:
        assert other.max_priority == 8.0  # shared by every process attached to the table
    finally:
        other.close()


def test_bad_batches_fail_at_trace_time(make_table):
    table = make_table(fields={"x": gj.Field((3,), "float32"), "a": gj.Field((), "int32")}, capacity=8)
    traj = make_table(fields={"x": gj.Field((3,), "float32")}, capacity=8, max_steps=4)
    wide = make_table(fields={"n": gj.Field((), "int64")}, capacity=8)
    x, a = jnp.zeros((2, 3)), jnp.zeros((2,), jnp.int32)
    cases = [
        (table, {"x": x}, {}, r"is missing fields \['a'\]"),
        (table, {"x": x, "a": a, "b": a}, {}, r"unknown fields \['b'\]"),
        (
            table,
            {"x": jnp.zeros((2, 4)), "a": a},
            {},
            r"batch\['x'\] has shape \(2, 4\); expected \[B, \*shape\]",
        ),
        (table, {"x": x, "a": jnp.zeros((2,))}, {}, r"batch\['a'\] has dtype float32.*astype\(jnp.int32\)"),
        (table, {"x": x, "a": jnp.zeros((3,), jnp.int32)}, {}, r"leading dimensions"),
        (
            table,
            {"x": x, "a": a},
            {"priorities": jnp.ones(3)},
            r"priorities has shape \(3,\), expected \(2,\)",
        ),
        (table, {"x": x, "a": a}, {"priorities": "min"}, r"priorities='min'"),
        (table, {"x": x, "a": a}, {"lengths": jnp.ones(2, jnp.int32)}, r"lengths are for trajectory tables"),
        (traj, {"x": jnp.zeros((2, 5, 3))}, {}, r"5 steps per row; the table holds 1 to max_steps=4"),
        (
            traj,
            {"x": jnp.zeros((2, 3, 3))},
            {"lengths": jnp.ones(2)},
            r"lengths have shape \(2,\) and dtype float32",
        ),
        (traj, {"x": x}, {}, r"expected \[B, T, \*shape\]"),
        (wide, {"n": a}, {}, r"field 'n' is int64, which JAX holds only with jax_enable_x64 on"),
    ]
    for t, batch, kwargs, message in cases:
        with pytest.raises(gj.InvalidArgumentError, match=message):
            jax.jit(lambda b: gj.insert(t, b, **kwargs))(batch)
    with pytest.raises(gj.InvalidArgumentError, match="batch must be a dict"):
        gj.insert(table, [x, a])
    assert table.size == 0 and traj.size == 0


def test_bad_values_fail_at_run_time_and_write_nothing(make_table):
    table = make_table(fields={"x": gj.Field((), "float32")}, capacity=8)
    traj = make_table(fields={"x": gj.Field((), "float32")}, capacity=8, max_steps=3)
    before = table.row_status()["generation"]
    step = jax.jit(lambda p: gj.insert(table, {"x": jnp.zeros(3)}, priorities=p))
    with pytest.raises(gj.EXECUTION_ERRORS, match=r"insert: priorities\[1\] = -?nan; priorities must be"):
        jax.block_until_ready(step(jnp.array([1.0, jnp.nan, 1.0])))
    with pytest.raises(gj.EXECUTION_ERRORS, match=r"insert: priorities\[2\] = -1\.0+; priorities must be"):
        jax.block_until_ready(step(jnp.array([1.0, 1.0, -1.0])))
    lengths_step = jax.jit(lambda n: gj.insert(traj, {"x": jnp.zeros((2, 3))}, lengths=n))
    with pytest.raises(gj.EXECUTION_ERRORS, match=r"insert: lengths\[0\] = 4 is outside \[1, 3\]"):
        jax.block_until_ready(lengths_step(jnp.array([4, 1], jnp.int32)))
    with pytest.raises(gj.EXECUTION_ERRORS, match=r"insert: lengths\[1\] = 0 is outside \[1, 3\]"):
        jax.block_until_ready(lengths_step(jnp.array([2, 0], jnp.int32)))
    assert table.size == 0 and traj.size == 0
    np.testing.assert_array_equal(table.row_status()["generation"], before)  # no row was even claimed
    np.testing.assert_array_equal(np.asarray(step(jnp.ones(3))), [0, 1, 2])  # and the table still works


def test_closed_table(make_table):
    table = make_table()
    step = jax.jit(lambda b: gj.insert(table, b))
    jax.block_until_ready(step(transitions(2)))
    table.close()
    with pytest.raises(gj.EXECUTION_ERRORS, match="closed"):
        jax.block_until_ready(step(transitions(2)))
    with pytest.raises(gj.TableClosedError):
        gj.insert(table, transitions(2))


@pytest.mark.multiprocess
def test_jit_inserts_and_writers_in_other_processes_never_yield_torn_valid_rows(make_table):
    """Two processes overwrite a small ring with host inserts while this one inserts inside jit, samples
    and gathers in the same program. Every row holds one value in all its elements; a valid row that mixes
    two values would be a torn row published as valid, and an invalid row must be zeroed.

    The steps start once a writer has committed a row and go on until the writers exit. Whether a read
    also lands in the middle of a write is up to the scheduler, so invalid rows are counted, not required:
    with the writers and this process sharing a core, runs of about 6,000 steps saw none at all.
    test_a_row_another_process_holds_is_skipped_by_jit_inserts_and_gathers_invalid makes that case every
    time."""
    width = 8192
    table = make_table(fields={"v": gj.Field((width,), "int32")}, capacity=8)
    table.insert({"v": np.zeros((8, width), np.int32)})

    @jax.jit
    def step(key, value):
        rows = gj.insert(table, {"v": jnp.broadcast_to(value, (2, width)) + jnp.arange(2)[:, None]})
        s = gj.sample(table, key, 8, after=rows)
        return gj.gather(table, s)

    jax.block_until_ready(step(jax.random.key(0), jnp.int32(0)))  # compiled before the writers start
    read_valid = {"mine": 0, "theirs": 0}  # rows read valid, from the jit inserts and from the writers

    def read(i):
        batch = step(jax.random.key(i), jnp.int32(3_000_000 + 4 * i))
        v, ok = np.asarray(batch["v"]), np.asarray(batch["valid"])
        read_valid["mine"] += int(((v[:, 0] >= 3_000_000) & ok).sum())
        read_valid["theirs"] += int(((v[:, 0] >= 1_000_000) & (v[:, 0] < 3_000_000) & ok).sum())
        return v, ok

    read_while_uniform_writers_write(
        table, width, read, seconds=4.0, bases=(1_000_000, 2_000_000), timeout=TIMEOUT
    )
    print(f"rows read valid: {read_valid}")
    assert read_valid["mine"] > 0 and read_valid["theirs"] > 0, "both kinds of writer must have been read"


@pytest.mark.multiprocess
def test_a_row_another_process_holds_is_skipped_by_jit_inserts_and_gathers_invalid(make_table):
    """The case the race above cannot force. Another process claims a row and writes the first of its
    three steps, then holds it while this one runs jitted programs: a gather of picks made before the
    claim reports the row invalid with every step zeroed (its memory holds a torn episode: a new first
    step, the old rest), and a program that inserts, samples after the insert and gathers goes past the
    held row, never picks it and reads only valid rows."""
    table = make_table(fields={"v": gj.Field((4,), "int32")}, capacity=8, max_steps=3)
    table.insert({"v": np.full((8, 3, 4), 7, np.int32)})
    before = gj.sample(table, jax.random.key(0), 8, method="fifo")  # rows 0 to 7, as committed

    @jax.jit
    def step(key, value):
        rows = gj.insert(table, {"v": jnp.full((2, 3, 4), value, jnp.int32)})
        s = gj.sample(table, key, 8, after=rows)
        return rows, s.indices, gj.gather(table, s)

    # Claims the ring's next row and writes its first step; alive until killed below.
    code = hold_a_row(table, then=f"time.sleep({TIMEOUT})", step='{"v": np.full(4, 1, np.int32)}')
    holder = start_python(code)
    try:
        line = holder.stdout.readline()
        assert line, holder.stderr.read()
        held = int(line)
        assert held == held_row(table)
        np.testing.assert_array_equal(table.columns["v"][held][:, 0], [1, 7, 7])  # half rewritten
        batch = jax.jit(lambda s: gj.gather(table, s))(before)
        valid, v = np.asarray(batch["valid"]), np.asarray(batch["v"])
        others = np.asarray(before.indices) != held
        assert not valid[~others].any(), "a row held mid-write was gathered as valid"
        assert (v[~others] == 0).all(), "an invalid row was not zeroed"
        assert valid[others].all() and (v[others] == 7).all()
        rows, picks, batch = step(jax.random.key(1), jnp.int32(5))
        assert held not in np.asarray(rows) and held not in np.asarray(picks)
        assert np.asarray(batch["valid"]).all()
        assert table.row_status()["generation"][held] % 2 == 1  # still held: all of it ran mid-write
    finally:
        holder.kill()
        holder.wait(timeout=TIMEOUT)


def test_trajectories_collected_by_lax_scan_go_in_time_major(make_table):
    """The trajectory case as it reads under lax.scan: T steps of N environments come out of the scan
    stacked [T, N, ...] and go into N rows of T steps; episodes that ended early give shorter rows."""
    n, t = 3, 5
    table = make_table(fields={"obs": gj.Field((2,), "float32"), "step": gj.Field((), "int32")}, max_steps=t)

    @jax.jit
    def collect(start):
        def env_step(carry, i):
            obs = jnp.stack([start + i + 10 * jnp.arange(n), -jnp.ones(n)], 1).astype(jnp.float32)
            return carry, {"obs": obs, "step": jnp.full((n,), i, jnp.int32)}

        _, trajectory = jax.lax.scan(env_step, None, jnp.arange(t))  # [T, N, ...]
        return gj.insert(table, trajectory, lengths=jnp.array([5, 2, 4]), time_major=True)

    rows = np.asarray(collect(jnp.int32(100)))
    status = table.row_status()
    np.testing.assert_array_equal(status["length"][rows], [5, 2, 4])
    steps = stored(table, "step", rows)
    obs = stored(table, "obs", rows)
    for env, length in enumerate([5, 2, 4]):
        np.testing.assert_array_equal(steps[env, :length], np.arange(length))
        np.testing.assert_array_equal(obs[env, :length, 0], 100 + np.arange(length) + 10 * env)
    with pytest.raises(gj.InvalidArgumentError, match="time_major=True is for trajectory tables"):
        gj.insert(make_table(), transitions(2), time_major=True)


def test_jit_inserts_follow_the_tables_casting_policy(make_table):
    """Inside jit the policy decides from dtypes at trace time: "fit" narrows floats, "strict" makes safe
    casts only, and an integer narrowing (whose range only the values tell) is refused under both."""
    table = make_table(fields={"x": gj.Field((), "float32"), "n": gj.Field((), "int32")}, capacity=8)
    with jax.enable_x64(True):
        x64 = jnp.array([0.25, 1e30], jnp.float64)
        n32, n64 = jnp.array([3, 4], jnp.int32), jnp.array([3, 4], jnp.int64)
        rows = np.asarray(jax.jit(lambda x, n: gj.insert(table, {"x": x, "n": n}))(x64, n32))
        np.testing.assert_array_equal(table.columns["x"][rows, 0], np.float32([0.25, 1e30]))
        with pytest.raises(gj.InvalidArgumentError, match=r"batch\['n'\] has dtype int64; .* range check"):
            jax.jit(lambda x, n: gj.insert(table, {"x": x, "n": n}))(x64, n64)
        table.casting = "strict"
        strict = r"batch\['x'\] has dtype float64, expected float32"
        with pytest.raises(gj.InvalidArgumentError, match=strict):
            jax.jit(lambda x, n: gj.insert(table, {"x": x, "n": n}))(x64, n32)
    assert table.size == 2

"""Step-ring tables: the CUDA handlers against the CPU handlers, on the same tables in one process.

A step ring (`TableSpec(step_capacity=N)`) keeps the steps of every episode back to back in one ring of N
steps per field, a row being an episode of its index: a window may wrap the ring's end, and an episode
whose steps the ring laps is retired (its generation moves on). The CUDA kernels must pick the same rows
and window starts as the CPU kernels for the same key (uniform windows over every valid start, with
short episodes padded or skipped, through rejection and through the exact fallback; fifo, lifo and topk
leaving short episodes out under "skip"), and gather the same windows, wrapped ones included. Uniform
windows draw their candidates by length through a priority index over lengths on both (the CPU's, and on
the GPU one the host refreshes in the stream's order), each start kept with probability count / length;
a GPU that has no index left for the table (PriorityIndexes::kMaxDeviceIndexes) keeps the law with the
older rule (uniform candidates, the longest episode as the bound), not the CPU's picks.

Tests marked `gpu` run where jax sees a GPU and skip elsewhere; as in test_cuda_handlers.py, each
comparison runs the same jitted function once on the CPU and once on the GPU.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gear_jax as gj
from gear_jax import _ffi, _native
from gear_jax.selection import METHODS

CPU = jax.devices("cpu")[0]
MAX_STEPS = 9
WINDOW = 4
FIELDS = {"t": gj.Field((), "int32"), "x": gj.Field((3,), "int16")}  # 4-byte and 6-byte steps


@pytest.fixture
def make_ring():
    """Creates step-ring tables that are closed (and unlinked) when the test ends."""
    tables = []

    def make(fields=FIELDS, capacity=12, step_capacity=40, max_steps=MAX_STEPS):
        spec = gj.TableSpec(fields, capacity=capacity, max_steps=max_steps, step_capacity=step_capacity)
        table = gj.Table.create(spec)
        tables.append(table)
        return table

    yield make
    for table in tables:
        table.close()


def episodes(table, lengths, rng, first_id=0):
    """A batch of len(lengths) episodes for `table`: field "t" holds 100 * episode id + step, every other
    field random values."""
    n = len(lengths)
    steps = table.spec.max_steps
    data = {}
    for name, field in table.spec.fields.items():
        if name == "t":
            ids = np.arange(first_id, first_id + n)
            data[name] = (100 * ids[:, None] + np.arange(steps)[None]).astype(np.int32)
        else:
            data[name] = rng.integers(0, 100, (n, steps, *field.shape)).astype(field.dtype)
    return data


def fill(table, rng, batches=5, per_batch=5):
    """Inserts batches of episodes of 1 to max_steps steps, and more batches until a held episode wraps
    the ring's end; returns the next episode id. With 5 x 5 episodes of 5 steps on average, a 40-step
    ring wraps three times and retires the oldest episodes."""
    first_id = 0
    for batch in range(batches + 20):
        if batch >= batches and wrapped_episodes(table).any():
            return first_id
        lengths = rng.integers(1, table.spec.max_steps + 1, per_batch).astype(np.int32)
        priorities = rng.choice([0.5, 1.0, 2.0], per_batch).astype(np.float32)
        table.insert(episodes(table, lengths, rng, first_id), lengths=lengths, priorities=priorities)
        first_id += per_batch
    raise AssertionError("no held episode wraps the ring's end")


def run_on(device, fn, *args):
    """jit(fn)(*args) with the arguments committed to `device`, so that it runs there."""
    return jax.block_until_ready(jax.jit(fn)(*jax.device_put(args, device)))


def sample_on(device, table, key, batch_size, **kwargs):
    return run_on(device, lambda k: gj.sample(table, k, batch_size, **kwargs), key)


def gather_on(device, table, s, **kwargs):
    return run_on(device, lambda s: gj.gather(table, s, **kwargs), s)


def assert_same_sample(got, expected):
    for name in ("indices", "generations", "probabilities", "starts", "selectable", "lengths"):
        np.testing.assert_array_equal(
            np.asarray(getattr(got, name)), np.asarray(getattr(expected, name)), err_msg=name
        )


def assert_same_batch(got, expected, fields):
    for name in (*fields, "valid"):
        assert got[name].dtype == expected[name].dtype and got[name].shape == expected[name].shape, name
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(expected[name]), err_msg=name)


def wrapping(table, rows, starts, window):
    """Which windows (row, start) of `window` steps wrap the ring's end, as the rows are now."""
    status = table.row_status()
    rows = np.asarray(rows)
    starts = np.asarray(starts, np.int64)
    ring = table.spec.step_capacity
    slot = (status["first_step"][rows] + starts.astype(np.uint64)) % np.uint64(ring)
    steps = np.clip(status["length"][rows] - starts, 0, window)
    return slot.astype(np.int64) + steps > ring


def wrapped_episodes(table):
    """The held episodes (rows) that wrap the ring's end."""
    status = table.row_status()
    rows = np.flatnonzero(status["priority"] > 0)
    return rows[wrapping(table, rows, np.zeros(len(rows), np.int64), table.spec.max_steps)]


def assert_windows_hold_their_steps(batch, starts, window):
    """Every valid step of a window of "t" is step start + s of one episode; invalid steps are zero."""
    t = np.asarray(batch["t"])
    valid = np.asarray(batch["valid"])
    expected_step = np.asarray(starts)[:, None] + np.arange(window)[None]
    np.testing.assert_array_equal(np.where(valid, t % 100, 0), np.where(valid, expected_step, 0))
    episode = t[:, :1] // 100
    np.testing.assert_array_equal(np.where(valid, t // 100, 0), np.where(valid, episode, 0))
    np.testing.assert_array_equal(np.where(valid, 0, t), 0)


def test_the_gpu_tests_of_step_rings_need_a_step_ring(make_ring):
    # Runs everywhere: the tables these tests build are step rings whose episodes wrap the ring's end.
    table = make_ring()
    fill(table, np.random.default_rng(0))
    assert table.spec.step_ring and len(wrapped_episodes(table)) > 0
    status = table.row_status()
    held = status["priority"] > 0
    assert held.sum() < table.capacity  # the ring retired episodes
    assert (held & (status["length"] < WINDOW)).any() and (held & (status["length"] >= WINDOW)).any()


@pytest.mark.gpu
@pytest.mark.parametrize("short_episodes", ["pad", "skip"])
def test_uniform_windows_match_cpu(gpu, make_ring, short_episodes):
    # Rejection with KeepWindow: the same rows and starts (uniform over every valid start), and the same
    # windows gathered, wrapped ones among them.
    table = make_ring()
    fill(table, np.random.default_rng(1))
    lengths = table.row_status()["length"]
    wrapped = False
    for seed in range(4):
        key = jax.random.key(seed)
        kwargs = dict(window=WINDOW, short_episodes=short_episodes)
        got = sample_on(gpu, table, key, 300, **kwargs)
        expected = sample_on(CPU, table, key, 300, **kwargs)
        assert_same_sample(got, expected)
        rows, starts = np.asarray(got.indices), np.asarray(got.starts)
        if short_episodes == "skip":
            assert (lengths[rows] >= WINDOW).all()
            assert (starts + WINDOW <= lengths[rows]).all()
        else:
            assert (starts <= np.maximum(lengths[rows] - WINDOW, 0)).all()
        batch = gather_on(gpu, table, got)
        assert_same_batch(batch, gather_on(CPU, table, expected), FIELDS)
        assert_windows_hold_their_steps(batch, starts, WINDOW)
        wrapped = wrapped or bool(wrapping(table, rows, starts, WINDOW).any())
    assert wrapped


LONG_STEPS = 64
LONG_WINDOW = 24


def varied_lengths(rng, n):
    """Episode lengths that vary widely: about one in ten of LONG_STEPS steps (41 windows of LONG_WINDOW),
    the others of 1 to LONG_WINDOW + 3 steps (none, one padded, or 1 to 4 windows)."""
    long = rng.random(n) < 0.1
    return np.where(long, LONG_STEPS, rng.integers(1, LONG_WINDOW + 4, n)).astype(np.int32)


def window_pairs(lengths, window, short_episodes):
    """How many valid windows (starts) each row of `lengths` (0: not held) offers: int64[rows]."""
    starts = np.maximum(lengths.astype(np.int64) - window + 1, 0)
    if short_episodes == "pad":
        starts = np.where((lengths > 0) & (starts == 0), 1, starts)
    return starts


@pytest.mark.gpu
@pytest.mark.parametrize("short_episodes", ["pad", "skip"])
def test_uniform_windows_by_length_match_cpu(gpu, make_ring, short_episodes):
    # Lengths of 1 to 64 steps, most rows with no window or a few (1 to 4 starts of 24 steps) and some
    # with 41: the CPU draws each candidate by length through its index over lengths and keeps a start
    # with probability count / length, where the rule without the index (uniform candidates, kept with
    # probability count / 64) takes other attempts and other rows for most picks. The same picks and
    # starts on the GPU show that its kernel walks the same index with the same draws; and they stay the
    # same after inserts that move the index (its refresh in the stream's order), the ring lapping the
    # oldest episodes and windows wrapping its end.
    table = make_ring(fields={"t": gj.Field((), "int32")}, capacity=1024, step_capacity=4096, max_steps=64)
    rng = np.random.default_rng(9)
    kwargs = dict(window=LONG_WINDOW, short_episodes=short_episodes)
    first_id = 0
    wrapped = False
    for round_ in range(3):
        lengths = varied_lengths(rng, 150)
        table.insert(episodes(table, lengths, rng, first_id), lengths=lengths)
        first_id += len(lengths)
        status = table.row_status()
        held = np.where(status["priority"] > 0, status["length"], 0)
        offered = window_pairs(held, LONG_WINDOW, short_episodes)
        assert (offered == 41).any() and ((offered > 0) & (offered <= 4)).sum() > 10
        picked = np.zeros(table.capacity, np.int64)
        for seed in range(4):
            key = jax.random.key(100 * round_ + seed)
            got = sample_on(gpu, table, key, 1000, **kwargs)
            expected = sample_on(CPU, table, key, 1000, **kwargs)
            assert_same_sample(got, expected)
            rows, starts = np.asarray(got.indices), np.asarray(got.starts)
            assert (np.asarray(got.generations) % 2 == 0).all()
            assert (offered[rows] > 0).all() and (starts < offered[rows]).all()
            np.add.at(picked, rows, 1)
            batch = gather_on(gpu, table, got)
            assert_same_batch(batch, gather_on(CPU, table, expected), ("t",))
            assert_windows_hold_their_steps(batch, starts, LONG_WINDOW)
            wrapped = wrapped or bool(wrapping(table, rows, starts, LONG_WINDOW).any())
        # Every valid window equally likely: the episodes of 41 windows take their share of the picks.
        share = offered[offered == 41].sum() / offered.sum()
        n = picked.sum()
        assert abs(picked[offered == 41].sum() / n - share) < 5 * np.sqrt(share * (1 - share) / n)
    assert wrapped


@pytest.mark.gpu
def test_uniform_windows_without_a_device_index_keep_their_law(gpu, make_ring):
    # The table's device indexes taken by four prioritized exponents: the GPU's uniform windows have no
    # index over lengths and draw uniform candidates (the CPU's picks hold only while the device index
    # exists), still only valid windows of held episodes, and the same law.
    table = make_ring(fields={"t": gj.Field((), "int32")}, capacity=1024, step_capacity=4096, max_steps=64)
    rng = np.random.default_rng(10)
    lengths = varied_lengths(rng, 200)
    table.insert(episodes(table, lengths, rng), lengths=lengths)
    for exponent in (0.25, 0.5, 1.5, 2.0):
        s = sample_on(gpu, table, jax.random.key(0), 8, method="prioritized", priority_exponent=exponent)
        assert_same_sample(
            s, sample_on(CPU, table, jax.random.key(0), 8, method="prioritized", priority_exponent=exponent)
        )
    status = table.row_status()
    offered = window_pairs(np.where(status["priority"] > 0, status["length"], 0), LONG_WINDOW, "skip")
    picked = np.zeros(table.capacity, np.int64)
    for seed in range(4):
        got = sample_on(gpu, table, jax.random.key(seed), 2000, window=LONG_WINDOW, short_episodes="skip")
        rows, starts = np.asarray(got.indices), np.asarray(got.starts)
        assert (offered[rows] > 0).all() and (starts < offered[rows]).all()
        np.add.at(picked, rows, 1)
    share = offered[offered == 41].sum() / offered.sum()
    n = picked.sum()
    assert abs(picked[offered == 41].sum() / n - share) < 5 * np.sqrt(share * (1 - share) / n)


@pytest.mark.gpu
@pytest.mark.parametrize("short_episodes", ["pad", "skip"])
def test_sample_gather_of_windows_matches_cpu(gpu, make_ring, short_episodes):
    # The CPU's fused sample_gather against the GPU's sample then gather.
    table = make_ring()
    fill(table, np.random.default_rng(2))
    for seed in range(3):
        key = jax.random.key(seed)

        def step(k):
            return gj.sample_gather(table, k, 64, window=WINDOW, short_episodes=short_episodes)

        got_sample, got = run_on(gpu, step, key)
        expected_sample, expected = run_on(CPU, step, key)
        assert_same_sample(got_sample, expected_sample)
        assert_same_batch(got, expected, FIELDS)


@pytest.mark.gpu
@pytest.mark.parametrize("short_episodes", ["pad", "skip"])
def test_uniform_fallback_over_windows_matches_cpu(gpu, make_ring, short_episodes):
    # 3 selectable episodes among 4096: rejection almost never finds one in 64 draws, and the exact
    # fallback decides, each episode weighed by its count of windows (9 steps: 6, 6 steps: 3, 2 steps: 1
    # padded or 0 skipped), the start being the rank's offset inside the episode's weight.
    table = make_ring(fields={"t": gj.Field((), "int32")}, capacity=4096, step_capacity=8192)
    rng = np.random.default_rng(3)
    lengths = np.ones(4096, np.int32)
    priorities = np.zeros(4096, np.float32)
    chosen = {5: 9, 2000: 6, 4000: 2}
    for row, length in chosen.items():
        lengths[row] = length
        priorities[row] = 1.0
    rows = table.insert(episodes(table, lengths, rng), lengths=lengths, priorities=priorities)
    np.testing.assert_array_equal(rows, np.arange(4096))
    offered = {5: 6, 2000: 3, 4000: 1 if short_episodes == "pad" else 0}
    for seed in range(3):
        key = jax.random.key(seed)
        kwargs = dict(window=WINDOW, short_episodes=short_episodes)
        got = sample_on(gpu, table, key, 500, **kwargs)
        expected = sample_on(CPU, table, key, 500, **kwargs)
        assert_same_sample(got, expected)
        picked, starts = np.asarray(got.indices), np.asarray(got.starts)
        assert set(picked) <= {row for row, count in offered.items() if count > 0}
        assert all(start < offered[row] for row, start in zip(picked, starts))
        assert len(set(zip(picked, starts))) > 3  # the starts differ: ranks inside the weights
        assert_same_batch(gather_on(gpu, table, got), gather_on(CPU, table, expected), ("t",))


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["fifo", "lifo", "topk"])
@pytest.mark.parametrize("short_episodes", ["pad", "skip"])
def test_ordered_windows_match_cpu(gpu, make_ring, method, short_episodes):
    # Under "skip", fifo/lifo/topk leave the episodes shorter than the window out, and count only the
    # others when they decide whether the table holds batch_size rows.
    table = make_ring()
    fill(table, np.random.default_rng(4))
    status = table.row_status()
    held = status["priority"] > 0
    long_enough = held & (status["length"] >= WINDOW)
    assert long_enough.sum() < held.sum()  # some held episodes are short
    batch = int(long_enough.sum()) if short_episodes == "skip" else int(held.sum())
    for size in sorted({1, max(batch // 2, 1), batch}):
        key = jax.random.key(size)
        kwargs = dict(method=method, window=WINDOW, short_episodes=short_episodes)
        got = sample_on(gpu, table, key, size, **kwargs)
        expected = sample_on(CPU, table, key, size, **kwargs)
        assert_same_sample(got, expected)
        rows = np.asarray(got.indices)
        assert (np.asarray(got.generations) % 2 == 0).all()
        if short_episodes == "skip":
            assert long_enough[rows].all()
        assert_same_batch(gather_on(gpu, table, got), gather_on(CPU, table, expected), FIELDS)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "fields",
    [
        FIELDS,  # 4-byte and 6-byte steps: a warp per window
        {"t": gj.Field((), "int32"), "b": gj.Field((), "bool")},  # 1-byte steps
        {"t": gj.Field((), "int32"), "img": gj.Field((64, 80), "uint8")},  # a block per window (>= 16 KiB)
    ],
)
@pytest.mark.parametrize("window", [1, WINDOW, MAX_STEPS])
def test_gather_of_every_window_matches_cpu(gpu, make_ring, fields, window):
    # Every start of every held episode (past its end too: padded and masked), and rows the ring retired
    # (stale generations): the same data and valid mask, and the windows that wrap the ring's end whole.
    table = make_ring(fields=fields)
    fill(table, np.random.default_rng(5))
    status = table.row_status()
    pairs = np.array([(row, start) for row in range(table.capacity) for start in range(MAX_STEPS)], np.int32)
    rows, starts = np.tile(pairs[:, 0], 2), np.tile(pairs[:, 1], 2)  # every pair twice
    generations = status["generation"][rows].astype(np.uint32)
    stale = np.arange(len(rows)) >= len(pairs)
    generations[stale] += 2  # the second time with another generation of the row: invalid
    s = gj.Sample(jnp.asarray(rows), jnp.asarray(generations), jnp.zeros(len(rows)), jnp.asarray(starts))
    got = gather_on(gpu, table, s, window=window)
    expected = gather_on(CPU, table, s, window=window)
    assert_same_batch(got, expected, fields)
    valid = np.asarray(got["valid"])
    assert not valid[stale].any()
    held = (status["priority"][rows] > 0) & ~stale
    np.testing.assert_array_equal(valid[:, 0], held & (starts < status["length"][rows]))
    assert_windows_hold_their_steps(got, starts, window)
    if window > 1:
        assert (wrapping(table, rows, starts, window) & held).any()


@pytest.mark.gpu
def test_whole_episodes_without_a_window_match_cpu(gpu, make_ring):
    table = make_ring()
    fill(table, np.random.default_rng(6))
    key = jax.random.key(0)
    got = sample_on(gpu, table, key, 200)
    expected = sample_on(CPU, table, key, 200)
    assert_same_sample(got, expected)
    batch = gather_on(gpu, table, got)
    assert_same_batch(batch, gather_on(CPU, table, expected), FIELDS)
    np.testing.assert_array_equal(
        np.asarray(batch["valid"]).sum(1), table.row_status()["length"][np.asarray(got.indices)]
    )
    assert wrapping(table, np.asarray(got.indices), np.zeros(200, np.int64), MAX_STEPS).any()


@pytest.mark.gpu
def test_windows_sampled_before_the_ring_lapped_their_episodes_come_back_invalid(gpu, make_ring):
    table = make_ring()
    rng = np.random.default_rng(7)
    next_id = fill(table, rng)
    held = int((table.row_status()["priority"] > 0).sum())
    s = sample_on(gpu, table, jax.random.key(0), held, method="fifo", window=WINDOW)
    before = gather_on(gpu, table, s)
    assert np.asarray(before["valid"])[:, 0].all()
    # 3 episodes of 9 steps: the ring reuses the slots of the oldest episodes, which are retired.
    lengths = np.full(3, MAX_STEPS, np.int32)
    table.insert(episodes(table, lengths, rng, next_id), lengths=lengths)
    now = table.row_status()["generation"][np.asarray(s.indices)]
    kept = now == np.asarray(s.generations)
    assert kept.any() and not kept.all()
    got = gather_on(gpu, table, s)
    assert_same_batch(got, gather_on(CPU, table, s), FIELDS)
    valid = np.asarray(got["valid"])
    np.testing.assert_array_equal(valid.any(1), kept)
    np.testing.assert_array_equal(valid[kept], np.asarray(before["valid"])[kept])
    for name in FIELDS:
        np.testing.assert_array_equal(np.asarray(got[name])[~kept], 0)
        np.testing.assert_array_equal(np.asarray(got[name])[kept], np.asarray(before[name])[kept])


@pytest.mark.gpu
def test_prioritized_windows_that_skip_short_episodes_are_refused_on_both(gpu, make_ring):
    # gear_jax.sample refuses them at trace time; a method word that asks for them anyway is refused by
    # the CUDA handler in the CPU handler's words.
    table = make_ring()
    fill(table, np.random.default_rng(8))
    with pytest.raises(gj.InvalidArgumentError, match="skip"):
        gj.sample(table, jax.random.key(0), 4, method="prioritized", window=WINDOW, short_episodes="skip")
    word = np.int32(METHODS["prioritized"] | _native.SKIP_SHORT_FLAG)
    types = (
        jax.ShapeDtypeStruct((4,), jnp.int32),
        jax.ShapeDtypeStruct((4,), jnp.uint32),
        jax.ShapeDtypeStruct((4,), jnp.float32),
        jax.ShapeDtypeStruct((4,), jnp.int32),
        jax.ShapeDtypeStruct((), jnp.int32),  # selectable
        jax.ShapeDtypeStruct((4,), jnp.int32),  # lengths
    )

    def forged(seed):
        call = jax.ffi.ffi_call(_ffi.SAMPLE, types, has_side_effect=False)
        return call(
            seed,
            jnp.zeros((), jnp.int32),
            handle=np.int64(table.handle),
            spec_hash=np.int64(table.spec.spec_hash),
            method=word,
            priority_exponent=np.float32(1.0),
            window=np.int32(WINDOW),
        )

    for device in (CPU, gpu):
        with pytest.raises(Exception, match="gear_jax.sample: prioritized windows pad short episodes"):
            run_on(device, forged, jnp.zeros(2, jnp.uint32))


@pytest.mark.gpu
@pytest.mark.parametrize("short_episodes", ["pad", "skip"])
def test_total_weight_of_uniform_windows_matches_cpu(gpu, make_ring, short_episodes):
    """`total_weight(window=W)` (what global uniform windows of sharded rings weigh each shard by): the
    CUDA tile sums count the same windows and rows as the CPU's scan, and both the windows of the
    selectable episodes as the ring holds them."""
    table = make_ring()
    fill(table, np.random.default_rng(11))
    zero = jnp.zeros((), jnp.float32)

    def total(x):
        return gj.total_weight(table, 0.0, after=x, window=WINDOW, short_episodes=short_episodes)

    cpu_total, cpu_count = run_on(CPU, total, zero)
    gpu_total, gpu_count = run_on(gpu, total, zero)
    assert float(gpu_total) == float(cpu_total) and int(gpu_count) == int(cpu_count)
    status = table.row_status()
    held = (status["generation"] % 2 == 0) & (status["priority"] > 0) & (status["length"] > 0)
    weights = [max(int(n) - WINDOW + 1, 0 if short_episodes == "skip" else 1) for n in status["length"][held]]
    assert float(cpu_total) == sum(weights) and int(cpu_count) == sum(w > 0 for w in weights)

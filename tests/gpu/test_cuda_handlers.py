"""The CUDA handlers against the CPU handlers, on the same tables in one process.

Tests marked `gpu` run where jax sees a GPU and skip elsewhere. A jitted function runs on the device its
inputs are committed to, so each comparison runs the same function once on the CPU and once on the GPU.
The CUDA handlers report bad data at the next call on the table (see xla_ffi/cuda_handlers.cu); the
error tests wait for the failing call before making the next one. update_priorities has two CUDA paths,
the kernel (GPUs with native host atomics) and a host callback on the stream (elsewhere, or with
GEAR_JAX_HOST_SCATTER=1): its tests take `scatter_path` and run on both paths.
"""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gear_jax as gj
from gear_jax.ops import ordered_candidates
from gear_jax import _native
from tests.helpers.sampling import assert_mass_in_tail, assert_prioritized, draw_counts, prioritized_table
from tests.helpers.tables import transitions

CPU = jax.devices("cpu")[0]


@pytest.fixture(params=["kernel", "host"])
def scatter_path(request, monkeypatch):
    """update_priorities through the kernel (forced with GEAR_JAX_HOST_SCATTER=0 even on a GPU without
    native host atomics: these tests have no concurrent writer), then through the host path (=1). The
    handler reads GEAR_JAX_HOST_SCATTER at every call."""
    monkeypatch.setenv("GEAR_JAX_HOST_SCATTER", "1" if request.param == "host" else "0")
    return request.param


@pytest.fixture(params=["one_block", "three_launches"])
def uniform_launches(request, monkeypatch):
    """Uniform picks of batches up to 1024 in one block's one launch (the default), then in the three
    launches of larger batches (GEAR_JAX_SAMPLE_ONE_BLOCK_PICKS=0; read at every launch)."""
    monkeypatch.setenv("GEAR_JAX_SAMPLE_ONE_BLOCK_PICKS", "0" if request.param == "three_launches" else "")
    return request.param


def run_on(device, fn, *args):
    """jit(fn)(*args) with the arguments committed to `device`, so that it runs there."""
    return jax.block_until_ready(jax.jit(fn)(*jax.device_put(args, device)))


def sample_on(device, table, key, batch_size, **kwargs):
    return run_on(device, lambda k: gj.sample(table, k, batch_size, **kwargs), key)


def gather_on(device, table, s, **kwargs):
    return run_on(device, lambda s: gj.gather(table, s, **kwargs), s)


def update_on(device, table, s, priorities):
    priorities = jnp.asarray(priorities, jnp.float32)
    return run_on(device, lambda s, p: gj.update_priorities(table, s, p), s, priorities)


def assert_same_sample(got, expected):
    for name in ("indices", "generations", "probabilities", "starts", "selectable", "lengths"):
        np.testing.assert_array_equal(
            np.asarray(getattr(got, name)), np.asarray(getattr(expected, name)), err_msg=name
        )


def make_sample(table, rows, generations=None):
    """A Sample of `rows` with their current generations (or the ones given)."""
    rows = np.asarray(rows, np.int32)
    if generations is None:
        generations = table.row_status()["generation"][np.clip(rows, 0, table.capacity - 1)]
    zeros = jnp.zeros(rows.shape, jnp.int32)
    return gj.Sample(jnp.asarray(rows), jnp.asarray(generations, jnp.uint32), jnp.zeros(rows.shape), zeros)


def test_cuda_handlers_built_when_nvcc_present():
    if os.environ.get("GEAR_JAX_CUDA", "AUTO").upper() == "OFF" or shutil.which("nvcc") is None:
        pytest.skip("no CUDA compiler on PATH (or GEAR_JAX_CUDA=OFF): a CPU-only build is expected")
    assert gj.build_info()["cuda"] is True, "nvcc is on PATH but gear_jax was built without CUDA handlers"


def test_tables_are_pinned_exactly_when_asked_and_a_gpu_is_visible(make_table):
    table = make_table()
    expected = bool(_native.with_cuda) and _native.cuda_device_count() > 0
    assert table.pinned is expected
    with gj.Table.attach(table.name) as actor_view:  # actors do not pin by default
        assert actor_view.pinned is False
    with gj.Table.attach(table.name, pin=True) as learner_view:
        assert learner_view.pinned is expected
    unpinned = make_table(pin=False)
    assert unpinned.pinned is False


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["uniform", "fifo", "lifo", "topk"])
def test_selection_matches_cpu_exactly(make_table, gpu, method, uniform_launches):
    table = make_table(capacity=64)
    priorities = np.random.default_rng(0).choice([0.0, 0.5, 1.0, 2.0], 50).astype(np.float32)  # ties, zeros
    table.insert(transitions(50), priorities=priorities)
    with table.writer() as held:
        held.append({"obs": np.zeros(3, np.float32), "action": np.int32(0)})  # row 50, being written
        batches = (300, 1024, 1025, 3000) if method == "uniform" else (20,)  # one block up to 1024 picks
        for seed, batch in enumerate(batches * 2):
            key = jax.random.key(seed)
            got = sample_on(gpu, table, key, batch, method=method)
            assert_same_sample(got, sample_on(CPU, table, key, batch, method=method))
            assert not np.isin(np.asarray(got.indices), np.append(np.flatnonzero(priorities == 0), 50)).any()


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["fifo", "lifo", "topk"])
def test_ordered_selection_over_many_tiles_matches_cpu(make_table, gpu, method):
    # More rows than one candidate tile (2048), a ring that wrapped, and many equal priorities.
    table = make_table(fields={"x": gj.Field((), "int32")}, capacity=5000)
    rng = np.random.default_rng(1)
    for start in range(0, 6500, 1300):
        table.insert(
            {"x": np.arange(start, start + 1300, dtype=np.int32)},
            priorities=rng.choice([0.0, 1.0, 2.0, 3.5], 1300).astype(np.float32),
        )
    for batch in (1, 300, 2500):
        key = jax.random.key(batch)
        assert_same_sample(
            sample_on(gpu, table, key, batch, method=method), sample_on(CPU, table, key, batch, method=method)
        )


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["fifo", "lifo", "topk"])
def test_ordered_candidates_match_cpu(make_table, gpu, method):
    # Several candidate tiles, a wrapped ring, ties; then fewer selectable rows than the batch (markers).
    table = make_table(fields={"x": gj.Field((), "int32")}, capacity=5000)
    rng = np.random.default_rng(2)
    for start in range(0, 6500, 1300):
        table.insert(
            {"x": np.arange(start, start + 1300, dtype=np.int32)},
            priorities=rng.choice([0.0, 1.0, 2.0, 3.5], 1300).astype(np.float32),
        )
    small = make_table(capacity=64)
    small.insert(transitions(10), priorities=np.array([1, 0, 2, 2, 0, 3, 1, 1, 0, 5], np.float32))
    for t, batch in ((table, 1), (table, 300), (table, 2500), (small, 4), (small, 20)):
        key = jax.random.key(batch)
        got = run_on(gpu, lambda k: ordered_candidates(t, k, batch, method), key)
        expected = run_on(CPU, lambda k: ordered_candidates(t, k, batch, method), key)
        assert_same_sample(got[0], expected[0])
        np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(expected[1]))
    assert np.asarray(got[0].generations)[7:].tolist() == [1] * 13  # small: 7 selectable rows, 13 markers


@pytest.mark.gpu
def test_uniform_fallback_matches_cpu(make_table, gpu, uniform_launches):
    # 2 selectable rows out of 4096 claimed: rejection almost always fails and the exact scan decides.
    table = make_table(fields={"x": gj.Field((), "int32")}, capacity=4096)
    priorities = np.zeros(4096, np.float32)
    priorities[[5, 4000]] = 1.0
    table.insert({"x": np.arange(4096, dtype=np.int32)}, priorities=priorities)
    for seed in range(3):
        key = jax.random.key(seed)
        got = sample_on(gpu, table, key, 500)
        assert_same_sample(got, sample_on(CPU, table, key, 500))
        assert set(np.asarray(got.indices)) <= {5, 4000}


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["uniform", "topk"])
def test_windows_match_cpu(make_table, gpu, method, uniform_launches):
    fields = {"t": gj.Field((), "int32"), "x": gj.Field((3,), "int16")}
    table = make_table(fields=fields, capacity=16, max_steps=9)
    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 10, 12).astype(np.int32)
    steps = np.arange(9, dtype=np.int32)
    data = {
        "t": np.stack([steps + 100 * r for r in range(12)]),
        "x": rng.integers(-1000, 1000, (12, 9, 3)).astype(np.int16),
    }
    table.insert(data, lengths=lengths, priorities=rng.uniform(0.5, 2.0, 12).astype(np.float32))
    key = jax.random.key(7)
    got = sample_on(gpu, table, key, 10, method=method, window=4)
    expected = sample_on(CPU, table, key, 10, method=method, window=4)
    assert_same_sample(got, expected)
    batch = gather_on(gpu, table, got)
    reference = gather_on(CPU, table, expected)
    for name in ("t", "x", "valid"):
        np.testing.assert_array_equal(np.asarray(batch[name]), np.asarray(reference[name]), err_msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["uniform", "prioritized", "fifo", "topk"])
@pytest.mark.parametrize("window", [None, 4])
def test_sample_gather_matches_cpu(make_table, gpu, method, window, uniform_launches):
    # The GPU's one custom call (sample's kernels then the gather's, enqueued by one handler) against the
    # CPU's, and against the GPU's sample then gather.
    fields = {"t": gj.Field((), "int32"), "x": gj.Field((3,), "int16")}
    table = make_table(fields=fields, capacity=64, max_steps=9)
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 10, 60).astype(np.int32)
    data = {
        "t": np.arange(60 * 9, dtype=np.int32).reshape(60, 9),
        "x": rng.integers(-1000, 1000, (60, 9, 3)).astype(np.int16),
    }
    table.insert(data, lengths=lengths, priorities=rng.uniform(0.5, 2.0, 60).astype(np.float32))
    batch = 16 if method in ("fifo", "topk") else 200
    for seed in range(2):
        key = jax.random.key(seed)

        def fused(k):
            return gj.sample_gather(table, k, batch, method=method, window=window)

        def separate(k):
            s = gj.sample(table, k, batch, method=method, window=window)
            return s, gj.gather(table, s)

        got_sample, got = run_on(gpu, fused, key)
        for expected_sample, expected in (run_on(CPU, fused, key), run_on(gpu, separate, key)):
            assert_same_sample(got_sample, expected_sample)
            for name in ("t", "x", "valid"):
                np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(expected[name]), err_msg=name)
        assert bool(np.asarray(got["valid"]).any())


@pytest.mark.gpu
@pytest.mark.parametrize("exponent", [0.0, 0.5, 1.0, 2.0])
def test_prioritized_matches_exact_distribution_on_gpu(make_table, gpu, exponent):
    table, priorities = prioritized_table(make_table)
    counts, _, s = draw_counts(table, 32, "prioritized", device=gpu, priority_exponent=exponent)
    assert_prioritized(counts, s, priorities, exponent)


@pytest.mark.gpu
def test_prioritized_over_many_rows_on_gpu(make_table, gpu):
    rows = 10_000
    table = make_table(fields={"x": gj.Field((), "int32")}, capacity=rows)
    priorities = np.full(rows, 1e-3, np.float32)
    priorities[-10:] = 100.0
    table.insert({"x": np.arange(rows, dtype=np.int32)}, priorities=priorities)
    counts, _, _ = draw_counts(table, rows, "prioritized", draws=20_000, device=gpu)
    assert_mass_in_tail(counts, priorities)


@pytest.mark.gpu
@pytest.mark.parametrize("exponent", [0.6, 1.0])
def test_prioritized_matches_cpu_exactly(make_table, gpu, exponent):
    # The GPU walks a priority index the host builds (in pinned memory) with the CPU's code and targets:
    # the same picks for the same key, also after updates and inserts the index must follow.
    table = make_table(fields={"x": gj.Field((), "int32")}, capacity=5000)
    rng = np.random.default_rng(21)
    priorities = rng.uniform(0.1, 3.0, 4000).astype(np.float32)
    table.insert({"x": np.arange(4000, dtype=np.int32)}, priorities=priorities)
    for step in range(3):
        key = jax.random.key(step)
        got = sample_on(gpu, table, key, 1000, method="prioritized", priority_exponent=exponent)
        expected = sample_on(CPU, table, key, 1000, method="prioritized", priority_exponent=exponent)
        assert_same_sample(got, expected)
        assert (np.asarray(got.generations) % 2 == 0).all()
        update_on(CPU, table, expected, rng.choice([0.0, 0.5, 4.0], 1000).astype(np.float32))
        more = rng.uniform(0.1, 3.0, 700).astype(np.float32)
        table.insert({"x": np.arange(700, dtype=np.int32)}, priorities=more)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "fields",
    [
        {"a": gj.Field((4,), "float32"), "b": gj.Field((), "int32")},  # 16-byte and 4-byte steps
        {"a": gj.Field((3,), "int16"), "b": gj.Field((), "bool")},  # 6-byte and 1-byte steps
        {"a": gj.Field((128, 160), "uint8"), "b": gj.Field((5,), "float64")},  # 20 KiB rows: a warp each
        {"a": gj.Field((256, 512), "uint8"), "b": gj.Field((5,), "float64")},  # a block per row (>= 128 KiB)
    ],
)
@pytest.mark.parametrize("max_steps,window", [(1, None), (5, 3)])
def test_gather_matches_cpu(make_table, gpu, fields, max_steps, window):
    table = make_table(fields=fields, capacity=40, max_steps=max_steps)
    rng = np.random.default_rng(3)
    lead = (40, max_steps) if max_steps > 1 else (40,)
    data = {name: rng.integers(0, 100, lead + f.shape).astype(f.dtype) for name, f in fields.items()}
    table.insert(data, lengths=rng.integers(1, max_steps + 1, 40) if max_steps > 1 else None)
    s = sample_on(CPU, table, jax.random.key(4), 333, window=window)
    batch = gather_on(gpu, table, s)
    reference = gather_on(CPU, table, s)
    assert bool(np.asarray(reference["valid"]).any())
    for name in (*fields, "valid"):
        assert batch[name].dtype == reference[name].dtype and batch[name].shape == reference[name].shape
        np.testing.assert_array_equal(np.asarray(batch[name]), np.asarray(reference[name]), err_msg=name)


@pytest.mark.gpu
def test_rows_being_written_are_never_sampled_on_gpu(make_table, gpu):
    table = make_table(capacity=32)
    table.insert(transitions(31))
    with table.writer() as held:
        held.append({"obs": np.zeros(3, np.float32), "action": np.int32(0)})  # row 31
        for method, batch in (("uniform", 2000), ("prioritized", 2000), ("topk", 31), ("lifo", 31)):
            s = sample_on(gpu, table, jax.random.key(5), batch, method=method)
            assert 31 not in set(np.asarray(s.indices)), method
            assert bool(gather_on(gpu, table, s)["valid"].all()), method


@pytest.mark.gpu
def test_rows_overwritten_after_sampling_come_back_invalid_on_gpu(make_table, gpu):
    table = make_table(capacity=8)
    table.insert(transitions(8))
    s = sample_on(gpu, table, jax.random.key(6), 8, method="fifo")
    np.testing.assert_array_equal(np.asarray(s.indices), np.arange(8))
    table.insert(transitions(3, start=100))  # overwrites rows 0..2, the oldest
    with table.writer() as held:
        held.append({"obs": np.ones(3, np.float32), "action": np.int32(1)})  # claims row 3
        batch = gather_on(gpu, table, s)
    valid = np.asarray(batch["valid"])
    np.testing.assert_array_equal(valid, np.arange(8) >= 4)
    np.testing.assert_array_equal(np.asarray(batch["obs"])[:4], 0)
    np.testing.assert_array_equal(np.asarray(batch["obs"])[4:], transitions(8)["obs"][4:])


@pytest.mark.gpu
def test_update_priorities_matches_cpu(make_table, gpu, scatter_path):
    # New memory for both (reuse=False): generations then start equal, and the two can be compared.
    tables = [make_table(capacity=16, reuse=False) for _ in range(2)]
    for table in tables:
        table.insert(transitions(16), priorities=np.full(16, 0.5, np.float32))
        table.insert(transitions(2, start=50))  # rows 0 and 1 now hold a newer generation
    stale = tables[0].row_status()["generation"] - 2
    rows = [1, 2, 1, 5, 7, 0, 9]
    generations = tables[0].row_status()["generation"][rows]
    generations[5] = stale[0]  # row 0 was overwritten since this "sample": skipped
    priorities = [0.25, 0.0, 3.0, 2.0, 1.0, 9.0, 0.0]
    counts = [
        int(update_on(device, table, make_sample(table, rows, generations), priorities))
        for table, device in zip(tables, (gpu, CPU))
    ]
    assert counts[0] == counts[1] == 6
    for key in ("priority", "generation"):
        np.testing.assert_array_equal(tables[0].row_status()[key], tables[1].row_status()[key], err_msg=key)
    assert tables[0].native.selectable == tables[1].native.selectable
    assert tables[0].row_status()["priority"][1] == 3.0  # the later entry of row 1 wins


@pytest.mark.gpu
def test_sample_errors_surface_at_the_next_call(make_table, gpu):
    table = make_table(capacity=4)
    key = jax.device_put(jax.random.key(0), gpu)
    empty = jax.jit(lambda k: gj.sample(table, k, 8))
    s = jax.block_until_ready(empty(key))  # the kernel found no row: every pick is an invalid row 0
    np.testing.assert_array_equal(np.asarray(s.generations), 1)
    with pytest.raises(gj.EXECUTION_ERRORS, match="no selectable rows"):
        gather_on(gpu, table, s)  # the next call on the table, whichever it is
    assert not bool(gather_on(gpu, table, s)["valid"].any())  # the error was reported once
    table.insert(transitions(2))
    few = jax.jit(lambda k: gj.sample(table, k, 3, method="fifo"))
    jax.block_until_ready(few(key))
    with pytest.raises(gj.EXECUTION_ERRORS, match="fewer than batch_size 3"):
        jax.block_until_ready(few(key))


@pytest.mark.gpu
def test_update_priorities_of_a_large_batch_matches_cpu(make_table, gpu, scatter_path):
    # More entries than the kernel's check block (1024), most rows picked several times, some stale.
    tables = [make_table(fields={"x": gj.Field((), "int32")}, capacity=700, reuse=False) for _ in range(2)]
    for table in tables:
        table.insert({"x": np.arange(700, dtype=np.int32)}, priorities=np.full(700, 1.0, np.float32))
        table.insert({"x": np.arange(50, dtype=np.int32)})  # rows 0..49 now hold a newer generation
    rng = np.random.default_rng(8)
    rows = rng.integers(0, 700, 3000).astype(np.int32)
    generations = tables[0].row_status()["generation"][rows]
    generations[rows < 50] -= 2  # sampled before the overwrite: skipped
    priorities = rng.choice([0.0, 0.5, 2.0, 7.0], 3000).astype(np.float32)
    counts = [
        int(update_on(device, table, make_sample(table, rows, generations), priorities))
        for table, device in zip(tables, (gpu, CPU))
    ]
    assert counts[0] == counts[1] == int((rows >= 50).sum())
    for key in ("priority", "generation"):
        np.testing.assert_array_equal(tables[0].row_status()[key], tables[1].row_status()[key], err_msg=key)
    assert tables[0].native.selectable == tables[1].native.selectable


@pytest.mark.gpu
def test_updates_in_flight_apply_in_order_and_before_a_later_sample(make_table, gpu, scatter_path):
    # Many updates dispatched without waiting (each its own staging on the host path), then a sample
    # ordered after the last one in the same program: it sees every update.
    table = make_table(capacity=64)
    table.insert(transitions(64))
    rows = np.arange(64, dtype=np.int32)
    s = jax.device_put(make_sample(table, rows), gpu)
    update = jax.jit(lambda s, p: gj.update_priorities(table, s, p))
    counts = [update(s, jax.device_put(jnp.full(64, step + 1.0, jnp.float32), gpu)) for step in range(40)]
    assert [int(c) for c in counts] == [64] * 40
    np.testing.assert_array_equal(table.row_status()["priority"], 40.0)

    def update_then_sample(s, key):
        only_row_9 = jnp.where(s.indices == 9, 1.0, 0.0).astype(jnp.float32)
        count = gj.update_priorities(table, s, only_row_9)
        return count, gj.sample(table, key, 100, method="prioritized", after=count)

    count, picked = run_on(gpu, update_then_sample, s, jax.random.key(9))
    assert int(count) == 64
    np.testing.assert_array_equal(np.asarray(picked.indices), 9)


@pytest.mark.gpu
def test_gather_errors_surface_at_the_next_call(make_table, gpu):
    table = make_table(capacity=4)
    table.insert(transitions(4))
    bad = make_sample(table, [0, 4])
    np.testing.assert_array_equal(np.asarray(gather_on(gpu, table, bad)["valid"]), [True, False])
    with pytest.raises(gj.EXECUTION_ERRORS, match=r"gather: indices\[1\] = 4 is outside \[0, 4\)"):
        gather_on(gpu, table, bad)


@pytest.mark.gpu
def test_update_errors_surface_at_the_next_call(make_table, gpu, scatter_path):
    table = make_table(capacity=4)
    table.insert(transitions(4))
    before = table.row_status()["priority"]
    good = make_sample(table, [0, 1])
    assert int(update_on(gpu, table, good, [1.0, np.nan])) == 0
    not_finite = r"update_priorities: priorities\[1\] = -?nan; priorities must be finite and >= 0"
    with pytest.raises(gj.EXECUTION_ERRORS, match=not_finite):
        update_on(gpu, table, good, [1.0, 1.0])
    np.testing.assert_array_equal(table.row_status()["priority"], before)
    # A bad row id is reported before a bad priority, as on the CPU.
    bad = make_sample(table, [2, 0, 4, 1])
    assert int(update_on(gpu, table, bad, [2.0, -1.0, 2.0, 2.0])) == 0
    with pytest.raises(gj.EXECUTION_ERRORS, match=r"update_priorities: indices\[2\] = 4 is outside \[0, 4\)"):
        update_on(gpu, table, good, [1.0, 1.0])
    np.testing.assert_array_equal(table.row_status()["priority"], before)
    assert int(update_on(gpu, table, good, [3.0, 3.0])) == 2  # each error was reported once
    np.testing.assert_array_equal(table.row_status()["priority"][:2], 3.0)


@pytest.mark.gpu
def test_closed_table_raises_on_gpu(make_table, gpu):
    table = make_table()
    table.insert(transitions(4))
    fn = jax.jit(lambda k: gj.sample(table, k, 2))
    key = jax.device_put(jax.random.key(0), gpu)
    jax.block_until_ready(fn(key))
    table.close()
    with pytest.raises(gj.EXECUTION_ERRORS, match="closed"):
        jax.block_until_ready(fn(key))


# ---- total_weight and sample_at (the sharded layer's building blocks) ---------------------------------


def weighted_table(make_table, rows=5000, capacity=6000):
    """Integer priorities (exact cumulative weights) over several 1024-row tiles of the CUDA kernel, some
    rows of priority 0, a row being written (the returned writer holds it)."""
    table = make_table(fields={"x": gj.Field((), "int32")}, capacity=capacity)
    priorities = np.random.default_rng(11).integers(0, 5, rows).astype(np.float32)
    priorities[1024:2048] = 0.0  # a whole tile without weight
    table.insert({"x": np.arange(rows, dtype=np.int32)}, priorities=priorities)
    writer = table.writer()
    writer.append({"x": np.int32(0)})  # holds row `rows`, unselectable
    return table, writer


@pytest.mark.gpu
@pytest.mark.parametrize("exponent", [0.0, 0.5, 1.0, 2.0])
def test_total_weight_matches_cpu(make_table, gpu, exponent):
    from gear_jax.ops import total_weight

    empty = make_table(capacity=8)
    table, writer = weighted_table(make_table)
    with writer:
        for t in (empty, table):
            got = run_on(gpu, lambda a: total_weight(t, exponent, after=a), jnp.zeros((), jnp.int32))
            expected = run_on(CPU, lambda a: total_weight(t, exponent, after=a), jnp.zeros((), jnp.int32))
            assert int(got[1]) == int(expected[1])
            np.testing.assert_allclose(float(got[0]), float(expected[0]), rtol=1e-6)
        assert int(got[1]) > 0 and (exponent != 0.0 or float(got[0]) == int(got[1]))


@pytest.mark.gpu
def test_sample_at_matches_cpu(make_table, gpu):
    from gear_jax.ops import sample_at, total_weight

    table, writer = weighted_table(make_table)
    with writer:
        total = float(run_on(CPU, lambda a: total_weight(table, after=a), jnp.zeros((), jnp.int32))[0])
        priorities = table.row_status()["priority"].astype(np.float64)
        cumulative = np.cumsum(priorities[priorities > 0])
        rng = np.random.default_rng(12)
        targets = np.concatenate(
            [
                rng.choice(cumulative, 300),  # exact boundaries, tile boundaries among them
                rng.choice(cumulative, 300) - 0.5,
                rng.uniform(0, total, 2000),
                [0.0, total, total + 1, 1e30, np.inf, -1.0, np.nan],
            ]
        ).astype(np.float32)
        key = jax.random.key(3)
        got = run_on(gpu, lambda k, x: sample_at(table, k, x), key, jnp.asarray(targets))
        expected = run_on(CPU, lambda k, x: sample_at(table, k, x), key, jnp.asarray(targets))
        for name in ("indices", "generations", "starts"):
            np.testing.assert_array_equal(
                np.asarray(getattr(got, name)), np.asarray(getattr(expected, name)), err_msg=name
            )
        np.testing.assert_allclose(
            np.asarray(got.probabilities), np.asarray(expected.probabilities), rtol=1e-6
        )
        assert (np.asarray(got.generations)[-2:] == 1).all()


@pytest.mark.gpu
def test_sample_at_windows_and_empty_tables_match_cpu(make_table, gpu):
    from gear_jax.ops import sample_at

    table = make_table(fields={"t": gj.Field((), "int32")}, capacity=16, max_steps=9)
    targets = jnp.asarray(np.random.default_rng(13).uniform(-2, 14, 100).astype(np.float32))
    key = jax.random.key(4)
    for step in range(2):
        got = run_on(gpu, lambda k, x: sample_at(table, k, x, window=4), key, targets)
        expected = run_on(CPU, lambda k, x: sample_at(table, k, x, window=4), key, targets)
        assert_same_sample(got, expected)
        if step == 0:  # empty: every pick is the marker
            np.testing.assert_array_equal(np.asarray(got.generations), 1)
            lengths = np.random.default_rng(14).integers(1, 10, 12).astype(np.int32)
            steps = np.arange(9, dtype=np.int32)
            table.insert({"t": np.stack([steps + 100 * r for r in range(12)])}, lengths=lengths)
    batch = gather_on(gpu, table, got)
    reference = gather_on(CPU, table, expected)
    for name in ("t", "valid"):
        np.testing.assert_array_equal(np.asarray(batch[name]), np.asarray(reference[name]), err_msg=name)


@pytest.mark.gpu
def test_weight_overflows_surface_at_the_next_call(make_table, gpu):
    from gear_jax.ops import sample_at, total_weight

    table = make_table(capacity=4)
    table.insert(transitions(2), priorities=np.full(2, 1e30, np.float32))
    s = run_on(
        gpu, lambda k, x: sample_at(table, k, x, priority_exponent=20.0), jax.random.key(0), jnp.zeros(3)
    )
    np.testing.assert_array_equal(np.asarray(s.generations), 1)
    with pytest.raises(gj.EXECUTION_ERRORS, match="gear_jax.sample_at: the sum .* overflows a double"):
        gather_on(gpu, table, s)
    run_on(gpu, lambda a: total_weight(table, 2.0, after=a), jnp.zeros((), jnp.int32))
    with pytest.raises(gj.EXECUTION_ERRORS, match="gear_jax.total_weight: the sum .* overflows a float32"):
        gather_on(gpu, table, s)


@pytest.mark.gpu
def test_insert_inside_jit_on_gpu_matches_cpu(make_table, gpu):
    """gj.insert from a program on the GPU writes the same bytes, lengths and priorities as on the CPU, in
    the stream's order with a sample after it; bad values surface at the next call and write nothing."""
    fields = {"obs": gj.Field((3,), "float32"), "pixels": gj.Field((7,), "uint8")}
    rng = np.random.default_rng(0)
    batch = {
        "obs": rng.integers(0, 2**32, (6, 4, 3), dtype=np.uint32).view(np.float32),
        "pixels": rng.integers(0, 256, (6, 4, 7), dtype=np.uint8),
    }
    lengths = np.array([4, 1, 2, 3, 4, 2], np.int32)
    tables = {}
    for name, device in (("cpu", CPU), ("gpu", gpu)):
        table = tables[name] = make_table(fields=fields, capacity=32, max_steps=4)
        table.insert({k: v[:2] for k, v in batch.items()}, priorities=[3.0, 0.5])

        def step(b, n, key, table=table):
            rows = gj.insert(table, b, priorities="max", lengths=n)
            s = gj.sample(table, key, 6, method="lifo", after=rows)
            return rows, s.indices

        rows, picked = run_on(device, step, batch, lengths, jax.random.key(0))
        np.testing.assert_array_equal(np.sort(np.asarray(picked)), np.sort(np.asarray(rows)))
    cpu_status, gpu_status = tables["cpu"].row_status(), tables["gpu"].row_status()
    for column in ("priority", "length"):
        np.testing.assert_array_equal(gpu_status[column], cpu_status[column], err_msg=column)
    np.testing.assert_array_equal(gpu_status["priority"][2:8], 3.0)
    for name in fields:
        got, expected = tables["gpu"].columns[name][2:8], tables["cpu"].columns[name][2:8]
        for i, n in enumerate(lengths):
            np.testing.assert_array_equal(got[i, :n].view(np.uint8), expected[i, :n].view(np.uint8))
    table = tables["gpu"]
    size = table.size
    bad = {k: v[:2] for k, v in batch.items()}
    rows = run_on(gpu, lambda b, n: gj.insert(table, b, lengths=n), bad, np.array([1, 5], np.int32))
    np.testing.assert_array_equal(np.asarray(rows), [-1, -1])
    with pytest.raises(gj.EXECUTION_ERRORS, match=r"insert: lengths\[1\] = 5 is outside \[1, 4\]"):
        run_on(gpu, lambda b: gj.insert(table, b), bad)
    assert table.size == size


@pytest.mark.gpu
def test_priority_updates_chained_through_a_scan_match_cpu(make_table, gpu, scatter_path):
    """A learner loop on JAX's fast path (`priority_update=` on sample and sample_gather, no effect) runs
    the same on the GPU as on the CPU: the same picks at every step, and at the end the priorities that
    writing each step's update in order gives (the last one through update_priorities)."""
    rows, batch, steps = 3000, 256, 6
    rng = np.random.default_rng(5)
    priorities = rng.uniform(0.1, 3.0, rows).astype(np.float32)
    new = rng.choice([0.0, 0.25, 1.0, 6.0], (steps, batch)).astype(np.float32)
    tables = []
    for _ in range(2):
        table = make_table(fields={"x": gj.Field((), "int32")}, capacity=rows, reuse=False)
        table.insert({"x": np.arange(rows, dtype=np.int32)}, priorities=priorities)
        tables.append(table)

    def learner(key, new, table):
        first = gj.sample(table, key, batch, method="prioritized", priority_exponent=0.6)

        def step(previous, step_input):
            key, p = step_input
            s, data = gj.sample_gather(
                table, key, batch, method="prioritized", priority_exponent=0.6, priority_update=(previous, p)
            )
            return s, (s.indices, data["x"])

        keys = jax.random.split(key, steps - 1)
        last, (picked, xs) = jax.lax.scan(step, first, (keys, new[:-1]))
        count = gj.update_priorities(table, last, new[-1])
        return first.indices, picked, xs, count

    key = jax.random.key(3)
    gpu_run, cpu_run = [
        [np.asarray(a) for a in run_on(device, lambda k, p, t=table: learner(k, p, t), key, new)]
        for table, device in zip(tables, (gpu, CPU))
    ]
    for got, expected, name in zip(gpu_run, cpu_run, ("first", "picked", "x", "count")):
        np.testing.assert_array_equal(got, expected, err_msg=name)
    first, picked, xs, count = gpu_run
    np.testing.assert_array_equal(xs, picked)  # row r holds x = r
    assert int(count) == batch
    expected = priorities.copy()
    for previous, p in zip([first, *picked], new):
        for row, value in zip(previous, p):
            expected[row] = value  # a row picked twice keeps its later entry, as update_priorities does
    for table in tables:
        np.testing.assert_array_equal(table.row_status()["priority"][:rows], expected)


@pytest.mark.gpu
def test_calls_after_an_insert_in_the_same_program_see_its_rows_on_gpu(make_table, gpu):
    """A GPU call's handler runs when XLA enqueues it, before an insert earlier on the stream has claimed
    its rows: the kernels read the claimed rows when they run. On an empty table, every call ordered after
    an insert in the same program sees exactly the inserted rows, as on the CPU. Four other exponents take
    the table's GPU priority indexes first, so that exponent 0.5 runs the scans that serve exponents past
    the index's limit."""
    fields = {"x": gj.Field((), "int32")}
    priorities = np.array([1.0, 2.0, 3.0, 4.0, 0.5, 0.25], np.float32)
    results = {}
    for name, device in (("cpu", CPU), ("gpu", gpu)):
        table = make_table(fields=fields, capacity=64, reuse=False)
        for exponent in (1.0, 2.0, 3.0, 4.0):  # on `device`: an argument commits the call there
            run_on(device, lambda z, e=exponent, t=table: gj.total_weight(t, e, after=z), np.int32(0))

        def step(x, p, key, table=table):
            rows = gj.insert(table, {"x": x}, priorities=p)
            uniform = gj.sample(table, key, 32, after=rows)
            fifo = gj.sample(table, key, 6, method="fifo", after=rows)
            prioritized = gj.sample(table, key, 32, method="prioritized", priority_exponent=0.5, after=rows)
            total, count = gj.total_weight(table, priority_exponent=0.5, after=rows)
            targets = jnp.linspace(0.0, 1.0, 16, dtype=jnp.float32) * total
            at = gj.sample_at(table, key, targets, priority_exponent=0.5, after=rows)
            return rows, uniform.indices, fifo.indices, count, at.indices, prioritized.indices, total

        x = np.arange(10, 16, dtype=np.int32)
        results[name] = [np.asarray(a) for a in run_on(device, step, x, priorities, jax.random.key(1))]
    rows, uniform, fifo, count, at, prioritized, total = results["gpu"]
    np.testing.assert_array_equal(rows, np.arange(6))
    assert set(uniform.tolist()) <= set(range(6)) and len(set(uniform.tolist())) > 1
    np.testing.assert_array_equal(fifo, np.arange(6))
    assert int(count) == 6
    np.testing.assert_allclose(float(total), float(np.sqrt(priorities).sum()), rtol=1e-6)
    assert set(at.tolist()) <= set(range(6)) and len(set(at.tolist())) > 1
    assert set(prioritized.tolist()) <= set(range(6))  # the scan: the same law as the CPU, not the same rows
    names = ("rows", "uniform", "fifo", "count", "sample_at")
    for got, expected, name in zip(results["gpu"], results["cpu"], names):
        np.testing.assert_array_equal(got, expected, err_msg=name)

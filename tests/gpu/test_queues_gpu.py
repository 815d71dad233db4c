"""Queues and max_times_sampled in GPU programs (gear_jax.queues).

A queue's consumption runs on the host in the stream's order (a host callback after the gather's copies),
so a GPU program dequeues exactly as a CPU one: each row once, oldest first. Samples of a
max_times_sampled table take each row's samples and retire it by compare-and-swaps on host memory, which
a GPU makes atomic against other processes only with native host atomics: elsewhere the whole sample runs
on the host in the stream's order (the CPU kernels, so the picks are a CPU program's for the same key),
and the gather on the GPU reads them.
Tests marked `gpu` skip where jax sees no GPU.
"""

import collections

import jax
import numpy as np
import pytest

import gear_jax as gj
from gear_jax import _native
from tests.helpers.queues import check_race, race_learners

IDS = {"id": gj.Field((), "int32")}
ROWS = {"id": gj.Field((), "int32"), "obs": gj.Field((4,), "float32")}


@pytest.mark.gpu
def test_a_gpu_program_dequeues_each_row_once_in_commit_order(gpu, make_table):
    queue = make_table(fields=IDS, capacity=64, queue=True)
    queue.insert({"id": np.arange(40, dtype=np.int32)})
    take = jax.jit(lambda: gj.dequeue(queue, 16), device=gpu)
    got = []
    for expected in (16, 16, 8, 0):
        _, batch = take()
        ok = np.asarray(batch["valid"])
        assert int(ok.sum()) == expected
        got += np.asarray(batch["id"])[ok].tolist()
    assert got == list(range(40))
    assert queue.unconsumed == 0 and queue.rate_limiter_counts().samples == 40
    queue.insert({"id": np.arange(40, 104, dtype=np.int32)}, timeout=5)  # the consumed rows are free
    _, batch = take()
    assert np.asarray(batch["id"]).tolist() == list(range(40, 56))


@pytest.mark.gpu
def test_max_times_sampled_on_a_gpu_counts_every_row_exactly(gpu, make_table):
    table = make_table(fields=IDS, capacity=64, max_times_sampled=2)
    table.insert({"id": np.arange(30, dtype=np.int32)})
    step = jax.jit(lambda k: (lambda s: (s, gj.gather(table, s)))(gj.sample(table, k, 8)), device=gpu)
    counts = collections.Counter()
    for i in range(100):
        if table.unconsumed == 0:
            break
        s, b = step(jax.random.key(i))  # the table holds selectable rows: no error, now or recorded
        ok = np.asarray(b["valid"])
        counts.update(np.asarray(b["id"])[ok].tolist())
    assert table.unconsumed == 0
    assert counts == {row: 2 for row in range(30)}


@pytest.fixture
def limited_pair():
    """make(ring) -> two tables of equal contents (rows and priorities), each row to be sampled at most
    twice; with `ring`, step rings of episodes of 4 to 12 steps. Closed when the test ends."""
    made = []

    def make(ring=False):
        spec = (
            gj.TableSpec(ROWS, capacity=128, max_steps=12, step_capacity=1024)
            if ring
            else gj.TableSpec(ROWS, capacity=128)
        )
        made.extend(gj.Table.create(spec, max_times_sampled=2) for _ in range(2))
        return fill(made[-2:], ring)

    yield make
    for table in made:
        table.close()


def fill(tables, ring):
    ids = np.arange(100, dtype=np.int32)
    lengths = np.random.default_rng(0).integers(4, 13, 100).astype(np.int32)  # each holds a window of 4
    for t in tables:
        steps = (100, 12) if ring else (100,)
        obs = np.broadcast_to(ids.reshape((100,) + (1,) * len(steps)), steps + (4,)).astype(np.float32)
        t.insert(
            {"id": np.broadcast_to(ids.reshape((100,) + (1,) * (len(steps) - 1)), steps).copy(), "obs": obs},
            priorities=np.linspace(0.5, 4.0, 100, dtype=np.float32),
            lengths=lengths if ring else None,
        )
    return tables


SAMPLE_FIELDS = ("indices", "generations", "probabilities", "starts", "selectable", "lengths")

# What each program returns: a Sample (or ordered_candidates' pair) and, where it gathers, the rows.
PROGRAMS = {
    **{
        f"sample_gather_{m}": (lambda m: lambda t, k, targets: gj.sample_gather(t, k, 16, method=m))(m)
        for m in ("uniform", "prioritized", "fifo", "topk")
    },
    "sample_then_gather": lambda t, k, targets: (lambda s: (s, gj.gather(t, s)))(gj.sample(t, k, 16)),
    "ordered_candidates_lifo": lambda t, k, targets: gj.ops.ordered_candidates(t, k, 16, "lifo"),
    "sample_at": lambda t, k, targets: (gj.ops.sample_at(t, k, targets), None),
    "ring_windows": lambda t, k, targets: gj.sample_gather(t, k, 16, window=4, short_episodes="skip"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("program", list(PROGRAMS))
def test_a_limited_table_gives_a_gpu_program_the_picks_of_a_cpu_program(gpu, limited_pair, program):
    """Without native host atomics a GPU program's samples of such a table run on the host by the CPU
    kernels: the same picks as a CPU program's for the same key, step after step as the rows' samples
    run out, and the gather on the GPU of those picks (sample_gather and sample's handlers, the ordered
    candidates', sample_at's, and uniform windows of step rings)."""
    if _native.cuda_device_info(gpu.id)["host_native_atomics"]:
        pytest.skip("this GPU samples limited tables in its own kernels (native host atomics)")
    on_cpu, on_gpu = limited_pair(ring=program == "ring_windows")
    cpu = jax.devices("cpu")[0]
    fn = PROGRAMS[program]
    run_cpu = jax.jit(lambda k, x: fn(on_cpu, k, x), device=cpu)
    run_gpu = jax.jit(lambda k, x: fn(on_gpu, k, x), device=gpu)
    rng = np.random.default_rng(1)
    for i in range(12):  # up to 192 picks of 100 rows of 2 samples each: rows run out on the way
        if on_cpu.unconsumed < 20:  # fifo and topk need 16 selectable rows
            break
        status = on_cpu.row_status()  # retired rows have priority 0; rows being written, odd generations
        total = float(np.sum(np.where(status["generation"] % 2 == 0, status["priority"], 0.0)))
        targets = (rng.uniform(0.0, 0.999, 16) * total).astype(np.float32)
        key = jax.random.key(i)
        want, got = run_cpu(key, targets), run_gpu(key, targets)
        for name in SAMPLE_FIELDS:
            w, g = getattr(want[0], name), getattr(got[0], name)
            assert (w is None) == (g is None), name
            if w is not None:
                np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=f"step {i}: {name}")
        if isinstance(want[1], dict):
            for field in ("id", "obs", "valid"):
                np.testing.assert_array_equal(np.asarray(got[1][field]), np.asarray(want[1][field]))
        elif want[1] is not None:  # ordered candidates' keys
            np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
    assert i >= 5 and on_gpu.unconsumed == on_cpu.unconsumed < 100  # rows were used up, alike
    for column in ("state", "times_sampled"):
        np.testing.assert_array_equal(on_gpu.status_columns[column], on_cpu.status_columns[column])


@pytest.mark.gpu
@pytest.mark.multiprocess
def test_gpu_and_cpu_learner_processes_sample_each_row_exactly_max_times_sampled_times(
    gpu, make_table, tmp_path
):
    """A GPU learner process and a CPU one race for the last samples of the rows a writer process keeps
    overwriting: no contents delivered more than k times, the last contents of every row exactly k."""
    k = 3
    table = make_table(fields={"id": gj.Field((), "int64")}, capacity=256, max_times_sampled=k)
    table.insert({"id": np.arange(256, dtype=np.int64)})
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # two processes on one GPU
    counts = race_learners(table, tmp_path / "writer_done", ["gpu", "cpu"], env=env)
    check_race(table, counts, k)

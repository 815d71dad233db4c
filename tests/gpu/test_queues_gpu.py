"""Queues and max_times_sampled in GPU programs (gear_jax.queues).

A queue's consumption runs on the host in the stream's order (a host callback after the gather's copies),
so a GPU program dequeues exactly as a CPU one: each row once, oldest first. Samples of a
max_times_sampled table retire rows by a compare-and-swap of their state words, which a GPU may make on
host memory only with native host atomics: elsewhere the handler refuses them, naming the CPU path.
Tests marked `gpu` skip where jax sees no GPU.
"""

import collections

import jax
import numpy as np
import pytest

import gear_jax as gj
from gear_jax import _native

IDS = {"id": gj.Field((), "int32")}


@pytest.fixture
def gpu():
    try:
        devices = jax.devices("gpu")
    except RuntimeError:
        pytest.skip("jax sees no GPU")
    if not gj.build_info()["cuda"]:
        pytest.fail("jax sees a GPU but gear_jax was built without its CUDA handlers (GEAR_JAX_CUDA=ON)")
    return devices[0]


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
def test_max_times_sampled_on_a_gpu_is_exact_or_refused_by_name(gpu, make_table):
    table = make_table(fields=IDS, capacity=64, max_times_sampled=2)
    table.insert({"id": np.arange(30, dtype=np.int32)})
    step = jax.jit(lambda k: (lambda s: (s, gj.gather(table, s)))(gj.sample(table, k, 8)), device=gpu)
    if not _native.cuda_device_info(gpu.id)["host_native_atomics"]:
        with pytest.raises(gj.EXECUTION_ERRORS, match="native host atomics"):
            jax.block_until_ready(step(jax.random.key(0)))
        assert table.unconsumed == 30  # nothing taken
        return
    counts = collections.Counter()
    for i in range(100):
        if table.unconsumed == 0:
            break
        s, b = step(jax.random.key(i))
        ok = np.asarray(b["valid"])
        counts.update(np.asarray(b["id"])[ok].tolist())
    assert table.unconsumed == 0
    assert counts == {row: 2 for row in range(30)}

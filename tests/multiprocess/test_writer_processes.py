"""Several processes on one table: attach by name, concurrent writers, a writer that dies mid-write."""

import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import gear_jax as gj
from tests.helpers.processes import start_python, start_uniform_writers

pytestmark = pytest.mark.multiprocess
TIMEOUT = 120


def run_python(code: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter, bounded by a timeout; raises on failure."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr
    return done


def hold_a_row(table, then: str) -> str:
    """Code for a process that attaches, starts an episode of one step, prints its row, then runs `then`."""
    return f"""
        import os, time, numpy as np, gear_jax as gj
        t = gj.Table.attach({table.name!r})
        w = t.writer()
        w.append({{"x": 1}})
        print(int(np.flatnonzero(t.row_status()["generation"] % 2 == 1)[0]), flush=True)  # the row held
        {then}
    """


def test_second_process_inserts_rows_the_first_samples(make_table):
    table = make_table(fields={"x": gj.Field((4,), "float32"), "id": gj.Field((), "int64")}, capacity=64)
    done = run_python(f"""
        import numpy as np, gear_jax as gj
        with gj.Table.attach({table.name!r}) as t:
            ids = t.insert({{"x": np.full((10, 4), 7, np.float32), "id": np.arange(100, 110)}})
            print(",".join(map(str, ids)))
    """)
    assert done.stdout.strip() == ",".join(map(str, range(10)))
    assert table.size == 10
    s = gj.sample(table, jax.random.key(0), 32)
    batch = gj.gather(table, s)
    np.testing.assert_array_equal(np.asarray(batch["id"]), 100 + np.asarray(s.indices))
    np.testing.assert_array_equal(np.asarray(batch["x"]), 7)


def test_concurrent_writers_never_yield_torn_valid_rows(make_table):
    """Two processes overwrite a small ring as fast as they can while this one samples and gathers.

    Every row a writer commits holds one value in every element, so a row read while it was being
    rewritten would mix two values. Such a row must come back invalid. The test also checks that reads
    did overlap writes (rows came back invalid), so the seqlock was really exercised.
    """
    width = 4096
    table = make_table(fields={"v": gj.Field((width,), "int32")}, capacity=8)
    table.insert({"v": np.zeros((8, width), np.int32)})
    writers = start_uniform_writers(table, width, seconds=3.0)
    step = jax.jit(lambda k: gj.gather(table, gj.sample(table, k, 8)))
    valid_rows = invalid_rows = 0
    commits_while_sampling = []  # the last commit order number, before the first and after the last read
    try:
        i = 0
        while any(w.poll() is None for w in writers) and i < 20_000 and invalid_rows < 200:
            if i == 0:
                jax.block_until_ready(step(jax.random.key(0)))  # compiled before the first measure
                commits_while_sampling.append(int(table.row_status()["insert_seq"].max()))
            batch = step(jax.random.key(i))
            v, ok = np.asarray(batch["v"]), np.asarray(batch["valid"])
            uniform = (v == v[:, :1]).all(axis=1)
            assert uniform[ok].all(), "a valid row mixes two writes"
            valid_rows += int(ok.sum())
            invalid_rows += int((~ok).sum())
            i += 1
        commits_while_sampling.append(int(table.row_status()["insert_seq"].max()))
    finally:
        for w in writers:
            w.wait(timeout=TIMEOUT)
    assert all(w.returncode == 0 for w in writers), [w.stderr.read() for w in writers]
    first, last = commits_while_sampling
    print(f"{i} batches, {valid_rows} valid rows, {invalid_rows} invalid rows, commits {first} -> {last}")
    assert last > first, "the writers made no progress while this process sampled"
    assert valid_rows > 0
    assert invalid_rows > 0, "no read overlapped a write: the test did not exercise the seqlock"
    assert table.row_status()["generation"].min() >= 2


def test_dead_writer_row_is_reclaimed(make_table):
    table = make_table(fields={"x": gj.Field((), "int32")}, capacity=4, max_steps=3)
    done = run_python(hold_a_row(table, then="os._exit(0)"))  # dies mid-episode: the row stays odd
    dead_row = int(done.stdout)
    assert table.row_status()["generation"][dead_row] % 2 == 1
    for method in ("uniform", "fifo"):
        table.insert({"x": np.ones((1, 1), np.int32)})
        assert dead_row not in np.asarray(gj.sample(table, jax.random.key(0), 1, method=method).indices)
    # Keep inserting: the ring comes back to the dead row and reclaims it instead of wedging.
    rows = table.insert({"x": np.arange(8, dtype=np.int32).reshape(8, 1)})
    assert dead_row in rows
    status = table.row_status()
    assert (status["generation"] % 2 == 0).all() and table.size == 4


def test_live_writer_row_is_not_stolen(make_table):
    table = make_table(fields={"x": gj.Field((), "int32")}, capacity=2, max_steps=3)
    holder = start_python(hold_a_row(table, then=f"time.sleep({TIMEOUT})"))  # alive until killed below
    try:
        held = int(holder.stdout.readline())
        rows = table.insert({"x": np.zeros((6, 1), np.int32)})
        assert held not in rows
        assert table.row_status()["generation"][held] % 2 == 1
    finally:
        holder.kill()
        holder.wait(timeout=TIMEOUT)

"""Step rings under writer processes: no window read while its steps were overwritten comes back valid
with mixed data (nor with steps of its own episode from another place: a slow writer's late copy), and
writers killed at any moment leave no episode half written, no row held for good and the counters right.

Every step of an episode carries the episode's id and its own index, so a window is checked whole: all
valid steps of one episode, consecutive from the sampled start. The ring is small against the writers'
speed, so it wraps many times a second and readers race the retirements.
"""

import os
import signal
import time

import jax
import numpy as np
import pytest

import gear_jax as gj

from ..helpers.processes import start_python
from .test_killed_writers import check_consistent, run_kill_storm, scan

pytestmark = pytest.mark.multiprocess
WIDTH = 64  # int32 per step of the "v" field: a copy long enough to race a writer

RING_FIELDS = {"v": gj.Field((WIDTH,), "int32"), "step": gj.Field((), "int32")}


# A writer process: for `seconds`, episodes of 1..max_steps steps, alternately whole (insert of a batch of
# episodes) and step by step (EpisodeWriter); every element of "v" holds the episode's id.
# argv = table name, base of the ids, seconds.
WRITER = """
    import sys, time
    import numpy as np
    import gear_jax as gj

    name, base, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    table = gj.Table.attach(name)
    rng = np.random.default_rng(base)
    width, longest = table.spec.fields["v"].shape[0], table.max_steps
    episode, end = base, time.monotonic() + seconds
    while time.monotonic() < end:
        lengths = rng.integers(1, longest + 1, 4)
        v = np.zeros((4, longest, width), np.int32)
        step = np.zeros((4, longest), np.int32)
        for i, length in enumerate(lengths):
            episode += 1
            v[i, :length] = episode
            step[i, :length] = np.arange(length)
        table.insert({"v": v, "step": step}, lengths=lengths)
        with table.writer() as writer:
            episode += 1
            for k in range(int(rng.integers(1, longest + 1))):
                writer.append({"v": np.full(width, episode, np.int32), "step": k})
            writer.end_episode()
    print("episodes", episode - base, flush=True)
    table.close()
"""


def check_windows(batch, starts, window):
    """Every valid window: one episode's steps, consecutive from its start; invalid steps zeroed.
    Returns the count of valid windows."""
    v, step, valid = np.asarray(batch["v"]), np.asarray(batch["step"]), np.asarray(batch["valid"])
    good = 0
    for i in range(len(valid)):
        n = int(valid[i].sum())
        assert valid[i, :n].all() and not valid[i, n:].any()
        assert not v[i, n:].any() and not step[i, n:].any()
        if n == 0:
            continue
        good += 1
        assert (v[i, :n] == v[i, 0, 0]).all(), f"window {i} mixes episodes: {np.unique(v[i, :n])}"
        np.testing.assert_array_equal(step[i, :n], np.arange(starts[i], starts[i] + n))
    return good


def test_windows_are_never_torn_while_writers_wrap_the_ring():
    table = gj.Table.create(
        gj.TableSpec(RING_FIELDS, capacity=64, step_capacity=128, max_steps=24), reuse=False
    )
    try:
        bases = (0, 10_000_000, 20_000_000)
        writers = [start_python(WRITER, table.name, str(base), "4") for base in bases]
        window, valid_windows, stale_checked = 6, 0, 0
        sample_gather = jax.jit(lambda k: gj.sample_gather(table, k, 64, window=window))
        deadline = time.monotonic() + 60
        while table.size == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        i = 0
        while any(w.poll() is None for w in writers):
            i += 1
            rng = np.random.default_rng(i)
            s, batch = gj.host.sample_gather(table, rng, 64, window=window, short_episodes="skip")
            valid_windows += check_windows(batch, np.asarray(s.starts), window)
            s, batch = sample_gather(jax.random.key(i))
            valid_windows += check_windows(batch, np.asarray(s.starts), window)
            # A sample gathered later, after the writers moved on: stale windows come back invalid.
            later = gj.gather(table, s)
            stale_checked += len(later["valid"]) - check_windows(later, np.asarray(s.starts), window)
            assert time.monotonic() < deadline, "writers did not finish"
        for w in writers:
            out, err = w.communicate(timeout=30)
            assert w.returncode == 0, err[-3000:]
            assert int(out.split()[-1]) > 100  # the ring wrapped many times
        assert valid_windows > 1000 and stale_checked > 0
        assert check_consistent(table, "after the writers") == 0
    finally:
        table.close()


# Killed writers: the parent forks writers of both kinds and SIGKILLs one at random moments.
# argv = table name, kills, seed, writers at a time, longest delay (s).
RING_KILLER = """
    import os, random, signal, sys, time
    import numpy as np
    import gear_jax as gj

    name, kills, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    width, delay = int(sys.argv[4]), float(sys.argv[5])
    table = gj.Table.attach(name)
    rng = random.Random(seed)
    size, longest = table.spec.fields["v"].shape[0], table.max_steps

    def insert_loop(k):
        episode = k * 1_000_000
        lengths = np.array([1 + (3 * i) % longest for i in range(16)], np.int32)
        v = np.zeros((16, longest, size), np.int32)
        step = np.tile(np.arange(longest, dtype=np.int32), (16, 1))
        while True:
            for i in range(16):
                episode += 1
                v[i] = episode
            try:
                table.insert({"v": v, "step": step}, lengths=lengths)
            except gj.GearJaxError:
                pass

    def episode_loop(k):
        episode = k * 1_000_000
        with table.writer() as writer:
            while True:
                episode += 1
                for t in range(1 + episode % longest):
                    writer.append({"v": np.full(size, episode, np.int32), "step": t})
                try:
                    writer.end_episode()
                except gj.GearJaxError:
                    pass

    loops = [insert_loop, episode_loop]
"""


def check_episodes(table):
    """Every committed episode holds its own steps: one id, steps 0..length-1, in ring order."""
    status = table.row_status()
    ring = table.spec.step_capacity
    v, step = table.columns["v"], table.columns["step"]
    live = np.flatnonzero((status["generation"] % 2 == 0) & (status["length"] > 0))
    for row in live:
        slots = (int(status["first_step"][row]) + np.arange(status["length"][row])) % ring
        ids = v[slots]
        assert (ids == ids[0, 0]).all(), f"row {row} mixes episodes"
        np.testing.assert_array_equal(step[slots], np.arange(status["length"][row]))
    return len(live)


@pytest.mark.parametrize("capacity, step_capacity, kills, seed", [(8, 64, 120, 1), (128, 1024, 200, 2)])
def test_killed_writers_leave_whole_episodes_and_reusable_rows(capacity, step_capacity, kills, seed):
    table = gj.Table.create(
        gj.TableSpec(RING_FIELDS, capacity=capacity, step_capacity=step_capacity, max_steps=16), reuse=False
    )
    try:
        run_kill_storm(RING_KILLER, table.name, kills, seed, 4, 0.003, timeout=120)
        committed, _, held = scan(table)
        print(f"{kills} kills: {committed} committed, {held} held rows")
        check_consistent(table, f"after {kills} kills")
        assert check_episodes(table) == committed

        # No writer is alive: rows held by killed writers are taken back as the cursor reaches them.
        lengths = np.full(capacity, 2, np.int32)
        v = np.repeat(np.arange(1, capacity + 1, dtype=np.int32), 2 * WIDTH).reshape(capacity, 2, WIDTH)
        rows = table.insert(
            {"v": v, "step": np.tile([0, 1], (capacity, 1)).astype(np.int32)}, lengths=lengths
        )
        assert sorted(rows) == list(range(capacity))
        assert check_consistent(table, "after an insert of every row") == 0
        assert table.size == capacity and check_episodes(table) == capacity
    finally:
        table.close()


def test_a_writer_killed_mid_episode_leaves_nothing():
    table = gj.Table.create(
        gj.TableSpec(RING_FIELDS, capacity=8, step_capacity=64, max_steps=16), reuse=False
    )
    try:
        code = """
            import os, signal, sys
            import numpy as np
            import gear_jax as gj
            table = gj.Table.attach(sys.argv[1])
            writer = table.writer()
            for t in range(10):
                writer.append({"v": np.full(64, 7, np.int32), "step": t})
            print("staged", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        """
        proc = start_python(code, table.name)
        out, _ = proc.communicate(timeout=60)
        assert "staged" in out and proc.returncode == -signal.SIGKILL
        assert table.size == 0 and table.native.cursors() == (0, 0) and not table.columns["v"].any()
        table.insert({"v": np.ones((1, 3, WIDTH), np.int32), "step": np.zeros((1, 3), np.int32)})
        assert table.row_status()["first_step"][0] == 0 and table.size == 1
    finally:
        table.close()
    assert os.path.exists(f"/dev/shm/{table.name}") is False

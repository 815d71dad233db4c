"""Writers SIGKILLed at random moments must not brick rows or leave the counters off.

A parent process attaches the table once and forks writers (cheap: no new interpreter), which insert
batches, add single rows or write episodes in tight loops; the parent kills one of them at a moment
drawn from a seeded generator and forks a replacement, many times. Afterwards no writer is alive, and:
  - `size` and `selectable` (the header counters, and the count the samplers report) equal what a scan
    of the rows gives: committed rows have an even generation and a length > 0; selectable rows an
    even generation and a priority > 0;
  - every row can be claimed again: an insert of `capacity` rows succeeds and leaves every row
    committed, and the counters still match the scan.
"""

import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import gear_jax as gj

pytestmark = pytest.mark.multiprocess
TIMEOUT = 90  # seconds for all the kills of one table (a few on an idle machine)
WRITERS = 4  # writer processes alive at a time
LONGEST_DELAY = 0.002  # seconds between kills: uniform in [0, this]

# The kill loop both killer scripts end with: forks `width` writers running `loops` (the script's own),
# then `kills` times sleeps a random moment, SIGKILLs a random writer and forks a replacement.
KILL_LOOP = """
    def spawn(k):
        pid = os.fork()
        if pid == 0:
            try:
                loops[k % len(loops)](k)
            finally:
                os._exit(0)
        return pid

    children = [spawn(k) for k in range(width)]
    for i in range(kills):
        time.sleep(rng.uniform(0.0, delay))
        j = rng.randrange(width)
        os.kill(children[j], signal.SIGKILL)
        os.waitpid(children[j], 0)
        children[j] = spawn(j + width * (i + 1))
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    print("done", flush=True)
"""


def run_kill_storm(script, *args, timeout=None):
    """Runs a killer `script` (its writers' loops, then KILL_LOOP) with `args` as its argv, and checks
    it finished its kills."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script + KILL_LOOP), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout or TIMEOUT,
    )
    assert done.returncode == 0 and "done" in done.stdout, done.stderr[-4000:]


# The parent of the writers, a small process (numpy and the native module only, no JAX): forks are
# cheap. argv = native module path, table name, kills, seed, writers at a time, longest delay (s).
KILLER = """
    import importlib.util, os, random, signal, sys, time
    import numpy as np

    path, name = sys.argv[1], sys.argv[2]
    kills, seed, width, delay = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
    spec = importlib.util.spec_from_file_location("_native", path)
    native = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(native)
    table = native.NativeTable.attach(name, False)
    rng = random.Random(seed)

    # Batches much larger than the table: a writer spends its time in claims and commits.
    n = 1024
    batch = [np.zeros((n, 2), np.int32).view(np.uint8).reshape(-1)]
    priorities = (np.arange(n) % 3 != 0).astype(np.float32)  # every third row of priority 0
    lengths = (np.arange(n) % 2 + 1).astype(np.int32)

    def insert_loop(k):
        while True:
            try:
                table.insert(batch, n, 2, lengths, priorities)
            except RuntimeError:
                pass  # every row held by live writers for the moment

    def row_loop(k):  # one row at a time, as Table.add
        i = 0
        while True:
            i += 1
            try:
                table.commit(table.claim(), 1 + i % 2, float(i % 2))
            except RuntimeError:
                pass

    def episode_loop(k):  # holds each row a while, then commits or abandons it, as EpisodeWriter
        i = 0
        while True:
            i += 1
            try:
                row = table.claim()
            except RuntimeError:
                continue
            for _ in range(i % 64):
                pass
            if i % 4 == 0:
                table.abandon(row)
            else:
                table.commit(row, 2, float(i % 3 != 0))

    loops = [insert_loop, row_loop, insert_loop, episode_loop]
"""


def scan(table):
    """(committed rows, selectable rows, held rows) from a snapshot of the rows."""
    status = table.row_status()
    even = status["generation"] % 2 == 0
    return (
        int((even & (status["length"] > 0)).sum()),
        int((even & (status["priority"] > 0)).sum()),
        int((~even).sum()),
    )


def counts(table):
    """The table's own counts: header size and selectable (each read repairs them if a writer died
    while changing them), and what uniform and prioritized samples report as selectable."""
    size, selectable = int(table.size), int(table.native.selectable)
    reported = []
    for method in ("uniform", "prioritized"):
        try:
            reported.append(int(gj.sample(table, jax.random.key(0), 1, method=method).selectable))
        except gj.EXECUTION_ERRORS as e:  # raised when no row is selectable
            assert "no selectable rows" in str(e)
            reported.append(0)
    return size, selectable, *reported


def check_consistent(table, when):
    committed, selectable, held = scan(table)
    size, native_selectable, uniform, prioritized = counts(table)
    assert (size, native_selectable, uniform, prioritized) == (
        committed,
        selectable,
        selectable,
        selectable,
    ), (
        f"{when}: counters (size, selectable, uniform's, prioritized's) = "
        f"{(size, native_selectable, uniform, prioritized)}; the rows hold {committed} committed, "
        f"{selectable} selectable, {held} held"
    )
    return held


@pytest.mark.parametrize("capacity, kills, seed", [(4, 150, 1), (256, 300, 2)])
def test_killed_writers_leave_no_row_held_and_counts_right(make_table, capacity, kills, seed):
    table = make_table(fields={"x": gj.Field((), "int32")}, capacity=capacity, max_steps=2)
    run_kill_storm(KILLER, gj._native.__file__, table.name, kills, seed, WRITERS, LONGEST_DELAY)
    committed, selectable, held = scan(table)
    print(
        f"capacity {capacity}, {kills} kills: {committed} committed, {selectable} selectable, {held} held "
        f"rows; counters (size, selectable, uniform's, prioritized's) = {counts(table)}"
    )
    check_consistent(table, f"after {kills} kills")

    # No writer is alive: every row can be claimed again, and ends committed.
    rows = table.insert({"x": np.zeros((capacity, 2), np.int32)})
    assert sorted(rows) == list(range(capacity))
    status = table.row_status()
    assert (status["generation"] % 2 == 0).all() and (status["length"] > 0).all()
    assert check_consistent(table, "after an insert of every row") == 0
    assert table.size == capacity


# Writers through the public API: episodes written step by step with EpisodeWriter, and single rows
# with Table.add. Each step's value names its episode and step, so a committed row can be checked whole.
# argv = table name, kills, seed, writers at a time, longest delay (s).
PUBLIC_API_KILLER = """
    import os, random, signal, sys, time
    import gear_jax as gj

    name, kills, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    width, delay = int(sys.argv[4]), float(sys.argv[5])
    table = gj.Table.attach(name)
    rng = random.Random(seed)

    def episode_loop(k):
        episode = k * 100_000
        with table.writer() as writer:
            while True:
                episode += 1
                steps = 1 + episode % table.max_steps
                for t in range(steps):
                    writer.append({"x": episode * 16 + t, "episode": episode})
                try:
                    writer.end_episode(priority=float(episode % 3 != 0))
                except gj.GearJaxError:
                    pass

    def add_loop(k):
        i = k * 100_000
        while True:
            i += 1
            try:
                table.insert({"x": [[i * 16] * table.max_steps], "episode": [[i] * table.max_steps]},
                             lengths=[1])
            except gj.GearJaxError:
                pass  # every row held by live writers for the moment

    loops = [episode_loop, episode_loop, add_loop]
"""


def test_kill_storm_of_episode_writers_and_inserters(make_table):
    """Episode writers (step by step) and inserters SIGKILLed at random moments: afterwards no row is
    held, the counters equal a scan, every committed row holds one whole episode, and inserts succeed."""
    capacity, max_steps, kills = 32, 6, 200
    table = make_table(
        fields={"x": gj.Field((), "int64"), "episode": gj.Field((), "int64")},
        capacity=capacity,
        max_steps=max_steps,
    )
    run_kill_storm(PUBLIC_API_KILLER, table.name, kills, 3, 3, 0.01)
    held = check_consistent(table, f"after {kills} kills")  # rows of killed writers: reclaimed below
    committed, _, _ = scan(table)
    print(f"{kills} kills: {committed} committed rows, {held} held by killed writers")
    assert committed > 0, "no writer committed anything: the storm did not exercise the writers"

    status = table.row_status()
    x, episode = table.columns["x"], table.columns["episode"]
    for row in np.flatnonzero(status["length"] > 0):
        n = int(status["length"][row])
        ep = int(episode[row, 0])
        assert (
            (episode[row, :n] == ep).all()
            and (x[row, :n] == ep * 16 + np.arange(n)).all()
            or (
                n == 1 and x[row, 0] == ep * 16  # a one-step insert
            )
        ), f"row {row} (length {n}) mixes episodes: {episode[row, :n]}, {x[row, :n]}"

    rows = table.insert(
        {"x": np.zeros((capacity, max_steps), np.int64), "episode": np.zeros((capacity, max_steps), np.int64)}
    )
    assert sorted(rows) == list(range(capacity))
    assert check_consistent(table, "after an insert of every row") == 0 and table.size == capacity


# Rate-limited writers of every host path (EpisodeWriter.end_episode, Table.insert, Table.add where the
# table takes single rows), each admitted by the limiter before it publishes. argv = table name, kills,
# seed, writers at a time, longest delay (s).
RATE_LIMITED_KILLER = """
    import os, random, signal, sys, time
    import numpy as np
    import gear_jax as gj

    name, kills, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    width, delay = int(sys.argv[4]), float(sys.argv[5])
    table = gj.Table.attach(name)
    rng = random.Random(seed)
    ring = table.spec.step_capacity is not None
    BATCH = 16

    def pace():  # past half the table, writers slow down: a fast machine must not wrap it (test void)
        if table.native.cursors()[0] > table.capacity // 2:
            time.sleep(0.002)

    def episode_loop(k):
        with table.writer() as writer:
            episode = 0
            while True:
                pace()
                episode += 1
                for t in range(1 + episode % table.max_steps):
                    writer.append({"x": t})
                writer.end_episode()

    def insert_loop(k):
        lengths = 1 + np.arange(BATCH) % table.max_steps
        while True:
            pace()
            table.insert({"x": np.zeros((BATCH, table.max_steps), np.int64)}, lengths=lengths)

    def add_loop(k):
        while True:
            pace()
            table.add({"x": np.zeros((table.max_steps,), np.int64)})

    def admitted_loop(k):  # rows admitted together, then claimed and committed one by one, as the
        # PyTorch bridge does: most of its time is spent admitted but not yet published
        while True:
            pace()
            with gj.writers.AdmittedInserts(table, BATCH, None) as admitted:
                for _ in range(BATCH):
                    row = table.native.claim()
                    time.sleep(0.0002)
                    admitted.commit(row, 1, 1.0)

    loops = [episode_loop, insert_loop] if ring else [episode_loop, insert_loop, add_loop, admitted_loop]
"""


@pytest.mark.parametrize("ring", [False, True], ids=["padded", "step_ring"])
def test_killed_rate_limited_inserters_give_their_admitted_rows_back(ring):
    """The limiter admits (and counts) an insert before its rows are published: writers SIGKILLed in
    between must not leave `inserts` ahead of the rows written. The table never wraps, so every row
    published is still held: afterwards the limiter's count equals the table's size, but for kills
    between two adjacent atomic steps (rate_limiter.h, "Killed inserters": a batch of 16 rows or one
    row each, rare). Before the take-back, the count ran ahead by about half a batch per kill of the
    admitted loop, a few hundred rows here."""
    capacity, max_steps, kills = 1 << 20, 4, 100
    spec = gj.TableSpec(
        {"x": gj.Field((), "int64")},
        capacity=capacity,
        max_steps=max_steps,
        step_capacity=capacity * max_steps if ring else None,
    )
    # A ratio whose tolerance no writer reaches: admissions never wait, and every one is counted.
    limiter = gj.RateLimiter(min_size_to_sample=1, samples_per_insert=1.0, error_buffer=1e12)
    table = gj.Table.create(spec, rate_limiter=limiter)
    try:
        run_kill_storm(RATE_LIMITED_KILLER, table.name, kills, 5, 3, 0.004)
        next_seq, _ = table.native.cursors()
        assert next_seq < capacity, (
            f"the writers claimed {next_seq} rows: the table wrapped, the test is void"
        )
        counts = table.rate_limiter_counts()
        print(f"{kills} kills: {table.size} rows written, limiter counts {counts}, {next_seq} rows claimed")
        assert table.size > 1000, "the writers wrote little: the storm did not exercise them"
        off = counts.inserts - table.size
        assert abs(off) <= 32, (
            f"after {kills} kills the limiter counts {counts.inserts} inserts for {table.size} rows written"
        )
        # The count goes on from there: one more insert counts one.
        table.insert({"x": np.zeros((1, max_steps), np.int64)})
        assert table.rate_limiter_counts().inserts - table.size == off
    finally:
        table.close()

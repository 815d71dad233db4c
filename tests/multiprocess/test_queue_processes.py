"""max_times_sampled and queues across processes: learners racing for the last samples of rows, writers
and consumers of one queue, consumers killed mid-batch (tests/helpers/queue_worker.py is one process)."""

import collections
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import gear_jax as gj

pytestmark = pytest.mark.multiprocess
WORKER = pathlib.Path(__file__).resolve().parents[1] / "helpers" / "queue_worker.py"
REPO = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 120
ROWS = 20_000  # the killed-consumer test: more than its victims can take


def start(role, table, *args, stdout=subprocess.PIPE):
    """Starts a worker; `stdout` a pipe (read it, or a process that prints much blocks) or a file."""
    return subprocess.Popen(
        [sys.executable, str(WORKER), role, table.name, *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def finish(process, timeout=TIMEOUT):
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return out


def test_concurrent_learners_sample_each_row_exactly_max_times_sampled_times(make_table, tmp_path):
    """Three learner processes sample while a writer overwrites rows: no contents are ever delivered
    more than k times, and every row's final contents exactly k times."""
    k = 3
    table = make_table(fields={"id": gj.Field((), "int64")}, capacity=256, max_times_sampled=k)
    table.insert({"id": np.arange(256, dtype=np.int64)})
    done = tmp_path / "writer_done"  # the learners sample until the writer is done and nothing is left
    learners = [start("learner", table, done) for _ in range(3)]
    writer = None
    try:
        for p in learners:
            assert p.stdout.readline() == "ready\n", p.stderr.read()
        for p in learners:
            p.stdin.write("go\n")
            p.stdin.flush()
        writer = start("writer", table, 1_000, 1_000, 8, 0.005)
        finish(writer)
        done.touch()
        outputs = [finish(p) for p in learners]
    finally:
        for p in [*learners, writer]:
            if p is not None:
                p.kill()
    counts = collections.Counter(int(v) for out in outputs for v in out.split())
    assert table.unconsumed == 0
    assert max(counts.values()) == k  # no contents delivered more than k times
    final = table.columns["id"][:, 0]
    assert all(counts[int(v)] == k for v in final)  # the last contents of every row: exactly k
    overwritten = set(counts) - {int(v) for v in final}
    assert overwritten, "the writer overwrote no row the learners had sampled: the race was not run"
    assert all(1 <= counts[v] <= k for v in overwritten)


def test_writers_and_consumers_of_a_queue_deliver_every_row_once(make_table, tmp_path):
    queue = make_table(fields={"id": gj.Field((), "int64")}, capacity=32, queue=True)
    done = tmp_path / "writers_done"
    consumers = [start("consumer", queue, done, 8) for _ in range(2)]
    writers = [start("writer", queue, w * 100_000, 400, 4) for w in range(3)]
    try:
        waits = [int(finish(w)) for w in writers]
        done.touch()
        outputs = [finish(c) for c in consumers]
    finally:
        for p in [*writers, *consumers]:
            p.kill()
    got = [int(v) for out in outputs for v in out.split()]
    expected = [w * 100_000 + i for w in range(3) for i in range(400)]
    assert len(got) == len(set(got)), "a row was delivered twice"
    assert sorted(got) == expected, "a committed row was lost"
    assert sum(waits) > 0, "the queue never filled: the writers' waits were not exercised"


def test_consumers_killed_mid_batch_lose_at_most_the_batch_in_flight(make_table, tmp_path):
    """Consumers are SIGKILLed at random moments while a writer fills the queue; a last consumer drains
    it. No row is delivered twice; the rows never reported are at most one batch per kill (those a
    killed consumer had taken and not yet reported), and every other row is delivered."""
    batch, kills = 16, 3
    queue = make_table(fields={"id": gj.Field((), "int64")}, capacity=128, queue=True)
    done = tmp_path / "writers_done"
    writer = start("writer", queue, 0, ROWS, 8)
    started = [writer]
    reports = []
    rng = np.random.default_rng(0)
    try:
        for _ in range(kills):
            victim = start("consumer", queue, done, batch, 0.001)  # paced: the queue outlasts it
            started.append(victim)
            first = victim.stdout.readline()  # compiled and consuming
            assert first, victim.stderr.read()
            time.sleep(float(rng.uniform(0.05, 0.4)))
            victim.send_signal(signal.SIGKILL)
            out, _ = victim.communicate(timeout=TIMEOUT)
            reports.append(first + out)
        with open(tmp_path / "last", "w") as log:  # a file: nothing reads it before the end
            last = start("consumer", queue, done, batch, stdout=log)  # drains while the writer finishes
            started.append(last)
            finish(writer)
            done.touch()
            finish(last)
        reports.append((tmp_path / "last").read_text())
    finally:
        for p in started:
            p.kill()
    got = [int(v) for out in reports for v in out.split()]
    assert len(got) == len(set(got)), "a row was delivered twice"
    missing = set(range(ROWS)) - set(got)
    assert len(missing) <= kills * batch, f"{len(missing)} rows lost, more than the batches in flight"
    assert queue.unconsumed == 0

"""max_times_sampled and queues across processes: learners racing for the last samples of rows, writers
and consumers of one queue, consumers killed mid-batch (tests/helpers/queue_worker.py is one process)."""

import signal
import time

import numpy as np
import pytest

import gear_jax as gj
from tests.helpers.queues import TIMEOUT, check_race, finish, race_learners, start

pytestmark = pytest.mark.multiprocess
ROWS = 20_000  # the killed-consumer test: more than its victims can take


def test_concurrent_learners_sample_each_row_exactly_max_times_sampled_times(make_table, tmp_path):
    """Three learner processes sample while a writer overwrites rows: no contents are ever delivered
    more than k times, and every row's final contents exactly k times."""
    k = 3
    table = make_table(fields={"id": gj.Field((), "int64")}, capacity=256, max_times_sampled=k)
    table.insert({"id": np.arange(256, dtype=np.int64)})
    counts = race_learners(table, tmp_path / "writer_done", ["", "", ""])
    check_race(table, counts, k)


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

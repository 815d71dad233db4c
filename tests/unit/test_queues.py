"""Rows used up by samples (max_times_sampled) and queues (gj.dequeue), in one process."""

import collections

import jax
import numpy as np
import pytest

import gear_jax as gj
from gear_jax import host

IDS = {"id": gj.Field((), "int32")}


def ids(n, start=0):
    return {"id": np.arange(start, start + n, dtype=np.int32)}


def delivered(table, sample, batch):
    """(row, generation, id) of each valid pick."""
    ok = np.asarray(batch["valid"])
    ok = ok if ok.ndim == 1 else ok[:, 0]
    rows, gens = np.asarray(sample.indices)[ok], np.asarray(sample.generations)[ok]
    values = np.asarray(batch["id"])[ok]
    return list(zip(rows.tolist(), gens.tolist(), values.reshape(len(values), -1)[:, 0].tolist()))


# -- max_times_sampled --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"max_times_sampled": 0}, "1 to 65535"),
        ({"max_times_sampled": 65536}, "1 to 65535"),
        ({"max_times_sampled": True}, "1 to 65535"),
        ({"max_times_sampled": 2.0}, "1 to 65535"),
        ({"queue": True, "max_times_sampled": 1}, "leave it None"),
        ({"queue": True, "rate_limiter": gj.RateLimiter(1)}, "rate_limiter=None"),
        ({"queue": "yes"}, "queue"),
    ],
)
def test_bad_sampling_rules_are_refused_by_name(make_table, kwargs, words):
    with pytest.raises(gj.InvalidArgumentError, match=words):
        make_table(fields=IDS, **kwargs)


def test_a_step_ring_cannot_be_a_queue():
    spec = gj.TableSpec(IDS, capacity=8, max_steps=4, step_capacity=64)
    with pytest.raises(gj.InvalidArgumentError, match="step ring"):
        gj.Table.create(spec, queue=True)


def test_the_rules_are_read_back_by_an_attach(make_table):
    limited = make_table(fields=IDS, max_times_sampled=3)
    queue = make_table(fields=IDS, queue=True)
    with gj.Table.attach(limited.name) as a, gj.Table.attach(queue.name) as b:
        assert (a.max_times_sampled, a.queue) == (3, False)
        assert (b.max_times_sampled, b.queue) == (None, True)
        assert b.rate_limiter is None  # the queue's own limiter is not a user's RateLimiter


@pytest.mark.parametrize("method", ["uniform", "prioritized", "fifo", "lifo", "topk"])
@pytest.mark.parametrize("k", [1, 3])
def test_every_row_is_sampled_exactly_max_times_sampled_times(make_table, method, k):
    table = make_table(fields=IDS, capacity=64, max_times_sampled=k)
    table.insert(ids(40), priorities=np.linspace(0.5, 2.0, 40))
    step = jax.jit(lambda key: (lambda s: (s, gj.gather(table, s)))(gj.sample(table, key, 8, method=method)))
    counts = collections.Counter()
    for i in range(200):
        if table.unconsumed == 0:
            break
        if method in ("fifo", "lifo", "topk") and table.unconsumed < 8:
            break  # these methods refuse a batch larger than the rows left
        s, b = step(jax.random.key(i))
        counts.update(delivered(table, s, b))
    if method in ("fifo", "lifo", "topk"):
        assert table.unconsumed < 8
        left = table.row_status()
        # The rows left were sampled fewer than k times and are still selectable.
        selectable = left["priority"][:40] > 0
        assert (left["times_sampled"][:40][selectable] < k).all()
        assert (left["times_sampled"][:40][~selectable] == k).all()
    else:
        assert table.unconsumed == 0
    for (row, _, value), n in counts.items():
        assert row == value and n <= k
    status = table.row_status()
    for row in range(40):
        assert status["times_sampled"][row] == sum(n for (r, _, _), n in counts.items() if r == row)
    if method not in ("fifo", "lifo", "topk"):
        assert all(counts[(row, int(status["generation"][row]), row)] == k for row in range(40))
        assert (status["priority"][:40] == 0).all()


def test_a_batch_larger_than_what_is_left_fails_the_extra_picks(make_table):
    table = make_table(fields=IDS, capacity=8, max_times_sampled=1)
    table.insert(ids(3))
    s = gj.sample(table, jax.random.key(0), 16)
    b = gj.gather(table, s)
    got = delivered(table, s, b)
    assert sorted(v for _, _, v in got) == [0, 1, 2]  # each row once, the other 13 picks failed
    assert int(np.asarray(b["valid"]).sum()) == 3
    with pytest.raises(gj.EXECUTION_ERRORS, match="no selectable rows"):
        jax.block_until_ready(gj.sample(table, jax.random.key(1), 4))


@pytest.mark.parametrize("method", ["uniform", "prioritized"])
def test_picks_of_a_batch_and_the_rows_they_use_up(make_table, method):
    """max_times_sampled=1, 4 rows, 4 picks with replacement. On the CPU a batch's picks are made one
    after another, and a uniform pick draws among the rows still selectable: a row an earlier pick used
    up is not drawn again, so the 4 picks are the 4 rows. A prioritized pick draws from the priorities as
    the call found them: one that lands on a row an earlier pick used up fails, so the valid picks are the
    distinct rows of 4 independent draws: 1, 2, 3 or 4 of them with probabilities 4, 84, 144 and 24 in
    256."""
    from scipy import stats

    from tests.helpers.sampling import P_THRESHOLD

    table = make_table(fields=IDS, capacity=4, max_times_sampled=1)
    rng = np.random.default_rng(0)
    counts = np.zeros(5)
    for _ in range(600):
        table.insert(ids(4))  # rewrites the 4 rows: each has its one sample again
        s = host.sample(table, rng, 4, method=method)
        valid = host.gather(table, s)["valid"]
        assert len(set(s.indices[valid].tolist())) == int(valid.sum())  # no row delivered twice
        counts[int(valid.sum())] += 1
    if method == "uniform":
        assert counts[4] == 600
    else:
        exact = np.array([4, 84, 144, 24]) / 256
        assert counts[0] == 0
        assert stats.chisquare(counts[1:], exact * counts.sum()).pvalue > P_THRESHOLD, counts


def test_update_priorities_never_revives_a_used_up_row(make_table):
    table = make_table(fields=IDS, capacity=8, max_times_sampled=2)
    table.insert(ids(2))
    first = gj.sample(table, jax.random.key(0), 1, method="fifo")  # row 0, one sample left
    second = gj.sample(table, jax.random.key(1), 1, method="fifo")  # row 0 again: used up
    assert int(first.indices[0]) == int(second.indices[0]) == 0
    assert table.row_status()["priority"][0] == 0
    assert int(gj.update_priorities(table, first, np.array([5.0], np.float32))) == 0
    assert table.row_status()["priority"][0] == 0
    # A row with samples left takes a new priority.
    other = gj.sample(table, jax.random.key(2), 1, method="fifo")
    assert int(other.indices[0]) == 1
    assert int(gj.update_priorities(table, other, np.array([5.0], np.float32))) == 1
    assert table.row_status()["priority"][1] == 5.0


def test_new_contents_of_a_row_get_a_fresh_budget(make_table):
    table = make_table(fields=IDS, capacity=4, max_times_sampled=1)
    table.insert(ids(4))
    s = gj.sample(table, jax.random.key(0), 4, method="fifo")
    assert table.unconsumed == 0
    table.insert(ids(4, start=100))  # overwrites every row
    assert table.unconsumed == 4
    assert (table.row_status()["times_sampled"] == 0).all()
    again = gj.sample(table, jax.random.key(1), 4, method="fifo")
    b = gj.gather(table, again)
    assert sorted(np.asarray(b["id"]).tolist()) == [100, 101, 102, 103]
    # The old sample is stale (other generations): gather says so.
    assert not np.asarray(gj.gather(table, s)["valid"]).any()


def test_windows_of_trajectories_use_rows_up_too(make_table):
    table = make_table(fields={"id": gj.Field((), "int32")}, capacity=8, max_steps=6, max_times_sampled=2)
    table.insert({"id": np.repeat(np.arange(4, dtype=np.int32)[:, None], 6, axis=1)})
    counts = collections.Counter()
    for i in range(20):
        if table.unconsumed == 0:
            break
        s = gj.sample(table, jax.random.key(i), 4, window=3)
        b = gj.gather(table, s)
        counts.update(delivered(table, s, b))
    assert table.unconsumed == 0
    assert sorted(counts.values()) == [2] * 4


def test_the_host_sampler_follows_the_limit(make_table):
    table = make_table(fields=IDS, capacity=16, max_times_sampled=2)
    table.insert(ids(5))
    seen = collections.Counter()
    for i in range(20):
        if table.unconsumed == 0:
            break
        _, b = host.sample_gather(table, np.random.default_rng(i), 4)
        ok = np.asarray(b["valid"])
        seen.update(np.asarray(b["id"])[ok].tolist())
    assert seen == {row: 2 for row in range(5)}


def test_a_checkpoint_keeps_counts_not_their_tags(make_table, tmp_path):
    table = make_table(fields=IDS, capacity=8, max_times_sampled=3)
    table.insert(ids(4))
    gj.sample(table, jax.random.key(0), 2, method="fifo")
    table.save(tmp_path / "ckpt")
    loaded = gj.Table.load(tmp_path / "ckpt")
    try:
        assert loaded.row_status()["times_sampled"][:4].tolist() == [1, 1, 0, 0]
    finally:
        loaded.close()


# -- queues -------------------------------------------------------------------------------------------


def test_dequeue_takes_each_row_once_in_commit_order(make_table):
    queue = make_table(fields=IDS, capacity=16, queue=True)
    queue.insert(ids(10))
    take = jax.jit(lambda: gj.dequeue(queue, 4))
    out = []
    for expected_valid in (4, 4, 2, 0):
        _, b = take()
        ok = np.asarray(b["valid"])
        assert int(ok.sum()) == expected_valid
        assert (np.asarray(b["id"])[~ok] == 0).all()
        out += np.asarray(b["id"])[ok].tolist()
    assert out == list(range(10))
    assert queue.unconsumed == 0
    assert queue.rate_limiter_counts().samples == 10


def test_a_full_queue_makes_inserts_wait_and_never_loses_a_row(make_table):
    queue = make_table(fields=IDS, capacity=8, queue=True)
    queue.insert(ids(8))
    with pytest.raises(gj.RateLimiterTimeout, match="queue is full"):
        queue.insert(ids(1, start=8), timeout=0.05)
    with pytest.raises(gj.RateLimiterTimeout, match="queue is full"):
        queue.add({"id": 8}, timeout=0.05)
    assert queue.unconsumed == 8  # nothing overwritten
    _, b = gj.dequeue(queue, 3)
    assert np.asarray(b["id"]).tolist() == [0, 1, 2]
    queue.insert(ids(3, start=8), timeout=1.0)  # room for three now
    with pytest.raises(gj.RateLimiterTimeout):
        queue.insert(ids(1, start=11), timeout=0.05)
    _, b = gj.dequeue(queue, 8)
    assert np.asarray(b["id"]).tolist() == list(range(3, 11))


def test_an_insert_larger_than_the_queue_is_refused(make_table):
    queue = make_table(fields=IDS, capacity=4, queue=True)
    with pytest.raises(gj.InvalidArgumentError):
        queue.insert(ids(5), timeout=0.05)
    assert queue.size == 0


def test_episode_writers_wait_for_room_and_give_it_back_when_they_abandon(make_table):
    queue = make_table(fields={"id": gj.Field((), "int32")}, capacity=2, max_steps=4, queue=True)
    with queue.writer() as w:
        w.append({"id": 1})
        w.end_episode()
    w = queue.writer()
    w.append({"id": 2})  # admitted: the queue's last room
    w.close()  # abandoned: the room comes back
    assert queue.rate_limiter_counts().inserts == 1
    with queue.writer() as w:
        for _ in range(3):
            w.append({"id": 3})
        w.end_episode()
    _, b = gj.dequeue(queue, 2, window=4)
    assert np.asarray(b["valid"]).sum(axis=1).tolist() == [1, 3]
    assert np.asarray(b["id"])[:, 0].tolist() == [1, 3]


def test_a_consumer_waits_for_rows(make_table):
    queue = make_table(fields=IDS, capacity=8, queue=True)
    assert not queue.can_sample(1)
    with pytest.raises(gj.RateLimiterTimeout, match="unconsumed"):
        queue.await_samples(2, timeout=0.05)
    queue.insert(ids(2))
    queue.await_samples(2, timeout=1.0)
    assert queue.can_sample(2) and not queue.can_sample(3)
    with pytest.raises(gj.InvalidArgumentError, match="capacity"):
        queue.await_samples(9)


def test_two_consumers_of_the_same_rows_split_them(make_table):
    """Two dequeues that copied the same rows: the consume step gives each row to one of them."""
    queue = make_table(fields=IDS, capacity=8, queue=True)
    queue.insert(ids(4))
    first, _ = gj.ordered_candidates(queue, jax.random.key(0), 4, "fifo")
    second, _ = gj.ordered_candidates(queue, jax.random.key(0), 4, "fifo")
    everything = np.ones(4, bool)
    took_first = np.asarray(gj.consume(queue, first, everything))
    took_second = np.asarray(gj.consume(queue, second, everything))
    assert took_first.all() and not took_second.any()
    assert queue.unconsumed == 0


def test_queue_misuse_is_refused_by_name(make_table):
    plain = make_table(fields=IDS)
    queue = make_table(fields=IDS, queue=True)
    with pytest.raises(gj.InvalidArgumentError, match="not a queue"):
        gj.dequeue(plain, 2)
    with pytest.raises(gj.InvalidArgumentError, match="is a queue"):
        gj.insert(queue, ids(2))
    s, _ = gj.ordered_candidates(queue, jax.random.key(0), 2, "fifo")
    with pytest.raises(gj.InvalidArgumentError, match="delivered"):
        gj.consume(queue, s, np.ones(3, bool))


def test_a_queues_priorities_cannot_be_set(make_table):
    """Priority 0 is what consumed means in a queue, and only dequeue may decide it: an update would
    bring consumed rows back (delivered twice) or drop unconsumed ones the queue's limiter still counts."""
    queue = make_table(fields=IDS, queue=True)
    queue.insert(ids(4))
    taken, batch = gj.dequeue(queue, 2)
    assert np.asarray(batch["valid"]).all()
    waiting = host.sample(queue, np.random.default_rng(0), 2, method="fifo")  # rows 2 and 3, not consumed
    refusals = [
        ("update_priorities", lambda: gj.update_priorities(queue, taken, np.ones(2, np.float32))),
        ("sample", lambda: gj.sample(queue, jax.random.key(0), 2, priority_update=(taken, np.ones(2)))),
        ("gear_jax.retire", lambda: gj.retire(queue, waiting)),
        ("gear_jax.host.update_priorities", lambda: host.update_priorities(queue, taken, [1.0, 1.0])),
        ("gear_jax.host.retire", lambda: host.retire(queue, [waiting])),
    ]
    for op, call in refusals:
        with pytest.raises(gj.InvalidArgumentError, match=f"{op}: table .* is a queue"):
            call()
    # Nothing changed: the two consumed rows stay consumed, the two others come out once.
    assert queue.unconsumed == 2
    _, rest = host.dequeue(queue, 4)
    assert rest["valid"].tolist() == [True, True, False, False] and rest["id"][:2].tolist() == [2, 3]
    queue.insert(ids(4, start=10), timeout=10)  # the queue has its room back


def test_a_queue_row_of_priority_zero_is_refused_and_nothing_is_counted(make_table):
    """A queue row of priority 0 would never be dequeued while the limiter counts it: refused natively,
    by every insert path, before anything is claimed or admitted."""
    queue = make_table(fields=IDS, queue=True)
    writer = queue.writer()
    writer.append({"id": 7})
    refusals = [
        lambda: queue.insert(ids(2), priorities=np.zeros(2, np.float32)),
        lambda: queue.insert(ids(1), priorities=0.0),  # the one-row short path
        lambda: queue.add({"id": 1}, priority=0.0),
        lambda: queue.insert(ids(3), priorities=[1.0, 0.0, 1.0]),
        lambda: writer.end_episode(priority=0.0),
    ]
    for call in refusals:
        with pytest.raises(gj.InvalidArgumentError, match="a queue: a row of priority 0 is never dequeued"):
            call()
    assert queue.unconsumed == 0 and queue.size == 0
    assert writer.end_episode(priority=0.5) >= 0  # the refused commit left the episode's row held
    queue.insert(ids(3, start=1), priorities=[2.0, 1.0, 3.0])
    _, batch = host.dequeue(queue, 4)
    assert batch["valid"].all() and batch["id"].tolist() == [7, 1, 2, 3]


# -- sharded tables ------------------------------------------------------------------------------------


def test_a_sharded_table_uses_rows_up_per_shard_in_local_mode():
    from jax.sharding import Mesh

    spec = gj.TableSpec(IDS, capacity=16)
    mesh = Mesh(np.array(jax.devices()[:1]), ("replay",))
    with gj.ShardedTable.create(spec, mesh, max_times_sampled=2) as table:
        assert table.max_times_sampled == 2 and table.shard(0).max_times_sampled == 2
        table.shard(0).insert(ids(6))
        step = table.sampler(4, mode="local")
        seen = collections.Counter()
        for i in range(10):
            if table.shard(0).unconsumed == 0:
                break
            _, batch = step(jax.random.key(i))
            ok = np.asarray(batch["valid"])
            seen.update(np.asarray(batch["id"])[ok].tolist())
        assert seen == {row: 2 for row in range(6)}
        with pytest.raises(gj.InvalidArgumentError, match='mode="local"'):
            table.sampler(4, method="fifo")(jax.random.key(0))


def test_the_host_dequeue_takes_rows_as_the_jitted_one(make_table):
    queue = make_table(fields={"id": gj.Field((), "int32")}, capacity=16, max_steps=3, queue=True)
    queue.insert({"id": np.repeat(np.arange(5, dtype=np.int32)[:, None], 3, axis=1)}, lengths=[3, 1, 2, 3, 3])
    s, b = host.dequeue(queue, 3)
    assert b["valid"].sum(axis=1).tolist() == [3, 1, 2]
    assert b["id"][:, 0].tolist() == [0, 1, 2]
    _, b = gj.dequeue(queue, 4)  # the jitted one takes the rest
    assert np.asarray(b["valid"])[:, 0].tolist() == [True, True, False, False]
    _, b = host.dequeue(queue, 2)
    assert not b["valid"].any() and (b["id"] == 0).all()
    # A row another consumer took is not offered again; the picks past the queue's rows are zeroed.
    queue.insert({"id": np.stack([np.full(3, 7, np.int32), np.full(3, 8, np.int32)])})
    taken, _ = gj.ordered_candidates(queue, jax.random.key(0), 2, "fifo")
    assert np.asarray(gj.consume(queue, taken, np.array([True, False]))).tolist() == [True, False]
    _, b = host.dequeue(queue, 2)
    assert b["valid"][:, 0].tolist() == [True, False]
    assert b["id"].tolist() == [[8, 8, 8], [0, 0, 0]]
    with pytest.raises(gj.InvalidArgumentError, match="not a queue"):
        host.dequeue(make_table(fields=IDS), 2)


def test_a_loaded_checkpoint_keeps_budgets_and_a_queue_its_unconsumed_rows(make_table, tmp_path):
    limited = make_table(fields=IDS, capacity=8, max_times_sampled=2)
    limited.insert(ids(3))
    gj.sample(limited, jax.random.key(0), 3, method="fifo")  # one sample each
    gj.sample(limited, jax.random.key(0), 1, method="fifo")  # row 0 used up
    limited.save(tmp_path / "limited")
    with gj.Table.load(tmp_path / "limited", max_times_sampled=2) as loaded:
        assert loaded.unconsumed == 2
        counts = collections.Counter()
        for i in range(5):
            if loaded.unconsumed == 0:
                break
            s = gj.sample(loaded, jax.random.key(i), 2)
            counts.update(delivered(loaded, s, gj.gather(loaded, s)))
        assert sorted((row, n) for (row, _, _), n in counts.items()) == [(1, 1), (2, 1)]

    queue = make_table(fields=IDS, capacity=4, queue=True)
    queue.insert(ids(4))
    gj.dequeue(queue, 1)
    queue.save(tmp_path / "queue")
    with gj.Table.load(tmp_path / "queue", queue=True) as loaded:
        assert loaded.queue and loaded.unconsumed == 3
        loaded.insert(ids(1, start=10), timeout=1.0)  # the consumed row's room
        with pytest.raises(gj.RateLimiterTimeout, match="queue is full"):
            loaded.insert(ids(1, start=11), timeout=0.05)
        _, b = gj.dequeue(loaded, 4)
        assert np.asarray(b["id"]).tolist() == [1, 2, 3, 10]


def test_two_dequeues_in_one_function_take_successive_rows_when_ordered_by_after(make_table):
    queue = make_table(fields=IDS, capacity=32, queue=True)
    queue.insert(ids(12))

    @jax.jit
    def twice():
        _, a = gj.dequeue(queue, 4)
        _, b = gj.dequeue(queue, 4, after=a["valid"])
        return a, b

    a, b = twice()
    assert np.asarray(a["id"]).tolist() == [0, 1, 2, 3] and np.asarray(b["id"]).tolist() == [4, 5, 6, 7]

    @jax.jit
    def in_a_scan():
        def body(carry, _):
            _, batch = gj.dequeue(queue, 2)
            return carry, batch["id"]

        return jax.lax.scan(body, 0, None, length=2)[1]

    assert np.asarray(in_a_scan()).tolist() == [[8, 9], [10, 11]]


def test_a_step_ring_uses_episodes_up_too():
    spec = gj.TableSpec(IDS, capacity=8, max_steps=6, step_capacity=64)
    with gj.Table.create(spec, max_times_sampled=2) as ring:
        lengths = np.array([6, 3, 5, 2])
        ring.insert({"id": np.repeat(np.arange(4, dtype=np.int32)[:, None], 6, axis=1)}, lengths=lengths)
        counts = collections.Counter()
        for i in range(20):
            if ring.unconsumed == 0:
                break
            s = gj.sample(ring, jax.random.key(i), 4, window=2, short_episodes="skip")
            counts.update(delivered(ring, s, gj.gather(ring, s)))
        assert ring.unconsumed == 0
        assert sorted(n for n in counts.values()) == [2] * 4
        # New episodes reuse the ring and get their own budget.
        ring.insert({"id": np.full((1, 6), 9, np.int32)}, lengths=[4])
        s = gj.sample(ring, jax.random.key(99), 3, window=2)
        assert sorted(v for _, _, v in delivered(ring, s, gj.gather(ring, s))) == [9, 9]


def test_a_torch_insert_into_a_queue_refuses_priority_zero_before_it_claims_a_row(make_table):
    torch = pytest.importorskip("torch")
    from gear_jax.torch import insert_tensors

    queue = make_table(fields=IDS, capacity=16, queue=True)
    batch = {"id": torch.arange(12, dtype=torch.int32)}
    with pytest.raises(gj.InvalidArgumentError, match=r"priorities\[11\] = 0 .* a queue"):
        insert_tensors(queue, batch, priorities=[1.0] * 11 + [0.0])  # chunks of 2 rows: the last is bad
    assert queue.size == 0 and queue.unconsumed == 0
    insert_tensors(queue, batch)
    assert host.dequeue(queue, 12)[1]["id"].tolist() == list(range(12))


def test_an_episode_writer_waits_for_room_at_its_first_append_as_long_as_its_timeout(make_table):
    import time

    queue = make_table(fields=IDS, capacity=2, max_steps=3, queue=True)
    queue.insert({"id": np.zeros((2, 3), np.int32)})  # full
    writer = queue.writer()
    start = time.monotonic()
    with pytest.raises(gj.RateLimiterTimeout, match="queue is full"):
        writer.append({"id": 7}, timeout=0.3)
    assert 0.25 < time.monotonic() - start < 10
    assert writer.steps == 0 and queue.unconsumed == 2  # nothing appended, nothing held
    with pytest.raises(gj.InvalidArgumentError, match="EpisodeWriter.append"):
        writer.append({"id": 7}, timeout=-1)
    host.dequeue(queue, 1)  # room for one episode
    writer.append({"id": 7}, timeout=10)
    writer.append({"id": 8}, timeout=0)  # later steps of the episode never wait
    assert writer.end_episode() >= 0
    _, batch = host.dequeue(queue, 2)
    assert batch["valid"][:, 0].tolist() == [True, True] and batch["id"][1, :2].tolist() == [7, 8]

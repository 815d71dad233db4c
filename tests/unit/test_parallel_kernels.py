"""Large CPU calls shared out over XLA's intra-op threads (kernels/parallel.h): calls of four ranges or
more, such as prioritized batches of 1,024 picks and more and gathers of 512 KiB and more (ranges of
256 picks and of about 128 KiB). Whatever the split, the result must be the one
of a single thread: each pick's draws depend on its index alone, and each range writes its own rows."""


import jax
import jax.numpy as jnp
import numpy as np

import gear_jax as gj
from tests.helpers.processes import read_while_uniform_writers_write
from tests.helpers.tables import held_rows

TIMEOUT = 120  # seconds a writer process may take to finish


def filled(make_table, rows, width):
    """A table of `rows` rows whose field "v" (`width` int32) holds the row's number in every element,
    with priorities that differ from row to row."""
    table = make_table(fields={"v": gj.Field((width,), "int32")}, capacity=rows)
    ids = np.arange(rows, dtype=np.int32)
    table.insert(
        {"v": np.repeat(ids[:, None], width, axis=1)}, priorities=(1.0 + ids % 97).astype(np.float32)
    )
    return table


def test_a_large_prioritized_batch_makes_the_picks_of_a_small_one(make_table):
    table = filled(make_table, 50_000, 4)
    key = jax.random.key(11)
    small = gj.sample(table, key, 256, method="prioritized", priority_exponent=0.6)  # one range
    large = gj.sample(table, key, 4096, method="prioritized", priority_exponent=0.6)  # 16 ranges
    for name in ("indices", "generations", "probabilities", "starts"):
        np.testing.assert_array_equal(
            np.asarray(getattr(large, name))[:256], np.asarray(getattr(small, name))
        )
    # The later ranges made picks of their own (not copies of the first range).
    assert len(np.unique(np.asarray(large.indices))) > 3000
    assert int(table.row_status()["times_sampled"].sum()) == 256 + 4096


def test_sample_gather_of_a_large_batch_copies_every_pick(make_table):
    table = filled(make_table, 20_000, 256)  # 1 KiB rows: 2,048 picks are 2 MiB, 16 ranges
    for method in ("uniform", "prioritized"):
        picks, batch = gj.sample_gather(table, jax.random.key(3), 2048, method=method)
        rows = np.asarray(picks.indices)
        v = np.asarray(batch["v"])
        assert np.asarray(batch["valid"]).all()
        np.testing.assert_array_equal(v, np.repeat(rows[:, None], 256, axis=1))
        again = gj.gather(table, picks)
        np.testing.assert_array_equal(np.asarray(again["v"]), v)


def test_large_window_gathers_match_the_rows(make_table):
    steps, width = 32, 16
    table = make_table(fields={"v": gj.Field((width,), "int32")}, capacity=2000, max_steps=steps)
    lengths = 1 + np.arange(2000) % steps
    data = np.zeros((2000, steps, width), np.int32)
    for row, n in enumerate(lengths):
        data[row, :n] = row * 100 + np.arange(n)[:, None]
    table.insert({"v": data}, lengths=lengths.astype(np.int32))
    picks = gj.sample(table, jax.random.key(4), 1024, window=8)  # 1024 x 8 steps x 64 B: 512 KiB
    batch = gj.gather(table, picks, window=8)
    rows, starts = np.asarray(picks.indices), np.asarray(picks.starts)
    valid = np.asarray(batch["valid"])
    for i in range(1024):
        row, start = rows[i], starts[i]
        inside = np.arange(8) < lengths[row] - start
        np.testing.assert_array_equal(valid[i], inside)
        np.testing.assert_array_equal(np.asarray(batch["v"])[i][inside], data[row, start : start + 8][inside])
        assert (np.asarray(batch["v"])[i][~inside] == 0).all()


def test_a_large_gather_never_yields_torn_valid_rows_under_concurrent_writers(make_table):
    """Two processes overwrite a 64-row ring while this one gathers all 64 rows of 16 KiB (1 MiB, 8
    ranges over the threads): every row a writer commits holds one value, so a valid row that mixes
    two writes would be a torn read, and an invalid row must be zeroed.

    The gathers start once a writer has committed a row and go on until the writers exit. Whether one
    also lands in the middle of a write is up to the scheduler, so invalid rows are counted, not required
    (runs capped at 5,000 batches saw as few as 20 of 320,000).
    test_rows_held_mid_write_gather_invalid_and_zeroed_in_every_range makes that case every time."""
    width = 4096
    table = make_table(fields={"v": gj.Field((width,), "int32")}, capacity=64)
    table.insert({"v": np.zeros((64, width), np.int32)})

    step = jax.jit(lambda k: gj.sample_gather(table, k, 64)[1])
    jax.block_until_ready(step(jax.random.key(0)))  # compiled before the writers start

    def read(i):
        batch = step(jax.random.key(i))
        return np.asarray(batch["v"]), np.asarray(batch["valid"])

    race = read_while_uniform_writers_write(table, width, read, seconds=3.0, timeout=TIMEOUT)
    assert race.last_commit > race.first_commit, "the writers made no progress while this process gathered"
    assert race.valid_rows > 0


def test_rows_held_mid_write_gather_invalid_and_zeroed_in_every_range(make_table):
    """The case the race above cannot force, in each of the 8 ranges of a 1 MiB gather: 8 writers claim
    rows 0 to 7 and write them without publishing, and a gather of picks made before the claims, ordered
    so that one held row opens each range of 8 picks, must report exactly those picks invalid and zeroed
    (although the rows' memory holds the writers' data) and copy every other row whole."""
    table = filled(make_table, 64, 4096)  # row r holds r in every element
    before = gj.sample(table, jax.random.key(5), 64, method="fifo")
    np.testing.assert_array_equal(np.asarray(before.indices), np.arange(64))
    order = np.arange(64).reshape(8, 8).T.reshape(-1)  # picks 8k, 8k + 1, ... : rows k, k + 8, ...
    fields = (before.indices, before.generations, before.probabilities, before.starts)
    picks = gj.Sample(*(jnp.asarray(np.asarray(a)[order]) for a in fields))
    writers = [table.writer() for _ in range(8)]
    try:
        for w in writers:
            w.append({"v": np.full(4096, -1, np.int32)})  # claims the ring's next row: rows 0 to 7
        np.testing.assert_array_equal(held_rows(table), np.arange(8))
        assert (table.columns["v"][:8] == -1).all()  # written, not published
        batch = jax.jit(lambda s: gj.gather(table, s))(picks)
        valid, v = np.asarray(batch["valid"]), np.asarray(batch["v"])
        opens_a_range = np.arange(64) % 8 == 0
        np.testing.assert_array_equal(valid, ~opens_a_range)
        assert (v[opens_a_range] == 0).all(), "an invalid row was not zeroed"
        np.testing.assert_array_equal(v[~opens_a_range], np.repeat(order[~opens_a_range, None], 4096, axis=1))
    finally:
        for w in writers:
            w.close()

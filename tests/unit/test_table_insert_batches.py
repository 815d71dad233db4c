"""Batched inserts: a batch is claimed, copied and published a chunk at a time (xla_ffi/shared_table.cc,
"Inserts"). These check what the chunks must not change: every row stored whole and in batch order,
batches larger than the ring, rows held by a writer left alone, exact counters, the copy of runs of
consecutive rows, and the inputs the native copy reads in place (views, Fortran order, bfloat16)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

import gear_jax as gj
from tests.helpers.tables import held_row


def _spec(
    capacity: int, max_steps: int = 1, shape: tuple[int, ...] = (5,), dtype: str = "int32"
) -> gj.TableSpec:
    return gj.TableSpec(
        fields={"x": gj.Field(shape, dtype), "r": gj.Field((), "float32")},
        capacity=capacity,
        max_steps=max_steps,
    )


def _exact_counts(table: gj.Table) -> tuple[int, int]:
    status = table.row_status()
    even = status["generation"] % 2 == 0
    return int(np.sum(even & (status["length"] > 0))), int(np.sum(even & (status["priority"] > 0)))


def test_batch_larger_than_the_ring_keeps_the_last_rows_in_order():
    with gj.Table.create(_spec(capacity=10)) as table:
        x = np.arange(25 * 5, dtype=np.int32).reshape(25, 5)
        ids = table.insert({"x": x, "r": np.arange(25, dtype=np.float32)})
        assert ids.dtype == np.int32 and ids.shape == (25,)
        assert list(ids) == [i % 10 for i in range(25)]
        status = table.row_status()
        # The last 10 rows of the batch hold the ring, in batch order of insert_seq.
        for b in range(15, 25):
            assert np.array_equal(table.columns["x"][ids[b], 0], x[b])
            assert table.columns["r"][ids[b], 0] == b
        order = np.argsort(status["insert_seq"])
        assert list(table.columns["r"][order, 0]) == list(range(15, 25))
        assert table.size == 10
        assert (table.size, table.native.selectable) == _exact_counts(table)


def test_chunks_of_a_small_ring_with_lengths_and_priorities():
    # capacity 64: chunks of 8 rows; trajectories of up to 4 steps, some shorter.
    with gj.Table.create(_spec(capacity=64, max_steps=4)) as table:
        rng = np.random.default_rng(0)
        for _ in range(3):
            x = rng.integers(-1000, 1000, (40, 4, 5), dtype=np.int32)
            r = rng.random((40, 4), dtype=np.float32)
            lengths = rng.integers(1, 5, 40)
            lengths[::3] = 4  # runs of whole rows between shorter ones
            priorities = rng.random(40).astype(np.float32)
            priorities[::7] = 0
            ids = table.insert({"x": x, "r": r}, priorities=priorities, lengths=lengths)
            assert len(set(ids.tolist())) == 40
            status = table.row_status()
            for b, row in enumerate(ids):
                n = lengths[b]
                assert status["length"][row] == n
                assert status["priority"][row] == priorities[b]
                assert status["generation"][row] % 2 == 0
                assert np.array_equal(table.columns["x"][row, :n], x[b, :n])
                assert np.array_equal(table.columns["r"][row, :n], r[b, :n])
            seqs = status["insert_seq"][ids]
            assert np.all(np.diff(seqs.astype(np.int64)) == 1)  # one commit_seq per row, in batch order
        assert (table.size, table.native.selectable) == _exact_counts(table)


def test_rows_held_by_a_writer_are_skipped_and_kept():
    with gj.Table.create(_spec(capacity=32)) as table:
        table.insert({"x": np.zeros((32, 5), np.int32), "r": np.zeros(32, np.float32)})
        with table.writer() as w:
            w.append({"x": np.full(5, 7, np.int32), "r": np.float32(7)})
            held = held_row(table)
            before = table.row_status()["generation"][held]
            assert before % 2 == 1
            ids = table.insert({"x": np.ones((100, 5), np.int32), "r": np.ones(100, np.float32)})
            assert held not in set(ids.tolist())
            assert table.row_status()["generation"][held] == before
            assert np.array_equal(table.columns["x"][held, 0], np.full(5, 7, np.int32))
            w.end_episode(priority=2.0)
        assert table.row_status()["priority"][held] == 2.0
        assert (table.size, table.native.selectable) == _exact_counts(table)


def test_views_fortran_order_and_bfloat16_are_stored_as_given():
    spec = gj.TableSpec(
        fields={"a": gj.Field((3, 4), "float32"), "h": gj.Field((6,), ml_dtypes.bfloat16)}, capacity=100
    )
    with gj.Table.create(spec) as table:
        rng = np.random.default_rng(1)
        base = rng.random((16, 3, 8), dtype=np.float32)
        a = base[:, :, ::2]  # not contiguous
        h = np.asfortranarray(rng.random((16, 6)).astype(ml_dtypes.bfloat16))
        ids = table.insert({"a": a, "h": h})
        assert np.array_equal(table.columns["a"][ids, 0], a)
        assert np.array_equal(
            table.columns["h"][ids, 0].view(np.uint16), np.ascontiguousarray(h).view(np.uint16)
        )
        ids = table.insert({"a": np.ascontiguousarray(a), "h": np.ascontiguousarray(h)})  # the in-place path
        assert np.array_equal(table.columns["a"][ids, 0], a)
        assert np.array_equal(
            table.columns["h"][ids, 0].view(np.uint16), np.ascontiguousarray(h).view(np.uint16)
        )

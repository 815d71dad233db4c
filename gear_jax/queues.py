"""Queues and rows used up by samples: actor -> learner queues (IMPALA-style) and `max_times_sampled`.

Two ways a table can use rows up, both chosen at `Table.create` and kept in the shared header, so that
every process attached to the table follows them:

- `max_times_sampled=k` (Reverb's): each row's contents are selectable for `k` samples. A sample takes
  one of them per pick, by a compare-and-swap of the row's count (tagged with the contents' generation),
  so that however many learners sample at once no row is picked more than `k` times; the pick that takes
  the last one sets the row's priority to 0 (unselectable; the ring overwrites it in turn) and
  `update_priorities` never raises it again. A pick of a row with no sample left fails: `gather`
  returns it `valid=False`. When that happens depends on the method. A uniform pick draws among the rows
  still selectable when it is made; on the CPU a batch's picks are made one after another, so a row that
  an earlier pick of the batch used up is not drawn again, and a pick fails only where another learner
  took the row's last sample between the pick's look at the row and its take (on a GPU, whose picks are
  made at once, also where another pick of the same batch did). A prioritized pick draws from the
  priorities as the call found them, so one that lands on a row an earlier pick of the batch used up
  fails. Fifo, lifo and topk picks pass a used-up row over for the next one. Priorities of 0 are refused
  in a queue's inserts, and priority updates (`update_priorities`, `retire`) of a queue's rows: in a
  queue, only `dequeue` consumes.
- `queue=True`: a queue of rows, consumed once each, oldest first. Writers never overwrite a row that no
  consumer took: host inserts (`Table.insert`, `Table.add`, and an `EpisodeWriter`'s first `append` of
  an episode) wait while the queue is full (their `timeout=` bounds the wait), through the table's rate
  limiter, which counts consumed rows as its samples. Learners consume with `dequeue` inside jit.

How `dequeue` delivers each row once. It picks the oldest unconsumed rows (fifo, a partial batch when
fewer are there), copies them out (`gather`), and only then consumes them: one compare-and-swap of each
row's state word from the generation it picked to priority 0. Of several consumers that copied the
same row, exactly one wins the exchange; the others get the pick `valid=False` (its arrays zeroed). A
writer takes only consumed rows, so a row cannot be overwritten between its copy and its consumption.

What a killed consumer leaves. A consumer killed before the exchange consumed nothing: its rows stay in
the queue for the others. A consumer killed after it (the jitted step ran `dequeue`, and the process died
before it used the batch) has taken the rows with it: they are lost, as with any at-most-once queue.
Nothing else is lost: every committed row is either consumed by exactly one `dequeue` or still in the
queue.

On a GPU: a sample of a `max_times_sampled` table takes each row's samples and retires it by
compare-and-swaps that must be atomic against other processes' samples and the writers' claims. A GPU
with native host atomics makes them in its kernels; on every other GPU the sample runs on the host in the
stream's order (a host callback running the CPU kernels: the picks a CPU program makes for the same key),
its picks are copied to the device, and the gather runs on the GPU. `dequeue`'s consumption runs on the
host in the stream's order too (as `update_priorities` does over PCIe), after the gather's copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from gear_jax import _args, _ffi
from gear_jax.errors import InvalidArgumentError
from gear_jax.ops import _attrs, gather, ordered_candidates
from gear_jax.selection import Sample
from gear_jax.table import Table


def consume(table: Table, sample: Sample, delivered: jax.Array) -> jax.Array:
    """Consumes the picks of `sample` that `delivered` marks (gathered and valid) from the queue `table`.

    Returns bool[B]: pick i took its row (no consumer took it before, none will after). The call is a
    side effect and runs after whatever computed `delivered` (pass the gathered `valid`, so that the copy
    comes first). `dequeue` is the usual way; this is its last step.
    """
    table = check_queue(table, "consume")
    b = _args.check_sample(sample, "consume", table)
    delivered = jnp.asarray(delivered)
    if delivered.shape != (b,) or delivered.dtype != jnp.bool_:
        raise InvalidArgumentError(
            f"consume: delivered must be bool[{b}] (one per pick: the gathered valid of its first step), "
            f"got {delivered.dtype}{list(delivered.shape)}"
        )
    return _ffi.call(_ffi.CONSUME, jax.ShapeDtypeStruct((b,), jnp.bool_), has_side_effect=True)(
        sample.indices.astype(jnp.int32), sample.generations.astype(jnp.uint32), delivered, **_attrs(table)
    )


def dequeue(
    table: Table,
    batch_size: int,
    fields: Sequence[str] | None = None,
    window: int | None = None,
    after: Any = None,
) -> tuple[Sample, dict[str, jax.Array]]:
    """Takes up to `batch_size` of the oldest unconsumed rows out of the queue `table`, inside jit.

    Args:
      table: a queue (`Table.create(..., queue=True)`), static.
      batch_size: picks B >= 1 (static).
      fields: the fields to gather (default all), as `gather`.
      window: steps per row for a trajectory table (default max_steps: whole rows), as `gather`.
      after: any array this dequeue must run after (the previous dequeue's `valid`, when one jitted
        function dequeues twice).

    Returns:
      (sample, batch): the picks in commit order, and the batch as `gather` returns it. `valid` is
      False for picks past the rows the queue held and for rows another consumer took first (their
      arrays are zero). Each row comes out of exactly one dequeue, of whichever process.

    Raises:
      InvalidArgumentError: `table` is not a queue; a bad batch_size, fields or window (at trace time).
    """
    table = check_queue(table, "dequeue")
    key = jax.random.key(0)  # fifo draws nothing; the key only seeds window starts, which are 0 here
    sample, _ = ordered_candidates(table, key, batch_size, "fifo", window=None, after=after)
    batch = gather(table, sample, fields=fields, window=window)
    valid = batch["valid"]
    first = valid if valid.ndim == 1 else valid[:, 0]
    taken = consume(table, sample, first)
    keep = taken.reshape(taken.shape + (1,) * (valid.ndim - 1))
    out = {"valid": valid & keep}
    for name, value in batch.items():
        if name != "valid":
            out[name] = jnp.where(keep.reshape(keep.shape + (1,) * (value.ndim - keep.ndim)), value, 0)
    return sample, out


def check_queue(table: Any, op: str) -> Table:
    """`table` as a Table that is a queue; InvalidArgumentError naming `op` otherwise."""
    table = _args.check_table(table, op)
    if not table.queue:
        raise InvalidArgumentError(
            f"{op}: table {table.name!r} is not a queue; create it with Table.create(spec, queue=True), or "
            "sample it with gj.sample"
        )
    return table


__all__ = ["consume", "dequeue"]

"""Epochs without replacement: every selectable row once, in shuffled minibatches, inside `jax.jit`.

On-policy learners (PPO and its kin) store a rollout, run a few epochs over it, each a fresh permutation
of its rows cut into minibatches, and then drop it. `epoch` gives one epoch's picks as a `Sample` whose
arrays are `[num_minibatches, minibatch_size]`, to scan over:

    def update(params, key):
        picks = gj.epoch(table, key, 64, after=inserted)        # [M, 64] picks of the rollout's rows
        def minibatch(params, s):
            batch = gj.gather(table, s)                          # [64, ...] per field, and `valid`
            return sgd_step(params, batch), None
        params, _ = jax.lax.scan(minibatch, params, picks)
        return params

An epoch's picks are the table's selectable rows when it runs, the `num_rows` newest where it holds more
(the latest rollout: found by the lifo selection, `gear_jax.ops.ordered_candidates`), permuted uniformly
by `key`. A table holding fewer than
`num_rows` selectable rows fills the epoch's tail with failed picks (generation 1, an odd one): `gather`
returns them with `valid` False, `update_priorities` and `retire` skip them. With `drop_last=True` the
epoch has `num_rows // minibatch_size` minibatches (the rows left over are random ones, as a shuffled
`DataLoader` drops them); with `drop_last=False` it has `ceil(num_rows / minibatch_size)` and the last
is filled with failed picks.

`retire` makes a sample's rows unselectable (priority 0; their data stays readable until a writer
reuses their slots), so a rollout that has served its epochs is never drawn again: the next rollout's
inserts take slots in commit order as always.

`gear_jax.host.epoch` and `gear_jax.torch.EpochSampler` give the same epochs outside jit;
`gear_jax.sharded.epoch` gives each device an epoch over its own shard (local mode).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from gear_jax import _args, _ffi, ops
from gear_jax.errors import InvalidArgumentError
from gear_jax.selection import Sample
from gear_jax.table import Table

__all__ = ["epoch", "epoch_shape", "retire"]

FAILED_GENERATION = 1  # the generation of a failed pick (ordered_candidates' marker): odd, never valid


def epoch_shape(num_rows: int, minibatch_size: int, drop_last: bool) -> tuple[int, int]:
    """(num_minibatches, minibatch_size) of an epoch over `num_rows` rows."""
    minibatches = num_rows // minibatch_size if drop_last else math.ceil(num_rows / minibatch_size)
    return minibatches, minibatch_size


def check_epoch(
    table: Table, minibatch_size: Any, num_rows: Any, drop_last: Any, op: str, window: Any = None
) -> tuple[int, int]:
    """The checked (minibatch_size, num_rows) of an epoch (and its window): num_rows defaults to the
    table's capacity."""
    mb = _args.check_batch_size(minibatch_size, op, "minibatch_size")
    _args.check_window(window, table.max_steps, op)
    if num_rows is None:
        num_rows = table.capacity
    _args.check_static(num_rows, "num_rows", op)
    if isinstance(num_rows, bool) or not isinstance(num_rows, (int, np.integer)) or not 1 <= num_rows:
        raise InvalidArgumentError(f"{op}: num_rows={num_rows!r} must be an int >= 1 (None: the capacity)")
    if num_rows > table.capacity:
        raise InvalidArgumentError(
            f"{op}: num_rows={num_rows} is more than the table's {table.capacity} rows; an epoch visits each "
            "row once (pass num_rows <= capacity)"
        )
    if not isinstance(drop_last, (bool, np.bool_)):
        raise InvalidArgumentError(f"{op}: drop_last={drop_last!r} must be True or False")
    if drop_last and mb > num_rows:
        raise InvalidArgumentError(
            f"{op}: minibatch_size={mb} is more than num_rows={num_rows}, so drop_last=True leaves no "
            "minibatch; pass a smaller minibatch_size or drop_last=False"
        )
    return mb, int(num_rows)


def shuffle_real_first(key: jax.Array, generations: jax.Array) -> jax.Array:
    """A permutation of the picks: the real ones (even generation) first, in a uniformly random order,
    the failed ones after them. order[k] is the pick that goes to position k.

    On the CPU a native Fisher-Yates shuffle (`gear_jax_shuffle`, O(n)): XLA:CPU's sort, which
    `jax.random.permutation` runs, took 0.34 ms for 512 picks and 14 ms for 8,192 on the 2-core VM, the
    shuffle microseconds. Elsewhere (GPUs sort fast) `jax.random.permutation` and a stable partition.
    Both are uniform permutations; they differ in which one a key gives."""
    n = generations.shape[0]

    def native(key: jax.Array, generations: jax.Array) -> jax.Array:
        seed = _args.seed_words(key, "gear_jax.epoch")
        out = jax.ShapeDtypeStruct((n,), jnp.int32)
        return _ffi.call(_ffi.SHUFFLE, out)(seed, generations)

    return lax.platform_dependent(key, generations, cpu=native, default=shuffle_by_sort)


def shuffle_by_sort(key: jax.Array, generations: jax.Array) -> jax.Array:
    """`shuffle_real_first` off the CPU: `jax.random.permutation`, then a stable partition."""
    n = generations.shape[0]
    order = jax.random.permutation(key, n).astype(jnp.int32)
    # A stable partition by scatter (one pass, not a second sort): the k-th real pick goes to k, the
    # k-th failed one to real_count + k.
    real = (generations[order] & 1) == 0
    real_before = jnp.cumsum(real) - real
    failed_before = jnp.arange(n) - real_before
    target = jnp.where(real, real_before, real.sum() + failed_before)
    return jnp.zeros_like(order).at[target].set(order, unique_indices=True)


def arrange(sample: Sample, order: jax.Array, minibatches: int, minibatch_size: int) -> Sample:
    """The picks of `sample` in `order`, cut into [minibatches, minibatch_size] (padded with failed picks
    or cut short to fill it)."""
    wanted = minibatches * minibatch_size
    pad = max(0, wanted - order.shape[0])

    def take(x: jax.Array, fill: Any) -> jax.Array:
        x = x[order[:wanted]]
        if pad:
            x = jnp.concatenate([x, jnp.full((pad,), fill, x.dtype)])
        return x.reshape(minibatches, minibatch_size)

    return Sample(
        take(sample.indices, 0),
        take(sample.generations, FAILED_GENERATION),
        take(sample.probabilities, 0),
        take(sample.starts, 0),
        window=sample.window,
        table_handle=sample.table_handle,
    )


def epoch(
    table: Table,
    key: jax.Array,
    minibatch_size: int,
    num_rows: int | None = None,
    drop_last: bool = True,
    window: int | None = None,
    after: Any = None,
) -> Sample:
    """One epoch over the table's selectable rows: each once, shuffled, in minibatches (inside jit).

    Args:
      table: a gear_jax.Table (static).
      key: a PRNG key: the epoch's permutation (and its window starts) follow from it.
      minibatch_size: picks per minibatch (static).
      num_rows: rows an epoch covers (static; default the table's capacity): the rollout's size. A table
        holding fewer selectable rows fills the rest with failed picks (`valid` False in `gather`); one
        holding more gives its `num_rows` newest (the latest rollout).
      drop_last: True: `num_rows // minibatch_size` full minibatches (random rows left over); False:
        `ceil(num_rows / minibatch_size)`, the last filled with failed picks.
      window: trajectory tables: steps per pick, at a uniform start in each row (whole rows if None).
      after: an array this epoch must run after (e.g. the rollout's `gj.insert` result).

    Returns:
      A `Sample` whose arrays are [num_minibatches, minibatch_size] (`lax.scan` over it gives one
      minibatch's Sample per step); probabilities are 1 (0 for failed picks); `selectable` and
      `lengths` are None.

    Raises:
      InvalidArgumentError: bad arguments (at trace time).
    """
    op = "gear_jax.epoch"
    table = _args.check_table(table, op)
    mb, rows = check_epoch(table, minibatch_size, num_rows, drop_last, op, window)
    drop_last = bool(drop_last)
    _args.seed_words(key, op)  # a bad key refused by name before it is split
    select_key, order_key = jax.random.split(key)
    picks, _ = ops.ordered_candidates(table, select_key, rows, "lifo", window=window, after=after)
    order = shuffle_real_first(order_key, picks.generations)
    return arrange(picks, order, *epoch_shape(rows, mb, drop_last))


def retire(table: Table, sample: Sample, after: Any = None) -> jax.Array:
    """Makes the rows of `sample` unselectable (priority 0) where they still hold what was picked: a
    rollout's rows after its epochs. Inside jit; returns the count of rows retired (int32), which a later
    call takes as `after=` to run after it. Failed picks and rows overwritten since are left alone."""
    table = _args.check_table(table, "gear_jax.retire")
    _args.check_priorities_settable(table, "gear_jax.retire")
    if not isinstance(sample, Sample):
        raise InvalidArgumentError(
            f"gear_jax.retire: sample must be a gear_jax.Sample (an epoch's), got {type(sample).__name__}"
        )
    flat = jax.tree_util.tree_map(lambda x: jnp.ravel(x), sample)
    return ops.update_priorities(table, flat, jnp.zeros(flat.indices.shape, jnp.float32), after=after)

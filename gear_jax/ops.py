"""Sampling, gathering and priority updates as XLA custom calls, usable inside `jax.jit`.

The table is a static Python object: the calls carry its integer handle and spec hash as attributes,
and the handler resolves them at run time. Random numbers come from the JAX key you pass (two 32-bit
words drawn with `jax.random.bits`), so a key gives the same sample on every run.

`sample` and `gather` are declared free of side effects, so a jitted step made of them keeps JAX's
fast C++ dispatch (an effectful custom call costs 50-350 us more per call on the CPU: docs/ARCHITECTURE.md,
"The update as an effect, and the fast path"; several steps per call in a `lax.scan` pay it once), and
XLA may drop a sample whose result is unused. `update_priorities` is declared side-effecting, so it
always runs. Side effects inside one jitted function are ordered only by data dependency:
`update_priorities` returns a count that a later `sample(..., after=count)` takes, which orders the
update first. `sample(..., priority_update=(previous, priorities))` makes the update part of the sample
instead (no effect: the fast path), applied before the picks.

`total_weight` and `sample_at` are the building blocks of sampling across several tables (the sharded
layer): the total p^a of a table's selectable rows, and the rows at given points of its cumulative
weight, so that one set of uniform draws can be split among tables by their totals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gear_jax import _args, _ffi, _rows
from gear_jax.errors import InvalidArgumentError, check_flag
from gear_jax.selection import METHODS, ORDERED_METHODS, PICK_BYTES, Sample
from gear_jax.table import Table

__all__ = [
    "METHODS",
    "ORDERED_METHODS",
    "Sample",
    "gather",
    "insert",
    "ordered_candidates",
    "sample",
    "sample_at",
    "sample_gather",
    "total_weight",
    "update_priorities",
]


def _pick_types(b: int) -> tuple[jax.ShapeDtypeStruct, ...]:
    """Result types of a selection's B picks: indices, generations, probabilities, starts."""
    return (
        jax.ShapeDtypeStruct((b,), jnp.int32),
        jax.ShapeDtypeStruct((b,), jnp.uint32),
        jax.ShapeDtypeStruct((b,), jnp.float32),
        jax.ShapeDtypeStruct((b,), jnp.int32),
    )


def _count_and_lengths(b: int) -> tuple[jax.ShapeDtypeStruct, ...]:
    """What `sample` returns besides the picks: the selectable count and each pick's row length."""
    return jax.ShapeDtypeStruct((), jnp.int32), jax.ShapeDtypeStruct((b,), jnp.int32)


def _attrs(table: Table) -> dict[str, Any]:
    return {"handle": np.int64(table.handle), "spec_hash": np.int64(table.spec.spec_hash)}


def _after(after: Any) -> jax.Array:
    if after is None:
        return jnp.zeros((), jnp.int32)
    leaves = jax.tree_util.tree_leaves(after)
    if not leaves:
        return jnp.zeros((), jnp.int32)
    try:
        return jnp.asarray(leaves[0])
    except TypeError:
        raise InvalidArgumentError(
            f"after= must be an array (or a pytree of arrays) the call must run after, such as the result "
            f"of a gear_jax call; got {type(leaves[0]).__name__}"
        ) from None


def sample(
    table: Table,
    key: jax.Array,
    batch_size: int,
    method: str = "uniform",
    priority_exponent: float = 1.0,
    window: int | None = None,
    after: Any = None,
    priority_update: tuple[Sample, Any] | None = None,
    short_episodes: str = "pad",
    *,
    defer_capacity_check: bool = False,
) -> Sample:
    """Selects `batch_size` rows of `table`.

    Only rows with a committed trajectory and priority > 0 are ever selected; rows being written
    (odd generation) never are.

    Args:
      table: a gear_jax.Table (static).
      key: a JAX PRNG key; the same key gives the same sample of the same table contents.
      batch_size: number of picks B >= 1 (static).
      method: "uniform" (with replacement), "prioritized" (row i with probability
        p_i^a / sum_j p_j^a, with replacement), "fifo" / "lifo" (the B oldest / newest rows),
        "topk" (the B highest priorities).
      priority_exponent: a >= 0 for "prioritized" (static).
      window: for trajectory tables, the length of a time window placed inside each row (`starts`),
        never across the end of its episode; None for whole rows. Uniform picks of a table of padded
        rows draw a row, then a start uniform among its windows; in a step ring every valid window of
        the table is equally likely (every step equally likely to start one, as a slice sampler over
        steps), so long episodes are picked in proportion to their windows. Other methods pick the row
        by their rule, then a uniform start.
      after: any array (e.g. the result of `update_priorities`) this sample must run after.
      priority_update: (previous, priorities): first set the priorities of the rows of `previous` (a
        `Sample` of this table, typically the previous learner step's) to `priorities` (float[B']),
        exactly as `update_priorities(table, previous, priorities)`, then sample. The update is part of
        this sample rather than a side effect: a jitted step whose only priority update comes this way
        has no JAX effect and keeps JAX's fast dispatch path (ARCHITECTURE, "The update as an effect,
        and the fast path"). A sample nothing uses is dropped together with its update, and inside
        `jax.checkpoint` both may run again in the backward pass.
      short_episodes: with a window, what becomes of episodes shorter than it (static): "pad" (the
        default: such an episode gives one window, its steps past the episode's end zeroed and
        `valid` False) or "skip" (it is never picked; not for prioritized windows). "skip" without a
        window is refused: it could change nothing. (A priority_exponent other than 1.0 with a method
        other than "prioritized" draws a UserWarning: it changes nothing either.)
      defer_capacity_check: fifo, lifo and topk pick distinct rows, so a batch_size above the table's
        capacity can never be filled and is refused at trace time. With True (keyword only, static) such
        a call is traced all the same and fails at run time, with the error of a table that holds fewer
        selectable rows than batch_size. For a call that must trace in a branch that may never run, or
        fail at run time on every device at once: the sharded layer's global fifo, lifo and topk, whose
        batch may exceed one shard's capacity. Other methods, and batches within the capacity, are
        unchanged.

    Under `jax.vmap` the call runs once per element, one after another: each element's picks are
    those its key gives alone.

    Returns:
      A `Sample`.

    Raises:
      InvalidArgumentError: bad batch_size (for fifo/lifo/topk, one above the capacity unless
        defer_capacity_check), method, exponent or window (at trace time).
      gear_jax.EXECUTION_ERRORS: at run time, when the table holds no selectable row, fewer than
        batch_size rows for fifo/lifo/topk, or was closed since the function was traced.
    """
    table = _args.check_table(table, "sample")
    defer = check_flag(defer_capacity_check, "defer_capacity_check", "sample")
    args, attrs, b, win = _sample_call(
        table, key, batch_size, method, priority_exponent, window, after, "sample", short_episodes, defer
    )
    update = _check_priority_update(table, priority_update, "sample")
    _args.check_fits("sample", b * PICK_BYTES, f"batch_size={b} picks", on_host=False)
    out_types = (*_pick_types(b), *_count_and_lengths(b))
    args = _update_first(table, args, update)  # every check passed: nothing is written before a refusal
    results = _ffi.call(_ffi.SAMPLE, out_types)(*args, **attrs)
    return Sample(*results, window=win, table_handle=table.handle)


def _sample_call(
    table: Table,
    key: jax.Array,
    batch_size: Any,
    method: Any,
    priority_exponent: Any,
    window: Any,
    after: Any,
    op: str,
    short_episodes: Any = "pad",
    defer_capacity_check: bool = False,
) -> tuple[tuple[jax.Array, jax.Array], dict[str, Any], int, int]:
    """The checked arguments and attributes of a sample custom call, the batch size and the window."""
    _args.check_batch_size(batch_size, op)
    _args.check_method(method, op)
    if not defer_capacity_check:
        _args.check_distinct_picks(batch_size, method, table.capacity, op)
    exponent = _args.check_exponent(priority_exponent, op)
    win = _args.check_window(window, table.max_steps, op)
    _args.check_options_take_effect(method, exponent, win, short_episodes, op)
    attrs = {
        "method": np.int32(_args.method_word(table.spec, method, win, short_episodes, op)),
        "priority_exponent": np.float32(exponent),
        "window": np.int32(win),
        **_attrs(table),
    }
    return (_args.seed_words(key, op), _after(after)), attrs, int(batch_size), win


def _check_priority_update(table: Table, priority_update: Any, op: str) -> tuple[jax.Array, ...] | None:
    """The checked operands of `priority_update=(previous, priorities)` (None for None)."""
    if priority_update is None:
        return None
    if not isinstance(priority_update, tuple | list) or len(priority_update) != 2:
        got = type(priority_update).__name__
        if isinstance(priority_update, tuple | list):
            got += f" of {len(priority_update)}"
        raise InvalidArgumentError(
            f"{op}: priority_update must be a pair (previous, priorities): a Sample of this table (an "
            f"earlier step's) and its rows' new priorities, got a {got}"
        )
    previous, priorities = priority_update
    return _update_operands(table, previous, priorities, op, ("priority_update[0]", "priority_update[1]"))


def _update_first(table: Table, args: tuple[jax.Array, jax.Array], update: Any) -> tuple[jax.Array, ...]:
    """The (seed, after) operands of a sample call that runs after the checked update `update` (from
    `_check_priority_update`): an effect-free update_priorities call, after the sample's own `after`,
    whose count becomes the sample's `after`. The update also takes the sample's seed (through an
    optimization barrier, which nothing sees through), so that it is never more loop-invariant than the
    sample: XLA hoists effect-free calls whose operands do not change out of a loop."""
    if update is None:
        return args
    seed, after = args
    after = jax.lax.optimization_barrier((after, seed))[0]
    return seed, _update_call(table, update, after, effect=False)


def gather(
    table: Table, sample: Sample, fields: Sequence[str] | None = None, window: int | None = None
) -> dict[str, jax.Array]:
    """Copies the sampled rows (or windows of them) out of the table.

    Args:
      table: the table `sample` came from (static).
      sample: a `Sample`.
      fields: names of the fields to gather; default all.
      window: steps per output row for trajectory tables; default the sample's window, or max_steps.

    Returns:
      A dict with one array per field, `[B, *shape]` for transition tables and `[B, window, *shape]`
      for trajectory tables, and `valid`: bool `[B]` or `[B, window]`. A step is valid when its row was
      not overwritten since it was sampled and the step lies inside the row's length; invalid steps
      are zero.
    """
    table = _args.check_table(table, "gather")
    b = _args.check_sample(sample, "gather", table)
    chosen, out_types, attrs = _gather_plan(table, b, fields, window, sample.window, "gather")
    results = _ffi.call(_ffi.GATHER, out_types)(
        sample.indices.astype(jnp.int32),
        sample.generations.astype(jnp.uint32),
        sample.starts.astype(jnp.int32),
        fields=attrs["fields"],
        window=attrs["steps"],
        **_attrs(table),
    )
    return _batch(chosen, results)


def _gather_plan(
    table: Table, b: int, fields: Any, window: Any, sample_window: int, op: str
) -> tuple[tuple[str, ...], list[jax.ShapeDtypeStruct], dict[str, np.ndarray]]:
    """The fields to gather, the result types (valid first) and the attributes `fields` and `steps`."""
    layout = _args.gather_layout(table, b, fields, window, sample_window, op, on_host=False)
    out_types = [jax.ShapeDtypeStruct(shape, dtype) for _, shape, dtype in layout.outputs]
    attrs = {"fields": np.array(layout.field_ids, np.int64), "steps": np.int32(layout.steps)}
    return layout.fields, out_types, attrs


def _batch(chosen: Sequence[str], results: Sequence[jax.Array]) -> dict[str, jax.Array]:
    """gather's dict from the custom call's results (valid first, then one per field)."""
    out = dict(zip(chosen, results[1:]))
    out["valid"] = results[0]
    return out


def sample_gather(
    table: Table,
    key: jax.Array,
    batch_size: int,
    fields: Sequence[str] | None = None,
    method: str = "uniform",
    priority_exponent: float = 1.0,
    window: int | None = None,
    after: Any = None,
    priority_update: tuple[Sample, Any] | None = None,
    short_episodes: str = "pad",
) -> tuple[Sample, dict[str, jax.Array]]:
    """`sample` then `gather` of the picks, in one custom call: the common learner step.

    The same as `s = sample(table, key, batch_size, method, priority_exponent, window, after)` followed
    by `gather(table, s, fields)`, with the same picks and data for the same key, at a lower cost per call
    (one custom call and one table lookup instead of two; on the CPU the gather finds the picked rows'
    states in the cache, on a CUDA GPU the sample's and the gather's kernels are enqueued by one handler).
    On other platforms it is exactly those two calls.

    Args:
      table: as for `sample`.
      key: as for `sample`.
      batch_size: as for `sample`.
      method: as for `sample`.
      priority_exponent: as for `sample`.
      window: as for `sample`.
      after: as for `sample`.
      priority_update: as for `sample`.
      short_episodes: as for `sample`.
      fields: as for `gather`; the gather's window is the sample's (max_steps without one).

    Returns:
      (Sample, batch): the `Sample` and `gather`'s dict of fields and `valid`.

    Raises:
      InvalidArgumentError: anything `sample` or `gather` refuses (at trace time).
      gear_jax.EXECUTION_ERRORS: at run time, as `sample`.
    """
    table = _args.check_table(table, "sample_gather")
    args, attrs, b, win = _sample_call(
        table, key, batch_size, method, priority_exponent, window, after, "sample_gather", short_episodes
    )
    update = _check_priority_update(table, priority_update, "sample_gather")
    _args.check_fits("sample_gather", b * PICK_BYTES, f"batch_size={b} picks", on_host=False)
    chosen, field_types, gather_attrs = _gather_plan(table, b, fields, None, win, "sample_gather")
    pick_types = (*_pick_types(b), *_count_and_lengths(b))
    args = _update_first(table, args, update)  # every check passed: nothing is written before a refusal

    def fused(*args: jax.Array) -> tuple[jax.Array, ...]:
        call = _ffi.call(_ffi.SAMPLE_GATHER, (*pick_types, *field_types))
        return tuple(call(*args, **attrs, **gather_attrs))

    def separate(*args: jax.Array) -> tuple[jax.Array, ...]:
        picks = _ffi.call(_ffi.SAMPLE, pick_types)(*args, **attrs)
        data = _ffi.call(_ffi.GATHER, field_types)(
            picks[0],
            picks[1],
            picks[3],
            fields=gather_attrs["fields"],
            window=gather_attrs["steps"],
            **_attrs(table),
        )
        return (*picks, *data)

    results = jax.lax.platform_dependent(*args, cpu=fused, cuda=fused, default=separate)
    s = Sample(*results[:6], window=win, table_handle=table.handle)
    return s, _batch(chosen, results[6:])


def update_priorities(table: Table, sample: Sample, priorities: jax.Array, after: Any = None) -> jax.Array:
    """Sets the priority of the sampled rows that were not overwritten since they were sampled.

    Args:
      table: the table `sample` came from (static).
      sample: a `Sample` of B rows.
      priorities: float[B], finite and >= 0. For a row picked twice, the later entry wins.
      after: any array this update must run after.

    It may be called inside a function that `jax.grad` differentiates (e.g. in the loss, with the TD
    errors it computes): it runs in the forward pass, and no gradient flows through the priorities.

    Returns:
      int32[] number of entries applied (a row picked twice counts twice; a row overwritten since it
      was sampled counts zero); pass it as `after=` to a later `sample` to order the two.

    Raises:
      InvalidArgumentError: `priorities` has the wrong shape (at trace time).
      gear_jax.EXECUTION_ERRORS: a priority is NaN, infinite or negative (at run time; no row is
        changed), or the table was closed.
    """
    table = _args.check_table(table, "update_priorities")
    operands = _update_operands(table, sample, priorities, "update_priorities")
    return _update_call(table, operands, after, effect=True)


def _update_operands(
    table: Table, sample: Any, priorities: Any, op: str, names: tuple[str, str] = ("sample", "priorities")
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The checked (indices, generations, priorities) of an update_priorities call; `names` are the
    arguments' names in `op`'s messages."""
    _args.check_priorities_settable(table, op)
    b = _args.check_sample(sample, op, table, names[0])
    matched = "the sample" if names[0] == "sample" else names[0]
    priorities = _rows.traced_priorities(priorities, b, op, names[1], broadcast=False, matched=matched)
    return (
        sample.indices.astype(jnp.int32),
        sample.generations.astype(jnp.uint32),
        priorities.astype(jnp.float32),
    )


def _update_call(table: Table, operands: tuple[jax.Array, ...], after: Any, effect: bool) -> jax.Array:
    """The update_priorities custom call; `effect` declares it side-effecting (JAX and XLA never drop
    it) or not (it lives as long as something uses its count)."""
    return _ffi.call(_ffi.UPDATE_PRIORITIES, jax.ShapeDtypeStruct((), jnp.int32), has_side_effect=effect)(
        *operands, _after(after), **_attrs(table)
    )


INSERT_PRIORITY_MODES = {"given": 0, "max": 1}  # the custom call's priority_mode (handler_checks.h)


def insert(
    table: Table,
    batch: dict[str, jax.Array],
    priorities: Any = None,
    lengths: Any = None,
    after: Any = None,
    time_major: bool = False,
) -> jax.Array:
    """Inserts a batch of rows from inside a jitted program (or eagerly); returns their row ids.

    The rows are claimed, written and published exactly as a host `Table.insert` does (the same row claim
    and seqlock: no sample ever sees a row half written, and writers in other processes may insert at the
    same time). On a GPU the batch moves device -> pinned host memory in the stream's order and a host
    callback on the stream writes the rows, so the claim stays atomic against CPU writers on PCIe hosts.

    The call is a side effect: XLA never drops it, and it runs once per iteration inside `lax.scan`. Like
    every side effect in a jitted function it is ordered only by data dependency: pass the returned ids
    (or anything computed from them) as `after=` to a later `sample` so that the sample sees the rows,
    and pass a result this insert must follow (e.g. `update_priorities`'s count) as its `after=`.

    Args:
      table: a gear_jax.Table (static).
      batch: every field of the table, by name: `[B, *shape]` for a transition table (max_steps == 1),
        `[B, T, *shape]` with 1 <= T <= max_steps for a trajectory table (`[T, B, *shape]` with
        `time_major=True`: the stacked outputs of a `lax.scan` over T steps of B environments, as they
        come). Arrays are cast to the fields' dtypes by the table's casting policy (`gear_jax.casting`),
        as far as their dtypes decide it when the insert is traced: safe casts always, float narrowing
        under "fit" (a finite value beyond the field's range becomes infinity: values are not looked
        at inside jit); an integer narrowing, whose range only the values tell, is refused.
      priorities: None (1 for every row), a scalar or float[B] array (finite, >= 0), or "max": every row
        gets the largest priority any row of the table was given so far (`Table.max_priority`, kept in
        the table's shared header, so the step never syncs to the host for it; 1 while no row had one).
      lengths: trajectory tables only: int[B] steps used per row, each in [1, T]; default T.
      after: any array this insert must run after.
      time_major: trajectory tables only: the batch's arrays are `[T, B, *shape]` (static).

    Returns:
      int32[B] the row ids written.

    Raises:
      InvalidArgumentError: missing or unknown fields, wrong shapes or dtypes, bad priorities or lengths
        shapes (at trace time).
      gear_jax.EXECUTION_ERRORS: at run time, a priority that is NaN, infinite or negative or a length out
        of range (nothing written), or a table closed since the function was traced. On a GPU such data
        errors surface at the next call on the table, and the call's row ids are -1.
    """
    table = _args.check_table(table, "insert")
    if table.queue:
        raise InvalidArgumentError(
            f"insert: table {table.name!r} is a queue, whose inserts wait while it is full, which a call "
            "inside XLA cannot; insert from the host (table.insert, table.add or an EpisodeWriter)"
        )
    time_major = check_flag(time_major, "time_major", "insert")
    arrays, b, steps = _rows.Batches(table.spec).traced(batch, table.casting, time_major, "insert")
    if _rows.names_max_priority(priorities, "insert", f"a float array of shape ({b},)"):
        mode, priority_array = INSERT_PRIORITY_MODES["max"], jnp.zeros((0,), jnp.float32)
    else:
        mode = INSERT_PRIORITY_MODES["given"]
        p = jnp.ones((b,), jnp.float32) if priorities is None else priorities
        priority_array = _rows.traced_priorities(
            p, b, "insert", "priorities", broadcast=True, matched="the batch"
        )
    if lengths is None:
        length_array = jnp.zeros((0,), jnp.int32)
    elif not table.spec.is_trajectory:
        raise InvalidArgumentError("insert: lengths are for trajectory tables (max_steps > 1) only")
    else:
        length_array = _rows.traced_lengths(lengths, b, "insert")
    return _ffi.call(_ffi.INSERT, jax.ShapeDtypeStruct((b,), jnp.int32), has_side_effect=True)(
        priority_array,
        length_array,
        _after(after),
        *arrays,
        steps=np.int32(steps),
        priority_mode=np.int32(mode),
        **_attrs(table),
    )


def total_weight(
    table: Table,
    priority_exponent: float = 1.0,
    after: Any = None,
    window: int | None = None,
    short_episodes: str = "pad",
) -> tuple[jax.Array, jax.Array]:
    """The total weight of the rows `sample(..., method="prioritized")` can pick, and their number; or,
    with a window, the weight uniform windows weigh the table by.

    Args:
      table: a gear_jax.Table (static).
      priority_exponent: a >= 0 (static): row i weighs p_i^a.
      after: any array this call must run after (e.g. the result of `update_priorities`).
      window: None; or the window of `sample(table, key, B, "uniform", window=window,
        short_episodes=short_episodes)` (static): each selectable row then weighs what that law weighs it
        by, instead of p^a: in a step ring, its number of valid window starts (every window equally
        likely; a row shorter than the window counts 1 with short_episodes="pad", 0 with "skip"); in a
        padded table with short_episodes="skip", 1 when it offers a window (rows uniform among those).
        A draw across tables that weighs each by this total, then draws inside it by `sample`, follows
        the law of one table holding them all (the sharded tables' global uniform windows). A padded
        table with short_episodes="pad" weighs every row 1, as priority_exponent=0 does.
      short_episodes: "pad" or "skip", with `window` (static).

    Returns:
      (total, count): float32[] the sum of p^a over the selectable rows (committed, even generation,
      priority > 0), accumulated in float64 and rounded once; int32[] the number of selectable rows.
      With a = 0, total == count. A table with no selectable row gives (0, 0). With a window: the sum of
      the rows' weights under its law (exact below 2**24) and the number of rows of positive weight.

    Raises:
      InvalidArgumentError: a bad exponent, window or short_episodes (at trace time).
      gear_jax.EXECUTION_ERRORS: at run time, when the total overflows a float32 or the table was
        closed since the function was traced.
    """
    table = _args.check_table(table, "total_weight")
    exponent = _args.check_exponent(priority_exponent, "total_weight")
    win = _args.check_window(window, table.max_steps, "total_weight")
    law = _args.window_law(table.spec, win, short_episodes, "total_weight")
    out_types = (jax.ShapeDtypeStruct((), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32))
    total, count = _ffi.call(_ffi.TOTAL_WEIGHT, out_types)(
        _after(after),
        priority_exponent=np.float32(exponent),
        window=np.int32(win),
        window_law=np.int32(law),
        **_attrs(table),
    )
    return total, count


def sample_at(
    table: Table,
    key: jax.Array,
    targets: jax.Array,
    priority_exponent: float = 1.0,
    window: int | None = None,
    after: Any = None,
) -> Sample:
    """The rows of `table` at given points of its cumulative weight.

    Row i weighs w_i = p_i^a when it is selectable (as in `sample`), else 0. Pick j is the first row, in
    row order, whose inclusive cumulative weight (in float64) exceeds targets[j]; a target at or past the
    table's total takes the last row of positive weight. With targets drawn uniformly in [0, total)
    (`total_weight`), row i is picked with probability w_i / total.

    A negative or NaN target means "not this table's pick": that pick gets the failed-pick marker (index
    0, generation 1, which `gather` returns invalid and `update_priorities` skips; probability 0, start
    0). So does every pick of a table with no row of positive weight; that is not an error.

    Args:
      table: a gear_jax.Table (static).
      key: a JAX PRNG key, for the window starts only.
      targets: float32[B].
      priority_exponent: a >= 0 (static).
      window: for trajectory tables, the length of a time window placed uniformly inside each picked row
        (`starts`, drawn as `sample` draws them); None for whole rows.
      after: any array this call must run after.

    Returns:
      A `Sample` of B picks; probabilities are w_r / total (0 for the marker).

    Raises:
      InvalidArgumentError: bad targets, exponent or window (at trace time).
      gear_jax.EXECUTION_ERRORS: at run time, when the sum of the weights overflows or the table was
        closed since the function was traced.
    """
    table = _args.check_table(table, "sample_at")
    if not hasattr(targets, "dtype") or not hasattr(targets, "shape"):
        raise InvalidArgumentError(
            f"sample_at: targets must be a float32 array of shape (B,), got {type(targets).__name__}"
        )
    if targets.dtype != jnp.float32 or len(targets.shape) != 1:
        raise InvalidArgumentError(
            "sample_at: targets must be a float32 array of shape (B,), got "
            f"{targets.dtype}{list(targets.shape)}"
        )
    exponent = _args.check_exponent(priority_exponent, "sample_at")
    win = _args.check_window(window, table.max_steps, "sample_at")
    seed = _args.seed_words(key, "sample_at")
    b = int(targets.shape[0])
    _args.check_fits("sample_at", b * PICK_BYTES, f"{b} targets", on_host=False)
    out_types = _pick_types(b)
    indices, generations, probabilities, starts = _ffi.call(_ffi.SAMPLE_AT, out_types)(
        seed,
        jnp.asarray(targets),
        _after(after),
        priority_exponent=np.float32(exponent),
        window=np.int32(win),
        **_attrs(table),
    )
    return Sample(indices, generations, probabilities, starts, window=win, table_handle=table.handle)


def ordered_candidates(
    table: Table,
    key: jax.Array,
    batch_size: int,
    method: str,
    window: int | None = None,
    after: Any = None,
) -> tuple[Sample, jax.Array]:
    """The `batch_size` best rows of `table` for fifo, lifo or topk, with their order keys.

    As `sample` with the same method, except that a table holding fewer than `batch_size` selectable rows
    is not an error: its rows come first, in answer order, and the other picks get the failed-pick marker
    (index 0, generation 1, probability 0). Each pick's order key is a uint64 ascending in answer order,
    unique within the table: fifo the row's commit order, lifo its bitwise complement, topk the complement
    of the priority's float32 bits in the high word and the row id in the low word; a failed pick has
    2**64 - 1. The sharded layer merges the shards' candidates by these keys.

    Returns:
      (Sample, order_keys): order_keys is uint32[B, 2], the low and the high word of each key.
    """
    table = _args.check_table(table, "ordered_candidates")
    _args.check_batch_size(batch_size, "ordered_candidates")
    _args.check_method(method, "ordered_candidates", ORDERED_METHODS)
    win = _args.check_window(window, table.max_steps, "ordered_candidates")
    seed = _args.seed_words(key, "ordered_candidates")
    b = int(batch_size)
    _args.check_fits("ordered_candidates", b * (PICK_BYTES + 8), f"batch_size={b} picks", on_host=False)
    out_types = (*_pick_types(b), jax.ShapeDtypeStruct((b, 2), jnp.uint32))  # and order keys
    indices, generations, probabilities, starts, order_keys = _ffi.call(_ffi.ORDERED_CANDIDATES, out_types)(
        seed,
        _after(after),
        method=np.int32(METHODS[method]),
        window=np.int32(win),
        **_attrs(table),
    )
    sample = Sample(indices, generations, probabilities, starts, window=win, table_handle=table.handle)
    return sample, order_keys

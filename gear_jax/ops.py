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

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gear_jax import _ffi, _native
from gear_jax.errors import InvalidArgumentError, TableClosedError
from gear_jax.table import Table

# Selection methods by name, with the number the custom call carries: defined once, in the native
# module (kernels/sample.h), so Python and the kernels cannot disagree.
METHODS: dict[str, int] = dict(_native.sample_methods())


@dataclasses.dataclass(frozen=True)
class Sample:
    """Rows picked by `sample`.

    Attributes:
      indices: int32[B] row ids.
      generations: uint32[B] each row's generation when it was picked; `gather` and
        `update_priorities` use it to detect rows overwritten since.
      probabilities: float32[B] probability of picking the row (uniform: 1/V for V selectable rows;
        prioritized: p^a / sum p^a; fifo, lifo, topk: 1).
      starts: int32[B] first step of each window (0 without a window).
      selectable: int32 scalar, the count N of selectable rows when the sample ran (uniform: the N of
        its probabilities 1/N), so that importance weights (N * P)^-beta need nothing else; None for
        samples that `sample` did not make (`sample_at`, `ordered_candidates`, hand-built ones).
      window: static int, the window length given to `sample` (0 for none).
      table_handle: static int, the handle of the table the rows were picked from (None for samples
        built by hand): `gather` and `update_priorities` refuse a sample of another table. It is part of
        the pytree structure; a `lax.scan` carry that starts from a hand-built sample can drop it with
        `sample.detached()`.
    """

    indices: jax.Array
    generations: jax.Array
    probabilities: jax.Array
    starts: jax.Array
    selectable: Any = None
    window: int = 0
    table_handle: int | None = None

    def detached(self) -> Sample:
        """The same picks without the table's handle (as a hand-built sample; no table check)."""
        return dataclasses.replace(self, table_handle=None)


jax.tree_util.register_dataclass(
    Sample,
    data_fields=["indices", "generations", "probabilities", "starts", "selectable"],
    meta_fields=["window", "table_handle"],
)


# A Table is a pytree without leaves whose structure is the table itself: it can be passed to a jitted
# function as an ordinary argument (not only captured or marked static). Tables equal in (handle, spec
# hash) share compiled functions, as they do as static arguments.
jax.tree_util.register_pytree_node(Table, lambda table: ((), table), lambda table, _: table)


def _check_table(table: Any, op: str) -> Table:
    if not isinstance(table, Table):
        raise InvalidArgumentError(f"{op}: `table` must be a gear_jax.Table, got {type(table).__name__}")
    if table.closed:
        raise TableClosedError(f"{op}: table {table.name!r} is closed; open it again")
    return table


MAX_BATCH_SIZE = 2**31 - 1  # picks are counted and indexed in int32


def _check_batch_size(batch_size: Any, op: str) -> None:
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, (int, np.integer))
        or not 1 <= batch_size <= MAX_BATCH_SIZE
    ):
        raise InvalidArgumentError(f"{op}: batch_size={batch_size!r} must be an int in [1, 2**31 - 1]")


def _memory_available() -> int | None:
    """Bytes the default backend's device can still hold: the memory limit of an accelerator, or the
    host's MemAvailable for the CPU; None when unknown."""
    device = jax.local_devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        limit = stats.get("bytes_limit")
        return None if limit is None else int(limit) - int(stats.get("bytes_in_use", 0))
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _check_result_bytes(op: str, nbytes: int, what: str) -> None:
    """Refuses, at trace time, results larger than the device can hold (instead of an allocation failure,
    or the process being killed, at run time)."""
    available = _memory_available()
    if available is not None and nbytes > available:
        raise InvalidArgumentError(
            f"{op}: {what} need {nbytes / 2**30:.2f} GiB of results, more than the "
            f"{available / 2**30:.2f} GiB the {jax.default_backend()} device has available; "
            "use a smaller batch (several calls, or a smaller window)"
        )


PICK_BYTES = 16  # per pick: index, generation, probability, start


def _pick_types(b: int) -> tuple[jax.ShapeDtypeStruct, ...]:
    """Result types of a selection's B picks: indices, generations, probabilities, starts."""
    return (
        jax.ShapeDtypeStruct((b,), jnp.int32),
        jax.ShapeDtypeStruct((b,), jnp.uint32),
        jax.ShapeDtypeStruct((b,), jnp.float32),
        jax.ShapeDtypeStruct((b,), jnp.int32),
    )


def _check_sample(sample: Any, op: str, table: Table, name: str = "sample") -> int:
    """The batch size of a well-formed Sample of `table` (the argument `name` of `op`); raises for
    anything else."""
    if not isinstance(sample, Sample):
        raise InvalidArgumentError(f"{op}: `{name}` must be a gear_jax.Sample, got {type(sample).__name__}")
    if sample.table_handle is not None and sample.table_handle != table.handle:
        raise InvalidArgumentError(
            f"{op}: the sample was picked from another table (handle {sample.table_handle}), not from "
            f"table {table.name!r} (handle {table.handle}); its row ids mean nothing here. Pass the table "
            "the sample came from"
        )
    shapes = {
        name: jnp.shape(getattr(sample, name))
        for name in ("indices", "generations", "probabilities", "starts")
    }
    if len(set(shapes.values())) != 1 or len(shapes["indices"]) != 1:
        raise InvalidArgumentError(f"{op}: the Sample's arrays must all have shape (B,); got {shapes}")
    for name in ("indices", "generations", "starts"):  # a cast to 32 bits must not pick another row
        value = getattr(sample, name)
        dtype = np.dtype(value.dtype if hasattr(value, "dtype") else jnp.result_type(value))  # numpy: as is
        if not jnp.issubdtype(dtype, jnp.integer) or dtype.itemsize > 4:
            raise InvalidArgumentError(
                f"{op}: the Sample's {name} have dtype {dtype}; they must be integers of at most 32 bits "
                f"(gj.sample makes int32 indices and starts, uint32 generations), so that no value is "
                "truncated or wrapped into another row's"
            )
    return shapes["indices"][0]


def _seed(key: Any, op: str) -> jax.Array:
    """The two uint32 words a custom call draws its random numbers from, taken from `key`."""
    try:
        return jax.random.bits(key, (2,), jnp.uint32)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(
            f"{op}: key must be a JAX PRNG key, got {type(key).__name__} ({e}). Make one with "
            "jax.random.key(seed) and thread it through the jitted step: pass it in, split it there "
            "(`key, sample_key = jax.random.split(key)`) and return the new key"
        ) from None


def _attrs(table: Table) -> dict[str, Any]:
    return {"handle": np.int64(table.handle), "spec_hash": np.int64(table.spec.spec_hash)}


def _after(after: Any) -> jax.Array:
    if after is None:
        return jnp.zeros((), jnp.int32)
    leaves = jax.tree_util.tree_leaves(after)
    if not leaves:
        return jnp.zeros((), jnp.int32)
    return jnp.asarray(leaves[0])


def _check_exponent(priority_exponent: Any, op: str) -> float:
    try:
        exponent = float(priority_exponent)
    except (TypeError, ValueError):
        exponent = math.nan
    if not math.isfinite(exponent) or exponent < 0:
        raise InvalidArgumentError(f"{op}: priority_exponent={priority_exponent!r} must be finite and >= 0")
    return exponent


def _check_window(table: Table, window: Any, op: str) -> int:
    if window is None:
        return 0
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise InvalidArgumentError(f"{op}: window={window!r} must be None or a positive int")
    if window > table.max_steps:
        raise InvalidArgumentError(
            f"{op}: window={window} is longer than the table's max_steps={table.max_steps}; "
            "use a shorter window or a table with longer rows"
        )
    return int(window)


def sample(
    table: Table,
    key: jax.Array,
    batch_size: int,
    method: str = "uniform",
    priority_exponent: float = 1.0,
    window: int | None = None,
    after: Any = None,
    priority_update: tuple[Sample, Any] | None = None,
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
      window: for trajectory tables, the length of a time window placed uniformly inside each row
        (`starts`); None for whole rows.
      after: any array (e.g. the result of `update_priorities`) this sample must run after.
      priority_update: (previous, priorities): first set the priorities of the rows of `previous` (a
        `Sample` of this table, typically the previous learner step's) to `priorities` (float[B']),
        exactly as `update_priorities(table, previous, priorities)`, then sample. The update is part of
        this sample rather than a side effect: a jitted step whose only priority update comes this way
        has no JAX effect and keeps JAX's fast dispatch path (ARCHITECTURE, "The update as an effect,
        and the fast path"). A sample nothing uses is dropped together with its update, and inside
        `jax.checkpoint` both may run again in the backward pass.

    Returns:
      A `Sample`.

    Raises:
      InvalidArgumentError: bad batch_size, method, exponent or window (at trace time).
      gear_jax.EXECUTION_ERRORS: at run time, when the table holds no selectable row, fewer than
        batch_size rows for fifo/lifo/topk, or was closed since the function was traced.
    """
    table = _check_table(table, "sample")
    args, attrs, b, win = _sample_call(
        table, key, batch_size, method, priority_exponent, window, after, "sample"
    )
    update = _check_priority_update(table, priority_update, "sample")
    _check_result_bytes("sample", b * PICK_BYTES, f"batch_size={b} picks")
    out_types = (*_pick_types(b), jax.ShapeDtypeStruct((), jnp.int32))  # and selectable
    args = _update_first(table, args, update)  # every check passed: nothing is written before a refusal
    results = jax.ffi.ffi_call(_ffi.SAMPLE, out_types, has_side_effect=False)(*args, **attrs)
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
) -> tuple[tuple[jax.Array, jax.Array], dict[str, Any], int, int]:
    """The checked arguments and attributes of a sample custom call, the batch size and the window."""
    _check_batch_size(batch_size, op)
    if method not in METHODS:
        raise InvalidArgumentError(f"{op}: method={method!r} is not one of {sorted(METHODS)}")
    exponent = _check_exponent(priority_exponent, op)
    win = _check_window(table, window, op)
    attrs = {
        "method": np.int32(METHODS[method]),
        "priority_exponent": np.float32(exponent),
        "window": np.int32(win),
        **_attrs(table),
    }
    return (_seed(key, op), _after(after)), attrs, int(batch_size), win


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
    table = _check_table(table, "gather")
    b = _check_sample(sample, "gather", table)
    chosen, out_types, attrs = _gather_plan(table, b, fields, window, sample.window, "gather")
    results = jax.ffi.ffi_call(_ffi.GATHER, out_types)(
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
) -> tuple[list[str], list[jax.ShapeDtypeStruct], dict[str, np.ndarray]]:
    """The fields to gather, the result types (valid first) and the attributes `fields` and `steps`."""
    names = list(table.spec.fields)
    if fields is None:
        chosen = names
    else:
        if isinstance(fields, str):
            fields = (fields,)
        if not isinstance(fields, Sequence) or not all(isinstance(f, str) for f in fields):
            raise InvalidArgumentError(
                f"{op}: fields={fields!r} must be a field name or a sequence of field names from {names}"
            )
        chosen = list(fields)
        unknown = [f for f in chosen if f not in table.spec.fields]
        if unknown or not chosen:
            raise InvalidArgumentError(
                f"{op}: fields {unknown or chosen} are not among the table's fields {names}"
            )
    if table.spec.is_trajectory:
        steps = _check_window(table, window, op) or sample_window or table.max_steps
    else:
        _check_window(table, window, op)
        steps = 1
    lead = (b, steps) if table.spec.is_trajectory else (b,)
    out_types = [jax.ShapeDtypeStruct(lead, jnp.bool_)]
    out_types += [
        jax.ShapeDtypeStruct((*lead, *table.spec.fields[f].shape), table.spec.fields[f].dtype) for f in chosen
    ]
    _check_result_bytes(
        op,
        sum(math.prod(t.shape) * np.dtype(t.dtype).itemsize for t in out_types),
        f"{b} picks x {steps} steps of {len(chosen)} fields",
    )
    attrs = {"fields": np.array([names.index(f) for f in chosen], np.int64), "steps": np.int32(steps)}
    return chosen, out_types, attrs


def _batch(chosen: list[str], results: Sequence[jax.Array]) -> dict[str, jax.Array]:
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
) -> tuple[Sample, dict[str, jax.Array]]:
    """`sample` then `gather` of the picks, in one custom call on the CPU: the common learner step.

    The same as `s = sample(table, key, batch_size, method, priority_exponent, window, after)` followed
    by `gather(table, s, fields)`, with the same picks and data for the same key, at a lower cost per call
    (one custom call and one table lookup instead of two; the gather finds the picked rows' states in the
    cache). On other platforms it is exactly those two calls.

    Args:
      table, key, batch_size, method, priority_exponent, window, after, priority_update: as for
        `sample`.
      fields: as for `gather`; the gather's window is the sample's (max_steps without one).

    Returns:
      (Sample, batch): the `Sample` and `gather`'s dict of fields and `valid`.

    Raises:
      InvalidArgumentError: anything `sample` or `gather` refuses (at trace time).
      gear_jax.EXECUTION_ERRORS: at run time, as `sample`.
    """
    table = _check_table(table, "sample_gather")
    args, attrs, b, win = _sample_call(
        table, key, batch_size, method, priority_exponent, window, after, "sample_gather"
    )
    update = _check_priority_update(table, priority_update, "sample_gather")
    _check_result_bytes("sample_gather", b * PICK_BYTES, f"batch_size={b} picks")
    chosen, field_types, gather_attrs = _gather_plan(table, b, fields, None, win, "sample_gather")
    pick_types = (*_pick_types(b), jax.ShapeDtypeStruct((), jnp.int32))  # and selectable
    args = _update_first(table, args, update)  # every check passed: nothing is written before a refusal

    def fused(*args: jax.Array) -> tuple[jax.Array, ...]:
        call = jax.ffi.ffi_call(_ffi.SAMPLE_GATHER, (*pick_types, *field_types), has_side_effect=False)
        return tuple(call(*args, **attrs, **gather_attrs))

    def separate(*args: jax.Array) -> tuple[jax.Array, ...]:
        picks = jax.ffi.ffi_call(_ffi.SAMPLE, pick_types, has_side_effect=False)(*args, **attrs)
        data = jax.ffi.ffi_call(_ffi.GATHER, field_types)(
            picks[0],
            picks[1],
            picks[3],
            fields=gather_attrs["fields"],
            window=gather_attrs["steps"],
            **_attrs(table),
        )
        return (*picks, *data)

    results = jax.lax.platform_dependent(*args, cpu=fused, default=separate)
    s = Sample(*results[:5], window=win, table_handle=table.handle)
    return s, _batch(chosen, results[5:])


def update_priorities(table: Table, sample: Sample, priorities: jax.Array, after: Any = None) -> jax.Array:
    """Sets the priority of the sampled rows that were not overwritten since they were sampled.

    Args:
      table: the table `sample` came from (static).
      sample: a `Sample` of B rows.
      priorities: float[B], finite and >= 0. For a row picked twice, the later entry wins.
      after: any array this update must run after.

    Returns:
      int32[] number of entries applied (a row picked twice counts twice; a row overwritten since it
      was sampled counts zero); pass it as `after=` to a later `sample` to order the two.

    Raises:
      InvalidArgumentError: `priorities` has the wrong shape (at trace time).
      gear_jax.EXECUTION_ERRORS: a priority is NaN, infinite or negative (at run time; no row is
        changed), or the table was closed.
    """
    table = _check_table(table, "update_priorities")
    operands = _update_operands(table, sample, priorities, "update_priorities")
    return _update_call(table, operands, after, effect=True)


def _update_operands(
    table: Table, sample: Any, priorities: Any, op: str, names: tuple[str, str] = ("sample", "priorities")
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The checked (indices, generations, priorities) of an update_priorities call; `names` are the
    arguments' names in `op`'s messages."""
    b = _check_sample(sample, op, table, names[0])
    # Host values (lists, numpy arrays, PyTorch tensors) are looked at through numpy.
    is_jax = isinstance(priorities, jax.Array | jax.core.Tracer)
    dtype = priorities.dtype if is_jax else np.asarray(priorities).dtype
    if not (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)):
        raise InvalidArgumentError(f"{op}: {names[1]} has dtype {dtype}; expected floats")
    priorities = jnp.asarray(priorities)
    if priorities.shape != (b,):
        matched = "the sample" if names[0] == "sample" else names[0]
        raise InvalidArgumentError(
            f"{op}: {names[1]} has shape {priorities.shape}, expected ({b},) to match {matched}"
        )
    return (
        sample.indices.astype(jnp.int32),
        sample.generations.astype(jnp.uint32),
        priorities.astype(jnp.float32),
    )


def _update_call(table: Table, operands: tuple[jax.Array, ...], after: Any, effect: bool) -> jax.Array:
    """The update_priorities custom call; `effect` declares it side-effecting (JAX and XLA never drop
    it) or not (it lives as long as something uses its count)."""
    return jax.ffi.ffi_call(
        _ffi.UPDATE_PRIORITIES, jax.ShapeDtypeStruct((), jnp.int32), has_side_effect=effect
    )(*operands, _after(after), **_attrs(table))


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
        come). Each array has the field's dtype or one that casts to it safely (int32 into int64,
        float16 into float32).
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
    table = _check_table(table, "insert")
    if not isinstance(batch, dict):
        raise InvalidArgumentError(
            f"insert: batch must be a dict of field name to array, got {type(batch).__name__}"
        )
    spec = table.spec
    names = list(spec.fields)
    unknown = sorted(set(batch) - set(names))
    missing = [n for n in names if n not in batch]
    if unknown or missing:
        raise InvalidArgumentError(
            f"insert: batch has unknown fields {unknown} and lacks fields {missing}; every insert writes "
            f"all of the table's fields {names}"
        )
    if time_major and not spec.is_trajectory:
        raise InvalidArgumentError("insert: time_major=True is for trajectory tables (max_steps > 1) only")
    lead = 2 if spec.is_trajectory else 1
    layout = "[B, *shape]" if not spec.is_trajectory else "[T, B, *shape]" if time_major else "[B, T, *shape]"
    arrays, problems, lead_shape = [], [], None
    for name, field in spec.fields.items():
        value = batch[name]
        if not hasattr(value, "dtype") or not hasattr(value, "shape"):
            value = jnp.asarray(value)
        dtype = np.dtype(value.dtype)
        if dtype != field.dtype and not np.can_cast(dtype, field.dtype, "safe"):
            problems.append(
                f"batch[{name!r}] has dtype {dtype}, which does not cast safely to the field's "
                f"{field.dtype}; cast it first (`.astype(jnp.{field.dtype.name})`)"
            )
            continue
        if jax.dtypes.canonicalize_dtype(field.dtype) != field.dtype:
            problems.append(
                f"field {name!r} is {field.dtype}, which JAX holds only with jax_enable_x64 on; enable it "
                "(jax.config.update('jax_enable_x64', True)) or declare the field with 32 bits"
            )
            continue
        shape = tuple(value.shape)
        if len(shape) != lead + len(field.shape) or shape[lead:] != field.shape:
            problems.append(f"batch[{name!r}] has shape {shape}; expected {layout} with shape={field.shape}")
            continue
        if lead_shape is None:
            lead_shape = shape[:lead]
        elif shape[:lead] != lead_shape:
            problems.append(f"batch[{name!r}] has leading dimensions {shape[:lead]}, others {lead_shape}")
            continue
        value = jnp.asarray(value, field.dtype)
        arrays.append(jnp.swapaxes(value, 0, 1) if time_major else value)
    if problems:
        raise InvalidArgumentError("insert: " + "; ".join(problems))
    assert lead_shape is not None
    if time_major:
        lead_shape = lead_shape[::-1]
    b = int(lead_shape[0])
    steps = int(lead_shape[1]) if spec.is_trajectory else 1
    if not 1 <= steps <= table.max_steps:
        raise InvalidArgumentError(
            f"insert: the batch has {steps} steps per row; the table holds 1 to max_steps={table.max_steps}"
        )
    if isinstance(priorities, str):
        if priorities != "max":
            raise InvalidArgumentError(
                f"insert: priorities={priorities!r}; pass None, a number, a float array of shape ({b},) "
                'or "max" (the largest priority so far)'
            )
        mode, priority_array = INSERT_PRIORITY_MODES["max"], jnp.zeros((0,), jnp.float32)
    else:
        mode = INSERT_PRIORITY_MODES["given"]
        p = jnp.ones((b,), jnp.float32) if priorities is None else jnp.asarray(priorities)
        if not (jnp.issubdtype(p.dtype, jnp.floating) or jnp.issubdtype(p.dtype, jnp.integer)):
            raise InvalidArgumentError(f"insert: priorities have dtype {p.dtype}; expected floats")
        if p.ndim == 0:
            p = jnp.broadcast_to(p, (b,))
        if p.shape != (b,):
            raise InvalidArgumentError(
                f"insert: priorities have shape {p.shape}; expected ({b},), one per row of the batch"
            )
        priority_array = p.astype(jnp.float32)
    if lengths is None:
        length_array = jnp.zeros((0,), jnp.int32)
    else:
        if not spec.is_trajectory:
            raise InvalidArgumentError("insert: lengths are for trajectory tables (max_steps > 1) only")
        length_array = jnp.asarray(lengths)
        if length_array.shape != (b,) or not jnp.issubdtype(length_array.dtype, jnp.integer):
            raise InvalidArgumentError(
                f"insert: lengths have shape {length_array.shape} and dtype {length_array.dtype}; expected "
                f"integers of shape ({b},)"
            )
        length_array = length_array.astype(jnp.int32)
    return jax.ffi.ffi_call(_ffi.INSERT, jax.ShapeDtypeStruct((b,), jnp.int32), has_side_effect=True)(
        priority_array,
        length_array,
        _after(after),
        *arrays,
        steps=np.int32(steps),
        priority_mode=np.int32(mode),
        **_attrs(table),
    )


def total_weight(
    table: Table, priority_exponent: float = 1.0, after: Any = None
) -> tuple[jax.Array, jax.Array]:
    """The total weight of the rows `sample(..., method="prioritized")` can pick, and their number.

    Args:
      table: a gear_jax.Table (static).
      priority_exponent: a >= 0 (static): row i weighs p_i^a.
      after: any array this call must run after (e.g. the result of `update_priorities`).

    Returns:
      (total, count): float32[] the sum of p^a over the selectable rows (committed, even generation,
      priority > 0), accumulated in float64 and rounded once; int32[] the number of selectable rows.
      With a = 0, total == count. A table with no selectable row gives (0, 0).

    Raises:
      InvalidArgumentError: a bad exponent (at trace time).
      gear_jax.EXECUTION_ERRORS: at run time, when the total overflows a float32 or the table was
        closed since the function was traced.
    """
    table = _check_table(table, "total_weight")
    exponent = _check_exponent(priority_exponent, "total_weight")
    out_types = (jax.ShapeDtypeStruct((), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32))
    total, count = jax.ffi.ffi_call(_ffi.TOTAL_WEIGHT, out_types, has_side_effect=False)(
        _after(after), priority_exponent=np.float32(exponent), **_attrs(table)
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
    table = _check_table(table, "sample_at")
    if not hasattr(targets, "dtype") or not hasattr(targets, "shape"):
        raise InvalidArgumentError(
            f"sample_at: targets must be a float32 array of shape (B,), got {type(targets).__name__}"
        )
    if targets.dtype != jnp.float32 or len(targets.shape) != 1:
        raise InvalidArgumentError(
            "sample_at: targets must be a float32 array of shape (B,), got "
            f"{targets.dtype}{list(targets.shape)}"
        )
    exponent = _check_exponent(priority_exponent, "sample_at")
    win = _check_window(table, window, "sample_at")
    seed = _seed(key, "sample_at")
    b = int(targets.shape[0])
    _check_result_bytes("sample_at", b * PICK_BYTES, f"{b} targets")
    out_types = _pick_types(b)
    indices, generations, probabilities, starts = jax.ffi.ffi_call(
        _ffi.SAMPLE_AT, out_types, has_side_effect=False
    )(
        seed,
        jnp.asarray(targets),
        _after(after),
        priority_exponent=np.float32(exponent),
        window=np.int32(win),
        **_attrs(table),
    )
    return Sample(indices, generations, probabilities, starts, window=win, table_handle=table.handle)


ORDERED_METHODS = ("fifo", "lifo", "topk")


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
    table = _check_table(table, "ordered_candidates")
    _check_batch_size(batch_size, "ordered_candidates")
    if method not in ORDERED_METHODS:
        raise InvalidArgumentError(f"ordered_candidates: method={method!r} is not one of {ORDERED_METHODS}")
    win = _check_window(table, window, "ordered_candidates")
    seed = _seed(key, "ordered_candidates")
    b = int(batch_size)
    _check_result_bytes("ordered_candidates", b * (PICK_BYTES + 8), f"batch_size={b} picks")
    out_types = (*_pick_types(b), jax.ShapeDtypeStruct((b, 2), jnp.uint32))  # and order keys
    indices, generations, probabilities, starts, order_keys = jax.ffi.ffi_call(
        _ffi.ORDERED_CANDIDATES, out_types, has_side_effect=False
    )(
        seed,
        _after(after),
        method=np.int32(METHODS[method]),
        window=np.int32(win),
        **_attrs(table),
    )
    sample = Sample(indices, generations, probabilities, starts, window=win, table_handle=table.handle)
    return sample, order_keys

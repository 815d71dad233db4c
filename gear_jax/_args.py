"""The argument checks every entry point shares: one rule, one wording, one home.

The jitted calls (`gear_jax.ops`), the host calls (`gear_jax.host`), the PyTorch bridge, the sharded layer
and the transition helpers check tables, batch sizes, methods, exponents, windows, samples, keys and
field lists here, so that the same bad argument gets the same message whichever way it comes in. What
an insert's rows must be (casting, priorities, lengths) lives in `gear_jax._rows`. The native handlers
check again what only run time can know (xla_ffi/handler_checks.h).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gear_jax import _native
from gear_jax.errors import InvalidArgumentError, TableClosedError, traced_value_error, warn_at_caller
from gear_jax.selection import METHODS, Sample
from gear_jax.spec import TableSpec
from gear_jax.table import Table

MAX_BATCH_SIZE = 2**31 - 1  # picks are counted and indexed in int32
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def check_table(table: Any, op: str) -> Table:
    """`table` when it is an open gear_jax.Table."""
    if not isinstance(table, Table):
        raise InvalidArgumentError(f"{op}: `table` must be a gear_jax.Table, got {type(table).__name__}")
    if table.closed:
        raise TableClosedError(f"{op}: table {table.name!r} is closed; open it again")
    return table


def check_priorities_settable(table: Table, op: str) -> None:
    """Refuses a priority change (an update, a retire) on a queue: there priority 0 means consumed, which
    only `dequeue` may decide, since the queue's limiter counts the rows it consumes. An update would
    bring consumed rows back (delivered twice) or drop unconsumed ones that the limiter still counts
    (inserts would then wait for room that never comes)."""
    if table.queue:
        raise InvalidArgumentError(
            f"{op}: table {table.name!r} is a queue, whose rows leave only through gj.dequeue (or "
            "gj.host.dequeue), each exactly once; its priorities cannot be set. For priorities, create "
            "a table without queue=True"
        )


def check_static(value: Any, name: str, op: str) -> None:
    """Refuses a traced value for the argument `name`, which must be a static Python value."""
    if isinstance(value, jax.core.Tracer):
        raise traced_value_error(value, name, op)


def check_batch_size(batch_size: Any, op: str, name: str = "batch_size") -> int:
    """A count of picks (the argument `name` of `op`): a static int in [1, 2**31 - 1]."""
    check_static(batch_size, name, op)
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, (int, np.integer))
        or not 1 <= batch_size <= MAX_BATCH_SIZE
    ):
        raise InvalidArgumentError(f"{op}: {name}={batch_size!r} must be an int in [1, 2**31 - 1]")
    return int(batch_size)


def check_method(method: Any, op: str, methods: Sequence[str] = tuple(METHODS)) -> str:
    check_static(method, "method", op)
    if not isinstance(method, str) or method not in methods:
        raise InvalidArgumentError(f"{op}: method={method!r} is not one of {sorted(methods)}")
    return method


def check_distinct_picks(batch_size: int, method: str, capacity: int, op: str) -> None:
    """fifo, lifo and topk pick distinct rows: a batch larger than the table can never be filled (and its
    scratch memory, sized for the batch, could not even be allocated)."""
    if method in ("fifo", "lifo", "topk") and batch_size > capacity:
        raise InvalidArgumentError(
            f"{op}: batch_size={batch_size} exceeds the table's capacity ({capacity}); {method} picks "
            "distinct rows, so at most capacity of them"
        )


SHORT_EPISODES = ("pad", "skip")


def method_word(spec: TableSpec, method: str, window: int, short_episodes: Any, op: str) -> int:
    """The `method` word of a selection call: the method's number and the window law's flags
    (kernels/sample.h). With a window, episodes shorter than it are padded and masked ("pad") or never
    picked ("skip"); in a step ring, uniform windows are uniform over every valid window start."""
    check_static(short_episodes, "short_episodes", op)
    if short_episodes not in SHORT_EPISODES:
        raise InvalidArgumentError(
            f"{op}: short_episodes={short_episodes!r} is not one of {list(SHORT_EPISODES)}"
        )
    word = METHODS[method]
    if window > 0 and short_episodes == "skip":
        if method == "prioritized":
            raise InvalidArgumentError(
                f'{op}: short_episodes="skip" is not available for prioritized windows; give episodes '
                'shorter than the window priority 0 (they are then never picked), or use short_episodes="pad"'
            )
        word |= _native.SKIP_SHORT_FLAG
    if window > 0 and method == "uniform" and spec.step_ring:
        word |= _native.UNIFORM_STARTS_FLAG
    return word


def check_options_take_effect(
    method: str, priority_exponent: float, window: int, short_episodes: Any, op: str
) -> None:
    """Refuses or warns about a selection's options given a value other than their default where it
    cannot take effect (defaults given explicitly pass, so callers that spell them out are unaffected).
    Call it once the method, exponent (a float), window (0 for none) and short_episodes are checked.

    - short_episodes="skip" without a window: refused (InvalidArgumentError). It says which episodes
      are too short for the window; without one every pick is a whole row, so the call cannot mean it.
    - priority_exponent other than 1.0 with a method other than "prioritized": a UserWarning
      at the user's line (`errors.warn_at_caller`). Only
      prioritized picks weigh rows by the exponent, but a learner that takes its method from a
      configuration legitimately passes one exponent whatever the method, so it is not refused. The
      host calls check a set of arguments once (host._checked_selection), so they warn once for it.
    """
    if window == 0 and short_episodes != "pad":
        raise InvalidArgumentError(
            f"{op}: short_episodes={short_episodes!r} needs a window: it says what becomes of episodes "
            "shorter than `window`, and without one every pick is a whole row. Pass window=W, or leave "
            "short_episodes out"
        )
    if method != "prioritized" and priority_exponent != 1.0:
        rule = {
            "uniform": "weighs every selectable row alike",
            "topk": "takes the highest priorities, an order no exponent changes",
        }.get(method, "takes rows in the order they were inserted")
        warn_at_caller(
            f"{op}: priority_exponent={priority_exponent!r} has no effect with method={method!r}, which "
            f'{rule}; only method="prioritized" weighs rows by priority**priority_exponent. Leave '
            "priority_exponent out for this method",
            UserWarning,
        )


def window_law(spec: TableSpec, window: int, short_episodes: Any, op: str) -> int:
    """The window law's flags of uniform picks of `window` steps (method_word's, without the method)."""
    word = method_word(spec, "uniform", window, short_episodes, op)
    return word & (_native.SKIP_SHORT_FLAG | _native.UNIFORM_STARTS_FLAG)


def check_exponent(priority_exponent: Any, op: str) -> float:
    check_static(priority_exponent, "priority_exponent", op)
    try:
        exponent = float(priority_exponent)
    except (TypeError, ValueError):
        exponent = math.nan
    if not math.isfinite(exponent) or exponent < 0 or exponent > _FLOAT32_MAX:
        raise InvalidArgumentError(
            f"{op}: priority_exponent={priority_exponent!r} must be finite and >= 0 (at most 3.4e38, the "
            "largest float32: the kernels raise priorities to it in float32)"
        )
    return exponent


def check_capacity_factor(capacity_factor: Any, op: str) -> float | None:
    """A sharded exchange's capacity factor: a finite number > 0, or None (full-size blocks)."""
    check_static(capacity_factor, "capacity_factor", op)
    if capacity_factor is None:
        return None
    if (
        isinstance(capacity_factor, bool)
        or not isinstance(capacity_factor, (int, float, np.integer, np.floating))
        or not math.isfinite(capacity_factor)
        or capacity_factor <= 0
    ):
        raise InvalidArgumentError(
            f"{op}: capacity_factor={capacity_factor!r} must be a number > 0 (the exchange's first block "
            "capacity over its mean), or None for full-size blocks"
        )
    return float(capacity_factor)


def check_window(window: Any, max_steps: int, op: str) -> int:
    """The window length (0 for None), at most the rows' `max_steps`."""
    if window is None:
        return 0
    check_static(window, "window", op)
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise InvalidArgumentError(f"{op}: window={window!r} must be None or a positive int")
    if window > max_steps:
        raise InvalidArgumentError(
            f"{op}: window={window} is longer than the table's max_steps={max_steps}; "
            "use a shorter window or a table with longer rows"
        )
    return int(window)


def check_sample(sample: Any, op: str, table: Table, name: str = "sample") -> int:
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
    window, longest = sample.window, table.max_steps
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or not 0 <= window <= longest:
        raise InvalidArgumentError(
            f"{op}: the Sample's window={window!r} must be an int in [0, {longest}] (0: no window; at most "
            "the table's max_steps); a Sample built by hand takes the window its starts were drawn for"
        )
    shapes = {
        name: jnp.shape(getattr(sample, name))
        for name in ("indices", "generations", "probabilities", "starts")
    }
    if len(set(shapes.values())) != 1 or len(shapes["indices"]) != 1:
        raise InvalidArgumentError(f"{op}: the Sample's arrays must all have shape (B,); got {shapes}")
    for name in ("indices", "generations", "starts"):  # a cast to 32 bits must not pick another row
        value = getattr(sample, name)
        if not hasattr(value, "dtype"):
            raise InvalidArgumentError(
                f"{op}: the Sample's {name} is a {type(value).__name__}; a Sample holds numpy or JAX arrays "
                "(gj.sample makes int32 indices and starts, uint32 generations)"
            )
        dtype = np.dtype(value.dtype)
        # Row ids and starts are int32 in the kernels: a uint32 of 2**31 or more would wrap to a negative.
        wraps = name != "generations" and dtype.kind == "u" and dtype.itemsize == 4
        if not jnp.issubdtype(dtype, jnp.integer) or dtype.itemsize > 4 or wraps:
            rule = "signed integers of at most 32 bits" if wraps else "integers of at most 32 bits"
            raise InvalidArgumentError(
                f"{op}: the Sample's {name} have dtype {dtype}; they must be {rule} (gj.sample makes int32 "
                "indices and starts, uint32 generations), so that no value is truncated or wrapped into "
                "another row's"
            )
    return shapes["indices"][0]


def seed_words(key: Any, op: str) -> jax.Array:
    """The two uint32 words a custom call draws its random numbers from, taken from the JAX key `key`."""
    try:
        return jax.random.bits(key, (2,), jnp.uint32)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(
            f"{op}: key must be a JAX PRNG key, got {type(key).__name__} ({e}). Make one with "
            "jax.random.key(seed) and thread it through the jitted step: pass it in, split it there "
            "(`key, sample_key = jax.random.split(key)`) and return the new key"
        ) from None


def check_fields(spec: TableSpec, fields: Any, op: str) -> tuple[str, ...]:
    """The names of the fields to gather: all for None, else the given name or names (at least one, each
    a field of the table)."""
    names = list(spec.fields)
    if fields is None:
        return tuple(names)
    check_static(fields, "fields", op)
    if isinstance(fields, str):
        fields = (fields,)
    if not isinstance(fields, Sequence) or not all(isinstance(f, str) for f in fields):
        raise InvalidArgumentError(
            f"{op}: fields={fields!r} must be a field name or a sequence of field names from {names}"
        )
    chosen = tuple(fields)
    unknown = [f for f in chosen if f not in spec.fields]
    if unknown or not chosen:
        method = (
            f" ({unknown[0]!r} is a sampling method: pass method={unknown[0]!r})"
            if (len(unknown) == 1 and unknown[0] in METHODS)
            else ""
        )
        raise InvalidArgumentError(
            f"{op}: fields {unknown or list(chosen)} are not among the table's fields {names}{method}"
        )
    return chosen


def host_memory_available() -> int | None:
    """The host's MemAvailable in bytes, or None when unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def device_memory_available() -> int | None:
    """Bytes the default backend's device can still hold: the memory limit of an accelerator, or the
    host's MemAvailable for the CPU; None when unknown."""
    device = jax.local_devices()[0]
    if device.platform == "cpu":
        return host_memory_available()
    stats = device.memory_stats() or {}
    limit = stats.get("bytes_limit")
    return None if limit is None else int(limit) - int(stats.get("bytes_in_use", 0))


def check_fits(op: str, nbytes: int, what: str, on_host: bool) -> None:
    """Refuses results of `nbytes` bytes that the memory they go to cannot hold (the host's for host
    calls, the default device's for compiled calls, refused at trace time), instead of an allocation
    failure, or the process being killed, at run time."""
    available = host_memory_available() if on_host else device_memory_available()
    if available is not None and nbytes > available:
        where = "host" if on_host else f"{jax.default_backend()} device"
        raise InvalidArgumentError(
            f"{op}: {what} need {nbytes / 2**30:.2f} GiB of results, more than the "
            f"{available / 2**30:.2f} GiB the {where} has available; "
            "use a smaller batch (several calls, or a smaller window)"
        )


class GatherLayout(NamedTuple):
    """What a gather writes: the fields chosen, their native ids, the steps per pick, and the
    (name, shape, dtype) of each output, the valid mask first."""

    fields: tuple[str, ...]
    field_ids: list[int]
    steps: int
    outputs: tuple[tuple[str, tuple[int, ...], np.dtype], ...]


def gather_layout(
    table: Table, b: int, fields: Any, window: Any, sample_window: int, op: str, on_host: bool
) -> GatherLayout:
    """The checked layout of a gather of `b` picks (for jitted and host calls alike): the window is the
    given one, else the sample's, else the rows' max_steps (trajectory tables); 1 for transition tables."""
    spec = table.spec
    chosen = check_fields(spec, fields, op)
    win = check_window(window, table.max_steps, op)
    steps = (win or sample_window or table.max_steps) if spec.is_trajectory else 1
    lead = (b, steps) if spec.is_trajectory else (b,)
    outputs = (("valid", lead, np.dtype(np.bool_)),) + tuple(
        (f, (*lead, *spec.fields[f].shape), np.dtype(spec.fields[f].dtype)) for f in chosen
    )
    nbytes = sum(math.prod(shape) * dtype.itemsize for _, shape, dtype in outputs)
    check_fits(op, nbytes, f"{b} picks x {steps} steps of {len(chosen)} fields", on_host)
    names = list(spec.fields)
    return GatherLayout(chosen, [names.index(f) for f in chosen], steps, outputs)

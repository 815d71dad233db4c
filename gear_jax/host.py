"""Sampling, gathering and priority updates on the host: numpy in, numpy out, outside `jax.jit`.

`gear_jax.sample`, `gather`, `sample_gather` and `update_priorities` are XLA custom calls: inside a
jitted learner step they cost nothing beyond the step's own dispatch. Called on their own, every call
pays a jitted function's fixed cost (JAX's dispatch, XLA's result buffers): on a small CPU that is
most of a 32-row batch. A learner whose step is not a JAX program (a PyTorch or numpy learner, a
data-loading thread) pays it for nothing. The functions here run the same CPU kernels from Python
directly, on the calling thread without the GIL, into numpy arrays (or arrays you pass as `out`):

    rng = np.random.default_rng(0)
    s, batch = gj.host.sample_gather(table, rng, 256, method="prioritized", priority_exponent=0.6)
    ...                                    # batch["obs"] is a numpy array, batch["valid"] its mask
    gj.host.update_priorities(table, s, new_priorities)

Semantics are the custom calls' on the CPU: the same rows are selectable, rows being written are never
picked, a gathered row overwritten meanwhile comes back invalid and zeroed, and the same seed words give
the same picks and bytes. `rng` is a `numpy.random.Generator` (64 random bits per call make the two
seed words) or a JAX PRNG key (its words come from `jax.random.bits` as in the custom calls, so
`gj.host.sample(table, key, ...)` picks what `jax.jit(gj.sample)(table, key, ...)` picks on the CPU).

The results are host memory: on a GPU machine this path reads the table with the CPU, and a jitted
`gj.sample_gather` (whose CUDA kernels read the pinned table straight into device memory) is the way to
feed a GPU. The `Sample` returned holds numpy arrays and is accepted by the jitted functions too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gear_jax import _native, ops
from gear_jax.errors import InvalidArgumentError, TableClosedError
from gear_jax.table import Table

__all__ = ["Sampler", "gather", "sample", "sample_gather", "update_priorities"]


def _table(table: Any, op: str) -> Table:
    if not isinstance(table, Table):
        raise InvalidArgumentError(f"{op}: `table` must be a gear_jax.Table, got {type(table).__name__}")
    if table.closed:
        raise TableClosedError(f"{op}: table {table.name!r} is closed; open it again")
    return table


def _draw_64_bits(generator: np.random.Generator) -> Callable[[], int]:
    """A function drawing 64 random bits from `generator`: one raw draw of its bit generator (64 bits
    for PCG64, Philox and SFC64), two of MT19937's 32-bit draws."""
    raw = generator.bit_generator.random_raw
    if isinstance(generator.bit_generator, np.random.MT19937):
        return lambda: (raw() << 32) | raw()
    return raw


def _seed_words(rng: Any, op: str) -> tuple[int, int]:
    """The two uint32 words a kernel draws its random numbers from."""
    if isinstance(rng, np.random.Generator):
        bits = _draw_64_bits(rng)()
        return bits & 0xFFFFFFFF, bits >> 32
    if not isinstance(rng, (jax.Array, np.ndarray)):
        raise InvalidArgumentError(
            f"{op}: rng must be a numpy.random.Generator (np.random.default_rng(seed)) or a JAX PRNG key, "
            f"got {type(rng).__name__}; keep one generator and pass it to every call"
        )
    words = np.asarray(ops._seed(rng, op))  # a JAX key: the words the custom calls draw from it
    return int(words[0]), int(words[1])


# Bytes of a sample's four per-pick arrays (indices, generations, probabilities, starts) per pick.
_PICK_BYTES = 16


def _check_fits(nbytes: int, what: str, op: str) -> None:
    """Refuses results of `nbytes` bytes that the host's available memory can not hold."""
    available = _memory_available()
    if available is not None and nbytes > available:
        raise InvalidArgumentError(
            f"{op}: {what} need {nbytes / 2**30:.2f} GiB, more than the {available / 2**30:.2f} GiB of host "
            "memory available; use a smaller batch"
        )


def _memory_available() -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# What a gather writes: (name, shape, dtype) of each output, the valid mask first; the native field ids;
# the steps per pick; the field names in order. Planned once per table, batch size, fields and window.
_Plan = tuple[tuple[tuple[str, tuple[int, ...], np.dtype], ...], list[int], int, tuple[str, ...]]


# By table (its handle and spec: a handle is reused only by a table of the same spec), batch, fields,
# window and the sample's window.
_PLANS: dict[tuple[Any, ...], _Plan] = {}
_MAX_PLANS = 256


def _plan(table: Table, batch: int, fields: tuple[str, ...] | None, window: int, sample_window: int) -> _Plan:
    key = (table.handle, table._native.spec_hash, batch, fields, window, sample_window)
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[key] = _make_plan(table, batch, fields, window, sample_window)
    return plan


def _make_plan(
    table: Table, batch: int, fields: tuple[str, ...] | None, window: int, sample_window: int
) -> _Plan:
    op = "gear_jax.host.gather"
    spec = table.spec
    names = list(spec.fields)
    chosen = names if fields is None else list(fields)
    unknown = [f for f in chosen if f not in spec.fields]
    if unknown or not chosen:
        raise InvalidArgumentError(
            f"{op}: fields {unknown or chosen} are not among the table's fields {names}"
        )
    steps = (window or sample_window or table.max_steps) if spec.is_trajectory else 1
    lead = (batch, steps) if spec.is_trajectory else (batch,)
    outputs = [("valid", lead, np.dtype(np.bool_))]
    outputs += [(f, (*lead, *spec.fields[f].shape), np.dtype(spec.fields[f].dtype)) for f in chosen]
    nbytes = sum(math.prod(shape) * dtype.itemsize for _, shape, dtype in outputs)
    _check_fits(nbytes, f"{batch} picks x {steps} steps of {len(chosen)} fields", op)
    return tuple(outputs), [names.index(f) for f in chosen], steps, tuple(chosen)


def _fields_key(fields: Any, op: str) -> tuple[str, ...] | None:
    if fields is None:
        return None
    if isinstance(fields, str):
        return (fields,)
    if isinstance(fields, Sequence) and all(isinstance(f, str) for f in fields):
        return tuple(fields)
    raise InvalidArgumentError(f"{op}: fields={fields!r} must be a field name or a sequence of field names")


def _outputs(plan: _Plan, out: Mapping[str, np.ndarray] | None, op: str) -> list[np.ndarray]:
    """The arrays the gather writes: those of `out` (checked), new ones for the rest."""
    specs = plan[0]
    if out is None:
        return [np.empty(shape, dtype) for _, shape, dtype in specs]
    if not isinstance(out, Mapping):
        raise InvalidArgumentError(
            f"{op}: out must be a dict of numpy arrays by field name, got {type(out).__name__}"
        )
    extra = set(out) - {name for name, _, _ in specs}
    if extra:
        raise InvalidArgumentError(
            f"{op}: out has arrays for {sorted(extra)}, which this gather does not write (it writes "
            f"{[name for name, _, _ in specs]})"
        )
    arrays = []
    for name, shape, dtype in specs:
        given = out.get(name)
        if given is None:
            arrays.append(np.empty(shape, dtype))
            continue
        if (
            not isinstance(given, np.ndarray)
            or given.shape != shape
            or given.dtype != dtype
            or not given.flags.c_contiguous
            or not given.flags.writeable
        ):
            what = (
                f"{type(given).__name__}"
                if not isinstance(given, np.ndarray)
                else f"{given.dtype}{list(given.shape)}"
            )
            raise InvalidArgumentError(
                f"{op}: out[{name!r}] is {what}; it must be a writable C-contiguous numpy array of "
                f"{dtype}{list(shape)}"
            )
        arrays.append(given)
    return arrays


def _batch(plan: _Plan, arrays: list[np.ndarray]) -> dict[str, np.ndarray]:
    batch = dict(zip(plan[3], arrays[1:]))
    batch["valid"] = arrays[0]
    return batch


def _new_sample(picks: tuple[Any, ...], window: int, table: Table) -> ops.Sample:
    """A Sample of the native call's (indices, generations, probabilities, starts, selectable), made
    without the frozen dataclass's __init__ (which sets each of its seven fields through
    object.__setattr__: a third of a small call's Python time). The same object as Sample(...) makes."""
    sample = object.__new__(ops.Sample)
    sample.__dict__.update(
        indices=picks[0],
        generations=picks[1],
        probabilities=picks[2],
        starts=picks[3],
        selectable=np.int32(picks[4]),
        window=window,
        table_handle=table.handle,
    )
    return sample


# The checked arguments of a selection, by the arguments as given (with the types of those where a
# value of another type compares equal: True == 1), so that a learner calling with the same arguments
# every step pays for the checks once: (batch size, method id, exponent, window, gather plan or None).
_SELECTIONS: dict[tuple[Any, ...], tuple[int, int, float, int, _Plan | None]] = {}


def _checked_selection(
    table: Table,
    batch_size: Any,
    method: Any,
    priority_exponent: Any,
    window: Any,
    fields: Any,
    gathers: bool,
    op: str,
) -> tuple[int, int, float, int, _Plan | None]:
    key: tuple[Any, ...] | None = (
        table.handle,
        table._native.spec_hash,
        type(batch_size),
        batch_size,
        method,
        type(priority_exponent),
        priority_exponent,
        type(window),
        window,
        tuple(fields) if type(fields) is list else fields,
        gathers,
    )
    try:
        return _SELECTIONS[key]
    except KeyError:
        pass
    except TypeError:  # unhashable arguments: checked at every call
        key = None
    b, method_id, exponent, win = _selection(table, batch_size, method, priority_exponent, window, op)
    plan = _plan(table, b, _fields_key(fields, op), 0, win) if gathers else None
    checked = (b, method_id, exponent, win, plan)
    if key is not None:
        if len(_SELECTIONS) >= _MAX_PLANS:
            _SELECTIONS.clear()
        _SELECTIONS[key] = checked
    return checked


def _selection(
    table: Table, batch_size: Any, method: Any, priority_exponent: Any, window: Any, op: str
) -> tuple[int, int, float, int]:
    ops._check_batch_size(batch_size, op)
    _check_fits(
        int(batch_size) * _PICK_BYTES, f"the row ids, generations and probabilities of {batch_size} picks", op
    )
    if method not in ops.METHODS:
        raise InvalidArgumentError(f"{op}: method={method!r} is not one of {sorted(ops.METHODS)}")
    return (
        int(batch_size),
        ops.METHODS[method],
        ops._check_exponent(priority_exponent, op),
        ops._check_window(table, window, op),
    )


def sample(
    table: Table,
    rng: Any,
    batch_size: int,
    method: str = "uniform",
    priority_exponent: float = 1.0,
    window: int | None = None,
) -> ops.Sample:
    """Selects `batch_size` rows of `table` now, on this thread: `gear_jax.sample` outside jit.

    Args:
      table: a gear_jax.Table.
      rng: a `numpy.random.Generator` (64 bits drawn per call) or a JAX PRNG key.
      batch_size, method, priority_exponent, window: as for `gear_jax.sample`.

    Returns:
      A `gear_jax.Sample` of numpy arrays (`selectable` a numpy int32).

    Raises:
      InvalidArgumentError: a bad argument.
      NotEnoughRowsError: no selectable row; fewer than `batch_size` for fifo, lifo or topk.
      TableClosedError: the table was closed.
    """
    op = "gear_jax.host.sample"
    table = _table(table, op)
    b, method_id, exponent, win, _ = _checked_selection(
        table, batch_size, method, priority_exponent, window, None, False, op
    )
    seed0, seed1 = _seed_words(rng, op)
    picks = table._native.host_sample(seed0, seed1, b, method_id, exponent, win, [], 0, [])
    return _new_sample(picks, win, table)


def gather(
    table: Table,
    sample: ops.Sample,
    fields: Sequence[str] | None = None,
    window: int | None = None,
    out: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Copies the sampled rows (or windows of them) out of the table: `gear_jax.gather` outside jit.

    Args:
      table, sample, fields, window: as for `gear_jax.gather` (the sample may hold numpy or JAX arrays).
      out: optional arrays to write into, by name (a field's or "valid"), each C-contiguous with the
        result's shape and dtype: a learner that reuses its batch buffers allocates nothing per call.

    Returns:
      A dict of numpy arrays, one per field and `valid`, shaped as `gear_jax.gather`'s results.
    """
    op = "gear_jax.host.gather"
    table = _table(table, op)
    b = ops._check_sample(sample, op, table)
    plan = _plan(table, b, _fields_key(fields, op), ops._check_window(table, window, op), sample.window)
    arrays = _outputs(plan, out, op)
    table._native.host_gather(
        np.asarray(sample.indices, np.int32),
        np.asarray(sample.generations, np.uint32),
        np.asarray(sample.starts, np.int32),
        plan[1],
        plan[2],
        arrays,
    )
    return _batch(plan, arrays)


def sample_gather(
    table: Table,
    rng: Any,
    batch_size: int,
    fields: Sequence[str] | None = None,
    method: str = "uniform",
    priority_exponent: float = 1.0,
    window: int | None = None,
    out: Mapping[str, np.ndarray] | None = None,
) -> tuple[ops.Sample, dict[str, np.ndarray]]:
    """`sample` then `gather` of its picks in one native call: `gear_jax.sample_gather` outside jit.

    Args:
      table, rng, batch_size, method, priority_exponent, window: as for `sample`.
      fields, out: as for `gather` (its window is the sample's; max_steps without one).

    Returns:
      (Sample, batch), both of numpy arrays.
    """
    op = "gear_jax.host.sample_gather"
    table = _table(table, op)
    b, method_id, exponent, win, plan = _checked_selection(
        table, batch_size, method, priority_exponent, window, fields, True, op
    )
    arrays = _outputs(plan, out, op)
    seed0, seed1 = _seed_words(rng, op)
    picks = table._native.host_sample(seed0, seed1, b, method_id, exponent, win, plan[1], plan[2], arrays)
    return _new_sample(picks, win, table), _batch(plan, arrays)


def update_priorities(table: Table, sample: ops.Sample, priorities: Any) -> int:
    """Sets the priorities of the sampled rows not overwritten since: `gear_jax.update_priorities` now.

    Args:
      table: the table `sample` came from.
      sample: a `Sample` of B rows (numpy or JAX arrays).
      priorities: B floats (a numpy array, a list, a CPU torch tensor), finite and >= 0; for a row
        picked twice the later entry wins.

    Returns:
      The number of entries applied (a row overwritten since it was sampled counts zero).

    Raises:
      InvalidArgumentError: `priorities` has the wrong shape or dtype, or holds a NaN, infinite or
        negative value (then no row is changed).
    """
    op = "gear_jax.host.update_priorities"
    table = _table(table, op)
    b = ops._check_sample(sample, op, table)
    if hasattr(priorities, "detach") and hasattr(priorities, "device"):  # a torch tensor
        if priorities.device.type != "cpu":
            raise InvalidArgumentError(
                f"{op}: priorities lie on {priorities.device}; move them to the CPU (priorities.cpu())"
            )
        priorities = priorities.detach()
        if priorities.is_floating_point():  # numpy has no torch.bfloat16: all floats as float32
            priorities = priorities.float()
    values = np.asarray(priorities)
    if not (jnp.issubdtype(values.dtype, jnp.floating) or jnp.issubdtype(values.dtype, jnp.integer)):
        raise InvalidArgumentError(f"{op}: priorities has dtype {values.dtype}; expected floats")
    if values.shape != (b,):
        raise InvalidArgumentError(
            f"{op}: priorities has shape {values.shape}, expected ({b},) to match the sample"
        )
    return table._native.host_update_priorities(
        np.asarray(sample.indices, np.int32),
        np.asarray(sample.generations, np.uint32),
        np.ascontiguousarray(values, np.float32),
    )


class Sampler:
    """The same `sample_gather` again and again, into arrays made once: for a learner's loop.

    The arguments are checked once, here; each call is one native call (the kernels' work and about two
    microseconds more) that writes its picks and rows into the sampler's own arrays and returns them. A
    call overwrites what the call `buffers` calls before it returned: keep a batch beyond that (a queue
    of prefetched batches, a list of them) and it changes under you. Give `buffers=k + 1` to keep the
    last k batches intact while drawing the next, or copy what you keep.

        sampler = gj.host.Sampler(table, 256, method="prioritized", priority_exponent=0.6, rng=0)
        for step in range(1000):
            s, batch = sampler()                      # numpy arrays, the sampler's own
            td = learn(batch["obs"], batch["valid"])
            sampler.update_priorities(np.abs(td) + 1e-3)   # the last draw's rows

    A sampler is for one thread at a time; give each thread its own. A call that finds its buffer in
    use by another thread's call raises, but with several buffers calls from several threads may go
    unnoticed and `update_priorities` apply to another thread's draw.

    Args:
      table: a gear_jax.Table.
      batch_size, fields, method, priority_exponent, window: as for `sample_gather`.
      rng: a `numpy.random.Generator` (64 bits drawn per call, as `sample_gather` draws them) or
        an int seed for a new one; None: a Generator seeded from the operating system.
      buffers: how many sets of arrays the calls cycle through (>= 1).

    Raises:
      InvalidArgumentError: a bad argument (here, not at the first call).
      TableClosedError: the table is closed (here, and at a call once it was closed).
    """

    def __init__(
        self,
        table: Table,
        batch_size: int,
        fields: Sequence[str] | None = None,
        method: str = "uniform",
        priority_exponent: float = 1.0,
        window: int | None = None,
        rng: np.random.Generator | int | None = None,
        buffers: int = 1,
    ):
        op = "gear_jax.host.Sampler"
        table = _table(table, op)
        b, method_id, exponent, win, plan = _checked_selection(
            table, batch_size, method, priority_exponent, window, fields, True, op
        )
        assert plan is not None
        if rng is None or (isinstance(rng, (int, np.integer)) and not isinstance(rng, bool)):
            if rng is not None and rng < 0:
                raise InvalidArgumentError(f"{op}: rng={rng} must be a seed >= 0, a Generator or None")
            rng = np.random.default_rng(None if rng is None else int(rng))
        if not isinstance(rng, np.random.Generator):
            raise InvalidArgumentError(
                f"{op}: rng must be a numpy.random.Generator, an int seed or None, got {type(rng).__name__}"
            )
        if isinstance(buffers, bool) or not isinstance(buffers, (int, np.integer)) or buffers < 1:
            raise InvalidArgumentError(f"{op}: buffers={buffers!r} must be an int >= 1")
        self._table = table
        self._window = win
        self._draw_64_bits = _draw_64_bits(rng)
        # Per buffer: (the native draw, its picks, its batch).
        self._sets: list[tuple[Any, tuple[np.ndarray, ...], dict[str, np.ndarray]]] = []
        for _ in range(int(buffers)):
            arrays = [np.empty(shape, dtype) for _, shape, dtype in plan[0]]
            draw = _native.HostDraw(table._native, b, method_id, exponent, win, plan[1], plan[2], arrays)
            self._sets.append((draw, draw.picks(), _batch(plan, arrays)))
        self._next = 0
        self._last: ops.Sample | None = None

    def __call__(self) -> tuple[ops.Sample, dict[str, np.ndarray]]:
        """Draws the next batch: (Sample, batch), numpy arrays that the sampler reuses (see above)."""
        draw, picks, batch = self._sets[self._next]
        self._next = (self._next + 1) % len(self._sets)
        bits = self._draw_64_bits()
        selectable = draw.run(bits & 0xFFFFFFFF, bits >> 32)
        sample = self._last = _new_sample((*picks, selectable), self._window, self._table)
        return sample, dict(batch)

    def update_priorities(self, priorities: Any) -> int:
        """Sets the priorities of the last draw's rows (`update_priorities` with its Sample)."""
        if self._last is None:
            raise InvalidArgumentError(
                "gear_jax.host.Sampler.update_priorities: nothing drawn yet; call the sampler first"
            )
        return update_priorities(self._table, self._last, priorities)

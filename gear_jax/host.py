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

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from gear_jax import _args, _native, _rows
from gear_jax.errors import InvalidArgumentError, NotEnoughRowsError
from gear_jax.selection import METHODS, PICK_BYTES, Sample
from gear_jax.table import Table

_FIFO = METHODS["fifo"]

__all__ = ["Sampler", "epoch", "gather", "retire", "sample", "sample_gather", "update_priorities"]


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
    words = np.asarray(_args.seed_words(rng, op))  # a JAX key: the words the custom calls draw from it
    return int(words[0]), int(words[1])


# What a gather writes (`_args.GatherLayout`), planned once per table, batch size, fields and window.
_Plan = _args.GatherLayout


# By table (its handle and spec: a handle is reused only by a table of the same spec), batch, fields,
# window and the sample's window.
_PLANS: dict[tuple[Any, ...], _Plan] = {}
_MAX_PLANS = 256


def _plan(
    table: Table, batch: int, fields: tuple[str, ...], window: int | None, sample_window: int, op: str
) -> _Plan:
    """The gather's plan; a refusal (too large a batch, say) names `op`, the call being made."""
    key = (table.handle, table.native.spec_hash, batch, fields, window, sample_window)
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[key] = _args.gather_layout(
            table, batch, fields, window, sample_window, op, on_host=True
        )
    return plan


def _outputs(plan: _Plan, out: Mapping[str, np.ndarray] | None, op: str, table: Table) -> list[np.ndarray]:
    """The arrays the gather writes: those of `out` (checked), new ones for the rest."""
    specs = plan.outputs
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
        _check_out_array(name, given, shape, dtype, op)
        arrays.append(given)
    _refuse_overlaps([(name, a) for (name, _, _), a in zip(specs, arrays) if name in out], table, op)
    return arrays


def _check_out_array(name: str, given: Any, shape: tuple[int, ...], dtype: np.dtype, op: str) -> None:
    """Refuses an `out` array the gather cannot write in place, naming every requirement it fails: a
    numpy array, of the result's shape and dtype, C-contiguous (the kernels write rows of bytes back to
    back) and writable."""
    expected = f"{dtype}{list(shape)}"
    fix = (
        f"give a writable C-contiguous numpy array of {expected}, as np.empty({shape}, {str(dtype)!r}) "
        f"makes, or drop out[{name!r}] to have the gather allocate it"
    )
    if not isinstance(given, np.ndarray):
        raise InvalidArgumentError(
            f"{op}: out[{name!r}] is a {type(given).__name__}, not a numpy array; {fix}"
        )
    failed = []
    if given.shape != shape:
        failed.append(f"has shape {given.shape}, expected {shape}")
    if given.dtype != dtype:
        failed.append(f"has dtype {given.dtype}, expected {dtype}")
    if not given.flags.c_contiguous:
        failed.append(f"is not C-contiguous (strides {given.strides})")
    if not given.flags.writeable:
        failed.append("is read-only (flags.writeable is False)")
    if failed:
        raise InvalidArgumentError(f"{op}: out[{name!r}] {', and '.join(failed)}; {fix}")


def _refuse_overlaps(given: list[tuple[str, np.ndarray]], table: Table, op: str) -> None:
    """Refuses `out` arrays that share bytes with one another or with the table's own memory: the gather
    would write one field over another, or over the rows it reads (their status words included)."""
    spans = [(a.__array_interface__["data"][0], a.nbytes, f"out[{name!r}]") for name, a in given if a.nbytes]
    start, size = table.memory_span
    spans.append((start, size, f"the memory of table {table.name!r}"))
    spans.sort()
    for (a, a_bytes, a_name), (b, _, b_name) in zip(spans, spans[1:]):
        if b < a + a_bytes:
            first, second = sorted((a_name, b_name), key=lambda n: n.startswith("the memory"))
            raise InvalidArgumentError(
                f"{op}: {first} overlaps {second}; give every output array memory of its own (a view of "
                "the table's columns or of another output would be written over)"
            )


def _batch(plan: _Plan, arrays: list[np.ndarray]) -> dict[str, np.ndarray]:
    batch = dict(zip(plan.fields, arrays[1:]))
    batch["valid"] = arrays[0]
    return batch


def _new_sample(picks: tuple[Any, ...], window: int, table: Table) -> Sample:
    """A Sample of the native call's (indices, generations, probabilities, starts, selectable, lengths),
    made without the frozen dataclass's __init__ (which sets each of its eight fields through
    object.__setattr__: a third of a small call's Python time). The same object as Sample(...) makes."""
    sample = object.__new__(Sample)
    sample.__dict__.update(
        indices=picks[0],
        generations=picks[1],
        probabilities=picks[2],
        starts=picks[3],
        selectable=np.int32(picks[4]),
        lengths=picks[5],
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
    short_episodes: Any = "pad",
) -> tuple[int, int, float, int, _Plan | None]:
    key: tuple[Any, ...] | None = (
        short_episodes,
        table.handle,
        table.native.spec_hash,
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
    b, method, exponent, win = _selection(table, batch_size, method, priority_exponent, window, op)
    method_id = _args.method_word(table.spec, method, win, short_episodes, op)
    # From the user's call: sample / sample_gather / Sampler -> _checked_selection -> this check.
    _args.check_options_take_effect(method, exponent, win, short_episodes, op)
    plan = _plan(table, b, _args.check_fields(table.spec, fields, op), None, win, op) if gathers else None
    checked = (b, method_id, exponent, win, plan)
    if key is not None:
        if len(_SELECTIONS) >= _MAX_PLANS:
            _SELECTIONS.clear()
        _SELECTIONS[key] = checked
    return checked


def _selection(
    table: Table, batch_size: Any, method: Any, priority_exponent: Any, window: Any, op: str
) -> tuple[int, str, float, int]:
    b = _args.check_batch_size(batch_size, op)
    method = _args.check_method(method, op)
    _args.check_distinct_picks(b, method, table.capacity, op)
    _args.check_fits(op, b * PICK_BYTES, f"the row ids, generations and probabilities of {b} picks", True)
    return (
        b,
        method,
        _args.check_exponent(priority_exponent, op),
        _args.check_window(window, table.max_steps, op),
    )


def sample(
    table: Table,
    rng: Any,
    batch_size: int,
    method: str = "uniform",
    priority_exponent: float = 1.0,
    window: int | None = None,
    short_episodes: str = "pad",
) -> Sample:
    """Selects `batch_size` rows of `table` now, on this thread: `gear_jax.sample` outside jit.

    Args:
      table: a gear_jax.Table.
      rng: a `numpy.random.Generator` (64 bits drawn per call) or a JAX PRNG key.
      batch_size: as for `gear_jax.sample`.
      method: as for `gear_jax.sample`.
      priority_exponent: as for `gear_jax.sample`.
      window: as for `gear_jax.sample`.
      short_episodes: as for `gear_jax.sample`.

    Returns:
      A `gear_jax.Sample` of numpy arrays (`selectable` a numpy int32).

    Raises:
      InvalidArgumentError: a bad argument; short_episodes="skip" without a window (it would change
        nothing).
      NotEnoughRowsError: no selectable row; fewer than `batch_size` for fifo, lifo or topk.
      TableClosedError: the table was closed.

    Warns:
      UserWarning: a priority_exponent other than 1.0 with a method other than "prioritized", where it
        has no effect (once per set of arguments: the checks of arguments seen before are not run again).
    """
    op = "gear_jax.host.sample"
    table = _args.check_table(table, op)
    b, method_id, exponent, win, _ = _checked_selection(
        table, batch_size, method, priority_exponent, window, None, False, op, short_episodes
    )
    seed0, seed1 = _seed_words(rng, op)
    picks = table.native.host_sample(seed0, seed1, b, method_id, exponent, win, [], 0, [])
    return _new_sample(picks, win, table)


def gather(
    table: Table,
    sample: Sample,
    fields: Sequence[str] | None = None,
    window: int | None = None,
    out: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Copies the sampled rows (or windows of them) out of the table: `gear_jax.gather` outside jit.

    Args:
      table: as for `gear_jax.gather` (the sample may hold numpy or JAX arrays).
      sample: as for `gear_jax.gather` (the sample may hold numpy or JAX arrays).
      fields: as for `gear_jax.gather` (the sample may hold numpy or JAX arrays).
      window: as for `gear_jax.gather` (the sample may hold numpy or JAX arrays).
      out: optional arrays to write into, by name (a field's or "valid"), each C-contiguous with the
        result's shape and dtype: a learner that reuses its batch buffers allocates nothing per call.

    Returns:
      A dict of numpy arrays, one per field and `valid`, shaped as `gear_jax.gather`'s results.
    """
    op = "gear_jax.host.gather"
    table = _args.check_table(table, op)
    b = _args.check_sample(sample, op, table)
    win = _args.check_window(window, table.max_steps, op) or None
    plan = _plan(table, b, _args.check_fields(table.spec, fields, op), win, sample.window, op)
    arrays = _outputs(plan, out, op, table)
    table.native.host_gather(
        np.asarray(sample.indices, np.int32),
        np.asarray(sample.generations, np.uint32),
        np.asarray(sample.starts, np.int32),
        plan.field_ids,
        plan.steps,
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
    short_episodes: str = "pad",
) -> tuple[Sample, dict[str, np.ndarray]]:
    """`sample` then `gather` of its picks in one native call: `gear_jax.sample_gather` outside jit.

    Args:
      table: as for `sample`.
      rng: as for `sample`.
      batch_size: as for `sample`.
      method: as for `sample`.
      priority_exponent: as for `sample`.
      window: as for `sample`.
      fields: as for `gather` (its window is the sample's; max_steps without one).
      out: as for `gather` (its window is the sample's; max_steps without one).
      short_episodes: as for `sample`.

    Returns:
      (Sample, batch), both of numpy arrays.
    """
    op = "gear_jax.host.sample_gather"
    table = _args.check_table(table, op)
    b, method_id, exponent, win, plan = _checked_selection(
        table, batch_size, method, priority_exponent, window, fields, True, op, short_episodes
    )
    arrays = _outputs(plan, out, op, table)
    seed0, seed1 = _seed_words(rng, op)
    picks = table.native.host_sample(
        seed0, seed1, b, method_id, exponent, win, plan.field_ids, plan.steps, arrays
    )
    return _new_sample(picks, win, table), _batch(plan, arrays)


def update_priorities(table: Table, sample: Sample, priorities: Any) -> int:
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
    table = _args.check_table(table, op)
    _args.check_priorities_settable(table, op)
    b = _args.check_sample(sample, op, table)
    values = _rows.priorities(priorities, b, op=op, broadcast=False, matched="the sample")
    return table.native.host_update_priorities(
        np.asarray(sample.indices, np.int32),
        np.asarray(sample.generations, np.uint32),
        values,
    )


def epoch(
    table: Table,
    rng: Any,
    minibatch_size: int,
    num_rows: int | None = None,
    drop_last: bool = True,
    window: int | None = None,
) -> list[Sample]:
    """One epoch over the table's selectable rows, each once, shuffled, in minibatches:
    `gear_jax.epoch` outside jit (the same arguments and rules, numpy arrays).

    The rows are those selectable in a snapshot of the rows' status taken now (the `num_rows` newest
    where there are more); a row overwritten since comes back invalid from `gather`, as for any sample.

    Returns:
      A list of `num_minibatches` Samples of `minibatch_size` picks each; the last ones end with failed
      picks (generation 1: `valid` False in `gather`) where the table held fewer than `num_rows` rows.
    """
    from gear_jax import epochs

    op = "gear_jax.host.epoch"
    table = _args.check_table(table, op)
    mb, rows = epochs.check_epoch(table, minibatch_size, num_rows, drop_last, op, window)
    win = _args.check_window(window, table.max_steps, op)
    drop_last = bool(drop_last)
    generator = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(_seed_words(rng, op))
    status = table.row_status()
    length = status["length"]
    selectable = (
        (status["generation"] % 2 == 0)
        & (status["priority"] > 0)
        & (length >= 1)
        & (length <= table.max_steps)
    )
    minibatches, _ = epochs.epoch_shape(rows, mb, drop_last)
    wanted = minibatches * mb
    indices = np.zeros(wanted, np.int32)
    generations = np.full(wanted, epochs.FAILED_GENERATION, np.uint32)
    probabilities = np.zeros(wanted, np.float32)
    starts = np.zeros(wanted, np.int32)
    if table.max_times_sampled:
        # Each pick takes one of its row's samples, as the jitted epoch's do: the newest rows that have
        # samples left, taken by the native lifo selection (atomic against other learners), shuffled.
        picks = _take_newest(table, generator, min(rows, int(np.count_nonzero(selectable))), win)
        order = generator.permutation(len(picks.indices))
        n = min(len(order), wanted)
        indices[:n] = picks.indices[order][:n]
        generations[:n] = picks.generations[order][:n]
        starts[:n] = picks.starts[order][:n]
        probabilities[:n] = 1.0
        return _minibatches(table, indices, generations, probabilities, starts, mb, win)
    found = np.flatnonzero(selectable)
    found = found[np.argsort(status["insert_seq"][found], kind="stable")[::-1][:rows]]  # the newest
    found = generator.permutation(found)
    n = min(len(found), wanted)
    indices[:n] = found[:n]
    generations[:n] = status["generation"][found[:n]]
    probabilities[:n] = 1.0
    if win > 0:
        room = np.maximum(length[found[:n]] - win, 0).astype(np.int64)
        starts[:n] = generator.integers(0, room + 1)
    return _minibatches(table, indices, generations, probabilities, starts, mb, win)


def _take_newest(table: Table, generator: np.random.Generator, n: int, window: int) -> Sample:
    """A lifo sample of the newest `n` rows with samples left (of a `max_times_sampled` table), or of
    fewer when other learners took the last samples of some meanwhile; each pick takes one sample."""
    op = "gear_jax.host.epoch"
    lifo = _args.method_word(table.spec, "lifo", window, "pad", op)
    while n > 0:
        seed0, seed1 = _seed_words(generator, op)
        try:
            picks = table.native.host_sample(seed0, seed1, n, lifo, 1.0, window, [], 0, [])
        except NotEnoughRowsError:
            n -= 1
            continue
        return _new_sample(picks, window, table)
    empty = np.zeros(0, np.int32)
    return Sample(empty, empty.astype(np.uint32), empty.astype(np.float32), empty, window=window)


def _minibatches(
    table: Table,
    indices: np.ndarray,
    generations: np.ndarray,
    probabilities: np.ndarray,
    starts: np.ndarray,
    mb: int,
    win: int,
) -> list[Sample]:
    """An epoch's picks cut into Samples of `mb`."""
    return [
        Sample(
            indices[i : i + mb],
            generations[i : i + mb],
            probabilities[i : i + mb],
            starts[i : i + mb],
            window=win,
            table_handle=table.handle,
        )
        for i in range(0, len(indices), mb)
    ]


def dequeue(
    table: Table,
    batch_size: int,
    fields: Sequence[str] | None = None,
    window: int | None = None,
    out: Mapping[str, np.ndarray] | None = None,
) -> tuple[Sample, dict[str, np.ndarray]]:
    """Takes up to `batch_size` of the oldest unconsumed rows out of the queue `table`, now, on this
    thread: `gear_jax.dequeue` outside jit (a PyTorch learner's, say), with the same guarantees: each row
    comes out of exactly one dequeue, of whichever process, and a pick another consumer took first comes
    back `valid=False` with zeroed arrays. Call `table.await_samples(n)` first to wait for rows.

    Args:
      table: a queue (`Table.create(..., queue=True)`).
      batch_size: picks B >= 1.
      fields: as for `gather`.
      window: as for `gather`.
      out: as for `gather`.

    Returns:
      (sample, batch) of numpy arrays, as `gear_jax.dequeue`.
    """
    from gear_jax import epochs, queues

    op = "gear_jax.host.dequeue"
    table = queues.check_queue(table, op)
    b = _args.check_batch_size(batch_size, op)
    indices = np.zeros(b, np.int32)
    generations = np.full(b, epochs.FAILED_GENERATION, np.uint32)
    n = min(b, table.unconsumed)
    while n > 0:  # the oldest n rows, n shrinking while other consumers take rows meanwhile
        try:
            picks = table.native.host_sample(0, 0, n, _FIFO, 1.0, 0, [], 0, [])
        except NotEnoughRowsError:
            n = min(n - 1, table.unconsumed)
            continue
        indices[:n], generations[:n] = picks[0], picks[1]
        break
    sample = Sample(
        indices, generations, np.zeros(b, np.float32), np.zeros(b, np.int32), table_handle=table.handle
    )
    batch = gather(table, sample, fields, window, out)
    valid = batch["valid"]
    first = valid if valid.ndim == 1 else valid[:, 0]
    taken = table.native.host_consume(indices, generations, np.ascontiguousarray(first))
    lost = ~taken
    valid[lost] = False
    for name, value in batch.items():
        if name != "valid":
            value[lost] = 0
    return sample, batch


def retire(table: Table, samples: Sample | Sequence[Sample]) -> int:
    """Makes the rows of a sample (or of every sample of an epoch) unselectable, priority 0, where they
    still hold what was picked: `gear_jax.retire` outside jit. Returns the count of rows retired."""
    op = "gear_jax.host.retire"
    table = _args.check_table(table, op)
    _args.check_priorities_settable(table, op)
    if isinstance(samples, Sample):
        samples = [samples]
    elif not isinstance(samples, (list, tuple)):
        raise InvalidArgumentError(
            f"{op}: samples must be a gear_jax.Sample or a list of them (an epoch), "
            f"got {type(samples).__name__}"
        )
    sizes = [_args.check_sample(s, op, table) for s in samples]  # all checked before any is retired
    return sum(update_priorities(table, s, np.zeros(b, np.float32)) for s, b in zip(samples, sizes))


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
      batch_size: as for `sample_gather`.
      fields: as for `sample_gather`.
      method: as for `sample_gather`.
      priority_exponent: as for `sample_gather`.
      window: as for `sample_gather`.
      rng: a `numpy.random.Generator` (64 bits drawn per call, as `sample_gather` draws them) or
        an int seed for a new one; None: a Generator seeded from the operating system.
      buffers: how many sets of arrays the calls cycle through (>= 1).
      short_episodes: as for `sample_gather`: with a window, "pad" (the default) gives an episode
        shorter than the window one padded window, "skip" never picks it (not for prioritized windows).

    Raises:
      InvalidArgumentError: a bad argument (here, not at the first call), as for `sample`.
      TableClosedError: the table is closed (here, and at a call once it was closed).

    Warns:
      UserWarning: as `sample` (a priority_exponent that has no effect with the method).
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
        short_episodes: str = "pad",
    ):
        op = "gear_jax.host.Sampler"
        table = _args.check_table(table, op)
        b, method_id, exponent, win, plan = _checked_selection(
            table, batch_size, method, priority_exponent, window, fields, True, op, short_episodes
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
            arrays = [np.empty(shape, dtype) for _, shape, dtype in plan.outputs]
            draw = _native.HostDraw(
                table.native, b, method_id, exponent, win, plan.field_ids, plan.steps, arrays
            )
            self._sets.append((draw, draw.picks(), _batch(plan, arrays)))
        self._next = 0
        self._last: Sample | None = None

    def __call__(self) -> tuple[Sample, dict[str, np.ndarray]]:
        """Draws the next batch: (Sample, batch), numpy arrays that the sampler reuses (see above)."""
        draw, picks, batch = self._sets[self._next]
        self._next = (self._next + 1) % len(self._sets)
        bits = self._draw_64_bits()
        selectable = draw.run(bits & 0xFFFFFFFF, bits >> 32)
        indices, generations, probabilities, starts, lengths = picks
        picked = (indices, generations, probabilities, starts, selectable, lengths)
        sample = self._last = _new_sample(picked, self._window, self._table)
        return sample, dict(batch)

    def update_priorities(self, priorities: Any) -> int:
        """Sets the priorities of the last draw's rows (`update_priorities` with its Sample)."""
        if self._last is None:
            raise InvalidArgumentError(
                "gear_jax.host.Sampler.update_priorities: nothing drawn yet; call the sampler first"
            )
        return update_priorities(self._table, self._last, priorities)

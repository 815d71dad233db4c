"""Tables in named shared host memory: create, attach from other processes, insert, write episodes."""

from __future__ import annotations

import numbers
import os
import re
import secrets
import time
import types
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

import jax

from gear_jax import _native, _rows
from gear_jax.casting import StepConverter, check_casting
from gear_jax.errors import (
    GearJaxError,
    InvalidArgumentError,
    RateLimiterTimeout,
    SpecError,
    TableClosedError,
    TableMismatchError,
    check_flag,
)
from gear_jax.rate_limiter import RateLimiter, RateLimiterCounts, check_count, check_timeout
from gear_jax.spec import TableSpec
from gear_jax.writers import AdmittedInserts, EpisodeWriter, row_writer

_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
POOL_NAME_PREFIX = "gear_jax_pool_"  # names of closed tables the pool keeps (xla_ffi/table_pool.cc)


def _check_name(name: Any, op: str, creating: bool) -> str:
    """`name` if it can name a table (a new one when `creating`); InvalidArgumentError with the fix."""
    if not isinstance(name, str) or not _NAME_PATTERN.match(name) or name in (".", ".."):
        raise InvalidArgumentError(
            f"{op}: name {name!r} must be 1-200 characters of letters, digits, '_', '.', '-' "
            "(not '.' or '..')"
        )
    if creating and name.startswith(POOL_NAME_PREFIX):
        raise InvalidArgumentError(
            f"{op}: name {name!r} starts with {POOL_NAME_PREFIX!r}, which names the pool's closed tables "
            "(other processes remove them when their owner is gone); choose another name"
        )
    return name


# A row's state word (kernels/table_view.h): its generation in the high 32 bits (odd while a writer holds
# the row), its priority's float32 bits in the low 32.
STATE_GENERATION_SHIFT = np.uint64(32)


def state_generation(states: np.ndarray) -> np.ndarray:
    """The generations (uint64) of state words."""
    return states >> STATE_GENERATION_SHIFT


def state_priority(states: np.ndarray) -> np.ndarray:
    """The priorities (float32) of state words."""
    return (states & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)


# `RowWriter.add`'s batch_axis (xla_ffi/row_writer.h): values may come as a batch of one row, every value
# or none (Table.add), or must (Table.insert).
BATCH_OF_ONE_OR_ROW = 1
BATCH_OF_ONE = 2
_ONE_PRIORITY = (type(None), float, int)  # priorities an insert of one row passes to the short path


class Table:
    """A replay table in named shared host memory.

    Create one with `Table.create(spec)`; other processes on the host open it with
    `Table.attach(table.name)` and insert into the same memory. Inside `jax.jit`, pass the table to
    `gear_jax.sample`, `gear_jax.gather` and `gear_jax.update_priorities` as a static Python object.

    A compiled function follows the table it was traced with: once the table is closed it raises
    instead of reading freed memory. The creator removes the name on `close()` (or at exit); memory
    stays mapped until every process that attached has closed it. A closed table's memory and handle
    may go to the pool of closed tables (`gear_jax.pool`): a later table of the same spec created from
    it gets the same handle, compares equal to the closed one, and functions compiled for the closed
    table run on it.

    A table created with a `RateLimiter` paces its actors and learners (`gear_jax.rate_limiter`):
    `insert`, `add` and `EpisodeWriter.end_episode` wait for room, and the learner calls
    `await_samples(batch_size)` before each jitted sampling step.
    """

    def __init__(self, native: Any, spec: TableSpec, casting: str = "fit"):
        self._native = native
        self._spec = spec
        self._casting = check_casting(casting)
        self._steps = StepConverter(spec.fields)
        self._batches = _rows.Batches(spec)
        self._finalizer = weakref.finalize(self, native.close)
        limiter = native.rate_limiter()
        self._rate_limiter = (
            None
            if limiter is None
            else RateLimiter(
                limiter["min_size_to_sample"],
                limiter["samples_per_insert"] or None,
                limiter["error_buffer"] if limiter["samples_per_insert"] else None,
            )
        )
        rules = native.sampling_rules()
        self._max_times_sampled: int | None = int(rules["max_times_sampled"]) or None
        self._queue = bool(rules["queue"])
        if self._queue:
            self._rate_limiter = None  # the queue's own (inserts less consumed rows within the capacity)
        memory = np.frombuffer(native.mapping(), dtype=np.uint8)  # views keep the mapping alive
        self._memory_span = (memory.__array_interface__["data"][0], memory.nbytes)
        layout = native.layout()
        capacity, steps = spec.capacity, spec.max_steps

        def column(offset: int, dtype: Any, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
            return np.ndarray(shape, dtype=dtype, buffer=memory, offset=offset, strides=strides)

        self._columns: dict[str, np.ndarray] = {}
        for (name, field), (offset, row_stride, step_bytes) in zip(spec.fields.items(), layout["fields"]):
            inner = tuple(int(s) for s in np.empty(field.shape, field.dtype).strides)
            if spec.step_ring:  # the ring: [step_capacity, *shape]
                shape, strides = (spec.step_capacity, *field.shape), (step_bytes, *inner)
            else:
                shape, strides = (capacity, steps, *field.shape), (row_stride, step_bytes, *inner)
            self._columns[name] = column(offset, field.dtype, shape, strides)
        self._first_step = (
            column(layout["first_step"], np.uint64, (capacity,), (8,)) if spec.step_ring else None
        )
        self._state = column(layout["state"], np.uint64, (capacity,), (8,))
        self._length = column(layout["length"], np.int32, (capacity,), (4,))
        self._insert_seq = column(layout["insert_seq"], np.uint64, (capacity,), (8,))
        self._times_sampled = column(layout["times_sampled"], np.uint32, (capacity,), (4,))
        # `add` of a transition table writes through a RowWriter: one native call for common values.
        self._row_writer = row_writer(native, spec) if steps == 1 and not spec.step_ring else None

    # -- opening and closing ------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        spec: TableSpec,
        name: str | None = None,
        pin: bool = True,
        reuse: bool = True,
        casting: str = "fit",
        outlive_creator: bool = False,
        rate_limiter: RateLimiter | None = None,
        max_times_sampled: int | None = None,
        queue: bool = False,
    ) -> Table:
        """Creates a table in shared memory (mode 0600).

        A table whose creator died without closing it (killed, `os._exit`, a crash) and that no other
        process has open any more is removed by the next `Table.create` on the host, or by
        `python -m gear_jax.cleanup --remove` (`gear_jax.cleanup`), unless `outlive_creator` is set.

        Args:
          spec: the table's `TableSpec`.
          name: the shared-memory name; by default an unguessable `gear_jax_<32 hex digits>`.
          pin: register the memory with CUDA (pinned and mapped, so GPU kernels read it) where this
            build has the CUDA handlers and the process sees a GPU. Ignored otherwise.
          reuse: take the memory (and, for the same spec, the handle) of a table this process closed,
            from the pool of closed tables (`gear_jax.pool`), when one fits. Such memory is already
            pinned; its rows start empty, but field bytes are not zeroed (no read returns bytes of a
            row beyond what its writer wrote).
          casting: how inserted values are cast to the fields' dtypes: "fit" (within a kind when every
            value fits: float64 into float32, int64 into int32) or "strict" (only safe casts). See
            `gear_jax.casting`; settable later as `table.casting`.
          outlive_creator: keep the table in /dev/shm when this process dies without closing it, for a
            process to attach later (a restarted creator, say), even while no process has it open.
            Such a table is removed only by `close()` (a normal exit closes it too), by hand, or by
            `python -m gear_jax.cleanup --remove --include_persistent`.
          rate_limiter: a `gear_jax.RateLimiter` pacing inserts against samples, kept in the table's
            shared header for every process that attaches (`gear_jax.rate_limiter`); None: no limiter
            (nothing waits, nothing is counted).
          max_times_sampled: retire each row's contents after this many samples (1 to 65535; None: no
            limit), as Reverb's `max_times_sampled`: the sample that takes the last one sets the row's
            priority to 0 (unselectable, its slot reusable), and `update_priorities` never makes it
            selectable again. Counted exactly across processes: a pick of a row with no sample left (taken
            by another learner, or earlier in the same batch) fails, and `gather` returns it
            `valid=False`. See `gear_jax.queues`.
          queue: make the table a queue (`gear_jax.queues`): writers never overwrite a row no consumer
            has taken, so `insert`, `add` and `EpisodeWriter` wait (up to their `timeout`) while the
            queue is full, and learners consume rows with `gj.dequeue` inside jit, each row exactly once
            in commit order. A queue takes no `rate_limiter` (it has its own) and is not a step ring.

        Raises:
          InvalidArgumentError: `name` is malformed or already in use; `rate_limiter` is not a
            `RateLimiter`, or asks for more rows before sampling than the table holds;
            `max_times_sampled` or `queue` out of range or combined with what they exclude.
          OutOfSpaceError: /dev/shm cannot hold the table (also a RuntimeError).
        """
        if not isinstance(spec, TableSpec):
            raise InvalidArgumentError(f"spec must be a gear_jax.TableSpec, got {type(spec).__name__}")
        check_casting(casting)
        if rate_limiter is not None:
            if not isinstance(rate_limiter, RateLimiter):
                raise InvalidArgumentError(
                    f"Table.create: rate_limiter must be a gear_jax.RateLimiter or None, "
                    f"got {type(rate_limiter).__name__}"
                )
            if rate_limiter.min_size_to_sample > spec.capacity:
                raise InvalidArgumentError(
                    f"Table.create: rate_limiter.min_size_to_sample={rate_limiter.min_size_to_sample} is "
                    f"more than the table's capacity={spec.capacity}, so samples would wait for good; lower "
                    "it or raise the capacity"
                )
        limit = _check_sampling_rules(spec, rate_limiter, max_times_sampled, queue, "Table.create")
        if name is None:
            name = f"gear_jax_{secrets.token_hex(16)}"
        _check_name(name, "Table.create", creating=True)
        step_bytes = [f.step_bytes for f in spec.fields.values()]
        try:
            native = _native.NativeTable.create(
                name,
                spec.capacity,
                spec.max_steps,
                step_bytes,
                spec.to_json(),
                spec.spec_hash,
                check_flag(pin, "pin", "Table.create"),
                check_flag(reuse, "reuse", "Table.create"),
                outlive_creator=check_flag(outlive_creator, "outlive_creator", "Table.create"),
                rate_limiter=None if rate_limiter is None else rate_limiter.native_settings(),
                step_capacity=spec.step_capacity or 0,
                max_times_sampled=limit,
                queue=bool(queue),
            )
        except GearJaxError:  # raised as gear_jax's own by the native module (xla_ffi/module.cc)
            raise
        except ValueError as e:
            raise InvalidArgumentError(str(e)) from e
        return cls(native, spec, casting)

    @classmethod
    def attach(
        cls, name: str, spec: TableSpec | None = None, pin: bool = False, casting: str = "fit"
    ) -> Table:
        """Opens a table that another process (or this one) created, by name.

        Args:
          name: the creator's `table.name`.
          spec: if given, the table must have exactly this spec.
          pin: register the memory with CUDA in this process too (as `create` does). Off by default:
            actor processes that only write need no CUDA context; a learner that samples on a GPU
            from a table another process created passes `pin=True`.
          casting: this process's casting policy for inserts, as in `create`.

        Raises:
          TableNotFoundError: no table of that name exists on this host.
          TableMismatchError: the mapping is not a gear_jax table, or its spec differs from `spec`.
        """
        _check_name(name, "Table.attach", creating=False)
        check_casting(casting)
        if spec is not None and not isinstance(spec, TableSpec):
            raise InvalidArgumentError(
                f"Table.attach: spec={spec!r} must be a gear_jax.TableSpec (or None to take the table's own)"
            )
        try:
            native = _native.NativeTable.attach(name, check_flag(pin, "pin", "Table.attach"))
        except GearJaxError:  # TableNotFoundError, TableMismatchError: raised by the native module
            raise
        except RuntimeError as e:  # a directory, a symbolic link, a file that can not be mapped
            raise TableMismatchError(
                f"Table.attach: '/dev/shm/{name}' can not be opened as a gear_jax table ({e}); "
                "check the name (table.name of the creator)"
            ) from None
        try:
            stored = _stored_spec(name, native)
            if spec is not None and spec != stored:
                raise TableMismatchError(
                    f"table '{name}' (/dev/shm/{name}) has spec {stored.to_json()}, "
                    f"not the requested {spec.to_json()}"
                )
        except BaseException:
            native.close()
            raise
        return cls(native, stored, casting)

    def close(self) -> None:
        """Closes this process's view of the table. Idempotent. The creator also removes the name.

        The mapping is let go at once (unless an `EpisodeWriter` of this process still holds a row:
        then when it gives the row back), even while compiled functions or jit caches still hold this
        `Table` object.
        """
        self._finalizer()
        # Views a caller still holds keep the mapping alive (module.cc's TableMapping), but this Table
        # drops its own so that a closed table lets go of its memory as soon as the caller's are gone.
        self._columns = {}
        self._row_writer = None
        self._state = self._length = self._insert_seq = self._times_sampled = self._first_step = None

    def __enter__(self) -> Table:
        return self

    # -- sampling, as methods (the same functions as gear_jax.sample, gather, update_priorities) ----

    def sample(self, key: Any, batch_size: int, **kwargs: Any) -> Any:
        """`gear_jax.sample(self, key, batch_size, **kwargs)`: usable inside `jax.jit`."""
        from gear_jax import ops

        return ops.sample(self, key, batch_size, **kwargs)

    def gather(self, sample: Any, fields: Any = None, window: int | None = None) -> dict[str, Any]:
        """`gear_jax.gather(self, sample, fields, window)`: usable inside `jax.jit`."""
        from gear_jax import ops

        return ops.gather(self, sample, fields, window)

    def sample_batch(self, key: Any, batch_size: int, fields: Any = None, **kwargs: Any) -> tuple[Any, dict]:
        """`sample` then `gather` of its rows: (Sample, batch). `kwargs` are `sample`'s."""
        smp = self.sample(key, batch_size, **kwargs)
        return smp, self.gather(smp, fields)

    def update_priorities(self, sample: Any, priorities: Any, after: Any = None) -> Any:
        """`gear_jax.update_priorities(self, sample, priorities, after)`: usable inside `jax.jit`."""
        from gear_jax import ops

        return ops.update_priorities(self, sample, priorities, after=after)

    def __eq__(self, other: object) -> bool:
        # Compiled calls carry (handle, spec hash): tables equal in those are one table to them.
        if not isinstance(other, Table):
            return NotImplemented
        return (self.handle, self._spec.spec_hash) == (other.handle, other._spec.spec_hash)

    def __hash__(self) -> int:
        return hash((self.handle, self._spec.spec_hash))

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"size={self.size}"
        return f"Table(name={self.name!r}, capacity={self.capacity}, max_steps={self.max_steps}, {state})"

    # -- properties -----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._native.name

    @property
    def spec(self) -> TableSpec:
        return self._spec

    @property
    def casting(self) -> str:
        """How inserted values are cast to the fields' dtypes: "fit" or "strict" (`gear_jax.casting`)."""
        return self._casting

    @casting.setter
    def casting(self, casting: str) -> None:
        self._casting = check_casting(casting)

    @property
    def capacity(self) -> int:
        return self._spec.capacity

    @property
    def max_steps(self) -> int:
        return self._spec.max_steps

    @property
    def memory_span(self) -> tuple[int, int]:
        """(address, bytes) of the table's mapping in this process: what no array a call writes may
        overlap."""
        return self._memory_span

    @property
    def closed(self) -> bool:
        return self._native.closed

    @property
    def outlive_creator(self) -> bool:
        """Whether the table was created to stay when its creator dies (`Table.create`)."""
        return bool(self._live().persistent)

    @property
    def pinned(self) -> bool:
        """Whether the memory is registered with CUDA in this process (GPU kernels can read it)."""
        return bool(self._native.pinned)

    @property
    def handle(self) -> int:
        """The integer compiled calls carry to find this table in the process's registry."""
        return self._native.handle

    @property
    def native(self) -> Any:
        """The table's native object (`gear_jax._native`): what gear_jax's own modules, benchmarks and
        tests call below the Python API. Not a stable interface."""
        return self._native

    @property
    def columns(self) -> Mapping[str, np.ndarray]:
        """Live views of every field's column in shared memory, `[capacity, max_steps, *shape]` each (a
        step ring: the ring, `[step_capacity, *shape]`; an episode's steps are at its `first_step`
        modulo step_capacity).

        Reading them bypasses the row protocol (a row may be half written); writing them bypasses the
        seqlock. For inspection, checkpoints and tests; a learner reads through `gather`."""
        self._live()
        return types.MappingProxyType(self._columns)

    @property
    def status_columns(self) -> Mapping[str, np.ndarray]:
        """Live views of the per-row status columns: `state` (uint64: generation << 32 | priority bits),
        `length` (int32), `insert_seq` (uint64), `times_sampled` (uint32), each `[capacity]`, and in a step
        ring `first_step` (uint64: the sequence number of each episode's first step). Same caveats as
        `columns`; `row_status()` gives a decoded snapshot."""
        self._live()
        ring = {} if self._first_step is None else {"first_step": self._first_step}
        return types.MappingProxyType(
            {
                "state": self._state,
                "length": self._length,
                "insert_seq": self._insert_seq,
                "times_sampled": self._times_sampled,
                **ring,
            }
        )

    @property
    def size(self) -> int:
        """Rows holding a committed trajectory (at most `capacity`)."""
        return int(self._live().size)

    @property
    def max_priority(self) -> float:
        """The largest priority any row of the table was inserted or updated with so far, by any process
        (0.0 before a row had a priority above 0). It never goes down: the priority prioritized replay
        gives new rows (`insert(..., priorities="max")`, `gj.insert` inside jit)."""
        return float(self._live().max_priority())

    @property
    def rate_limiter(self) -> RateLimiter | None:
        """The table's rate limiter settings (the creator's, read from the shared header by every process
        that attaches), or None for a table without one."""
        return self._rate_limiter

    @property
    def max_times_sampled(self) -> int | None:
        """Samples after which a row's contents are retired (`Table.create`), None for no limit."""
        return self._max_times_sampled

    @property
    def queue(self) -> bool:
        """Whether the table is a queue (`Table.create(..., queue=True)`, `gear_jax.queues`)."""
        return self._queue

    @property
    def unconsumed(self) -> int:
        """Rows a sample may select now: in a queue, the rows no consumer has taken yet."""
        return int(self._live().selectable)

    def rate_limiter_counts(self) -> RateLimiterCounts:
        """The limiter's shared counts now: inserts and samples admitted since the table was made, the
        table's size, and `diff = inserts * samples_per_insert - samples` (None without a ratio). A table
        without a limiter counts nothing (inserts and samples stay 0)."""
        c = self._live().rate_limiter_counts()
        ratio = self._rate_limiter is not None and self._rate_limiter.samples_per_insert is not None
        return RateLimiterCounts(
            int(c["inserts"]), int(c["samples"]), int(c["size"]), c["diff"] if ratio else None
        )

    def can_sample(self, n: int) -> bool:
        """Whether `await_samples(n)` would return at once (nothing is counted). Without a limiter: whether
        the table holds a row. A queue: whether it holds `n` unconsumed rows."""
        n = check_count(n, "Table.can_sample")
        if self._queue:
            return self.unconsumed >= n
        return bool(self._live().can_sample(n))

    def await_samples(self, n: int, timeout: float | None = None) -> None:
        """The learner's side of the rate limiter: waits until `n` samples may proceed, then counts them.

        Call it on the host with the batch size before each jitted step that samples (`gj.sample` inside
        jit neither waits nor counts: a step never blocks inside XLA). The wait releases the GIL and polls
        the shared counts (50 us, backing off to 1 ms). Without a limiter it waits only for a first row
        and counts nothing. A queue's consumer waits until the queue holds `n` unconsumed rows (nothing
        is counted: `gj.dequeue` counts the rows it consumes); with several consumers another may take
        them first, and the dequeue then returns some picks `valid=False`.

        Args:
          n: samples the next step takes (>= 1).
          timeout: seconds to wait at most; None waits as long as it takes; 0 tries once.

        Raises:
          RateLimiterTimeout: not admitted within `timeout` (the message has the counts and bounds).
          TableClosedError: the table was closed meanwhile, by this process or by its creator.
          InvalidArgumentError: `n` is more than the limiter's tolerance (2 * error_buffer) lets through.
        """
        native = self._live()
        n = check_count(n, "Table.await_samples")
        timeout = check_timeout(timeout, "Table.await_samples")
        if self._queue:
            return _await_unconsumed(self, n, timeout)
        native.await_samples(n, timeout)

    @property
    def nbytes(self) -> int:
        """Bytes of shared memory the table occupies."""
        return int(self._live().total_bytes)

    def _live(self) -> Any:
        if self._native.closed:
            raise TableClosedError(
                f"table {self._native.name!r} is closed; open it again with Table.attach or create a new one"
            )
        return self._native

    def row_status(self) -> dict[str, np.ndarray]:
        """A snapshot of every row's status: generation, priority, length, insert_seq, times_sampled (and
        first_step in a step ring)."""
        # The views taken once: a close() on another thread meanwhile drops the attributes, but views
        # held here keep the mapping (module.cc's TableMapping) until the copies are made.
        views = (self._state, self._length, self._insert_seq, self._times_sampled)
        first_step = self._first_step
        self._live()
        if any(v is None for v in views):
            raise TableClosedError(f"table {self._native.name!r} was closed while its status was read")
        state, length, insert_seq, times_sampled = (v.copy() for v in views)
        ring = {} if first_step is None else {"first_step": first_step.copy()}
        return {
            "generation": state_generation(state).astype(np.uint32),
            "priority": state_priority(state),
            "length": length,
            "insert_seq": insert_seq,
            "times_sampled": self.times_sampled_counts(times_sampled),
            **ring,
        }

    def times_sampled_counts(self, words: np.ndarray) -> np.ndarray:
        """The counts of samples in `words` of the `times_sampled` column: the words themselves, or in a
        table with `max_times_sampled` their low 16 bits (the high 16 tag the contents' generation)."""
        return words & np.uint32(0xFFFF) if self._max_times_sampled else words

    # -- writing --------------------------------------------------------------------------------

    def insert(
        self,
        batch: Mapping[str, Any],
        priorities: Any = None,
        lengths: Any = None,
        timeout: float | None = None,
    ) -> np.ndarray:
        """Inserts a batch of rows; returns their row ids, int32[B].

        The rows go into the ring in batch order, so a batch larger than the table (or than the rows
        writers do not hold) keeps its last rows, as later inserts would: ids[i] and ids[j] (i < j) are
        then the same row, which holds row j of the batch. A step ring's episodes likewise retire the
        oldest steps, those of the batch's own first episodes included.

        Args:
          batch: one array per field (numpy, JAX or PyTorch), `[B, *shape]` for a transition table,
            `[B, T, *shape]` with `1 <= T <= max_steps` for a trajectory table. Values are cast to the
            fields' dtypes by the table's `casting` policy (`gear_jax.casting`): by default within a
            kind when every value fits (float64 into float32, int64 into int32). Host arrays
            (PyTorch CPU tensors, pinned or not, included) are read in place; a batch with a CUDA
            tensor goes through `gear_jax.torch.insert_tensors`: one copy from the device into the rows.
          priorities: float[B] or a scalar, finite and >= 0; default 1. Rows of priority 0 are stored
            but not sampled until their priority is raised. "max": the largest priority any row of the
            table was given so far (`max_priority`, 1 while no row had one), the priority prioritized
            replay gives new experience.
          lengths: int[B] steps actually used per row (trajectory tables), each in [1, T]; default T.
          timeout: with a rate limiter, seconds to wait at most for the B rows to be admitted (before any
            is claimed); None waits as long as it takes. Ignored without a limiter (nothing waits).

        Raises:
          InvalidArgumentError: missing or unknown fields, wrong shapes or dtypes (one message names
            every refused field), bad priorities or lengths, a batch the rate limiter can never admit.
            Nothing is written then.
          RateLimiterTimeout: the rate limiter did not admit the rows in time. Nothing is written.
          TableClosedError: the table was closed while the insert waited. Nothing is written.
        """
        if timeout is not None:
            timeout = check_timeout(timeout, "Table.insert")
        if _rows.names_max_priority(priorities):
            priorities = self.max_priority or 1.0
        writer = self._row_writer
        if (
            writer is not None
            and type(batch) is dict
            and lengths is None
            and type(priorities) in _ONE_PRIORITY
        ):
            # A batch of one row (a vector env of one env): the one-row short path, values checked natively.
            # -1: not a batch of one (or a value it does not take); -2: closed, refused by `_live` below.
            # A float goes as it is (the native path checks it); an int is read as _rows reads it (one
            # too large for a double is refused by name, not by pybind).
            priority = 1.0 if priorities is None else priorities
            if type(priority) is int:
                priority = _rows.priority(priority, "priorities")
            claimed = writer.add(batch, self._casting == "strict", priority, timeout, BATCH_OF_ONE)
            if claimed >= 0:
                return np.array([claimed], np.int32)
        native = self._live()
        checked = self._batches.ready(batch, self._casting)
        if checked is None:
            if isinstance(batch, Mapping) and _rows.holds_device_tensor(batch.values()):
                if self._spec.step_ring:  # the ring's steps are claimed in native code, from host memory
                    batch = {n: v.cpu() if _rows.is_device_tensor(v) else v for n, v in batch.items()}
                    return self.insert(batch, priorities, lengths, timeout)
                from gear_jax.torch import insert_tensors  # from the device straight into the rows

                return insert_tensors(self, batch, priorities, lengths, timeout)
            checked = self._batches.host(batch, self._casting)
        arrays, rows, steps = checked
        if rows == 0:
            return np.zeros((0,), np.int32)
        if priorities is not None:  # None: 1 for every row (the native default)
            priorities = _rows.priorities(priorities, rows)
        if lengths is not None:  # None: `steps` for every row
            lengths = _rows.lengths(lengths, rows, steps)
        types = self._batches.native_types  # arrays of other dtypes are converted natively (`ready`)
        try:
            return native.insert(arrays, rows, steps, lengths, priorities, timeout, True, types)
        except OverflowError:  # a value the native cast could not store: the general path names it
            arrays, rows, steps = self._batches.host(batch, self._casting)
            return native.insert(arrays, rows, steps, lengths, priorities, timeout)

    def add(self, row: Mapping[str, Any], priority: float | str = 1.0, timeout: float | None = None) -> int:
        """Inserts one row; returns its row id. The one-transition-per-call loop of a single environment.

        Args:
          row: one value per field, without a batch axis: of the field's shape for a transition table
            (numpy arrays, numpy or Python scalars, lists), `[T, *shape]` for a trajectory table. Values
            are cast by the table's `casting` policy, as in `insert`. A batch of one (every value with one
            more leading axis, of size 1, as a vector environment of one environment gives) is stored as
            that one row; batches of more rows go through `insert`.
          priority: finite and >= 0; or "max": the largest priority any row of the table was given so far
            (`max_priority`, 1 while no row had one), as `insert(..., priorities="max")`.
          timeout: with a rate limiter, seconds to wait at most for the row to be admitted, as in `insert`.

        Raises:
          InvalidArgumentError: as `insert`; a value with a batch axis that is not a batch of one (the
            message names `insert` and `v[0]`). Nothing is written then.
          RateLimiterTimeout, TableClosedError: as `insert`. Nothing is written then.
        """
        if timeout is not None:
            timeout = check_timeout(timeout, "Table.add")
        writer = self._row_writer
        if type(priority) not in _ONE_PRIORITY and not isinstance(priority, str):
            priority = _rows.priority(priority)  # a bool, a numpy scalar, ...: the one rule of _rows
        if writer is not None and type(row) is dict:  # the short path: a row id, or -1 / -2
            try:
                claimed = writer.add(row, self._casting == "strict", priority, timeout, BATCH_OF_ONE_OR_ROW)
            except TypeError:  # a priority that is not a number: "max" below, or refused below
                claimed = -1
            if claimed >= 0:
                return claimed
        native = self._live()
        if not isinstance(row, Mapping):
            raise InvalidArgumentError(f"row must map field names to values, got {type(row).__name__}")
        if _rows.names_max_priority(priority, "Table.add", rows=None, name="priority"):
            return self.add(row, self.max_priority or 1.0, timeout)
        try:
            return self._add_general(native, row, priority, timeout)
        except InvalidArgumentError as e:
            one, hint = self._batch_of_one(row)
            if one is None:
                if hint is None:
                    raise
                raise InvalidArgumentError(f"{e}\n{hint}") from None
        return self.add(one, priority, timeout)  # every value one axis shorter: the row it holds

    def _add_general(self, native: Any, row: Mapping[str, Any], priority: Any, timeout: Any) -> int:
        """`add`'s general path (any value type, casts, trajectory tables, device tensors)."""
        if not self._spec.is_trajectory and not _rows.holds_device_tensor(row.values()):
            values = self._steps(row, self._casting, "row")
            if type(row) is dict and self._row_writer is not None:  # the short path refused it: say why, once
                self._steps.warn_general_path(row, self._casting, "row")
            priority = _rows.priority(priority)
            with AdmittedInserts(self, 1, timeout) as admitted:
                claimed = native.claim()
                try:
                    for column, value in zip(self._columns.values(), values):
                        column[claimed, 0] = value
                except BaseException:
                    native.abandon(claimed)
                    raise
                admitted.commit(claimed, 1, priority)
            return claimed
        batch = self._batches.row_as_batch(row)  # a value of another shape named as the caller gave it
        return int(self.insert(batch, priorities=[_rows.priority(priority)], timeout=timeout)[0])

    def _batch_of_one(self, row: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
        """For a row `add` refused: (the row without its batch axis, None) when every value is a batch of
        one (a leading axis of size 1 more than a row has), else (None, a hint naming the fix when some
        value has a batch axis, or None)."""
        fields = self._spec.fields
        if set(row) != set(fields):
            return None, None
        trajectory = self._spec.is_trajectory
        batched: dict[str, int] = {}  # field name -> the size of its value's batch axis
        for name, field in fields.items():
            value = row[name]
            try:
                shape = tuple(value.shape) if hasattr(value, "shape") else np.shape(value)
            except (TypeError, ValueError):  # ragged lists and the like: the general path's message
                return None, None
            inner = shape[2:] if trajectory else shape[1:]
            if len(shape) == len(field.shape) + (2 if trajectory else 1) and inner == field.shape:
                batched[name] = int(shape[0])
        if len(batched) == len(fields) and all(n == 1 for n in batched.values()):
            return {name: row[name][0] for name in fields}, None
        if not batched:
            return None, None
        listed = ", ".join(f"row[{name!r}]: {n}" for name, n in batched.items())
        if any(n != 1 for n in batched.values()):
            return None, (
                f"Table.add stores one row, without a batch axis; these values have a batch axis ({listed}). "
                "Store a batch with table.insert(batch), or pass one row: v[i] of each value"
            )
        others = sorted(set(fields) - set(batched))
        return None, (
            f"Table.add: some values have a leading batch axis of one ({listed}) and others not ({others}); "
            "pass v[0] of the batched ones, or give every value the batch axis and call table.insert(batch)"
        )

    def writer(self, deferred: Sequence[str] = ()) -> EpisodeWriter:
        """A step-by-step writer of episodes into rows of this table (use as a context manager).
        `deferred`: fields given once per episode at `end_episode(deferred=...)` instead of with each
        step (return-to-go, say); see `EpisodeWriter`."""
        self._live()
        return EpisodeWriter(self, deferred)

    # -- checkpoints (gear_jax/checkpoint.py) -----------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes a crash-safe checkpoint of every row (fields and status) to the directory `path`,
        replacing an earlier checkpoint there atomically: a process killed at any moment leaves the
        previous checkpoint loadable. Safe while other processes write: each saved row is a committed
        row as of some instant during the save; rows held by a writer are saved as empty. Streams the
        columns a few MiB at a time (no second copy of the table in memory). A step ring saves its
        committed episodes (as of one instant during the save, each exact), each with only its own
        steps: the checkpoint's size is that of the stored steps, not of step_capacity. See
        `gear_jax.checkpoint`.

        Raises:
          CheckpointError: `path` holds something other than a gear_jax checkpoint, or the table is closed.
        """
        from gear_jax import checkpoint

        checkpoint.save(self, path)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        name: str | None = None,
        pin: bool = True,
        casting: str = "fit",
        rate_limiter: RateLimiter | None = None,
        max_times_sampled: int | None = None,
        queue: bool = False,
    ) -> Table:
        """Creates a table from the checkpoint `Table.save` wrote to `path`: the same spec, field bytes,
        priorities, lengths, generations, insert order, times sampled and allocator cursor, so FIFO and
        LIFO order, prioritized sampling and the next row overwritten are those of the saved table.

        The table is created in new memory (never from the pool of closed tables, whose rows carry other
        generations), then filled: fields and status while every row is still empty, then the rows'
        states once every checksum passed, then the cursors and `size`. A process that attaches by
        `name` before `load` returns sees rows appear (each complete) and `size` settle at the end; it
        must not write before then (its rows could be overwritten by the load). `name`, `pin`,
        `casting` and `rate_limiter` are those of `Table.create`; a checkpoint keeps no limiter counts:
        the loaded rows count toward `size` (and so `min_size_to_sample`) but not as inserts.
        `max_times_sampled` and `queue` too: with a limit, each row keeps the samples it had taken (a
        row that had taken the limit's worth is retired); a queue holds the rows no consumer had taken
        (the consumed ones have priority 0), and its inserts wait for room as before.

        A step ring's checkpoint loads into a new ring of the same spec: its episodes back to back from
        the ring's start in insert order (first_step 0, then each one after the last), in the rows they
        had, with their priorities, generations, insert order and times sampled; the step cursor
        follows the restored steps, so inserts go on after them and retire the oldest first.

        Raises:
          CheckpointError: `path` is not a gear_jax checkpoint, is of a newer format, names files
            outside itself or symbolic links, or a file is truncated, corrupted (checksum) or of
            another size than the spec implies, or its kind (padded rows or step ring) and its spec
            disagree. The new table is removed then.
          InvalidArgumentError: `name` is malformed or already in use.
        """
        from gear_jax import checkpoint

        table = checkpoint.load(
            path,
            lambda spec: cls.create(
                spec,
                name=name,
                pin=pin,
                reuse=False,
                casting=casting,
                rate_limiter=rate_limiter,
                max_times_sampled=max_times_sampled,
                queue=queue,
            ),
        )
        try:
            table._settle_loaded_rules()
        except BaseException:
            table.close()
            raise
        return table

    def _settle_loaded_rules(self) -> None:
        """After a load: a limited table's counts become its tagged words (rows that had used their
        samples up retired); a queue's limiter counts its unconsumed rows as inserts, so that inserts
        find room only where a row was consumed."""
        native = self._live()
        state = self._state.copy()
        generation = state_generation(state).astype(np.uint32)
        priority = state_priority(state)
        committed = (generation % 2 == 0) & (self._length >= 1)
        if self._max_times_sampled:
            counts = np.minimum(self._times_sampled, self._max_times_sampled).astype(np.uint32)
            self._times_sampled[:] = (((generation >> 1) & 0xFFFF) << 16) | counts
            used = np.flatnonzero(committed & (priority > 0) & (counts >= self._max_times_sampled))
            if used.size:
                native.host_update_priorities(
                    used.astype(np.int32), generation[used], np.zeros(used.size, np.float32)
                )
        if self._queue:
            native.count_published_inserts(int(np.count_nonzero(committed & (priority > 0))))


def _stored_spec(name: str, native: Any) -> TableSpec:
    """The spec in the header of the table `name` (attached as `native`), checked against the header's
    layout; TableMismatchError, naming the file and what is wrong, for a damaged or forged header.

    Everything a view or a writer of this process addresses comes from the spec (shapes, dtypes) over
    the layout (offsets, strides; checked by the native attach): a spec that the layout does not hold
    would read and write other rows' bytes.
    """
    where = f"Table.attach: '/dev/shm/{name}'"
    try:
        text = native.spec_json_bytes.decode("utf-8")
        stored = TableSpec.from_json(text)
    except UnicodeDecodeError as e:
        raise TableMismatchError(
            f"{where} has a damaged spec in its header: its JSON is not UTF-8 ({e})"
        ) from None
    except SpecError as e:
        reason = str(e) if len(str(e)) <= 1000 else str(e)[:997] + "..."
        raise TableMismatchError(f"{where} has a damaged spec in its header: {reason}") from None
    if stored.spec_hash != native.spec_hash:
        raise TableMismatchError(f"{where} has a damaged header: its spec hash does not match its spec")
    layout = native.layout()
    fields = layout["fields"]
    problem = None
    if len(fields) != len(stored.fields):
        problem = f"its spec has {len(stored.fields)} fields, its layout {len(fields)} fields"
    elif stored.capacity != layout["capacity"]:
        problem = f"its spec has capacity={stored.capacity}, its layout capacity={layout['capacity']}"
    elif stored.max_steps != layout["max_steps"]:
        problem = f"its spec has max_steps={stored.max_steps}, its layout max_steps={layout['max_steps']}"
    else:
        # Strides need no look: the native attach found every column exactly where the layout's
        # capacity, max_steps and step sizes put it (rows of max_steps steps each).
        for (field_name, field), (_, _, step_bytes) in zip(stored.fields.items(), fields):
            if field.step_bytes != step_bytes:
                problem = (
                    f"its spec gives field {field_name!r} (shape {field.shape}, {field.dtype.name}) "
                    f"{field.step_bytes} bytes a step, its layout {step_bytes}"
                )
                break
    if problem:
        raise TableMismatchError(f"{where} has a spec that does not match its layout: {problem}")
    return stored


# A Table is a pytree without leaves whose structure is the table itself: it can be passed to a jitted
# function as an ordinary argument (not only captured or marked static). Tables equal in (handle, spec
# hash) share compiled functions, as they do as static arguments.
jax.tree_util.register_pytree_node(Table, lambda table: ((), table), lambda table, _: table)


def _check_sampling_rules(
    spec: TableSpec, rate_limiter: Any, max_times_sampled: Any, queue: Any, op: str
) -> int:
    """Checks `Table.create`'s max_times_sampled and queue; returns the limit for the header (0: none)."""
    queue = check_flag(queue, "queue", op)
    limit = 0
    if max_times_sampled is not None:
        if (
            isinstance(max_times_sampled, bool)
            or not isinstance(max_times_sampled, numbers.Integral)
            or not 1 <= max_times_sampled <= 0xFFFF
        ):
            raise InvalidArgumentError(
                f"{op}: max_times_sampled={max_times_sampled!r} must be an integer from 1 to 65535 (samples "
                "after which a row is retired), or None for no limit"
            )
        limit = int(max_times_sampled)
    if queue:
        if rate_limiter is not None:
            raise InvalidArgumentError(
                f"{op}: a queue paces its writers itself (inserts wait while it is full); pass "
                "rate_limiter=None with queue=True"
            )
        if spec.step_ring:
            raise InvalidArgumentError(
                f"{op}: queue=True takes a table of padded rows (transitions or trajectories); a step ring "
                "retires episodes by step room, which a queue cannot"
            )
        if limit:
            raise InvalidArgumentError(
                f"{op}: a queue consumes each row once (gj.dequeue); max_times_sampled={limit} does not "
                "apply: leave it None"
            )
        if spec.capacity < 2:
            raise InvalidArgumentError(f"{op}: a queue needs capacity >= 2, got {spec.capacity}")
    return limit


def _await_unconsumed(table: Table, n: int, timeout: float | None) -> None:
    """A queue consumer's wait for `n` unconsumed rows: polls, sleeping 50 us and backing off to 1 ms."""
    if n > table.capacity:
        raise InvalidArgumentError(
            f"Table.await_samples: n={n} is more than the queue's capacity={table.capacity}; it would wait "
            "for good"
        )
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = 5e-5
    while table.unconsumed < n:
        if deadline is not None and time.monotonic() >= deadline:
            raise RateLimiterTimeout(
                f"Table.await_samples: the queue {table.name!r} held {table.unconsumed} unconsumed rows, "
                f"fewer than n={n}, for {timeout} s"
            )
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)

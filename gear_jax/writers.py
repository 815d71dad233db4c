"""Writers of rows one at a time: episodes step by step (`EpisodeWriter`), and rows admitted by the rate
limiter then committed one by one (`AdmittedInserts`: `Table.add`'s general path and the PyTorch bridge).

A writer holds a claimed row (odd generation: never sampled) while it writes, publishes it with its
length and priority, and gives it back empty when it stops without publishing (its finalizer does, for a
writer dropped without `close()`).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gear_jax import _native, _rows
from gear_jax.casting import StepConverter, cast
from gear_jax.errors import InvalidArgumentError, TableClosedError
from gear_jax.rate_limiter import check_timeout
from gear_jax.spec import TableSpec

if TYPE_CHECKING:
    from gear_jax.table import Table


def row_writer(native: Any, spec: TableSpec) -> Any:
    """A native writer of one step of every field: the short path of `Table.add` and `EpisodeWriter`
    (xla_ffi/row_writer.h), which writes what the general path (`gear_jax.casting`) would."""
    fields = [(name, f.dtype.kind, f.dtype.itemsize, list(f.shape)) for name, f in spec.fields.items()]
    return _native.RowWriter(native, fields)


def _live(table: Table) -> Any:
    """The table's native object, or TableClosedError once it is closed."""
    if table.closed:
        raise TableClosedError(
            f"table {table.name!r} is closed; open it again with Table.attach or create a new one"
        )
    return table.native


class DeferredFields:
    """The deferred fields of an episode writer (`EpisodeWriter`, `RemoteEpisodeWriter`): fields given once
    per episode at `end_episode(deferred=...)`, `[steps, *shape]`, instead of with each step."""

    def __init__(self, deferred: Any, spec: TableSpec):
        self.spec = spec
        self.names = self._checked(deferred, spec)
        self._appended = [name for name in spec.fields if name not in self.names]  # what a step gives
        # Appended in their place until end_episode gives them: a step stays one native short-path write.
        self._placeholders = {
            name: np.zeros(spec.fields[name].shape, spec.fields[name].dtype) for name in self.names
        }

    @staticmethod
    def _checked(deferred: Any, spec: TableSpec) -> tuple[str, ...]:
        """Distinct fields of `spec`, not all of them, in field order."""
        if isinstance(deferred, str):
            raise InvalidArgumentError(
                f"deferred must be a list of field names: deferred=[{deferred!r}], not a str"
            )
        if not isinstance(deferred, Sequence | set | frozenset):
            raise InvalidArgumentError(
                f"deferred must be a list of field names, got {type(deferred).__name__}"
            )
        names = tuple(deferred)
        unknown = [n for n in names if n not in spec.fields]
        if unknown:
            raise InvalidArgumentError(
                f"deferred names {unknown}, which are not fields of the table {list(spec.fields)}"
            )
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"deferred names a field twice: {list(names)}")
        if names and len(names) == len(spec.fields):
            raise InvalidArgumentError(
                "deferred names every field, so no step has a value to append; insert whole episodes with "
                "table.insert({name: values[None]}) instead"
            )
        return tuple(n for n in spec.fields if n in names)  # in field order

    def step(self, step: Any) -> Any:
        """`step` with zeros in place of the deferred fields; refuses a step that gives a deferred field
        or misses another."""
        if not self.names:
            return step
        appended = self._appended
        if not isinstance(step, Mapping) or set(step) != set(appended):
            if isinstance(step, Mapping):
                missing = [n for n in appended if n not in step]
                extra = sorted(str(n) for n in step if n not in appended)
                given = f"missing {missing}, unknown or deferred {extra}"
            else:
                given = type(step).__name__
            raise InvalidArgumentError(
                f"step must map every field but the deferred ones {list(self.names)} (given at "
                f"end_episode(deferred=...)) to a value, {appended}; got {given}"
            )
        return {**step, **self._placeholders}

    def values(self, deferred: Any, steps: int, casting: str) -> dict[str, np.ndarray]:
        """The checked values of end_episode's `deferred` for an episode of `steps` steps: each field's
        `[steps, *shape]`, cast by `casting`. Raises InvalidArgumentError naming every refused field."""
        if not self.names:
            if deferred is None:
                return {}
            raise InvalidArgumentError(
                "end_episode: deferred= is for writers made with table.writer(deferred=[field names]); "
                "this writer appends every field with each step"
            )
        if not isinstance(deferred, Mapping) or set(deferred) != set(self.names):
            given = sorted(map(str, deferred)) if isinstance(deferred, Mapping) else type(deferred).__name__
            raise InvalidArgumentError(
                f"end_episode: deferred must map each deferred field {list(self.names)} to its values "
                f"for the episode's {steps} steps; got {given}"
            )
        values, problems = {}, []
        for name in self.names:
            field, what = self.spec.fields[name], f"end_episode: deferred[{name!r}]"
            array, why = cast(deferred[name], field.dtype, casting, what)
            expected = (steps, *field.shape)
            if array is None:
                problems.append(f"{what} {why}")
            elif array.shape != expected:
                problems.append(f"{what} has shape {array.shape}, expected {expected} (one value per step)")
            else:
                values[name] = np.ascontiguousarray(array)
        if problems:
            raise InvalidArgumentError("\n".join(problems))
        return values


def check_room_for_a_step(steps: int, spec: TableSpec) -> None:
    """Refuses a step beyond `max_steps` of an episode that has `steps` (every episode writer's rule)."""
    if steps >= spec.max_steps:
        raise InvalidArgumentError(
            f"the episode already has max_steps={spec.max_steps} steps; call end_episode() first"
        )


class EpisodeWriter:
    """Writes episodes step by step, in place, into the row it holds.

    The first `append` claims a row (odd generation: it is never sampled while being written); each
    step's arrays are copied straight into the table's memory; `end_episode` publishes the row with its
    length and priority. Leaving the `with` block (or `close()`) abandons an unfinished episode.

    In a step ring the episode's steps are staged in native memory of this writer (no Python
    accumulation) and `end_episode` claims exactly as many steps of the ring as the episode has, copies
    them there and publishes the episode: nothing is in the table before, so a writer killed mid-episode
    leaves nothing behind.

    Fields known only once the episode ends (return-to-go, a relabelled goal, a discounted return) are
    `deferred`: `append` takes every other field, and `end_episode(deferred={name: values})` gives each
    deferred field for every step at once (`[steps, *shape]`), written before the episode is published,
    so no reader ever sees the episode without them:

        with table.writer(deferred=["return_to_go"]) as writer:
            for step in episode:
                writer.append({"obs": step.obs, "action": step.action, "reward": step.reward})
            rewards = np.asarray(episode_rewards, np.float32)
            writer.end_episode(deferred={"return_to_go": np.cumsum(rewards[::-1])[::-1]})
    """

    def __init__(self, table: Table, deferred: Sequence[str] = ()):
        self._table = table
        self._deferred = DeferredFields(deferred, table.spec)
        self._steps = 0
        self._packer: Any = None  # a RowWriter, made on the first append
        # The row held, in a cell the finalizer shares: a writer dropped without close() (an
        # exception, say) still gives its row back instead of holding it for the process's lifetime.
        # The second entry: whether a queue admitted the row's insert (given back if it is abandoned).
        self._held: list[Any] = [None, False]
        self._finalizer = weakref.finalize(self, _abandon_held, table.native, self._held)
        self._convert = StepConverter(table.spec.fields)

    @property
    def _row(self) -> int | None:
        return self._held[0]

    @_row.setter
    def _row(self, row: int | None) -> None:
        self._held[0] = row

    @property
    def steps(self) -> int:
        """Steps appended to the current episode."""
        return self._steps

    def _stage(self, step: Mapping[str, Any]) -> None:
        """A step ring's `append`: the step is staged in the writer's native memory."""
        table = self._table
        if self._packer is None:
            self._packer = row_writer(table.native, table.spec)
        if type(step) is dict and self._packer.pack(step, table.casting == "strict"):
            self._packer.stage_packed()
        else:
            spec = table.spec
            host = {
                n: v.cpu() if _rows.is_device_tensor(v) else v for n, v in step.items()
            }  # device tensors: one copy to the host, checked and cast as host values
            converted = self._convert(host, table.casting)
            if type(step) is dict and not _rows.holds_device_tensor(step.values()):
                self._convert.warn_general_path(host, table.casting, "step")
            fields = spec.fields.values()
            self._packer.stage_step(
                [np.ascontiguousarray(np.asarray(v, f.dtype)) for v, f in zip(converted, fields)]
            )
        self._steps += 1

    def append(self, step: Mapping[str, Any], timeout: float | None = None) -> None:
        """Appends one step: a mapping of every field name to a value of the field's shape, cast by the
        table's `casting` policy (`gear_jax.casting`), as `insert` casts.

        In a queue (`Table.create(..., queue=True)`) the first step of an episode waits while the queue
        is full: the episode's row is taken only once the queue has room for it. `timeout` bounds that
        wait (None: as long as it takes); other steps, and other tables, never wait here.

        Raises:
          InvalidArgumentError: missing or unknown fields, wrong shapes or dtypes (one message names
            every refused field), or an episode that
            would exceed `max_steps` (end it first).
          RateLimiterTimeout: a full queue had no room within `timeout`; the step was not appended
            (append it again later).
          TableClosedError: the table was closed (before or while the step waited).
        """
        if timeout is not None:
            timeout = check_timeout(timeout, "EpisodeWriter.append")
        table = self._table
        native = _live(table)
        spec = table.spec
        step = self._deferred.step(step)
        if not isinstance(step, Mapping) or set(step) != set(spec.fields):
            self._convert.refuse_keys(step, "step")
        check_room_for_a_step(self._steps, spec)
        if spec.step_ring:
            return self._stage(step)
        if type(step) is dict:  # the short path: checked and copied in one native call each
            if self._packer is None:
                self._packer = row_writer(native, spec)
            if self._packer.pack(step, table.casting == "strict"):
                if self._row is None:
                    self._claim(native, timeout)
                self._packer.write_packed(self._row, self._steps)
                self._steps += 1
                return
        device = _rows.holds_device_tensor(step.values())
        if device:  # device tensors are checked (not cast) here and copied once the row is held
            from gear_jax.torch import check_step, copy_step

            host = {n: v for n, v in step.items() if not _rows.is_device_tensor(v)}
            on_device = {n: check_step(table, n, v) for n, v in step.items() if n not in host}
            converted = StepConverter({n: spec.fields[n] for n in host})(host, table.casting)
            values = {**step, **on_device, **dict(zip(host, converted))}
        else:
            values = dict(zip(spec.fields, self._convert(step, table.casting)))
            if type(step) is dict:
                self._convert.warn_general_path(step, table.casting, "step")
        if self._row is None:
            self._claim(native, timeout)
        for name, value in values.items():
            if device and _rows.is_device_tensor(value):
                copy_step(table, name, self._row, self._steps, value)
            else:
                table.columns[name][self._row, self._steps] = value
        self._steps += 1

    def _claim(self, native: Any, timeout: float | None) -> None:
        """Claims the row the episode goes to. A queue admits the episode first (waiting while the queue
        is full): a writer never holds a row the queue has no room for."""
        if not self._table.queue:
            self._row = int(native.claim())
            return
        native.reserve_inserts(1, timeout)
        try:
            self._row = int(native.claim())
        except BaseException:
            native.return_inserts(1)
            raise
        self._held[1] = True

    def end_episode(
        self,
        priority: float | str = 1.0,
        timeout: float | None = None,
        deferred: Mapping[str, Any] | None = None,
    ) -> int:
        """Publishes the episode; returns its row id.

        With a rate limiter, first waits (holding the row) until the limiter admits one insert: an
        episode counts when it is published, not when it starts.

        Args:
          priority: finite and >= 0 (as `Table.add` takes it); or "max": the largest priority any row of
            the table was given so far (`max_priority`, 1 while no row had one), read when the episode
            is published, as `Table.add(..., priority="max")`.
          timeout: seconds to wait at most for the rate limiter; None waits as long as it takes.
          deferred: for a writer made with `table.writer(deferred=[...])`: every deferred field's values
            for the episode's steps, `[steps, *shape]`, cast by the table's casting policy; written
            before the episode is published.

        Raises:
          InvalidArgumentError: no step was appended, `priority` is neither "max" nor a number whose
            float32 is finite and >= 0, or `deferred` misses a deferred field, names another, or has a
            value of the wrong shape or dtype (nothing is written; the episode is kept).
          TableClosedError: the table was closed (before or while waiting); the row is still held, and
            close() gives it back.
          RateLimiterTimeout: the limiter did not admit the episode in time; the episode is kept (call
            end_episode again, or close() to abandon it).
        """
        if _rows.names_max_priority(priority, "EpisodeWriter.end_episode", rows=None, name="priority"):
            priority = self._table.max_priority or 1.0  # as Table.add reads "max"
        p = _rows.priority(priority)
        if self._table.spec.step_ring:
            if self._steps == 0:
                raise InvalidArgumentError("end_episode() needs at least one append() first")
            if timeout is not None:
                timeout = check_timeout(timeout, "EpisodeWriter.end_episode")
            values = self._deferred.values(deferred, self._steps, self._table.casting)
            _live(self._table)
            indices = list(self._table.spec.fields)
            for name, array in values.items():
                self._packer.replace_staged(indices.index(name), array)
            row = int(self._packer.commit_staged(p, timeout))  # a throw keeps the episode staged
            self._steps = 0
            return row
        if self._row is None:
            raise InvalidArgumentError("end_episode() needs at least one append() first")
        if timeout is not None:
            timeout = check_timeout(timeout, "EpisodeWriter.end_episode")
        values = self._deferred.values(deferred, self._steps, self._table.casting)
        native = _live(self._table)
        row, steps = self._row, self._steps
        for name, array in values.items():  # into the held row: no reader sees it before the commit
            self._table.columns[name][row, :steps] = array
        try:
            # Waits for the limiter first, holding the row: a timeout, a close or an interrupt meanwhile
            # leaves the row held and the episode kept.
            native.commit(row, steps, p, timeout, self._held[1])  # a queue's: admitted at the claim
        except TableClosedError:
            raise
        except RuntimeError:  # the row was taken over (reclaimed as a dead writer's): held no more
            if self._held[1]:  # a queue's admission of an episode never published
                native.return_inserts(1)
                self._held[1] = False
            self._row, self._steps = None, 0
            raise
        self._row, self._steps = None, 0
        self._held[1] = False
        return row

    def close(self) -> None:
        """Abandons an unfinished episode (the row becomes empty again), even after the table's
        close(): other processes may still be using the table."""
        _abandon_held(self._table.native, self._held)
        if self._packer is not None and self._table.spec.step_ring:
            self._packer.drop_staged()
        self._steps = 0

    def __enter__(self) -> EpisodeWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AdmittedInserts:
    """Rows the table's rate limiter admitted, for code that claims rows and commits them one at a time
    (`Table.add`'s general path, `gear_jax.torch.insert_tensors`).

    Entering waits until the limiter admits `rows` inserts (up to `timeout` seconds), which counts them;
    `commit` publishes a claimed row as one of them; leaving gives back those not committed (a failed
    write). Without a limiter nothing waits and nothing is counted.
    """

    def __init__(self, table: Table, rows: int, timeout: float | None):
        self._native = _live(table)
        self._limited = table.rate_limiter is not None
        self._rows = rows
        self._timeout = timeout
        self._left = 0

    def __enter__(self) -> AdmittedInserts:
        if self._limited:
            self._native.reserve_inserts(self._rows, self._timeout)
            self._left = self._rows
        return self

    def commit(self, row: int, length: int, priority: float) -> None:
        """Publishes `row` (claimed by this process) with `length` steps and `priority`."""
        self._native.commit(row, length, priority, None, self._limited)  # reserved: counted when admitted
        if self._limited:
            self._left -= 1

    def __exit__(self, *exc: object) -> None:
        if self._left > 0 and not self._native.closed:
            self._native.return_inserts(self._left)


def _abandon_held(native: Any, held: list[Any]) -> None:
    """Gives back the row in `held`, if any, and a queue's admission of it (a writer's close and
    finalizer)."""
    row, held[0] = held[0], None
    admitted, held[1] = held[1], False
    if row is not None:
        native.abandon(row)
    if admitted and not native.closed:
        native.return_inserts(1)

"""What an insert's rows must be, for every way rows come in: one home for batches, priorities and lengths.

`Table.insert` and `add`, `EpisodeWriter`, `gj.insert` inside jit, `gear_jax.torch.insert_tensors` and the
transition writers all prepare their rows here. Values become the fields' dtypes by the table's casting
policy through the one rule of `gear_jax.casting.cast_rule`: host arrays with every check, PyTorch
tensors with the value checks run by torch on their device, arrays traced inside jit with what the dtypes
decide at trace time (`casting.traced_cast_problem` says what only run time could check). Priorities are
finite, >= 0 and within float32 everywhere: checked here for host values, by the native handler at run
time for traced ones (xla_ffi/handler_checks.h), with the same message.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gear_jax.casting import (
    cast,
    refuse,
    short_cast,
    to_numpy,
    traced_cast_problem,
    warn_general_path,
)
from gear_jax.errors import InvalidArgumentError
from gear_jax.spec import TableSpec

_FLOAT32_MAX = float(np.finfo(np.float32).max)


# -- where values lie -----------------------------------------------------------------------------------


def torch_loaded() -> bool:
    """Whether PyTorch is imported: only then can a value be a device tensor."""
    return "torch" in sys.modules


def is_device_tensor(value: Any) -> bool:
    """Whether `value` is a PyTorch tensor outside host memory (CUDA): copied once, by gear_jax.torch."""
    return (
        type(value).__module__.startswith("torch")
        and getattr(value, "device", None) is not None
        and (value.device.type != "cpu")
    )


def holds_device_tensor(values: Any) -> bool:
    """Whether any of `values` is a PyTorch tensor outside host memory."""
    return torch_loaded() and any(map(is_device_tensor, values))


# -- priorities ---------------------------------------------------------------------------------------


def priority(value: Any, what: str = "priority") -> float:
    """One priority (`Table.add`, `EpisodeWriter.end_episode`) as a float, by the rule of `priorities`
    (`_host_priorities`): a number (not a bool, str or bytes) whose float32 is finite and >= 0; the
    float32's value is returned, as the table stores it. InvalidArgumentError naming `what` otherwise."""
    if (type(value) is float or type(value) is int) and 0 <= value <= _FLOAT32_MAX:  # the common case
        return float(np.float32(value))
    given = _host_priorities(value, what, "")
    if given.ndim != 0:
        raise InvalidArgumentError(f"{what} has shape {given.shape}; expected one number, finite and >= 0")
    return float(_checked_priorities(given, what, ""))


def names_max_priority(
    value: Any, op: str = "", rows: str | None = "an array of one per row", name: str = "priorities"
) -> bool:
    """Whether the argument `name` is the name "max" (the largest priority so far); False for values,
    and InvalidArgumentError for any other string. `rows` says what an array of priorities is; None for
    an argument of one priority (`Table.add`, the episode writers' `end_episode`)."""
    if not isinstance(value, str):
        return False
    if value != "max":
        prefix = f"{op}: " if op else ""
        if rows is None:
            accepted = 'a number (finite, >= 0) or "max" (the largest priority so far, `max_priority`)'
        else:
            accepted = f'None, a number, {rows}, or "max" (the largest priority so far)'
        raise InvalidArgumentError(f"{prefix}{name}={value!r}; pass {accepted}")
    return True


def _priority_dtype_ok(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer))


def priorities(
    value: Any, rows: int, op: str = "", broadcast: bool = True, matched: str = "the batch"
) -> np.ndarray:
    """Host priorities as float32[rows]: None gives 1 each, a scalar is broadcast (with `broadcast`), and
    every value must be a number whose float32 is finite and >= 0 (`_host_priorities`; nothing is written
    otherwise). Messages name `op` and say the rows are to match `matched`."""
    what = "priorities"
    prefix = f"{op}: " if op else ""
    if value is None:
        return np.ones((rows,), np.float32)
    given = _host_priorities(value, what, prefix)
    if given.ndim == 0 and broadcast:
        return np.full((rows,), _checked_priorities(given, what, prefix), np.float32)
    if given.shape != (rows,):
        raise InvalidArgumentError(
            f"{prefix}{what} has shape {given.shape}, expected ({rows},) to match {matched}"
        )
    return _checked_priorities(given, what, prefix)


def _host_priorities(value: Any, what: str, prefix: str) -> np.ndarray:
    """The one rule of host priorities, for `priority` (one) and `priorities` (one per row) alike, part
    one: `value` as a numpy array of numbers, refusing by name what is not numbers (bools, strings,
    bytes, objects; InvalidArgumentError "has dtype ...; expected floats"). A torch tensor must lie on
    the CPU. A Python number numpy holds as an object (an int beyond 64 bits, a Decimal, a Fraction) is
    read as its float, as `Table.add`'s native short path reads it. `_checked_priorities` is part two."""
    if hasattr(value, "detach") and hasattr(value, "device"):  # a torch tensor
        if value.device.type != "cpu":
            raise InvalidArgumentError(
                f"{prefix}{what} lie on {value.device}; move them to the CPU ({what}.cpu())"
            )
        value = value.detach()
        if value.is_floating_point():  # numpy has no torch.bfloat16: all floats as float32
            value = value.float()
    given = to_numpy(value, f"{prefix}{what}")
    if given.dtype == object and given.ndim == 0:
        number = given.item()
        if not isinstance(number, (str, bytes, bytearray, bool)) and hasattr(type(number), "__float__"):
            try:
                given = np.asarray(float(number))
            except OverflowError:  # beyond float64: beyond float32 as well
                raise _refused(f"{prefix}{what}", _clip(number), True) from None
            except (TypeError, ValueError):
                pass
    if not _priority_dtype_ok(given.dtype):
        shown = f" = {_clip(value)}" if given.ndim == 0 else ""
        raise InvalidArgumentError(f"{prefix}{what}{shown} has dtype {given.dtype}; expected floats")
    return given


def _checked_priorities(given: np.ndarray, what: str, prefix: str) -> np.ndarray:
    """Part two of the rule (`_host_priorities`): the float32 of every value, which must be finite and
    >= 0 (-0.0, the float32 of a tiny negative, is 0); InvalidArgumentError naming the first that is not,
    as the value given, and saying so when only its float32 is out of range."""
    with np.errstate(over="ignore", invalid="ignore"):
        p = given.astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(p) | (p < 0))
    if bad.size:
        i = int(bad[0])
        where = f"[{i}]" if given.ndim else ""
        original = given.reshape(-1)[i]
        overflow = bool(np.isfinite(original)) and not np.isfinite(p.reshape(-1)[i])
        raise _refused(f"{prefix}{what}{where}", str(original), overflow)
    return p


def _refused(label: str, shown: str, overflow: bool) -> InvalidArgumentError:
    """The refusal of the priority `label` = `shown`; `overflow`: finite, but not as a float32."""
    note = f" (as a float32, which holds at most {np.finfo(np.float32).max!s})" if overflow else ""
    return InvalidArgumentError(f"{label} = {shown}; priorities must be finite and >= 0{note}")


def _clip(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def traced_priorities(value: Any, rows: int, op: str, what: str, broadcast: bool, matched: str) -> jax.Array:
    """Priorities of a compiled call as float32[rows], checked at trace time for dtype and shape (a
    scalar is broadcast with `broadcast`); their values are checked by the handler at run time."""
    is_jax = isinstance(value, jax.Array | jax.core.Tracer)
    dtype = value.dtype if is_jax else np.asarray(value).dtype  # lists, numpy, torch: through numpy
    if not _priority_dtype_ok(dtype):
        raise InvalidArgumentError(f"{op}: {what} has dtype {dtype}; expected floats")
    p = jnp.asarray(value)
    if p.ndim == 0 and broadcast:
        p = jnp.broadcast_to(p, (rows,))
    if p.shape != (rows,):
        raise InvalidArgumentError(f"{op}: {what} has shape {p.shape}, expected ({rows},) to match {matched}")
    return p.astype(jnp.float32)


# -- lengths ------------------------------------------------------------------------------------------


def lengths(value: Any, rows: int, steps: int) -> np.ndarray:
    """Host steps used per row as int32[rows], each in [1, steps]."""
    n = to_numpy(value, "lengths")
    if n.shape != (rows,) or not np.issubdtype(n.dtype, np.integer):
        raise InvalidArgumentError(
            f"lengths has shape {n.shape} and dtype {n.dtype}; expected integers of shape ({rows},)"
        )
    bad = np.flatnonzero((n < 1) | (n > steps))
    if bad.size:
        raise InvalidArgumentError(
            f"lengths[{bad[0]}] = {n[bad[0]]} is outside [1, {steps}] (the batch's time axis)"
        )
    return n.astype(np.int32)


def traced_lengths(value: Any, rows: int, op: str) -> jax.Array:
    """Lengths of a compiled insert as int32[rows], checked at trace time for dtype and shape; the handler
    checks each lies in [1, T] at run time."""
    if not isinstance(value, jax.Array | jax.core.Tracer):  # host values: checked here, before JAX
        host = np.asarray(value)  # narrows them to int32 (or refuses them: strings, objects)
        if host.dtype.kind not in "iu":
            raise InvalidArgumentError(
                f"{op}: lengths have shape {host.shape} and dtype {host.dtype}; expected integers of shape "
                f"({rows},)"
            )
        if host.size and (host.min() < 0 or host.max() > np.iinfo(np.int32).max):
            raise InvalidArgumentError(
                f"{op}: lengths hold {host.max() if host.max() > 0 else host.min()}, outside int32 (and "
                "outside [1, T]); pass each row's steps used"
            )
    n = jnp.asarray(value)
    if n.shape != (rows,) or not jnp.issubdtype(n.dtype, jnp.integer):
        raise InvalidArgumentError(
            f"{op}: lengths have shape {n.shape} and dtype {n.dtype}; expected integers of shape ({rows},)"
        )
    if n.dtype.itemsize > 4 or n.dtype == jnp.uint32:  # traced wide integers: clipped, never wrapped, so
        n = jnp.clip(n, 0, np.iinfo(np.int32).max)  # that the handler refuses them as outside [1, T]
    return n.astype(jnp.int32)


# -- batches ------------------------------------------------------------------------------------------


class Batches:
    """Checks and converts batches of rows for one table spec: `[B, *shape]` per field for transition
    tables, `[B, T, *shape]` (1 <= T <= max_steps) for trajectory tables."""

    def __init__(self, spec: TableSpec):
        self.spec = spec
        self.names = list(spec.fields)
        self.lead = 2 if spec.is_trajectory else 1
        self.layout = "[B, T, *shape]" if spec.is_trajectory else "[B, *shape]"
        self._warned: set[str] = set()  # fields whose general path was warned about
        # Each field's numpy kind and itemsize ("f4i4b1"), for the native insert's conversions of arrays
        # of other dtypes (`short_cast`).
        self.native_types = "".join(f"{f.dtype.kind}{f.dtype.itemsize}" for f in spec.fields.values())
        # (name, dtype, ndim, shape) of every field, for the checks of `ready`.
        self._ready_layout = [
            (name, f.dtype, self.lead + len(f.shape), tuple(f.shape)) for name, f in spec.fields.items()
        ]

    def fields_problem(self, batch: Any, what: str = "batch") -> str:
        """Why `batch` does not map exactly the table's fields ("" when it does)."""
        if not isinstance(batch, Mapping):
            return f"{what} must be a mapping of field name to array, got {type(batch).__name__}"
        unknown = sorted(map(str, set(batch) - set(self.names)))
        missing = [n for n in self.names if n not in batch]
        if unknown and missing:
            return (
                f"{what} has unknown fields {unknown} and is missing fields {missing}; every insert "
                f"writes all of the table's fields {self.names}"
            )
        if unknown:
            return f"{what} has unknown fields {unknown}; the table's fields are {self.names}"
        if missing:
            return f"{what} is missing fields {missing}; every insert writes all of {self.names}"
        return ""

    def shape_problem(
        self, name: str, shape: tuple[int, ...], lead_shape: tuple[int, ...] | None, layout: str = ""
    ) -> str:
        """Why an array of `shape` is not field `name`'s part of a batch whose other fields have the
        leading dimensions `lead_shape` (None: the first field) ("" when it is). `layout` names the
        expected axes (default: this table's `[B, *shape]` or `[B, T, *shape]`)."""
        field = self.spec.fields[name]
        expected = layout or self.layout
        if len(shape) != self.lead + len(field.shape) or shape[self.lead :] != field.shape:
            return f"batch[{name!r}] has shape {shape}; expected {expected} with shape={field.shape}"
        if lead_shape is not None and shape[: self.lead] != lead_shape:
            axes = "rows" if self.lead == 1 else "steps, rows" if expected.startswith("[T") else "rows, steps"
            return (
                f"batch[{name!r}] has leading dimensions {shape[: self.lead]} ({axes}), but earlier "
                f"fields have {lead_shape}"
            )
        return ""

    def row_as_batch(self, row: Mapping[str, Any], what: str = "row") -> dict[str, Any]:
        """One row of `Table.add` (values without the batch axis: `[*shape]`, or `[T, *shape]` in a
        trajectory table) as a batch of one row for `insert`: every value with a leading axis of 1 (a
        device tensor as a view, anything else through numpy). A value of another shape is refused here,
        by the shape the caller gave and the row's layout (InvalidArgumentError naming `what[name]`,
        one message for every such field): `insert` would name the batch it was given instead."""
        problem = self.fields_problem(row, what)
        if problem:
            raise InvalidArgumentError(problem)
        layout = "[T, *shape]" if self.spec.is_trajectory else "[*shape]"
        batch: dict[str, Any] = {}
        problems: list[str] = []
        steps = None
        for name, field in self.spec.fields.items():
            value = row[name]
            if not is_device_tensor(value):
                value = to_numpy(value, f"{what}[{name!r}]")
            shape = tuple(value.shape)
            if len(shape) != self.lead - 1 + len(field.shape) or shape[self.lead - 1 :] != field.shape:
                rows = f" (T steps, 1 <= T <= max_steps={self.spec.max_steps})" if self.lead == 2 else ""
                problems.append(
                    f"{what}[{name!r}] has shape {shape}; expected {layout} with shape={field.shape}{rows}"
                )
                continue
            if self.lead == 2:
                if steps is not None and shape[0] != steps:
                    problems.append(f"{what}[{name!r}] has {shape[0]} steps, but earlier fields have {steps}")
                    continue
                steps = shape[0]
            batch[name] = value[None]
        if problems:
            raise InvalidArgumentError("; ".join(problems))
        return batch

    def rows_and_steps(self, lead_shape: tuple[int, ...], op: str = "") -> tuple[int, int]:
        """The batch's rows and steps per row, refusing more steps than a row holds."""
        rows = int(lead_shape[0])
        steps = int(lead_shape[1]) if self.spec.is_trajectory else 1
        if rows > 0 and not 1 <= steps <= self.spec.max_steps:
            prefix = f"{op}: " if op else ""
            raise InvalidArgumentError(
                f"{prefix}the batch has {steps} steps per row; the table holds 1 to "
                f"max_steps={self.spec.max_steps}"
            )
        return rows, steps

    def ready(self, batch: Any, casting: str = "fit") -> tuple[list[np.ndarray], int, int] | None:
        """The common batch, checked without numpy's casting machinery: a dict of numpy (or JAX) arrays
        of the fields' shapes (copied into C order where they are not), all with the same rows (and
        steps), at least one row, each of its field's dtype or of one the native insert converts under
        `casting` (`short_cast`: gymnasium's int64 actions, float64 rewards and bool flags; pass
        `native_types` to the insert). None for anything else, which `host` converts or refuses; both
        store the same values. A value the native conversion finds out of range makes the insert raise
        OverflowError before anything is written: `Table.insert` then takes `host`, which refuses it by
        name."""
        if type(batch) is not dict or len(batch) != len(self._ready_layout):
            return None
        arrays = []
        lead_shape = None
        lead = self.lead
        for name, dtype, ndim, shape in self._ready_layout:
            array = batch.get(name)
            if type(array) is not np.ndarray:
                if not isinstance(array, jax.Array) or isinstance(array, jax.core.Tracer):
                    return None
                array = np.asarray(array)  # a CPU array in place; a device array's one copy to the host
            if array.ndim != ndim or array.shape[lead:] != shape:
                return None
            if not array.flags.c_contiguous:  # a vector environment's transposed state, say: one copy
                array = np.ascontiguousarray(array)
            if array.dtype is not dtype and array.dtype != dtype:
                if not short_cast(array.dtype, dtype, casting):
                    return None  # the native insert converts the others (`native_types`)
            if lead_shape is None:
                lead_shape = array.shape[:lead]
            elif array.shape[:lead] != lead_shape:
                return None
            arrays.append(array)
        assert lead_shape is not None
        rows = lead_shape[0]
        steps = lead_shape[1] if lead == 2 else 1
        if rows == 0 or not 1 <= steps <= self.spec.max_steps:
            return None
        return arrays, rows, steps

    def host(self, batch: Any, casting: str) -> tuple[list[np.ndarray], int, int]:
        """Host arrays (numpy, JAX, CPU PyTorch, array-likes) cast by the policy into C-contiguous arrays
        of the fields' dtypes: (arrays in field order, rows, steps). One message names every refused
        field."""
        problem = self.fields_problem(batch)
        if problem:
            raise InvalidArgumentError(problem)
        arrays: list[np.ndarray] = []
        problems: list[str] = []
        lead_shape = None
        for name, field in self.spec.fields.items():
            array, why = cast(batch[name], field.dtype, casting, f"batch[{name!r}]")
            if array is None:
                problems.append(f"batch[{name!r}] {why}")
                continue
            problem = self.shape_problem(name, array.shape, lead_shape)
            if problem:
                problems.append(problem)
                continue
            lead_shape = lead_shape or array.shape[: self.lead]
            arrays.append(np.ascontiguousarray(array))
        refuse(problems, casting)
        assert lead_shape is not None
        rows, steps = self.rows_and_steps(lead_shape)
        self.warn_general_path(batch, casting, "batch")
        return arrays, rows, steps

    def warn_general_path(self, batch: Mapping[str, Any], casting: str, what: str) -> None:
        """Warns once per field whose value made a stored batch take `host` (`warn_general_path`)."""
        warn_general_path(batch, self.spec.fields, casting, what, self._warned)

    def traced(self, batch: Any, casting: str, time_major: bool, op: str) -> tuple[list[jax.Array], int, int]:
        """Arrays of a compiled insert (traced or concrete), cast by the policy as far as their dtypes
        decide it at trace time: (arrays `[B, ...]` in field order, rows, steps)."""
        if not isinstance(batch, dict):
            raise InvalidArgumentError(
                f"{op}: batch must be a dict of field name to array, got {type(batch).__name__}"
            )
        problem = self.fields_problem(batch)
        if problem:
            raise InvalidArgumentError(f"{op}: {problem}")
        if time_major and not self.spec.is_trajectory:
            raise InvalidArgumentError(f"{op}: time_major=True is for trajectory tables (max_steps > 1) only")
        layout = self.layout if not time_major else "[T, B, *shape]"
        arrays, problems, lead_shape = [], [], None
        for name, field in self.spec.fields.items():
            value = batch[name]
            if not hasattr(value, "dtype") or not hasattr(value, "shape"):
                try:
                    value = jnp.asarray(value)
                except (TypeError, ValueError) as e:
                    problems.append(f"batch[{name!r}] is not an array of numbers ({e})")
                    continue
            why = traced_cast_problem(np.dtype(value.dtype), field.dtype, casting)
            if why:
                problems.append(f"batch[{name!r}] {why}")
                continue
            if jax.dtypes.canonicalize_dtype(field.dtype) != field.dtype:
                problems.append(
                    f"field {name!r} is {field.dtype}, which JAX holds only with jax_enable_x64 on; enable "
                    "it (jax.config.update('jax_enable_x64', True)) or declare the field with 32 bits"
                )
                continue
            shape = tuple(value.shape)
            problem = self.shape_problem(name, shape, lead_shape, layout)
            if problem:
                problems.append(problem)
                continue
            lead_shape = lead_shape or shape[: self.lead]
            value = value.astype(field.dtype)
            arrays.append(jnp.swapaxes(value, 0, 1) if time_major else value)
        if problems:
            raise InvalidArgumentError(f"{op}: " + "; ".join(problems))
        assert lead_shape is not None
        rows, steps = self.rows_and_steps(lead_shape[::-1] if time_major else lead_shape, op)
        return arrays, rows, steps

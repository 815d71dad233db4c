"""How values are stored as a field's dtype: the casting policy of `insert`, `add` and episode writers.

Two policies, chosen per table (`Table.create(..., casting=...)`, or `table.casting = ...`):

- "fit" (the default): a value is stored when it keeps its kind and fits the field, as the common replay
  buffers do. Within floats any cast is made (float64 into float32 loses precision, as every float32
  buffer does), unless a finite value would overflow to infinity. Within integers (signed or not) a
  cast is made when every value lies in the field's range (gymnasium's int64 actions into int32).
  Safe casts across kinds are made too (bool into int, int8 into float32; int64 into float64, which
  numpy calls safe, only when every value is exact, as for Python ints).
- "strict": arrays and numpy scalars must have the field's dtype or one that casts to it safely (int8
  into int32, float32 into float64); anything else is refused.

Under both, Python scalars and lists (which carry no dtype of their own) are stored when every value fits
the field: ints into integer fields within range and into float fields when exact, floats into float
fields unless they overflow, bools anywhere a bool casts safely. A value is never cast to another kind
(a float into an integer or bool field, an integer into a bool field), and nothing is written when any
field of an insert is refused: the error names every refused field at once.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import ml_dtypes
import numpy as np

from gear_jax.errors import InvalidArgumentError, SlowPathWarning, warn_at_caller

CASTING_POLICIES = ("fit", "strict")
_PYTHON_VALUES = (bool, int, float, list, tuple)


def check_casting(casting: Any) -> str:
    if type(casting) is not str or casting not in CASTING_POLICIES:
        raise InvalidArgumentError(f"casting={casting!r} must be one of {CASTING_POLICIES}")
    return casting


_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def kind(dtype: np.dtype) -> str:
    """'b' bool, 'i' any integer, 'f' any float (bfloat16 included), or numpy's own kind."""
    if dtype == _BFLOAT16:
        return "f"
    return "i" if dtype.kind in "iu" else dtype.kind


_KIND_NAMES = {"b": "bools", "i": "integers", "f": "floats"}


def not_array_reason(value: Any) -> str:
    """Why `value` can be no field's value (a mapping or None, which numpy would make an object array),
    or "" for any other value."""
    if value is None:
        return "is None; give a value of the field's shape"
    if isinstance(value, Mapping):
        return (
            f"is a mapping (keys {sorted(map(str, value))}); a field holds one array, so give each entry its "
            "own field (one field per key, e.g. TableSpec.from_spaces({'obs_pos': space['pos'], ...})) and "
            "pass the entries by those names"
        )
    return ""


def to_numpy(value: Any, what: str) -> np.ndarray:
    """A host numpy array for a numpy, JAX or PyTorch array (or anything array-like)."""
    if type(value).__module__.startswith("torch"):
        return _tensor_to_numpy(value, what)
    try:
        return np.asarray(value)
    except jax.errors.TracerArrayConversionError:
        raise InvalidArgumentError(
            f"{what} is a value traced by jax.jit: inserts run on the host, outside compiled code. Return "
            "the data from the jitted step and insert it after the call"
        ) from None
    except Exception as e:  # noqa: BLE001 - report what could not be converted
        raise InvalidArgumentError(f"{what} could not be converted to an array: {e}") from e


def _tensor_to_numpy(value: Any, what: str) -> np.ndarray:
    """A PyTorch tensor as a host numpy array; InvalidArgumentError naming `what` for one numpy cannot
    hold (sparse, quantized, a dtype numpy lacks)."""
    import torch

    if not isinstance(value, torch.Tensor):
        return np.asarray(value)
    if value.is_quantized:
        raise InvalidArgumentError(
            f"{what} is a quantized torch tensor ({value.dtype}); pass {what}.dequantize() (or .int_repr() "
            "for its integers) instead"
        )
    if value.layout != torch.strided:
        raise InvalidArgumentError(
            f"{what} is a torch tensor of layout {value.layout}; pass a dense one ({what}.to_dense())"
        )
    tensor = value.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    try:
        return tensor.numpy()
    except (TypeError, RuntimeError) as e:
        raise InvalidArgumentError(
            f"{what} is a {tensor.dtype} torch tensor, which numpy cannot hold: {e}"
        ) from e


def _limits(dtype: np.dtype) -> tuple[float, float]:
    """The finite range of a numeric dtype."""
    info = np.iinfo(dtype) if kind(dtype) == "i" else ml_dtypes.finfo(dtype)
    return info.min, info.max


def cast_rule(
    source: np.dtype,
    target: np.dtype,
    casting: str,
    python_values: bool = False,
    source_name: str | None = None,
    astype: str | None = None,
) -> tuple[str, str]:
    """How values of dtype `source` become `target` under the policy, decided from the dtypes alone:
    the one rule of every insert (host arrays, PyTorch tensors, arrays traced inside jit).

    Returns (check, why): check is "" when the cast is refused (`why` says why, starting with "has dtype"),
    "none" for the same dtype or a safe cast, "range" when every value must lie in the target's integer
    range, "overflow" when no finite float may overflow the target, "exact" when integers (Python ints,
    or int64 into float64, which numpy calls safe) must be exactly representable as the target float.
    `source_name` is the dtype as the user wrote it (a torch dtype, say); `astype` the conversion a
    message suggests.
    """
    name = source_name or str(source)
    convert = astype or f".astype('{target}')"
    source_kind, target_kind = kind(source), kind(target)
    if source == target:
        return "none", ""
    if np.can_cast(source, target, casting="safe"):
        if source_kind == "i" and target_kind == "f" and 2 * source.itemsize > target.itemsize:
            return "exact", ""  # numpy's safe int64 -> float64 rounds above 2**53: each value is checked
        return "none", ""
    if source_kind not in _KIND_NAMES:
        return "", f"has dtype {name}, which no field stores; convert it to {target} first"
    if source_kind != target_kind and not (python_values and source_kind in "bi" and target_kind in "if"):
        return "", (
            f"has dtype {name}, which does not cast to the field's {target}: {_KIND_NAMES[source_kind]} are "
            f"not stored as {_KIND_NAMES[target_kind]} (convert it first, e.g. {convert})"
        )
    if casting == "strict" and not python_values:
        return "", (
            f"has dtype {name}, expected {target}: casting='strict' makes only safe casts "
            f"(cast it first, e.g. {convert}, or use casting='fit')"
        )
    if target_kind == "i":
        return "range", ""
    return ("overflow", "") if source_kind == "f" else ("exact", "")


def cast(value: Any, dtype: np.dtype, casting: str, what: str = "value") -> tuple[np.ndarray | None, str]:
    """`value` as an array of `dtype` under the policy, or (None, why it is refused). Raises
    InvalidArgumentError naming `what` for a value that is not an array at all (a traced one, say)."""
    not_an_array = not_array_reason(value)
    if not_an_array:
        return None, not_an_array
    python_values = isinstance(value, _PYTHON_VALUES)
    array = to_numpy(value, what)
    if array.dtype == dtype:
        return array, ""
    if python_values and array.dtype.kind == "O" and all(type(v) is int for v in array.flat):
        low, high = _limits(dtype) if kind(dtype) in "if" else (0, 1)
        return None, f"holds Python ints outside {dtype}'s range [{low}, {high}]"
    check, why = cast_rule(array.dtype, dtype, casting, python_values)
    if not check:
        return None, why
    if check == "none":
        return array.astype(dtype), ""
    low, high = _limits(dtype)
    if check == "range":
        if array.size:
            lo, hi = array.min(), array.max()
            if lo < low or hi > high:
                return None, f"holds values in [{lo}, {hi}], outside {dtype}'s range [{low}, {high}]"
        return array.astype(dtype), ""  # every value is in range: the cast is exact
    with np.errstate(all="ignore"):  # overflows are found below, not warned about
        result = array.astype(dtype)
        # An integer becomes an infinity only by overflowing (and the way back may even give it back).
        exact = check != "exact" or (
            bool(np.isfinite(result).all()) and np.array_equal(result.astype(array.dtype), array)
        )
    if check == "overflow":
        overflow = np.isinf(result) & np.isfinite(array)
        if overflow.any():
            return None, f"holds {array[overflow].flat[0]}, beyond {dtype}'s range +-{high:g}"
    if not exact:
        return None, f"holds integers that {dtype} does not represent exactly; cast it first"
    return result, ""


def traced_cast_problem(source: np.dtype, target: np.dtype, casting: str) -> str:
    """Why an array traced inside jit, of dtype `source`, cannot be stored in a `target` field under the
    policy ("" when it can). Only the dtypes are known at trace time: what the policy decides from them
    is decided exactly as on the host; an integer narrowing, whose range check needs the values, is
    refused (cast it first), and a float narrowing under "fit" is made without the overflow check (a
    finite value beyond the target's range is stored as infinity)."""
    check, why = cast_rule(source, target, casting, astype=f".astype(jnp.{target.name})")
    if check == "range":
        return (
            f"has dtype {source}; the field holds {target}, and inside jit the values are not known when "
            f"the insert is traced, so the range check of casting={casting!r} cannot run: cast it first "
            f"(e.g. jnp.clip(x, lo, hi).astype(jnp.{target.name}))"
        )
    return why


def refuse(problems: list[str], casting: str) -> None:
    """Raises one InvalidArgumentError naming every refused field, or returns when there is none."""
    if not problems:
        return
    if len(problems) == 1:
        raise InvalidArgumentError(problems[0])
    raise InvalidArgumentError(
        f"{len(problems)} fields can not be stored (casting={casting!r}):\n  " + "\n  ".join(problems)
    )


@functools.lru_cache(maxsize=256)
def short_cast(src: np.dtype, dst: np.dtype, casting: str) -> bool:
    """Whether the native short path (xla_ffi/row_writer.h, ConvertElements) converts arrays of `src`
    into `dst` under `casting`: bools into any numeric dtype, integers into integers (each value checked
    against the range) and float32/float64 into float32/float64 (checked against overflow) under "fit",
    and the safe casts (small integers into floats, widening) under both policies. Values it refuses go
    the general path, which refuses them with a message."""
    if src.byteorder == ">" or dst.byteorder == ">" or src.kind not in "biuf" or dst.kind not in "biuf":
        return False
    if dst.kind == "f" and dst.itemsize not in (4, 8) or src.kind == "f" and src.itemsize not in (4, 8):
        return False  # float16, and bfloat16 (kind "V"), go the general path
    if casting == "strict":
        return bool(np.can_cast(src, dst, "safe"))
    if src.kind == "b":
        return True
    if src.kind in "iu":
        return dst.kind in "iu" or 2 * src.itemsize <= dst.itemsize
    return dst.kind == "f"


def general_path_reason(value: Any, dtype: np.dtype, casting: str) -> str:
    """Why `value` (one field's part of a stored insert or row) made it take the general path, with the
    fix; "" when the value is one the short path takes (another field was the cause), and for JAX arrays
    and PyTorch tensors, whose conversion is the general path's work anyway."""
    if isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer):
        value = np.asarray(value)
    elif type(value).__module__.startswith("torch"):
        return ""
    if isinstance(value, np.ndarray):  # one not in C order is copied into it for the short path
        if value.dtype == dtype or short_cast(value.dtype, dtype, casting):
            return ""
        return f"is {value.dtype}, which the short path does not convert into {dtype}; pass {dtype} values"
    if isinstance(value, np.generic):
        return (
            ""
            if value.dtype == dtype or short_cast(value.dtype, dtype, casting)
            else (
                f"is a numpy {value.dtype} scalar, which the short path does not convert into {dtype}; pass "
                f"{dtype} values"
            )
        )
    if type(value) in (bool, int, float):
        return ""
    return f"is a {type(value).__module__}.{type(value).__name__}; pass numpy arrays (np.asarray(...))"


def warn_general_path(
    values: Mapping[str, Any], fields: Mapping[str, Any], casting: str, what: str, warned: set[str]
) -> None:
    """Issues the SlowPathWarning for each field of `fields` whose value in `values` (a stored insert's
    batch or row, e.g. `what`="batch") made the call take the general path, once per field: the names
    warned about are kept in `warned`."""
    for name, field in fields.items():
        if name in warned:
            continue
        why = general_path_reason(values[name], field.dtype, casting)
        if why:
            warned.add(name)
            warn_at_caller(
                f"{what}[{name!r}] {why}: this call took the general path, several times the cost of the "
                "native short path, storing the same values. Warned once per field and writer.",
                SlowPathWarning,
            )


class StepConverter:
    """Checks and converts one step: a mapping of every field to one value of the field's shape.

    The general path of one-row writes; the short path (xla_ffi/row_writer.h) takes the common values
    (arrays of the field's dtype, Python and numpy scalars that fit) without numpy and stores the same.
    """

    def __init__(self, fields: Mapping[str, Any]):
        self.fields = dict(fields)
        self._warned: set[str] = set()  # fields whose general path was warned about

    def __call__(self, step: Any, casting: str, what: str = "step") -> list[np.ndarray]:
        """One array per field, in field order; raises naming every refused field."""
        if not isinstance(step, Mapping) or set(step) != set(self.fields):
            self.refuse_keys(step, what)
        values: list[np.ndarray] = []
        problems: list[str] = []
        for name, field in self.fields.items():
            array, why = cast(step[name], field.dtype, casting, f"{what}[{name!r}]")
            if array is None:
                problems.append(f"{what}[{name!r}] {why}")
            elif array.shape != field.shape:
                problems.append(f"{what}[{name!r}] has shape {array.shape}, expected {field.shape}")
            else:
                values.append(array)
        refuse(problems, casting)
        return values

    def warn_general_path(self, step: Mapping[str, Any], casting: str, what: str) -> None:
        """Warns once per field whose value made a stored step take this path (`warn_general_path`)."""
        warn_general_path(step, self.fields, casting, what, self._warned)

    def refuse_keys(self, step: Any, what: str) -> None:
        """Raises for a `step` that is no mapping of exactly the fields, naming the missing and unknown."""
        if not isinstance(step, Mapping):
            got = type(step).__name__
        else:
            missing = [n for n in self.fields if n not in step]
            unknown = sorted(str(n) for n in step if n not in self.fields)
            got = "; ".join([f"missing {missing}"] * bool(missing) + [f"unknown {unknown}"] * bool(unknown))
        raise InvalidArgumentError(f"{what} must map every field {list(self.fields)} to a value; got {got}")

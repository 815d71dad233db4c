"""Table specifications: the fields of a row, their shapes and dtypes, and the table's size."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import keyword
import math
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from gear_jax.errors import SpecError

SUPPORTED_DTYPES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
)
RESERVED_FIELD_NAMES = ("valid",)
MAX_FIELDS = 64
MAX_TABLE_BYTES = 2**50
SPEC_FORMAT = 1


def canonical_dtype(dtype: Any) -> np.dtype:
    """The numpy dtype for a numpy, JAX, PyTorch or string dtype; raises SpecError if unsupported."""
    name = str(dtype).removeprefix("torch.")
    if name == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16)
    try:
        result = np.dtype(dtype if not isinstance(dtype, str) else name)
    except TypeError:
        try:
            result = np.dtype(name)
        except TypeError:
            result = None
    if result is None or result.name not in SUPPORTED_DTYPES:
        raise SpecError(f"dtype {dtype!r} is not supported; use one of {', '.join(SUPPORTED_DTYPES)}")
    return result


@dataclasses.dataclass(frozen=True)
class Field:
    """One column of a table: the shape and dtype of a single step.

    Args:
      shape: tuple of positive ints (`()` for a scalar per step).
      dtype: one of `SUPPORTED_DTYPES`, as a string, numpy, JAX or PyTorch dtype.
    """

    shape: tuple[int, ...]
    dtype: np.dtype

    def __init__(self, shape: Any, dtype: Any):
        if isinstance(shape, (int, np.integer)):
            shape = (int(shape),)
        try:
            dims = tuple(shape)
        except TypeError:
            raise SpecError(
                f"Field shape {shape!r} is not a tuple of ints; write e.g. (84, 84, 4) or ()"
            ) from None
        for d in dims:
            if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
                raise SpecError(f"Field shape {shape!r} must hold positive ints; got dimension {d!r}")
        object.__setattr__(self, "shape", tuple(int(d) for d in dims))
        object.__setattr__(self, "dtype", canonical_dtype(dtype))

    @property
    def step_bytes(self) -> int:
        """Bytes of one step of this field."""
        return math.prod(self.shape) * self.dtype.itemsize


@dataclasses.dataclass(frozen=True, eq=False)
class TableSpec:
    """The layout of a table: named fields, rows and steps per row.

    Args:
      fields: mapping of field name to `Field`, in the order the columns are laid out.
      capacity: rows in the table; when full, inserts overwrite the oldest rows.
      max_steps: steps per row. 1 makes a transition table (one step per row, arrays `[B, *shape]`);
        more makes a trajectory table (rows of up to `max_steps` steps, arrays `[B, T, *shape]`).

    Raises:
      SpecError: for an empty or reserved field name, a bad shape or dtype, or a bad size.
    """

    fields: Mapping[str, Field]
    capacity: int
    max_steps: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.fields, Mapping) or not self.fields:
            raise SpecError("TableSpec needs `fields`: a non-empty mapping of name to gear_jax.Field")
        if len(self.fields) > MAX_FIELDS:
            raise SpecError(f"TableSpec has {len(self.fields)} fields; at most {MAX_FIELDS} are supported")
        for name, field in self.fields.items():
            if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
                raise SpecError(f"field name {name!r} must be a Python identifier")
            if name in RESERVED_FIELD_NAMES:
                raise SpecError(f"field name {name!r} is reserved (gather returns the `valid` mask under it)")
            if not isinstance(field, Field):
                raise SpecError(f"field {name!r} must be a gear_jax.Field, got {type(field).__name__}")
        for attr, low, high in (("capacity", 1, 2**31 - 1), ("max_steps", 1, 2**31 - 1)):
            value = getattr(self, attr)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, np.integer))
                or not low <= value <= high
            ):
                raise SpecError(f"TableSpec {attr}={value!r} must be an int in [{low}, {high}]")
        row_bytes = self.max_steps * sum(f.step_bytes for f in self.fields.values())
        if int(self.capacity) * row_bytes > MAX_TABLE_BYTES:
            raise SpecError(
                f"TableSpec of {int(self.capacity) * row_bytes} bytes is larger than gear_jax addresses "
                f"({MAX_TABLE_BYTES} bytes); lower capacity, max_steps or the fields' sizes"
            )
        object.__setattr__(self, "fields", dict(self.fields))
        object.__setattr__(self, "capacity", int(self.capacity))
        object.__setattr__(self, "max_steps", int(self.max_steps))

    @property
    def is_trajectory(self) -> bool:
        """True when rows hold more than one step (arrays carry a time axis)."""
        return self.max_steps > 1

    def to_json(self) -> str:
        """Canonical JSON of the spec; equal specs give equal strings."""
        return json.dumps(
            {
                "format": SPEC_FORMAT,
                "capacity": self.capacity,
                "max_steps": self.max_steps,
                "fields": [[n, list(f.shape), f.dtype.name] for n, f in self.fields.items()],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> TableSpec:
        data = json.loads(text)
        if data.get("format") != SPEC_FORMAT:
            raise SpecError(f"spec format {data.get('format')!r} is not {SPEC_FORMAT}")
        fields = {n: Field(tuple(shape), dtype) for n, shape, dtype in data["fields"]}
        return cls(fields=fields, capacity=data["capacity"], max_steps=data["max_steps"])

    @property
    def spec_hash(self) -> int:
        """A stable 63-bit hash of the spec, stored in the table header and carried by compiled calls."""
        digest = hashlib.sha256(self.to_json().encode()).digest()
        return int.from_bytes(digest[:8], "little") & (2**63 - 1)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TableSpec) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return self.spec_hash

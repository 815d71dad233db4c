"""Table specifications: the fields of a row, their shapes and dtypes, and the table's size."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import keyword
import math
import types
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
# The bytes a table header keeps for the spec's JSON, its terminating NUL included (kSpecJsonCapacity in
# xla_ffi/table_layout.h): `to_json()` must be shorter. Field names take most of it.
SPEC_JSON_CAPACITY = 16384


def canonical_dtype(dtype: Any) -> np.dtype:
    """The numpy dtype for a numpy, JAX, PyTorch or string dtype; raises SpecError if unsupported (None
    included: numpy reads it as float64, which is no dtype the caller named)."""
    if dtype is None:
        raise SpecError(
            f"dtype None is not a dtype; pass one of {', '.join(SUPPORTED_DTYPES)} (Field's default, when "
            "dtype is left out, is float32)"
        )
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


# What `narrow=True` turns 64-bit dtypes into: JAX computes in 32 bits unless x64 is enabled.
NARROWED_DTYPES = {"float64": "float32", "int64": "int32", "uint64": "uint32"}


def _narrow_dtype(dtype: Any, narrow: bool) -> np.dtype:
    """`canonical_dtype(dtype)`, and with `narrow` a 64-bit dtype as its 32-bit kin (`NARROWED_DTYPES`)."""
    result = canonical_dtype(dtype)
    return np.dtype(NARROWED_DTYPES.get(result.name, result)) if narrow else result


def _clip(value: Any, limit: int = 80) -> str:
    """repr(value) for a message, cut to `limit` characters: values of a damaged file may be huge."""
    text = value if isinstance(value, BaseException) else repr(value)
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _named(what: str, make: Any, *args: Any) -> Any:
    """`make(*args)`, with a SpecError's message prefixed by `what` (the field it is about)."""
    try:
        return make(*args)
    except SpecError as e:
        raise SpecError(f"{what}: {e}") from None


@dataclasses.dataclass(frozen=True)
class Field:
    """One column of a table: the shape and dtype of a single step.

    `Field()` is a float32 scalar, `Field(dtype="bool")` a bool scalar, `Field((84, 84, 4), "uint8")` an
    image per step.

    Args:
      shape: tuple of positive ints (`()` for a scalar per step). Default `()`.
      dtype: one of `SUPPORTED_DTYPES`, as a string, numpy, JAX or PyTorch dtype. Default float32.
    """

    shape: tuple[int, ...] = ()
    dtype: np.dtype = np.dtype("float32")

    def __init__(self, shape: Any = (), dtype: Any = "float32"):
        if isinstance(shape, (int, np.integer)):
            shape = (int(shape),)
        if isinstance(shape, str):
            raise SpecError(
                f"Field shape {shape!r} is a str: the first argument is the shape, the second the dtype; "
                f"write e.g. Field((), {shape!r}) for a scalar"
            )
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

    @classmethod
    def from_space(cls, space: Any, *, narrow: bool = True) -> Field:
        """The field of one step of a gymnasium or gymnax space.

        Box keeps its shape and dtype; Discrete is a scalar of the space's integer dtype; MultiDiscrete and
        MultiBinary keep their shape and dtype (MultiBinary is int8 in gymnasium). A `Field` is returned
        as is. gymnasium and gymnax are not imported: spaces are recognized by class name.

        Args:
          space: a gymnasium `Box`, `Discrete`, `MultiDiscrete` or `MultiBinary`, a gymnax `Box` or
            `Discrete`, or a `Field`.
          narrow: read 64-bit dtypes as 32-bit (float64 -> float32, int64 -> int32, uint64 -> uint32):
            gymnasium's Discrete is int64, and JAX computes in 32 bits unless x64 is enabled.

        Raises:
          SpecError: for a Dict, Tuple, Text, Graph, Sequence or OneOf space, anything else that is not
            one of the spaces above, an unsupported dtype, or values that do not fit the narrowed dtype.
        """
        return _field_from_space(space, narrow, None)

    @property
    def step_bytes(self) -> int:
        """Bytes of one step of this field."""
        return math.prod(self.shape) * self.dtype.itemsize


@dataclasses.dataclass(frozen=True, eq=False)
class TableSpec:
    """The layout of a table: named fields, rows and steps per row.

    Two kinds of trajectory table share one API. A table of padded rows reserves `max_steps` steps for
    every row. A step ring (`step_capacity=N`) keeps the steps of every episode back to back in one
    ring of N steps per field, with an index of `capacity` episodes: an episode holds exactly the steps
    it has, and windows never cross from one episode into the next. When either the ring or the index
    is full, the oldest episodes make room.

    Args:
      fields: mapping of field name to `Field`, in the order the columns are laid out. The spec keeps a
        read-only copy (`types.MappingProxyType`): a spec, like the table made from it, never changes.
      capacity: rows in the table (a step ring: episodes in its index); when full, inserts overwrite
        the oldest rows.
      max_steps: steps per row. 1 (the default without `step_capacity`) makes a transition table (one
        step per row, arrays `[B, *shape]`); more makes a trajectory table (rows of up to `max_steps`
        steps, arrays `[B, T, *shape]`). In a step ring: the longest episode it takes (default and at
        most `step_capacity`).
      step_capacity: None for padded rows; an int makes a step ring of that many steps per field.

    Raises:
      SpecError: for an empty or reserved field name, a bad shape or dtype, a bad size, or a spec whose
        JSON (`to_json`) is too long for a table's header (long field names, many fields).
    """

    fields: Mapping[str, Field]
    capacity: int
    max_steps: int | None = None
    step_capacity: int | None = None

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
        checked = [("capacity", 1, 2**31 - 1)]
        if self.step_capacity is not None:
            checked.append(("step_capacity", 2, 2**48))
            if self.max_steps is None:
                object.__setattr__(self, "max_steps", min(int(self.step_capacity), 2**31 - 1))
        elif self.max_steps is None:
            object.__setattr__(self, "max_steps", 1)
        checked.append(("max_steps", 1, 2**31 - 1))
        for attr, low, high in checked:
            value = getattr(self, attr)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, np.integer))
                or not low <= value <= high
            ):
                raise SpecError(f"TableSpec {attr}={value!r} must be an int in [{low}, {high}]")
        step_bytes = sum(f.step_bytes for f in self.fields.values())
        if self.step_capacity is not None:
            if self.max_steps > self.step_capacity:
                raise SpecError(
                    f"TableSpec max_steps={self.max_steps} (the longest episode of a step ring) must be at "
                    f"most step_capacity={self.step_capacity}; raise step_capacity or lower max_steps"
                )
            total, what = int(self.step_capacity) * step_bytes, "step_capacity"
        else:
            total, what = int(self.capacity) * self.max_steps * step_bytes, "capacity, max_steps"
        if total > MAX_TABLE_BYTES:
            raise SpecError(
                f"TableSpec of {total} bytes is larger than gear_jax addresses "
                f"({MAX_TABLE_BYTES} bytes); lower {what} or the fields' sizes"
            )
        # A read-only copy: `table.spec.fields` must not be changed under a table made of it.
        object.__setattr__(self, "fields", types.MappingProxyType(dict(self.fields)))
        object.__setattr__(self, "capacity", int(self.capacity))
        object.__setattr__(self, "max_steps", int(self.max_steps))
        if self.step_capacity is not None:
            object.__setattr__(self, "step_capacity", int(self.step_capacity))
        size = len(self.to_json())  # ASCII: json.dumps escapes other characters
        if size >= SPEC_JSON_CAPACITY:
            names = sum(len(json.dumps(name)) - 2 for name in self.fields)  # without the quotes
            raise SpecError(
                f"TableSpec's JSON (to_json) is {size} bytes, and a table's header holds at most "
                f"{SPEC_JSON_CAPACITY - 1} (gear_jax.spec.SPEC_JSON_CAPACITY, less its final NUL); the "
                f"{len(self.fields)} field names take {names} of them: shorten the names, or use fewer "
                "fields (one field of a larger shape for several alike)"
            )

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as its arguments (a mappingproxy does not pickle); unpickling checks them again.
        return (type(self), (dict(self.fields), self.capacity, self.max_steps, self.step_capacity))

    def __repr__(self) -> str:
        ring = f", step_capacity={self.step_capacity}" if self.step_ring else ""
        return (
            f"TableSpec(fields={dict(self.fields)!r}, capacity={self.capacity}, max_steps={self.max_steps}"
            f"{ring})"
        )

    @classmethod
    def from_example(
        cls,
        example: Mapping[str, Any],
        capacity: int,
        max_steps: int | None = None,
        *,
        batched: bool = False,
        narrow: bool = True,
        step_capacity: int | None = None,
    ) -> TableSpec:
        """The spec whose fields have the shapes and dtypes of one example step.

        `TableSpec.from_example({"obs": obs, "action": action, "reward": reward, "done": terminated},
        capacity=100_000)` with the values of one `env.step` makes a transition table for them; with
        `max_steps > 1` the same step makes a trajectory table (each value is still one step).

        Args:
          example: mapping of field name to one value, in the order the columns are laid out: a numpy,
            JAX or PyTorch array, a numpy scalar, a Python bool, int or float, or a (nested) list.
            Python values give bool, int32 and float32 (also with `narrow=False`), or the 64-bit dtype
            when a value does not fit the 32-bit one: int64 (uint64 above int64's range) for an int
            beyond int32's range, float64 for a finite float beyond float32's. A table holds such a
            field in host memory and `gather` returns it as int64 / float64 even without
            `jax_enable_x64`; computing on it in JAX (and `gear_jax.insert` inside jit) needs x64.
            Arrays are read by shape and dtype only: a JAX or PyTorch array is not copied to the host.
          capacity: rows in the table.
          max_steps: steps per row (see `TableSpec`).
          batched: the values carry a leading batch axis (of one size for all), which is dropped.
          narrow: read 64-bit dtypes as 32-bit (float64 -> float32, int64 -> int32, uint64 -> uint32):
            gymnasium hands out int64 actions and float64 values, and JAX computes in 32 bits unless
            x64 is enabled. `narrow=False` keeps them.
          step_capacity: steps of a step ring (see `TableSpec`); None for padded rows.

        Raises:
          SpecError: for a nested mapping, a string, object or otherwise unsupported value, a value
            without a batch axis when `batched`, batch axes of different sizes, or a bad spec.
        """
        if not isinstance(example, Mapping):
            raise SpecError(
                f"TableSpec.from_example needs a mapping of field name to one value, got "
                f"{type(example).__name__}"
            )
        read = {name: _field_from_value(value, name, batched, narrow) for name, value in example.items()}
        fields = {name: field for name, (field, _) in read.items()}
        if batched:
            sizes = {name: batch for name, (_, batch) in read.items()}
            if len(set(sizes.values())) > 1:
                raise SpecError(
                    f"batched example has batch axes of different sizes ({sizes}); every value needs "
                    "the same leading batch axis, or pass one unbatched step with batched=False"
                )
        return cls(fields=fields, capacity=capacity, max_steps=max_steps, step_capacity=step_capacity)

    @classmethod
    def from_spaces(
        cls,
        spaces: Mapping[str, Any],
        capacity: int,
        max_steps: int | None = None,
        *,
        narrow: bool = True,
        step_capacity: int | None = None,
    ) -> TableSpec:
        """The spec of one field per gymnasium or gymnax space (see `Field.from_space`).

        `TableSpec.from_spaces({"obs": env.observation_space, "action": env.action_space, "reward":
        Field(), "done": Field()}, capacity=10_000)` (float32 `done`, so that a learner computes `1 - done`;
        gymnasium's bools are cast into it on the fast path); a gymnax environment's spaces are
        `env.observation_space(params)` and `env.action_space(params)`.

        Args:
          spaces: mapping of field name to a space or a `Field` (kept as is), in column order.
          capacity: rows in the table.
          max_steps: steps per row (see `TableSpec`).
          step_capacity: steps of a step ring (see `TableSpec`); None for padded rows.
          narrow: read 64-bit dtypes as 32-bit (gymnasium's Discrete is int64); `narrow=False` keeps them.

        Raises:
          SpecError: naming the field, for a space `Field.from_space` refuses, or for a bad spec.
        """
        if not isinstance(spaces, Mapping):
            raise SpecError(
                f"TableSpec.from_spaces needs a mapping of field name to space or Field, got "
                f"{type(spaces).__name__}"
            )
        fields = {name: _field_from_space(space, narrow, name) for name, space in spaces.items()}
        return cls(fields=fields, capacity=capacity, max_steps=max_steps, step_capacity=step_capacity)

    @property
    def is_trajectory(self) -> bool:
        """True when rows hold more than one step (arrays carry a time axis); always for a step ring."""
        return self.max_steps > 1 or self.step_ring

    @property
    def step_ring(self) -> bool:
        """True for a step ring (`step_capacity` set): episodes back to back, no padding."""
        return self.step_capacity is not None

    def to_json(self) -> str:
        """Canonical JSON of the spec; equal specs give equal strings."""
        data: dict[str, Any] = {
            "format": SPEC_FORMAT,
            "capacity": self.capacity,
            "max_steps": self.max_steps,
            "fields": [[n, list(f.shape), f.dtype.name] for n, f in self.fields.items()],
        }
        if self.step_ring:  # only then: padded tables keep the JSON (and spec hash) they always had
            data["step_capacity"] = self.step_capacity
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> TableSpec:
        """The spec of `to_json`'s text (str, or its UTF-8 bytes). Raises SpecError, saying what is wrong,
        for any other text (a table header's, say, that another process damaged) and for a value that is
        not text (None, a dict)."""
        if not isinstance(text, (str, bytes, bytearray)):
            raise SpecError(
                f"TableSpec.from_json needs the text of TableSpec.to_json() (a str or bytes), got "
                f"{type(text).__name__}"
            )
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, digits past int's limit, nesting
            raise SpecError(f"spec JSON does not parse ({_clip(e)})") from None
        if not isinstance(data, dict):
            raise SpecError(f"spec JSON is {_clip(data)}, not an object")
        if data.get("format") != SPEC_FORMAT:
            raise SpecError(f"spec format {_clip(data.get('format'))} is not {SPEC_FORMAT}")
        missing = [key for key in ("capacity", "max_steps", "fields") if key not in data]
        if missing:
            raise SpecError(f"spec JSON lacks {missing}")
        nulls = [key for key in ("max_steps", "step_capacity") if key in data and data[key] is None]
        if nulls:  # to_json always writes numbers: a null is another writer's (or damage)
            raise SpecError(f"spec JSON has null {nulls}")
        entries = data["fields"]
        if not isinstance(entries, list):
            raise SpecError(f"spec JSON fields are {_clip(entries)}, not a list")
        fields: dict[str, Field] = {}
        for i, entry in enumerate(entries):
            if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)):
                raise SpecError(f"spec JSON field {i} is {_clip(entry)}, not [name, shape, dtype]")
            name, shape, dtype = entry
            if name in fields:
                raise SpecError(f"spec JSON names field {_clip(name)} twice")
            if not isinstance(shape, list) or not isinstance(dtype, str):
                raise SpecError(
                    f"spec JSON field {_clip(name)} has shape {_clip(shape)} and dtype {_clip(dtype)}; "
                    "expected a list of dimensions and a dtype name"
                )
            fields[name] = _named(f"field {_clip(name)}", Field, tuple(shape), dtype)
        return cls(
            fields=fields,
            capacity=data["capacity"],
            max_steps=data["max_steps"],
            step_capacity=data.get("step_capacity"),
        )

    @property
    def spec_hash(self) -> int:
        """A stable 63-bit hash of the spec, stored in the table header and carried by compiled calls."""
        digest = hashlib.sha256(self.to_json().encode()).digest()
        return int.from_bytes(digest[:8], "little") & (2**63 - 1)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TableSpec) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return self.spec_hash


# Python values (bool, int, float and lists of them) give these dtypes whatever `narrow` says, by the
# kind of numpy array they make (np.float64 subclasses float, but is a numpy value and narrows instead),
# unless their values do not fit: then the array's own 64-bit dtype (`_python_dtype`).
_PYTHON_DTYPES = {
    "b": np.dtype("bool"),
    "i": np.dtype("int32"),
    "u": np.dtype("int32"),  # ints above int64's range: numpy's uint64, kept by `_python_dtype`
    "f": np.dtype("float32"),
}


def _python_dtype(array: np.ndarray) -> np.dtype:
    """The dtype of a field for Python values read as `array`: `_PYTHON_DTYPES`'s 32-bit one when every
    value fits it, else the array's 64-bit one (int64, uint64 for ints above int64's range, float64), so
    that the example itself can be stored."""
    dtype = _PYTHON_DTYPES[array.dtype.kind]
    if array.size == 0 or dtype.kind == "b":
        return dtype
    if dtype.kind == "i":
        info = np.iinfo(dtype)
        return dtype if info.min <= array.min() and array.max() <= info.max else array.dtype
    finite = array[np.isfinite(array)]
    limit = np.finfo(dtype).max
    return dtype if finite.size == 0 or np.abs(finite).max() <= limit else array.dtype


def _python_values(value: Any) -> bool:
    """True for a Python bool, int or float, or a (nested) list or tuple of only those."""
    if isinstance(value, (list, tuple)):
        return all(_python_values(v) for v in value)
    return type(value) in (bool, int, float)


def _field_from_value(value: Any, name: str, batched: bool, narrow: bool) -> tuple[Field, int | None]:
    """The field of one example value of field `name`, and its batch size when `batched`."""
    what = f"field {name!r}"
    if isinstance(value, Mapping):
        fix = ", ".join(f"'{name}_{k}': {name}[{k!r}]" for k in list(value)[:2])
        raise SpecError(
            f"{what} is a mapping (keys {list(value)}); a field holds one array, so give each entry of "
            f"{name!r} its own field, e.g. {{{fix}, ...}}"
        )
    python = False
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # numpy, JAX and PyTorch arrays, numpy scalars
        shape, dtype = tuple(value.shape), value.dtype  # read in place: no copy off a device
    else:
        try:
            array = np.asarray(value)
        except Exception as e:  # noqa: BLE001 - report what could not be read
            raise SpecError(f"{what}: {type(value).__name__} could not be read as an array ({e})") from None
        shape, dtype = array.shape, array.dtype
        python = dtype.kind in _PYTHON_DTYPES and _python_values(value)
        if python:
            dtype = _python_dtype(array)
    if isinstance(dtype, np.dtype) and dtype.kind == "O" and _python_values(value):
        raise SpecError(
            f"{what} holds a Python int beyond 64 bits (no field dtype holds it: int64 and uint64 are the "
            f"widest); store {name!r} in smaller numbers (split it into 64-bit parts, say)"
        )
    if isinstance(dtype, np.dtype) and dtype.kind in "OUS":
        raise SpecError(
            f"{what} holds {type(value).__name__} values (dtype {dtype}); a table stores numbers only: "
            f"encode {name!r} as numbers (token ids in an int32 array, say) or leave it out of the example"
        )
    batch = None
    if batched:
        if not shape:
            raise SpecError(
                f"{what} has no batch axis (it is a scalar) but batched=True; give every value a leading "
                "batch axis, or pass one step with batched=False"
            )
        batch, shape = shape[0], shape[1:]
    dtype = dtype if python else _named(what, _narrow_dtype, dtype, narrow)
    return _named(what, Field, shape, dtype), batch


# Space classes read by name (gymnasium, gymnax, and gym before them, share these names) with the
# attribute each needs, and what to do instead for the ones a field cannot hold.
_READ_SPACES = {"Box": "shape", "Discrete": "n", "MultiDiscrete": "nvec", "MultiBinary": "shape"}
_REFUSED_SPACES = {
    "Dict": None,
    "Tuple": None,
    "Text": "a Text space holds strings, which a table cannot store; store them as token ids, e.g. "
    "Field((max_length,), 'int32')",
    "Graph": "a Graph space has a varying number of nodes and edges; pad them to a fixed size and give "
    "nodes, edges and edge links their own fields",
    "Sequence": "a Sequence space has a varying length; pad it to a fixed length and pass a Field of that "
    "shape, or store one element per step in a trajectory table (max_steps > 1)",
    "OneOf": "a OneOf space holds one of several spaces; give each of them its own field, plus an int32 "
    "field saying which one a step holds",
}


def _space_class(space: Any) -> str | None:
    """The first name in `space`'s class hierarchy that names a space gear_jax knows, or None."""
    for cls in type(space).__mro__:
        if cls.__name__ in _READ_SPACES or cls.__name__ in _REFUSED_SPACES:
            return cls.__name__
    return None


def _field_from_space(space: Any, narrow: bool, name: str | None) -> Field:
    """The field of one step of `space`, for field `name` (None: a space on its own)."""
    if isinstance(space, Field):
        return space
    what = f"field {name!r}" if name is not None else "space"
    label = name if name is not None else "obs"
    kind = _space_class(space)
    if kind == "Dict" or (kind is None and isinstance(space, Mapping)):
        entries = list(getattr(space, "spaces", space))
        fix = ", ".join(f"'{label}_{k}': {label}_space[{k!r}]" for k in entries[:2])
        raise SpecError(
            f"{what} is a {'Dict space' if kind else 'mapping'} (entries {entries}); a field holds one "
            "array, so give each entry "
            f"its own field: TableSpec.from_spaces({{{fix}, ...}})"
        )
    if kind == "Tuple":
        count = len(getattr(space, "spaces", ()))
        fix = ", ".join(f"'{label}_{i}': {label}_space[{i}]" for i in range(min(count, 2)))
        raise SpecError(
            f"{what} is a Tuple space of {count} spaces; a field holds one array, so give each element "
            f"its own field: TableSpec.from_spaces({{{fix}, ...}})"
        )
    if kind in _REFUSED_SPACES:
        raise SpecError(f"{what}: {_REFUSED_SPACES[kind]}")
    if kind is None or not hasattr(space, _READ_SPACES[kind]):
        hint = " (a gymnax environment's spaces are methods: pass env.observation_space(params))"
        raise SpecError(
            f"{what}: {type(space).__name__} is not a space gear_jax reads; pass a gymnasium Box, Discrete, "
            "MultiDiscrete or MultiBinary space, a gymnax Box or Discrete space, or a gear_jax.Field"
            + (hint if callable(space) else "")
        )
    # gymnasium's Discrete and MultiDiscrete are int64; gymnax's Discrete is int32 (int64 before 1.0).
    dtype = getattr(space, "dtype", None)
    dtype = _named(what, _narrow_dtype, np.int64 if dtype is None else dtype, narrow)
    if kind in ("Discrete", "MultiDiscrete") and dtype.kind in "iu":  # start .. start + n - 1 must fit
        count = np.asarray(space.n if kind == "Discrete" else space.nvec, dtype=np.int64)
        low = np.asarray(getattr(space, "start", 0), dtype=np.int64)
        high = low + count - 1
        if count.size and (low.min() < np.iinfo(dtype).min or high.max() > np.iinfo(dtype).max):
            raise SpecError(
                f"{what}: {kind} values {int(low.min())} .. {int(high.max())} do not fit {dtype.name}; "
                "pass narrow=False (JAX then needs x64) or a gear_jax.Field"
            )
    if kind == "Box" and dtype.kind in "iu" and hasattr(space, "low") and hasattr(space, "high"):
        low, high = np.asarray(space.low), np.asarray(space.high)  # bounds of an integer Box must fit too
        if low.size and (low.min() < np.iinfo(dtype).min or high.max() > np.iinfo(dtype).max):
            raise SpecError(
                f"{what}: Box bounds {low.min()} .. {high.max()} do not fit {dtype.name}; pass narrow=False "
                "(JAX then needs x64) or a gear_jax.Field"
            )
    return _named(what, Field, () if kind == "Discrete" else space.shape, dtype)

"""Hand-off to and from PyTorch through DLPack, without copying.

`import gear_jax` never imports torch; `import gear_jax.torch` (or `gj.torch`) does.

- `to_torch(tree)` / `from_torch(tree)`: pytrees of arrays to and from `torch.Tensor`, sharing memory.
  On a GPU the consumer's stream waits for the producer's work through the DLPack stream protocol
  (torch passes its current stream to JAX's `__dlpack__`, JAX makes it wait on an event): no host
  synchronisation. Every dtype gear_jax tables hold crosses without a copy in both directions, bool and
  bfloat16 included. JAX has no 64-bit types unless `jax_enable_x64` is set, so `from_torch` of an int64
  or float64 tensor makes a narrowed copy (an int64 or uint64 value that does not fit 32 bits is refused,
  never wrapped); a non-contiguous tensor is copied too (JAX imports compact layouts only). A copy is
  never silent: it raises `CopyWarning`, or `InvalidArgumentError` with `allow_copy=False`.
- `Sampler(table, batch_size, ...)`: an iterator of batches (dicts of tensors), with
  `update_priorities(tensor)` for the last batch. For a GPU, a jitted `gj.sample` + `gj.gather` (the CUDA
  kernels read the pinned table into device memory); for the CPU, `gj.host.sample_gather` and
  `gj.host.update_priorities` (the same kernels without a JAX dispatch per batch or per update).
- `Table.insert` and `EpisodeWriter.append` take torch tensors. CPU tensors (pinned or not) are read in
  place; a CUDA tensor is copied once, from the device straight into the table's rows (`insert_tensors`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch

from gear_jax import _args, _rows, host, ops
from gear_jax.casting import cast_rule, refuse
from gear_jax.errors import AllRowsHeldError, InvalidArgumentError, warn_at_caller
from gear_jax.selection import Sample
from gear_jax.table import Table
from gear_jax.writers import AdmittedInserts

__all__ = [
    "CopyWarning",
    "EpochSampler",
    "Sampler",
    "from_torch",
    "insert_tensors",
    "to_torch",
    "torch_dtype",
]


class CopyWarning(UserWarning):
    """A hand-off between JAX and PyTorch had to copy (a dtype or layout the other side lacks)."""


_TORCH_DTYPES: dict[np.dtype, torch.dtype] = {
    np.dtype(np.bool_): torch.bool,
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.int8): torch.int8,
    np.dtype(np.uint16): torch.uint16,
    np.dtype(np.int16): torch.int16,
    np.dtype(np.uint32): torch.uint32,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.uint64): torch.uint64,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.float16): torch.float16,
    np.dtype(ml_dtypes.bfloat16): torch.bfloat16,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
}


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of a numpy / JAX dtype; InvalidArgumentError when torch has none."""
    try:
        return _TORCH_DTYPES[np.dtype(dtype)]
    except (KeyError, TypeError) as e:
        raise InvalidArgumentError(f"dtype {dtype} has no torch counterpart") from e


def _pointer(x: jax.Array) -> int | None:
    try:
        return int(x.unsafe_buffer_pointer())
    except Exception:  # noqa: BLE001 - sharded or deleted arrays have no single buffer
        return None


def to_torch(tree: Any) -> Any:
    """The arrays of `tree` as torch tensors on the same device, sharing their memory.

    Args:
      tree: a pytree of `jax.Array` (e.g. the dict `gj.gather` returns). Leaves that are not JAX
        arrays are left as they are.

    Returns:
      The same pytree with `torch.Tensor` leaves. On a GPU, torch's current stream is made to wait for
      the work that produces each array (no host synchronisation).

    Raises:
      InvalidArgumentError: a JAX array torch cannot take (a PRNG key, a deleted array), named by its
        path in `tree`.
    """

    def convert(path: Any, x: Any) -> Any:
        if not isinstance(x, jax.Array):
            return x
        if not isinstance(x.dtype, np.dtype):  # an extended dtype: PRNG keys
            raise InvalidArgumentError(
                f"{_leaf(path)} is a JAX array of dtype {x.dtype} (a PRNG key), which has no torch "
                "counterpart: pass its data (jax.random.key_data(key)) or leave it out of the tree"
            )
        try:
            return torch.from_dlpack(x)
        except (BufferError, RuntimeError, TypeError, ValueError) as e:
            raise InvalidArgumentError(
                f"{_leaf(path)} (a {x.dtype} array of shape {x.shape}) could not be handed to torch: {e}"
            ) from e

    return jax.tree_util.tree_map_with_path(convert, tree)


def _leaf(path: Any) -> str:
    """A leaf of `to_torch`'s tree, named by its path."""
    return f"to_torch: tree{jax.tree_util.keystr(path)}" if path else "to_torch: the array"


def from_torch(tree: Any, allow_copy: bool = True) -> Any:
    """The tensors of `tree` as JAX arrays on the same device, sharing their memory where JAX can.

    Args:
      tree: a pytree with `torch.Tensor` leaves (others are left as they are).
      allow_copy: when JAX cannot take a tensor's memory as it is (int64 / float64 without
        `jax_enable_x64`, a non-contiguous layout, CPU memory not 64-byte aligned), copy it with a
        `CopyWarning` (True) or raise `InvalidArgumentError` (False).

    Returns:
      The same pytree with `jax.Array` leaves.

    Raises:
      InvalidArgumentError: a copy `allow_copy=False` forbids; an int64 / uint64 tensor, without
        `jax_enable_x64`, holding a value outside int32's / uint32's range (JAX would wrap it).
    """

    def convert(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        source = t.detach()
        reason = None
        if not source.is_contiguous():
            reason = (
                f"the tensor of shape {tuple(t.shape)} is not contiguous (JAX imports compact layouts only)"
            )
            if not allow_copy:
                raise InvalidArgumentError(f"from_torch: {reason}; pass .contiguous() or allow_copy=True")
            source = source.contiguous()
        x = jax.dlpack.from_dlpack(source)
        narrowed = x.dtype.itemsize < source.element_size()  # int64 / float64 without jax_enable_x64
        if reason is None and _pointer(x) != source.data_ptr() and source.numel() > 0:
            if x.dtype != _jax_dtype_of(source.dtype):
                reason = f"JAX holds {source.dtype} as {x.dtype} (jax_enable_x64 is off)"
            else:
                reason = "JAX could not take the tensor's memory as it is (CPU memory not 64-byte aligned)"
            if not allow_copy:
                raise InvalidArgumentError(f"from_torch: {reason}; a copy would be needed")
        if narrowed and x.dtype.kind in "iu":
            _check_narrowed_range(source, x.dtype)
        if reason is not None:
            copies.append(reason)
        return x

    copies: list[str] = []
    converted = jax.tree_util.tree_map(convert, tree, is_leaf=lambda x: isinstance(x, torch.Tensor))
    for reason in copies:
        warn_at_caller(f"from_torch copied: {reason}", CopyWarning)
    return converted


def _check_narrowed_range(t: torch.Tensor, dtype: np.dtype) -> None:
    """InvalidArgumentError when the int64 / uint64 tensor `t` holds a value outside `dtype`, the
    32-bit type JAX narrowed it to (values outside would have wrapped). Run by torch on `t`'s device."""
    if not t.numel():
        return
    info = np.iinfo(dtype)
    if t.dtype == torch.uint64:  # torch has no min / max for uint64: as int64, values >= 2**63 are < 0
        signed = t.view(torch.int64)
        wide = signed < 0
        small = signed[~wide]
        lo = int(small.min()) if small.numel() else int(signed.min()) % 2**64
        hi = int(signed[wide].max()) % 2**64 if bool(wide.any()) else int(small.max())
    else:
        lo, hi = (int(v) for v in torch.aminmax(t))
    if info.min <= lo and hi <= info.max:
        return
    cast = (
        f"(e.g. t.clamp({info.min}, {info.max}).to(torch.{dtype}))"
        if t.dtype == torch.int64
        else f"once its values fit (t.to(torch.{dtype}))"
    )
    raise InvalidArgumentError(
        f"from_torch: the {t.dtype} tensor of shape {tuple(t.shape)} holds values in [{lo}, {hi}], outside "
        f"{dtype}'s range [{info.min}, {info.max}]; JAX holds {t.dtype} as {dtype} (jax_enable_x64 is off), "
        f"so they would wrap: enable 64-bit types (jax.config.update('jax_enable_x64', True)) or cast the "
        f"tensor first {cast}"
    )


def _jax_dtype_of(dtype: torch.dtype) -> np.dtype | None:
    for np_dtype, t in _TORCH_DTYPES.items():
        if t == dtype:
            return np_dtype
    return None


# -- torch experience in ----------------------------------------------------------------------------


def _column_tensor(column: np.ndarray) -> torch.Tensor:
    """A torch view of a table column (shares the table's memory)."""
    if column.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(column.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(column)


def _not_plain(t: torch.Tensor, what: str) -> str:
    """Why the sparse or quantized tensor `what` is refused, with the fix."""
    if t.is_quantized:
        return (
            f"{what} is a quantized torch tensor ({t.dtype}); pass {what}.dequantize() (or .int_repr() for "
            "its integers) instead"
        )
    return f"{what} is a torch tensor of layout {t.layout}; pass a dense one ({what}.to_dense())"


def _runs(rows: np.ndarray) -> Iterator[tuple[int, int, int]]:
    """(first batch index, first row, count) of each run of consecutive row ids."""
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i] != rows[i - 1] + 1:
            yield start, int(rows[start]), i - start
            start = i


def _cast_tensor(t: torch.Tensor, dtype: np.dtype, casting: str) -> tuple[torch.Tensor | None, str]:
    """`t` as a tensor of the field's dtype under the table's casting policy (`gear_jax.casting`'s rule,
    with the value checks run by torch on the tensor's device), or (None, why it is refused)."""
    target = torch_dtype(dtype)
    if t.dtype == target:
        return t, ""
    source = _jax_dtype_of(t.dtype)
    if source is None:
        return None, f"has dtype {t.dtype}, which no field stores; convert it to {target} first"
    check, why = cast_rule(
        source, np.dtype(dtype), casting, source_name=str(t.dtype), astype=f".to({target})"
    )
    if not check:
        return None, why
    if check == "range" and t.numel():
        info = torch.iinfo(target)
        lo, hi = t.min().item(), t.max().item()
        if lo < info.min or hi > info.max:
            return None, f"holds values in [{lo}, {hi}], outside {dtype}'s range [{info.min}, {info.max}]"
    converted = t.to(target)
    if check == "overflow":  # floats narrowed
        overflow = torch.isinf(converted) & torch.isfinite(t)
        if bool(overflow.any()):
            return None, f"holds {t[overflow].flatten()[0].item()}, beyond {dtype}'s range"
    if check == "exact" and t.numel():  # int64 into float64: above 2**53 integers round
        if not bool(torch.isfinite(converted).all()) or not bool((converted.to(t.dtype) == t).all()):
            return None, f"holds integers that {dtype} does not represent exactly; cast it first"
    return converted, ""


def insert_tensors(
    table: Table,
    batch: Mapping[str, torch.Tensor],
    priorities: Any = None,
    lengths: Any = None,
    timeout: float | None = None,
) -> np.ndarray:
    """Inserts a batch of torch tensors by copying each straight into the table's rows.

    This is how `Table.insert` takes CUDA tensors: a chunk of rows (at most an eighth of the table) is
    claimed, each field is copied from the device into the claimed rows (one copy per run of consecutive
    rows), then the rows are published, and so on, as the host insert claims, copies and publishes its
    chunks. So the rows stored and the ids returned are those of `Table.insert` of the same batch on the
    host: a batch larger than the table, or one that meets rows held by writers, overwrites rows of its
    own earlier chunks (the ids of those rows appear twice; the rows hold the later values), and rows held
    by writers are skipped. It works for CPU tensors too (and is tested with them).

    Args and returns as `Table.insert`. Tensors are cast to the fields' dtypes by the table's casting
    policy, as host arrays are (`gear_jax.casting`), with the value checks run by torch on the tensors'
    device. With a rate limiter, the batch's rows are admitted (waiting up to `timeout`) before any is
    claimed.

    Raises:
      InvalidArgumentError: missing or unknown fields, wrong dtypes or shapes, sparse or quantized
        tensors, tensors on different devices, bad priorities or lengths. Nothing is written then.
      AllRowsHeldError: every row of the table is held by writers when a chunk is claimed: the chunks
        before it stay published (as with the host insert); nothing else changed.

    A copy that fails (a CUDA error, a KeyboardInterrupt) gives the rows of its chunk back empty (at most
    an eighth of the table); the earlier chunks stay published.
    """
    table = _args.check_table(table, "insert_tensors")
    native = table.native
    spec = table.spec
    batches = _rows.Batches(spec)
    problem = batches.fields_problem(batch)
    if problem:
        raise InvalidArgumentError(problem)
    tensors: dict[str, torch.Tensor] = {}
    problems: list[str] = []
    lead_shape = None
    devices = set()
    for name, field in spec.fields.items():
        t = batch[name]
        if not isinstance(t, torch.Tensor):
            raise InvalidArgumentError(f"batch[{name!r}] is a {type(t).__name__}, expected a torch.Tensor")
        devices.add(t.device)
        if t.layout != torch.strided or t.is_quantized:
            problems.append(_not_plain(t, f"batch[{name!r}]"))
            continue
        problem = batches.shape_problem(name, tuple(t.shape), lead_shape)
        if problem:
            problems.append(problem)
            continue
        lead_shape = lead_shape or tuple(t.shape[: batches.lead])
        tensors[name] = t
    if any(d.type not in ("cpu", "cuda") for d in devices):
        raise InvalidArgumentError(
            f"the batch's tensors lie on {sorted(map(str, devices))}; expected cpu or cuda"
        )
    if len(devices) > 1:
        raise InvalidArgumentError(f"the batch's tensors lie on several devices {sorted(map(str, devices))}")
    for name, t in list(tensors.items()):
        converted, why = _cast_tensor(t, spec.fields[name].dtype, table.casting)
        if converted is None:
            problems.append(f"batch[{name!r}] {why}")
        else:
            tensors[name] = converted
    refuse(problems, table.casting)
    assert lead_shape is not None
    rows, steps = batches.rows_and_steps(lead_shape)
    if rows == 0:
        return np.zeros((0,), np.int32)
    p = _rows.priorities(priorities, rows)
    table.native.check_priorities(p)  # the native rules (a queue's rows > 0) before any row is claimed
    n = np.full((rows,), steps, np.int32) if lengths is None else _rows.lengths(lengths, rows, steps)

    ids = np.empty((rows,), np.int32)
    # Claimed, copied and published a chunk at a time, as the host insert does (SharedTable::Insert): at
    # most an eighth of the ring is held at once, so that a batch larger than the table, or one that
    # meets rows held by writers, overwrites rows of its own earlier chunks instead of claiming every
    # row of the table (and giving them all back empty when the next claim finds none left).
    chunk = max(1, table.capacity // 8)
    with AdmittedInserts(table, rows, timeout) as admitted:
        done = 0
        while done < rows:
            claimed = _claim_rows(native, min(chunk, rows - done))
            committed = 0
            try:
                for name in spec.fields:
                    source = tensors[name].detach()[done : done + len(claimed)]
                    column = _column_tensor(table.columns[name])
                    for first, row, count in _runs(claimed):
                        piece = source[first : first + count]
                        if not spec.is_trajectory:
                            piece = piece.unsqueeze(1)
                        column[row : row + count, :steps].copy_(piece)
                for i, row in enumerate(claimed):
                    admitted.commit(int(row), int(n[done + i]), float(p[done + i]))
                    committed = i + 1
            except BaseException:
                for row in claimed[committed:]:
                    native.abandon(int(row))
                raise
            ids[done : done + len(claimed)] = claimed
            done += len(claimed)
    return ids


def _claim_rows(native: Any, want: int) -> np.ndarray:
    """Up to `want` rows claimed by this process, at least one: fewer when every other row is held (by
    writers, or by this claim), as the host insert publishes what it holds rather than wait. Raises
    AllRowsHeldError when no row at all can be claimed; the rows claimed are given back on any error."""
    claimed: list[int] = []
    try:
        while len(claimed) < want:
            try:
                claimed.append(int(native.claim()))
            except AllRowsHeldError:
                if not claimed:
                    raise
                break
    except BaseException:
        for row in claimed:
            native.abandon(row)
        raise
    return np.asarray(claimed, np.int64)


def check_step(table: Table, name: str, value: torch.Tensor) -> torch.Tensor:
    """One step of field `name` from a device tensor, cast by the table's casting policy (the episode
    writer, before a claim); InvalidArgumentError for a tensor that is not one."""
    field = table.spec.fields[name]
    if tuple(value.shape) != field.shape:
        raise InvalidArgumentError(
            f"step[{name!r}] is a {value.dtype} tensor of shape {tuple(value.shape)}; expected shape "
            f"{field.shape}"
        )
    converted, why = _cast_tensor(value, field.dtype, table.casting)
    if converted is None:
        raise InvalidArgumentError(f"step[{name!r}] {why}")
    return converted


def copy_step(table: Table, name: str, row: int, step: int, value: torch.Tensor) -> None:
    """Copies one checked step of field `name` from a tensor (any device) into row `row`."""
    _column_tensor(table.columns[name])[row, step].copy_(value.detach())


# -- batches out ------------------------------------------------------------------------------------


def _seed(seed: Any, op: str) -> int:
    """`seed` as an int in [0, 2**63 - 1] (what both numpy's Generator and `jax.random.key` take), or
    InvalidArgumentError naming `op`'s `seed`."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**63:
        raise InvalidArgumentError(f"{op}: seed={seed!r} must be an int in [0, 2**63 - 1]")
    return int(seed)


def _jax_device(device: Any, op: str) -> jax.Device:
    """The JAX device for a torch device (or name): cpu, or cuda:N -> the N-th GPU."""
    try:
        d = torch.device(device) if device is not None else torch.device("cpu")
    except (RuntimeError, TypeError, ValueError):
        raise InvalidArgumentError(
            f"{op}: device={device!r} is not a torch device; expected 'cpu', 'cuda', 'cuda:N' or a "
            "torch.device"
        ) from None
    if d.type == "cpu":
        return jax.devices("cpu")[0]
    if d.type == "cuda":
        try:
            gpus = jax.devices("gpu")
        except RuntimeError as e:
            raise InvalidArgumentError(f"{op}: device={device!r}: JAX sees no GPU") from e
        index = d.index or 0
        if index >= len(gpus):
            raise InvalidArgumentError(f"{op}: device={device!r}: JAX sees {len(gpus)} GPUs")
        return gpus[index]
    raise InvalidArgumentError(f"{op}: device={device!r}: expected 'cpu' or 'cuda[:N]'")


# The keys each sampler adds to a batch of the gathered fields (`valid` is reserved by every TableSpec).
_SAMPLER_KEYS = {
    "indices": "the int32 row ids of the picks",
    "probabilities": "the picks' sampling probabilities",
    "selectable": "the count of selectable rows",
}
# And with a window: where each window lies in its episode (a position = start + step, for models that
# embed it).
_WINDOW_SAMPLER_KEYS = {
    "starts": "the int32 step of its episode each window starts at",
    "lengths": "the int32 length of each picked episode",
}
_EPOCH_SAMPLER_KEYS = {"indices": "the int32 row ids of the picks"}


def _check_batch_keys(table: Table, fields: Any, keys: Mapping[str, str], op: str, instead: str) -> None:
    """Refuses (InvalidArgumentError) gathering a field that has the name of one of the keys `op` adds
    to each batch: the field's values would be replaced by the sampler's own without a word. `instead`
    names the calls that return the picks apart from the fields."""
    clash = [name for name in _args.check_fields(table.spec, fields, op) if name in keys]
    if not clash:
        return
    plural, it = ("s", "them") if len(clash) > 1 else ("", "it")
    own = "; ".join(f"{key!r}: {what}" for key, what in keys.items())
    others = [name for name in table.spec.fields if name not in keys]
    leave_out = f", or leave {it} out with fields={others!r}" if others else ""
    raise InvalidArgumentError(
        f"{op}: the table's field{plural} {', '.join(map(repr, clash))} would be replaced in every batch "
        f"by the sampler's own key{plural} of that name ({own}); rename {it} in the TableSpec (to a name "
        f"other than {', '.join(map(repr, [*keys, 'valid']))}){leave_out}, or draw with {instead}, which "
        "return the picks apart from the fields"
    )


class Sampler:
    """Batches of a gear_jax table as dicts of torch tensors, for a PyTorch learner.

    On a GPU each batch is one jitted `gj.sample` + `gj.gather` on the JAX device that matches `device`,
    handed to torch without a copy. On the CPU it is `gj.host.sample_gather` into numpy arrays that torch
    shares (`seed` seeds a numpy Generator), and `update_priorities` is `gj.host.update_priorities`: no
    JAX dispatch per batch or update (an update through JAX's dispatch of an effectful call costs
    hundreds of microseconds on a small CPU).

    `method`, `priority_exponent`, `window` and `short_episodes` are those of `gj.sample`, `fields` that
    of `gj.gather`.

    Besides the fields and `valid`, a batch holds `indices` (int32[B] row ids) and `probabilities`
    (float32[B]) and `selectable` (int64, the count N of selectable rows when the batch was drawn), so a
    learner can form importance weights (N * P)^-beta; with a `window`, also `starts` (int32[B], the step
    of its episode each window starts at: step i of a window is the episode's step starts + i) and
    `lengths` (int32[B], the picked episodes' lengths). Gathering a field of one of these names is
    refused at construction (InvalidArgumentError): rename the field, or leave it out with `fields=`.

    With `prefetch=True` the next batch is enqueued before the current one is returned (on a GPU, JAX
    draws it while the consumer works on this one); its sample then runs before this batch's priority
    update (the usual trade of prefetching replay). With `prefetch=False` an update is ordered before
    the next sample. On the CPU a draw runs on the calling thread, where drawing early gains nothing:
    there `prefetch` is ignored and every update precedes the next sample.

    Example:
      sampler = gj.torch.Sampler(table, 256, method="prioritized", priority_exponent=0.6)
      for step, batch in zip(range(1000), sampler):
          loss, td = learner(batch)
          sampler.update_priorities(td.abs() + 1e-3)
    """

    def __init__(
        self,
        table: Table,
        batch_size: int,
        method: str = "uniform",
        priority_exponent: float = 1.0,
        fields: Sequence[str] | None = None,
        window: int | None = None,
        device: Any = None,
        seed: int = 0,
        prefetch: bool = True,
        short_episodes: str = "pad",
    ):
        if not isinstance(table, Table):
            raise InvalidArgumentError(
                f"Sampler: `table` must be a gear_jax.Table, got {type(table).__name__}"
            )
        seed = _seed(seed, "Sampler")
        keys = {**_SAMPLER_KEYS, **(_WINDOW_SAMPLER_KEYS if window else {})}
        _check_batch_keys(table, fields, keys, "Sampler", "gj.host.sample_gather or gj.sample_gather")
        self._windowed = bool(window)
        self._table = table
        self._batch_size = int(batch_size)
        self._device = _jax_device(device, "Sampler")
        self._prefetch = bool(prefetch) and self._device.platform != "cpu"
        self._key = jax.device_put(jax.random.key(seed), self._device)
        self._after = jax.device_put(jnp.zeros((), jnp.int32), self._device)
        self._last: Sample | None = None
        self._pending: tuple[dict[str, Any], Sample] | None = None
        self._on_host = self._device.platform == "cpu"
        self._rng = np.random.default_rng(seed)
        self._host_options = {
            "fields": fields,
            "method": method,
            "priority_exponent": priority_exponent,
            "window": window,
            "short_episodes": short_episodes,
        }

        def draw(key: jax.Array, after: jax.Array) -> tuple[jax.Array, dict[str, jax.Array], Sample]:
            key, sub = jax.random.split(key)
            s = ops.sample(
                table,
                sub,
                batch_size,
                method=method,
                priority_exponent=priority_exponent,
                window=window,
                after=after,
                short_episodes=short_episodes,
            )
            out = ops.gather(table, s, fields=fields)
            out["indices"] = s.indices
            out["probabilities"] = s.probabilities
            out["selectable"] = s.selectable
            if window:
                out["starts"], out["lengths"] = s.starts, s.lengths
            return key, out, s

        def update(s: Sample, priorities: jax.Array) -> jax.Array:
            return ops.update_priorities(table, s, priorities)

        # Argument checks run now, at trace time, with clear errors, not at the first batch.
        jax.eval_shape(draw, self._key, self._after)
        self._draw = jax.jit(draw)
        self._update = jax.jit(update)

    def _enqueue(self) -> tuple[dict[str, Any], Sample]:
        if self._on_host:
            s, out = host.sample_gather(self._table, self._rng, self._batch_size, **self._host_options)
            out["indices"] = s.indices
            out["probabilities"] = s.probabilities
            if self._windowed:
                out["starts"], out["lengths"] = s.starts, s.lengths
            return out, s
        self._key, out, s = self._draw(self._key, self._after)
        return out, s

    def __iter__(self) -> Sampler:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        out, s = self._pending if self._pending is not None else self._enqueue()
        self._pending = self._enqueue() if self._prefetch else None
        self._last = s
        if self._on_host:
            batch = {name: _column_tensor(value) for name, value in out.items()}
            batch["selectable"] = torch.tensor(int(s.selectable), dtype=torch.int64)
            return batch
        batch = to_torch(out)
        batch["selectable"] = batch["selectable"].to(torch.int64)  # the N of the sample, as torch counts
        return batch

    def update_priorities(self, priorities: torch.Tensor) -> torch.Tensor:
        """Sets the priorities of the last batch's rows (rows overwritten since are left alone).

        Args:
          priorities: a float tensor of shape [B], finite and >= 0, on the sampler's device.

        Returns:
          A 0-d int32 tensor: entries applied (the count is ready without a host synchronisation on GPU).
        """
        if self._last is None:
            raise InvalidArgumentError("update_priorities: no batch was drawn yet; call next(sampler) first")
        if not isinstance(priorities, torch.Tensor):
            raise InvalidArgumentError(
                f"update_priorities: priorities must be a torch.Tensor, got {type(priorities).__name__}"
            )
        wanted = "cpu" if self._device.platform == "cpu" else "cuda"
        if priorities.device.type != wanted:
            raise InvalidArgumentError(
                f"update_priorities: priorities lie on {priorities.device}, the sampler's batches on {wanted}"
            )
        if self._on_host:  # shape, dtype and values: checked as every host update's
            applied = host.update_priorities(self._table, self._last, priorities)
            return torch.tensor(applied, dtype=torch.int32)
        with warnings.catch_warnings():  # B floats: a copy, where one is needed, costs nothing here
            warnings.simplefilter("ignore", CopyWarning)
            p = from_torch(priorities.detach().contiguous())  # checked as every compiled update's
        count = self._update(self._last, p)
        self._after = count
        return torch.from_dlpack(count)


class EpochSampler:
    """Epochs over a gear_jax table for a PyTorch on-policy learner: each `iter(sampler)` is one epoch, a
    fresh permutation of the selectable rows in minibatches (dicts of torch tensors), each row once.

    On the CPU an epoch is `gj.host.epoch` and each minibatch `gj.host.gather` (numpy arrays torch
    shares); on a GPU it is one jitted `gj.epoch` and a jitted `gj.gather` per minibatch on the JAX
    device that matches `device`, handed to torch without a copy. `minibatch_size`, `num_rows`,
    `drop_last` and `window` are those of `gj.epoch`, `fields` that of `gj.gather`. A minibatch holds
    the fields, `valid` (False for the failed picks that fill an epoch over fewer rows than `num_rows`)
    and `indices` (int32 row ids; gathering a field named `indices` is refused at construction).
    `retire()` makes the rows of the last epoch unselectable.

    Example:
      sampler = gj.torch.EpochSampler(rollouts, 64, num_rows=2048)
      for _ in range(4):                      # four epochs over the rollout
          for batch in sampler:
              loss = ppo_loss(policy, batch)   # mask with batch["valid"]
              ...
      sampler.retire()                        # the rollout is never drawn again
    """

    def __init__(
        self,
        table: Table,
        minibatch_size: int,
        num_rows: int | None = None,
        drop_last: bool = True,
        fields: Sequence[str] | None = None,
        window: int | None = None,
        device: Any = None,
        seed: int = 0,
    ):
        from gear_jax import epochs

        if not isinstance(table, Table):
            raise InvalidArgumentError(
                f"EpochSampler: `table` must be a gear_jax.Table, got {type(table).__name__}"
            )
        op = "EpochSampler"
        seed = _seed(seed, op)
        mb, rows = epochs.check_epoch(table, minibatch_size, num_rows, drop_last, op, window)
        drop_last = bool(drop_last)
        self._table = table
        self._options = {"minibatch_size": mb, "num_rows": rows, "drop_last": drop_last, "window": window}
        self._fields = fields
        self._device = _jax_device(device, op)
        self._on_host = self._device.platform == "cpu"
        self._rng = np.random.default_rng(seed)
        self._key = jax.device_put(jax.random.key(seed), self._device)
        self._last: list[Sample] = []
        self._minibatches = epochs.epoch_shape(rows, mb, drop_last)[0]
        _check_batch_keys(table, fields, _EPOCH_SAMPLER_KEYS, op, "gj.host.epoch or gj.epoch and a gather")
        _args.check_window(window, table.max_steps, op)

        def draw(key: jax.Array) -> tuple[jax.Array, Sample]:
            key, sub = jax.random.split(key)
            return key, epochs.epoch(table, sub, **self._options)

        def gather(s: Sample) -> dict[str, jax.Array]:
            out = ops.gather(table, s, fields=fields)
            out["indices"] = s.indices
            return out

        self._draw = jax.jit(draw)
        self._gather = jax.jit(gather)

    def __len__(self) -> int:
        """Minibatches per epoch."""
        return self._minibatches

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if self._on_host:
            self._last = host.epoch(self._table, self._rng, **self._options)
            for s in self._last:
                out = host.gather(self._table, s, fields=self._fields)
                out["indices"] = s.indices
                yield {name: _column_tensor(value) for name, value in out.items()}
            return
        self._key, picks = self._draw(self._key)
        self._last = [jax.tree_util.tree_map(lambda x, i=i: x[i], picks) for i in range(self._minibatches)]
        for s in self._last:
            yield to_torch(self._gather(s))

    def retire(self) -> int:
        """Makes the rows of the last epoch unselectable (priority 0) where they still hold what was
        drawn; returns how many it retired."""
        if not self._last:
            raise InvalidArgumentError("retire: no epoch was drawn yet; iterate the sampler first")
        return host.retire(self._table, [jax.tree_util.tree_map(np.asarray, s) for s in self._last])

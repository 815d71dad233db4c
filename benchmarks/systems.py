"""The systems a selection suite times: gear_jax and the in-process baselines.

Each system holds the rows of one `Dataset` and, for a batch size B, makes a `step(i)` that selects B
rows (or windows of `window` steps) with the workload's method and, when `collect` is set, copies them
out, returning only when the work is complete. Building a baseline that is not installed or fails
raises `Unavailable`; the suite then skips it with a note.

`pinned_host_loop` and `pure_callback` are XLA's own ways to gather from host memory, the paths
gear_jax exists to beat; they only gather (uniform picks, whole rows or windows).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import gear_jax as gj
from gear_jax.bench.common import GEAR, GEAR_EFFECT, GEAR_HOST, Unavailable, time_calls
from gear_jax.bench.data import Dataset

Step = Callable[[int], Any]
ORDERED = ("fifo", "lifo", "topk")


@dataclasses.dataclass(frozen=True)
class Workload:
    """What each step does.

    Attributes:
      data: the rows.
      method: "uniform", "prioritized", "fifo", "lifo" or "topk".
      priority_exponent: for "prioritized".
      window: steps per sampled window (trajectory rows), 0 for whole one-step rows.
      collect: copy the selected rows out (sample + gather) or only select them.
      scan_bytes: bytes every step accounts for whatever the batch size (the priorities suite: the
        state column a prioritized pick reads once); 0: picks x `bytes_per_pick()`.
    """

    data: Dataset
    method: str = "uniform"
    priority_exponent: float = 1.0
    window: int = 0
    collect: bool = True
    scan_bytes: int = 0

    @property
    def steps_out(self) -> int:
        """Steps per selected row in the output."""
        return self.window or 1

    def bytes_per_pick(self) -> int:
        """Bytes one pick copies out (0 when only selecting)."""
        return self.steps_out * self.data.item_bytes if self.collect else 0

    def bytes_per_step(self, batch_size: int) -> int:
        """Bytes one step of `batch_size` picks accounts for in the throughput."""
        return self.scan_bytes or batch_size * self.bytes_per_pick()


class System:
    """One system holding the workload's rows. Subclasses set `name` and implement `make_step`.

    `measured_as`, when set, says what a reference system timed; the suites copy it into its records.
    """

    name = ""
    measured_as: str | None = None
    # Its steps can be timed one turn at a time between other systems' steps (`--interleave`): false
    # for a system that times its work elsewhere (another process, CUDA events).
    interleavable = True

    def __init__(self, work: Workload):
        self.work = work

    def make_step(self, batch_size: int) -> Step:
        """A function of the iteration number doing one complete step of `batch_size` picks."""
        raise NotImplementedError

    def work_per_step(self, batch_size: int) -> tuple[int, int]:
        """(items, bytes) one step of `batch_size` picks accounts for in the throughput."""
        return batch_size, self.work.bytes_per_step(batch_size)

    def describe(self) -> str | None:
        """Where the system holds its rows or how it ran, for a note after timing (None: nothing to say)."""
        return None

    def latencies(
        self, batch_sizes: list[int], warmup: int, iters: int, tick: Callable[[], None]
    ) -> dict[int, np.ndarray]:
        """Seconds per step for each batch size, this system alone."""
        return {b: time_calls(self.make_step(b), warmup, iters, tick) for b in batch_sizes}

    def close(self) -> None:
        """Frees the system's copy of the rows."""


def _window_rows(work: Workload, rows: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Flat step ids int64[B * window] of windows starting at `starts` in `rows` (numpy)."""
    first = rows.astype(np.int64) * work.data.steps + starts
    return (first[:, None] + np.arange(work.window)).reshape(-1)


def where(array: jax.Array) -> str:
    """The device(s) and memory kind holding `array`, e.g. "cuda:0, memory kind device"."""
    devices = ", ".join(str(d) for d in sorted(array.devices(), key=lambda d: d.id))
    return f"{devices}, memory kind {array.sharding.memory_kind}"


def memory_kinds(device: jax.Device) -> set[str]:
    """The memory kinds JAX can place arrays in on `device` (device, pinned_host, unpinned_host, ...)."""
    return {m.kind for m in device.addressable_memories()}


def flat_firsts(rows: jax.Array, start_key: jax.Array, work: Workload) -> jax.Array:
    """int32[B]: the first flat step row of each picked row in `rows`: row * steps, plus, with a
    window, a uniform window start drawn with `start_key` (jitted code)."""
    data = work.data
    first = rows * data.steps
    if work.window:
        first = first + jax.random.randint(start_key, rows.shape, 0, data.steps - work.window + 1)
    return first


def uniform_firsts(i: jax.Array, work: Workload, batch_size: int) -> jax.Array:
    """int32[B]: `flat_firsts` of B uniform picks at iteration `i`, the picks jnp_take makes (jitted code)."""
    key, start_key = jax.random.split(jax.random.fold_in(jax.random.key(0), i))
    return flat_firsts(jax.random.randint(key, (batch_size,), 0, work.data.rows), start_key, work)


def _gather_only(work: Workload, name: str) -> None:
    if not work.collect or work.method != "uniform":
        raise Unavailable(f"{name} is a gather baseline: it runs uniform sample + gather only")


HLO_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%\S+\s*=\s*(.+?)\s+([a-z][\w-]*)\(")
HLO_PLUMBING = (
    "parameter",
    "get-tuple-element",
    "tuple",
    "while",
    "call",
    "conditional",
    "bitcast",
    "opt-barrier",
)


def host_memory_summary(hlo: str, table_shape: str, result_shape: str) -> str:
    """What a compiled program does with host memory, from its optimized HLO text: the parameters and
    ops whose result lives in host memory (layout memory space S(5)), and the ops other than
    parameters, tuples and control flow whose result holds the whole table (a copy of it, which a
    per-row DMA avoids), unless the program's result has the table's shape and so can't be told apart.

    Args:
      table_shape, result_shape: HLO shapes without layout, e.g. "u8[1000,64]"."""
    entry = re.search(r"entry_computation_layout=\{\((.*?)\)->", hlo)
    host_params = entry.group(1).count("S(5)") if entry else 0
    host: Counter[str] = Counter()
    whole: Counter[str] = Counter()
    for line in hlo.splitlines():
        m = HLO_INSTRUCTION.match(line)
        if m is None:
            continue
        shape, op = m.groups()
        if "S(5)" in shape:
            host[op] += 1
        if table_shape + "{" in shape and op not in HLO_PLUMBING:
            whole[op] += 1

    def show(counts: Counter[str]) -> str:
        return ", ".join(f"{op} x{n}" for op, n in sorted(counts.items())) or "none"

    whole_table = (
        show(whole) if result_shape != table_shape else "not told apart (result of the table's shape)"
    )
    return (
        f"parameters in host memory S(5): {host_params}; ops with results in host memory: {show(host)}; "
        f"ops producing the whole table: {whole_table}"
    )


def make_table(data: Dataset) -> gj.Table:
    """A gear_jax table (field "x", uint8[item_bytes] per step; pinned where CUDA is present) holding
    the dataset's rows with its priorities, inserted chunk by chunk."""
    spec = gj.TableSpec(
        fields={"x": gj.Field((data.item_bytes,), "uint8")}, capacity=data.rows, max_steps=data.steps
    )
    table = gj.Table.create(spec)
    priorities = data.priorities()
    for start, chunk in data.chunks():
        rows = chunk if data.steps > 1 else chunk[:, 0]
        table.insert({"x": rows}, priorities=priorities[start : start + len(chunk)])
    # Every page of the status columns mapped in this process, as in a learner that has run a while:
    # inserts never touch times_sampled, and a fresh page costs a fault at its first sample (at 1e7
    # rows, the first 30 prioritized samples of 1,024 picks took 1.4 ms each, the next 0.4 ms).
    table.row_status()
    return table


class GearSystem(System):
    """gear_jax: a shared-memory table; one jitted function samples (and gathers, with
    `gj.sample_gather`: one custom call on the CPU)."""

    name = GEAR

    def __init__(self, work: Workload):
        super().__init__(work)
        self.table = make_table(work.data)

    def make_step(self, batch_size: int) -> Step:
        work, table = self.work, self.table
        window = work.window or None

        @jax.jit
        def run(i: jax.Array) -> Any:
            key = jax.random.fold_in(jax.random.key(0), i)
            options = {"method": work.method, "priority_exponent": work.priority_exponent, "window": window}
            if work.collect:
                return gj.sample_gather(table, key, batch_size, fields=("x",), **options)[1]
            return gj.sample(table, key, batch_size, **options)

        return lambda i: jax.block_until_ready(run(i))

    def close(self) -> None:
        self.table.close()


class GearHostSystem(GearSystem):
    """gear_jax.host: the same table and kernels called from Python outside jit, what a PyTorch or numpy
    learner on the CPU would call: `gj.host.sample` for selection alone, a `gj.host.Sampler` (arrays made
    once, as numpy's baseline `np.take`s into a preallocated buffer) for sample + gather."""

    name = GEAR_HOST

    def make_step(self, batch_size: int) -> Step:
        work, table = self.work, self.table
        rng = np.random.default_rng(0)
        options = {
            "method": work.method,
            "priority_exponent": work.priority_exponent,
            "window": work.window or None,
        }
        if not work.collect:
            return lambda i: gj.host.sample(table, rng, batch_size, **options)
        sampler = gj.host.Sampler(table, batch_size, fields=("x",), rng=rng, **options)
        return lambda i: sampler()[1]


class NumpySystem(System):
    """numpy: fancy indexing with np.take into a preallocated buffer; selection with numpy."""

    name = "numpy"

    def __init__(self, work: Workload):
        super().__init__(work)
        data = work.data
        self.flat = data.as_array().reshape(data.rows * data.steps, data.item_bytes)
        self.weights = data.priorities().astype(np.float64)
        self.seq = np.arange(data.rows, dtype=np.uint64)
        self.rng = np.random.default_rng(0)

    def select(self, batch_size: int) -> np.ndarray:
        """Row ids int64[B] picked with the workload's method."""
        work, rng, n = self.work, self.rng, self.work.data.rows
        if work.method == "uniform":
            return rng.integers(0, n, batch_size)
        if work.method == "prioritized":
            cdf = np.cumsum(self.weights**work.priority_exponent)
            return np.minimum(np.searchsorted(cdf, rng.random(batch_size) * cdf[-1], side="right"), n - 1)
        key = {"fifo": self.seq, "lifo": ~self.seq, "topk": -self.weights}[work.method]
        picked = np.argpartition(key, batch_size - 1)[:batch_size]
        return picked[np.argsort(key[picked], kind="stable")]

    def make_step(self, batch_size: int) -> Step:
        work = self.work
        if not work.collect:
            return lambda i: self.select(batch_size)
        out = np.empty((batch_size * work.steps_out, work.data.item_bytes), np.uint8)

        def step(i: int) -> np.ndarray:
            rows = self.select(batch_size)
            if work.window:
                starts = self.rng.integers(0, work.data.steps - work.window + 1, batch_size)
                rows = _window_rows(work, rows, starts)
            return np.take(self.flat, rows, axis=0, out=out)

        return step

    def close(self) -> None:
        del self.flat


class JnpSystem(System):
    """JAX: a device array of the rows; jitted selection and `jnp.take`."""

    name = "jnp_take"

    def __init__(self, work: Workload):
        super().__init__(work)
        data = work.data
        self.flat = jnp.zeros((data.rows * data.steps, data.item_bytes), jnp.uint8)
        write = jax.jit(
            lambda buf, chunk, at: jax.lax.dynamic_update_slice(buf, chunk, (at, 0)), donate_argnums=0
        )
        for start, chunk in data.chunks():
            self.flat = write(self.flat, chunk.reshape(-1, data.item_bytes), start * data.steps)
        self.weights = jnp.asarray(data.priorities())
        self.seq = jnp.arange(data.rows, dtype=jnp.int32)

    def make_step(self, batch_size: int) -> Step:
        work = self.work
        n, window = work.data.rows, work.window

        def select(key: jax.Array, weights: jax.Array, seq: jax.Array) -> jax.Array:
            if work.method == "uniform":
                return jax.random.randint(key, (batch_size,), 0, n)
            if work.method == "prioritized":
                cdf = jnp.cumsum(weights**work.priority_exponent)
                u = jax.random.uniform(key, (batch_size,)) * cdf[-1]
                return jnp.minimum(jnp.searchsorted(cdf, u, side="right"), n - 1)
            score = {"fifo": -seq, "lifo": seq, "topk": weights}[work.method]
            return jax.lax.top_k(score, batch_size)[1]

        @jax.jit
        def run(i: jax.Array, flat: jax.Array, weights: jax.Array, seq: jax.Array) -> jax.Array:
            key, window_key = jax.random.split(jax.random.fold_in(jax.random.key(0), i))
            rows = select(key, weights, seq)
            if not work.collect:
                return rows
            if window:
                rows = (flat_firsts(rows, window_key, work)[:, None] + jnp.arange(window)).reshape(-1)
            return jnp.take(flat, rows, axis=0)

        return lambda i: jax.block_until_ready(run(i, self.flat, self.weights, self.seq))

    def describe(self) -> str:
        return f"jnp_take holds its rows on {where(self.flat)}"

    def close(self) -> None:
        self.flat.delete()


def pinned_host_steps(work: Workload) -> tuple[jax.Array, jax.sharding.Sharding]:
    """(the workload's steps as a JAX array [rows x steps, item_bytes] of memory kind "pinned_host" on
    the default device, that device's "device" memory); raises Unavailable where it has no pinned_host
    memory."""
    device = jax.devices()[0]
    kinds = memory_kinds(device)
    if "pinned_host" not in kinds:
        raise Unavailable(f"{device} has no pinned_host memory (its memory kinds: {sorted(kinds)})")
    host = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
    data = work.data
    steps = data.as_array().reshape(data.rows * data.steps, data.item_bytes)
    flat = jax.block_until_ready(jax.device_put(steps, host))
    return flat, jax.sharding.SingleDeviceSharding(device, memory_kind="device")


class PinnedHostLoopSystem(System):
    """XLA's host-memory path: the rows in a JAX array of memory kind "pinned_host" on the default
    device; one jitted function draws B uniform picks, then a `lax.fori_loop` dynamic-slices each
    picked row (or window) out of the host array and moves it to device memory with
    `jax.device_put(..., memory_kind="device")` into a device result: on GPU, XLA turns a dynamic
    slice of host memory that moves to the device into a DMA (other indexing of host memory, such as
    `jnp.take`, is refused or runs as host compute)."""

    name = "pinned_host_loop"

    def __init__(self, work: Workload):
        super().__init__(work)
        _gather_only(work, self.name)
        self.flat, self.device_memory = pinned_host_steps(work)
        self.compiled: dict[str, list[int]] = {}  # host_memory_summary -> batch sizes compiled to it

    def make_step(self, batch_size: int) -> Step:
        work, steps_out, item_bytes = self.work, self.work.steps_out, self.work.data.item_bytes
        to_device = self.device_memory

        def run(i: jax.Array, flat: jax.Array) -> jax.Array:
            first = uniform_firsts(i, work, batch_size)

            def copy(k: jax.Array, out: jax.Array) -> jax.Array:
                piece = jax.device_put(lax.dynamic_slice_in_dim(flat, first[k], steps_out, axis=0), to_device)
                return lax.dynamic_update_slice_in_dim(out, piece, k * steps_out, axis=0)

            return lax.fori_loop(
                0, batch_size, copy, jnp.zeros((batch_size * steps_out, item_bytes), jnp.uint8)
            )

        compiled = jax.jit(run).lower(np.int32(0), self.flat).compile()
        table, result = (f"u8[{rows},{item_bytes}]" for rows in (self.flat.shape[0], batch_size * steps_out))
        summary = host_memory_summary(compiled.as_text(), table, result)
        self.compiled.setdefault(summary, []).append(batch_size)
        return lambda i: jax.block_until_ready(compiled(np.int32(i), self.flat))

    def describe(self) -> str:
        programs = "; ".join(
            f"compiled program (B={','.join(map(str, batch_sizes))}): {summary}"
            for summary, batch_sizes in self.compiled.items()
        )
        return f"pinned_host_loop holds its rows on {where(self.flat)}; {programs}"

    def close(self) -> None:
        self.flat.delete()


class PureCallbackSystem(System):
    """`jax.pure_callback` + numpy: one jitted function draws B uniform picks on the device and calls
    back into Python, where `np.take` copies the picked rows (or windows) of a host numpy array into a
    preallocated buffer; JAX moves the callback's result to the device (on GPU: a host-to-device copy)."""

    name = "pure_callback"

    def __init__(self, work: Workload):
        super().__init__(work)
        _gather_only(work, self.name)
        data = work.data
        self.flat = data.as_array().reshape(data.rows * data.steps, data.item_bytes)

    def make_step(self, batch_size: int) -> Step:
        work, steps_out = self.work, self.work.steps_out
        out = np.empty((batch_size * steps_out, work.data.item_bytes), np.uint8)
        result = jax.ShapeDtypeStruct(out.shape, jnp.uint8)

        def collect(first: np.ndarray) -> np.ndarray:
            ids = (np.asarray(first, np.int64)[:, None] + np.arange(steps_out)).reshape(-1)
            return np.take(self.flat, ids, axis=0, out=out)

        @jax.jit
        def run(i: jax.Array) -> jax.Array:
            first = uniform_firsts(i, work, batch_size)
            return jax.pure_callback(collect, result, first)

        return lambda i: jax.block_until_ready(run(i))

    def close(self) -> None:
        del self.flat


class FlashbaxSystem(System):
    """flashbax: item buffer (uniform), prioritised item buffer, or a trajectory buffer with one lane
    per row for windows; jitted `sample`."""

    name = "flashbax"

    def __init__(self, work: Workload):
        super().__init__(work)
        try:
            import flashbax as fbx
        except ImportError as e:
            raise Unavailable(f"flashbax is not installed ({e})") from None
        if work.method not in ("uniform", "prioritized"):
            raise Unavailable(f"flashbax has no {work.method} sampling")
        if work.window and work.method != "uniform":
            raise Unavailable("the flashbax window baseline is uniform only")
        self.fbx = fbx
        data = work.data
        buffer = self._buffer(1)
        self.state = buffer.init(jnp.zeros((data.item_bytes,), jnp.uint8))
        add = jax.jit(buffer.add, donate_argnums=0)
        if work.window:
            for t in range(data.steps):
                self.state = add(self.state, data.step_column(t)[:, None])
        else:
            for _, chunk in data.chunks():
                self.state = add(self.state, chunk[:, 0])
            if work.method == "prioritized":
                set_priorities = jax.jit(buffer.set_priorities, donate_argnums=0)
                self.state = set_priorities(self.state, jnp.arange(data.rows), jnp.asarray(data.priorities()))

    def _buffer(self, batch_size: int) -> Any:
        work, fbx = self.work, self.fbx
        n = work.data.rows
        if work.window:
            return fbx.make_trajectory_buffer(
                add_batch_size=n,
                sample_batch_size=batch_size,
                sample_sequence_length=work.window,
                period=1,
                min_length_time_axis=work.window,
                max_length_time_axis=work.data.steps,
            )
        if work.method == "prioritized":
            return fbx.make_prioritised_item_buffer(
                max_length=n,
                min_length=1,
                sample_batch_size=batch_size,
                add_sequences=True,
                priority_exponent=work.priority_exponent,
            )
        return fbx.make_item_buffer(
            max_length=n, min_length=1, sample_batch_size=batch_size, add_sequences=True
        )

    def make_step(self, batch_size: int) -> Step:
        sample = jax.jit(self._buffer(batch_size).sample)
        key = jax.random.key(0)
        return lambda i: jax.block_until_ready(sample(self.state, jax.random.fold_in(key, i)))

    def close(self) -> None:
        jax.tree_util.tree_map(lambda x: x.delete(), self.state)


def update_values(i: jax.Array, batch_size: int) -> jax.Array:
    """float32[B] in [0.1, 1): the new priorities a learner step `i` writes (jitted code)."""
    key = jax.random.fold_in(jax.random.key(1), i)
    return jax.random.uniform(key, (batch_size,), minval=0.1, maxval=1.0)


class GearUpdateSystem(GearSystem):
    """gear_jax, learner workload: one jitted step sets the priorities of the B rows the previous
    step sampled, then samples B rows after it, so that the priority index follows B changes per step.
    Prioritized selection only, no gather.

    `gear_jax` passes the update as `gj.sample(..., priority_update=(previous, priorities))`: part of the
    sample, no JAX effect, JAX's fast dispatch path. `gear_jax_effect` (`effect=True`) calls
    `gj.update_priorities` (a JAX effect: JAX's Python dispatch every step) and samples `after=` its
    count. (Older reports under docs/bench ran the effectful step under the name gear_jax.)"""

    def __init__(self, work: Workload, effect: bool = False):
        super().__init__(work)
        self.effect = effect
        if effect:
            self.name = GEAR_EFFECT

    def make_step(self, batch_size: int) -> Step:
        table, exponent = self.table, self.work.priority_exponent

        def pick(i: jax.Array, **update: Any) -> gj.Sample:
            key = jax.random.fold_in(jax.random.key(0), i)
            return gj.sample(
                table, key, batch_size, method="prioritized", priority_exponent=exponent, **update
            )

        effect = self.effect

        @jax.jit
        def run(i: jax.Array, previous: gj.Sample) -> gj.Sample:
            values = update_values(i, batch_size)
            if effect:
                return pick(i, after=gj.update_priorities(table, previous, values))
            return pick(i, priority_update=(previous, values))

        previous = jax.block_until_ready(jax.jit(pick)(0))

        def step(i: int) -> gj.Sample:
            nonlocal previous
            previous = jax.block_until_ready(run(i, previous))
            return previous

        return step


class GearHostUpdateSystem(GearSystem):
    """gear_jax.host, learner workload: `gj.host.update_priorities` of the B rows the previous step
    sampled (new priorities drawn with numpy, as numpy_cumsum's), then `gj.host.sample` of B: the
    learner step of a PyTorch or numpy learner, no JAX dispatch. Prioritized selection only."""

    name = GEAR_HOST

    def make_step(self, batch_size: int) -> Step:
        table, exponent = self.table, self.work.priority_exponent
        rng = np.random.default_rng(0)
        options = {"method": "prioritized", "priority_exponent": exponent}
        previous = gj.host.sample(table, rng, batch_size, **options)

        def step(i: int) -> gj.Sample:
            nonlocal previous
            gj.host.update_priorities(table, previous, rng.uniform(0.1, 1.0, batch_size).astype(np.float32))
            previous = gj.host.sample(table, rng, batch_size, **options)
            return previous

        return step


class JnpCumsumUpdateSystem(System):
    """JAX, learner workload: float32 priorities in a device array; one jitted step (the array
    donated) writes the B priorities of the rows the previous step picked, then `cumsum(p**a)` +
    `searchsorted` as jnp_take. Selection only (it holds no rows)."""

    name = "jnp_take"

    def __init__(self, work: Workload):
        super().__init__(work)
        self.weights = jnp.asarray(work.data.priorities())

    def make_step(self, batch_size: int) -> Step:
        n, exponent = self.work.data.rows, self.work.priority_exponent

        def pick(i: jax.Array, weights: jax.Array) -> jax.Array:
            cdf = jnp.cumsum(weights**exponent)
            u = jax.random.uniform(jax.random.fold_in(jax.random.key(0), i), (batch_size,)) * cdf[-1]
            return jnp.minimum(jnp.searchsorted(cdf, u, side="right"), n - 1)

        def run(i: jax.Array, weights: jax.Array, previous: jax.Array) -> tuple[jax.Array, jax.Array]:
            weights = weights.at[previous].set(update_values(i, batch_size))
            return weights, pick(i, weights)

        run = jax.jit(run, donate_argnums=1)
        previous = jax.block_until_ready(jax.jit(pick)(0, self.weights))

        def step(i: int) -> jax.Array:
            nonlocal previous
            self.weights, previous = jax.block_until_ready(run(i, self.weights, previous))
            return previous

        return step

    def describe(self) -> str:
        return f"jnp_take holds its priorities on {where(self.weights)}"

    def close(self) -> None:
        self.weights.delete()


class NumpyCumsumSystem(System):
    """numpy on the host: p**a of every row in a float64 array, made once; each step `np.cumsum` of
    it into a preallocated array and `np.searchsorted` of B uniform targets (the usual
    prioritized sampling without an index). With `updates`, each step first writes the new p**a of
    the B rows the previous step picked."""

    name = "numpy_cumsum"

    def __init__(self, work: Workload, updates: bool = False):
        super().__init__(work)
        self.updates = updates
        self.weights = work.data.priorities().astype(np.float64) ** work.priority_exponent
        self.cdf = np.empty_like(self.weights)
        self.rng = np.random.default_rng(0)

    def pick(self, batch_size: int) -> np.ndarray:
        """Row ids int64[B], row r with probability p_r^a / sum p^a."""
        cdf = np.cumsum(self.weights, out=self.cdf)
        picks = np.searchsorted(cdf, self.rng.random(batch_size) * cdf[-1], side="right")
        return np.minimum(picks, len(cdf) - 1)

    def make_step(self, batch_size: int) -> Step:
        if not self.updates:
            return lambda i: self.pick(batch_size)
        exponent, previous = self.work.priority_exponent, self.pick(batch_size)

        def step(i: int) -> np.ndarray:
            nonlocal previous
            new = self.rng.uniform(0.1, 1.0, batch_size).astype(np.float32)
            self.weights[previous] = new.astype(np.float64) ** exponent
            previous = self.pick(batch_size)
            return previous

        return step

    def close(self) -> None:
        del self.weights, self.cdf


def sum_tree_nodes(leaves: np.ndarray) -> tuple[np.ndarray, int]:
    """(float32 nodes, depth) of a flashbax sum tree over `leaves` (`flashbax.buffers.sum_tree`'s
    layout: level d at [2^d - 1, 2^(d+1) - 1), the leaves at the bottom, zeros past them), each
    parent the sum of its children, built level by level in numpy in float64 and rounded once."""
    depth = max(0, int(np.ceil(np.log2(len(leaves)))))
    level = np.zeros(2**depth, np.float64)
    level[: len(leaves)] = leaves
    nodes = np.empty(2 ** (depth + 1) - 1, np.float32)
    for d in range(depth, -1, -1):
        nodes[2**d - 1 : 2 ** (d + 1) - 1] = level
        level = level.reshape(-1, 2).sum(axis=1) if d else level
    return nodes, depth


class FlashbaxSumTreeSystem(System):
    """flashbax's sum tree (`flashbax.buffers.sum_tree`, what its prioritised buffers sample with),
    holding p**a of every row; each step a jitted `stratified_sample` of B. With `updates`, one
    jitted step (the tree donated) first sets the new p**a of the B rows the previous step picked,
    with the batch setter flashbax's buffers use on this backend (`set_batch_bincount` on GPU and
    TPU, `set_batch_scan` on CPU), then samples."""

    name = "flashbax_sumtree"

    def __init__(self, work: Workload, updates: bool = False):
        super().__init__(work)
        try:
            from flashbax.buffers import sum_tree
            from flashbax.buffers.prioritised_trajectory_buffer import SET_BATCH_FN
        except ImportError as e:
            raise Unavailable(f"flashbax is not installed ({e})") from None
        self.sum_tree, self.updates = sum_tree, updates
        self.backend = jax.default_backend()
        self.set_batch = SET_BATCH_FN.get(self.backend, sum_tree.set_batch_scan)
        leaves = work.data.priorities().astype(np.float64) ** work.priority_exponent
        nodes, depth = sum_tree_nodes(leaves)
        empty = sum_tree.init(work.data.rows)
        if empty.tree_depth != depth:
            raise Unavailable(f"flashbax's sum tree has depth {empty.tree_depth}, expected {depth}")
        self.state = empty.replace(nodes=jnp.asarray(nodes), max_recorded_priority=jnp.asarray(leaves.max()))

    def make_step(self, batch_size: int) -> Step:
        sum_tree, exponent = self.sum_tree, self.work.priority_exponent

        def pick(i: jax.Array, state: Any) -> jax.Array:
            return sum_tree.stratified_sample(state, batch_size, jax.random.fold_in(jax.random.key(0), i))

        if not self.updates:
            sample = jax.jit(pick)
            return lambda i: jax.block_until_ready(sample(i, self.state))

        def run(i: jax.Array, state: Any, previous: jax.Array) -> tuple[Any, jax.Array]:
            state = self.set_batch(state, previous, update_values(i, batch_size) ** exponent)
            return state, pick(i, state)

        update = jax.jit(run, donate_argnums=1)
        previous = jax.block_until_ready(jax.jit(pick)(0, self.state))

        def step(i: int) -> jax.Array:
            nonlocal previous
            self.state, previous = jax.block_until_ready(update(i, self.state, previous))
            return previous

        return step

    def describe(self) -> str:
        setter = f"; updates with {self.set_batch.__name__} ({self.backend})" if self.updates else ""
        nodes = self.state.nodes
        return f"flashbax_sumtree holds its tree ({nodes.size} float32 nodes) on {where(nodes)}{setter}"

    def close(self) -> None:
        jax.tree_util.tree_map(lambda x: x.delete(), self.state)


def import_torchrl() -> tuple[Any, Any]:
    """(torch, torchrl.data), with torchrl's info logging silenced and torch on one CPU thread.

    One thread, like numpy's take and gear_jax's CPU gather: with two OpenMP threads on a 2-core
    machine, torch's index copies stall for milliseconds now and then (p90 of a 32-row `extend` was
    7-18 ms instead of 50 us). Raises Unavailable if torchrl is not importable.
    """
    try:
        import torch
        import torchrl.data
    except Exception as e:  # noqa: BLE001 - any import failure means the baseline is unavailable
        raise Unavailable(f"torchrl is not importable ({type(e).__name__}: {e})") from None
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    return torch, torchrl.data


class TorchrlSystem(System):
    """torchrl: ReplayBuffer over LazyTensorStorage with RandomSampler, PrioritizedSampler, or
    SliceSampler for windows."""

    name = "torchrl"

    def __init__(self, work: Workload):
        super().__init__(work)
        if work.method not in ("uniform", "prioritized"):
            raise Unavailable(f"torchrl has no {work.method} sampler in this comparison")
        torch, rl = import_torchrl()
        from tensordict import TensorDict

        data = work.data
        n = data.rows * data.steps
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if work.window:
                    sampler = rl.SliceSampler(
                        slice_len=work.window, traj_key="episode", cache_values=True, strict_length=True
                    )
                elif work.method == "prioritized":
                    sampler = rl.PrioritizedSampler(max_capacity=n, alpha=work.priority_exponent, beta=1.0)
                else:
                    sampler = rl.RandomSampler()
        except Exception as e:  # noqa: BLE001 - e.g. its C++ extension does not load with this torch
            raise Unavailable(f"torchrl {work.method} sampler failed: {type(e).__name__}: {e}") from None
        self.buffer = rl.ReplayBuffer(storage=rl.LazyTensorStorage(n), sampler=sampler)
        for start, chunk in data.chunks():
            x = torch.from_numpy(chunk.reshape(-1, data.item_bytes))
            if work.window:
                episode = torch.arange(start, start + len(chunk)).repeat_interleave(data.steps)
                self.buffer.extend(TensorDict({"x": x, "episode": episode}, batch_size=[len(x)]))
            else:
                self.buffer.extend(x)
        if work.method == "prioritized":
            self.buffer.update_priority(torch.arange(n), torch.from_numpy(data.priorities()))

    def make_step(self, batch_size: int) -> Step:
        picks = batch_size * (self.work.window or 1)
        return lambda i: self.buffer.sample(batch_size=picks)

    def close(self) -> None:
        del self.buffer


IN_PROCESS: dict[str, type[System]] = {
    GEAR: GearSystem,
    GEAR_HOST: GearHostSystem,
    "numpy": NumpySystem,
    "jnp_take": JnpSystem,
    "flashbax": FlashbaxSystem,
    "torchrl": TorchrlSystem,
    PinnedHostLoopSystem.name: PinnedHostLoopSystem,
    PureCallbackSystem.name: PureCallbackSystem,
}
GATHER_ONLY = (PinnedHostLoopSystem.name, PureCallbackSystem.name)

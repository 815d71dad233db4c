"""Reference systems: a plain copy or read of the bytes a gear_jax step moves, over the same memory path.

They do no selection. Each holds a gear_jax table of the workload's rows (the memory gear_jax reads,
pinned where CUDA is present) and times one contiguous transfer out of it:

- `pinned_copy` (gather suite): the bytes of B consecutive rows (B x row stride) in one copy. Where
  jax runs on a CUDA GPU: `cudaMemcpyAsync` of the pinned table bytes into a GPU buffer, timed with
  CUDA events around the copy alone (`cuda_copy.py`, through ctypes), the host-to-device bandwidth
  a gather is measured against. Elsewhere: `np.copyto` of B consecutive rows into a preallocated
  buffer (host to host), starting at a different row each iteration so the rows come from memory
  rather than cache.
- `pinned_copy_jit` (gather suite): the same bytes, one contiguous span of B consecutive rows, copied
  by XLA inside one jitted call: the rows are a JAX array of memory kind "pinned_host", and the call is
  `jax.device_put(lax.dynamic_slice(rows, start, B rows), device memory)`, which XLA turns into one DMA.
  It is timed as every jitted system is (from the call to `block_until_ready`), so it carries JAX's
  dispatch cost as gear_jax's figures do: the copy a jitted program can have. It needs a device with
  pinned_host memory (a GPU); elsewhere it is unavailable.
- `priority_read` (priorities suite): the state column, 8 bytes per row, where the priorities live.
  On a CUDA GPU: `cudaMemcpyAsync` of the column to the GPU, timed the same way. Elsewhere:
  `np.add.reduce` over the column as uint64[N], one read of it.

On a CUDA GPU the reference's latency is the copy's device time (no launch or Python cost), while
the systems' latencies are wall-clock times of whole jitted calls. If the CUDA copy cannot run, the
reference raises `Unavailable` and the suite notes it; it never falls back to a host copy there.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
from jax import lax

from gear_jax import _native
from gear_jax.bench.common import PINNED_COPY, PINNED_COPY_JIT, PRIORITY_READ, Unavailable
from gear_jax.bench.cuda_copy import CudaCopyError, time_host_to_device_copies
from gear_jax.bench.systems import Step, System, Workload, make_table, pinned_host_steps, where

STATE_BYTES = 8  # the state column: uint64 per row (priority bits, generation)


def cuda_device() -> tuple[int | None, str]:
    """(CUDA ordinal of jax's first device, "") where jax runs on a CUDA GPU and this gear_jax build
    can time copies on it; otherwise (None, why not)."""
    backend = jax.default_backend()
    if backend != "gpu":
        return None, f"jax runs on {backend}, not a CUDA GPU"
    if not _native.with_cuda:
        return None, "this gear_jax build has no CUDA support"
    if _native.cuda_device_count() < 1:
        return None, "CUDA sees no device in this process"
    return int(getattr(jax.devices()[0], "local_hardware_id", None) or 0), ""


class Reference(System):
    """A plain transfer of a span of the table's bytes (see the module docstring). Subclasses say
    which span (`span`), and how to read it without CUDA (`make_step`) and what that is (`host_transfer`)."""

    host_transfer = ""
    cuda_transfer = "cudaMemcpyAsync of pinned table memory to the GPU, CUDA-event timed"

    def __init__(self, work: Workload):
        super().__init__(work)
        self.device, self.why_host = cuda_device()
        self.measured_as = self.cuda_transfer if self.device is not None else self.host_transfer
        self.table = make_table(work.data)
        self.memory = np.frombuffer(self.table.native.mapping(), np.uint8)
        self.layout = self.table.native.layout()

    def span(self, batch_size: int, i: int) -> tuple[int, int]:
        """(byte offset in the table, bytes) that iteration `i` transfers."""
        raise NotImplementedError

    def bytes_of(self, offset: int, nbytes: int) -> np.ndarray:
        """The table's bytes [offset, offset + nbytes), a view of its mapping; ValueError if the span
        does not lie inside the table."""
        if offset < 0 or nbytes < 1 or offset + nbytes > self.memory.size:
            raise ValueError(f"bytes [{offset}, {offset + nbytes}) are not in the table's {self.memory.size}")
        return self.memory[offset : offset + nbytes]

    def work_per_step(self, batch_size: int) -> tuple[int, int]:
        return batch_size, self.span(batch_size, 0)[1]

    @property
    def interleavable(self) -> bool:  # CUDA-event timed copies run alone
        return self.device is None

    def latencies(
        self, batch_sizes: list[int], warmup: int, iters: int, tick: Callable[[], None]
    ) -> dict[int, np.ndarray]:
        """Seconds per transfer for each batch size: CUDA-event times of the copies on a CUDA GPU,
        else wall-clock times of the host transfer (`make_step`)."""
        if self.device is None:
            return super().latencies(batch_sizes, warmup, iters, tick)
        if not self.table.pinned:
            raise Unavailable(
                "the pinned host-to-device copy could not be timed: the table's memory "
                "is not registered with CUDA"
            )
        out = {}
        for b in batch_sizes:
            host = self.bytes_of(*self.span(b, 0))
            try:
                if warmup:
                    time_host_to_device_copies(host, self.device, repeats=warmup)
                seconds = time_host_to_device_copies(host, self.device, repeats=iters)
            except CudaCopyError as e:
                raise Unavailable(f"the pinned host-to-device copy could not be timed: {e}") from None
            out[b] = np.asarray(seconds, np.float64)
            for _ in range(iters):
                tick()
        return out

    def describe(self) -> str:
        if self.device is not None:
            return f"{self.name} is {self.measured_as} (CUDA device {self.device}), the copy alone"
        return f"{self.name} is {self.measured_as}, not a host-to-device copy: {self.why_host}"

    def close(self) -> None:
        del self.memory
        self.table.close()


def check_gathers(work: Workload, name: str) -> None:
    """Raises Unavailable where `work` only selects: a copy reference is the reference of gathers."""
    if not work.collect:
        raise Unavailable(f"{name} is the reference of gathers; this workload only selects")


class PinnedCopySystem(Reference):
    """One contiguous copy of the bytes of B consecutive rows (B x row stride; windows: B x window
    steps) of the table's field."""

    name = PINNED_COPY
    host_transfer = "numpy np.copyto of consecutive table rows (host to host)"

    def __init__(self, work: Workload):
        check_gathers(work, self.name)
        super().__init__(work)
        self.offset, self.row_stride, self.step_bytes = self.layout["fields"][0]

    def _bytes(self, batch_size: int) -> int:
        work = self.work
        return batch_size * (work.window * self.step_bytes if work.window else self.row_stride)

    def span(self, batch_size: int, i: int) -> tuple[int, int]:
        nbytes = self._bytes(batch_size)
        column = self.work.data.rows * self.row_stride
        if nbytes > column:
            raise Unavailable(f"a batch of {batch_size} is more than the table's {self.work.data.rows} rows")
        starts = (column - nbytes) // self.row_stride + 1
        return self.offset + (i * batch_size % starts) * self.row_stride, nbytes

    def make_step(self, batch_size: int) -> Step:
        """Without CUDA: `np.copyto` of the span of iteration `i` into a preallocated buffer."""
        out = np.empty(self._bytes(batch_size), np.uint8)

        def step(i: int) -> np.ndarray:
            np.copyto(out, self.bytes_of(*self.span(batch_size, i)))
            return out

        return step


class PriorityReadSystem(Reference):
    """One read of the state column (uint64[N], where the priorities live), whatever the batch size."""

    name = PRIORITY_READ
    host_transfer = "numpy np.add.reduce over the state column as uint64[N] (host memory)"

    def span(self, batch_size: int, i: int) -> tuple[int, int]:
        return self.layout["state"], self.work.data.rows * STATE_BYTES

    def make_step(self, batch_size: int) -> Step:
        """Without CUDA: `np.add.reduce` over the state column as uint64[N]."""
        state = self.bytes_of(*self.span(batch_size, 0)).view(np.uint64)
        return lambda i: np.add.reduce(state)


class PinnedCopyJitSystem(System):
    """`pinned_copy`'s bytes (B consecutive rows; windows: B x window steps), moved by XLA in one jitted
    call from a JAX array in pinned_host memory (see the module docstring)."""

    name = PINNED_COPY_JIT
    measured_as = "one jitted call: jax.device_put of a dynamic slice of a pinned_host array (one DMA)"

    def __init__(self, work: Workload):
        check_gathers(work, self.name)
        super().__init__(work)
        self.flat, self.device_memory = pinned_host_steps(work)

    def make_step(self, batch_size: int) -> Step:
        steps = batch_size * self.work.steps_out
        total = self.flat.shape[0]
        if steps > total:
            raise Unavailable(f"a batch of {batch_size} is more than the table's {self.work.data.rows} rows")
        starts = total - steps + 1
        to_device = self.device_memory

        def run(first: jax.Array, flat: jax.Array) -> jax.Array:
            return jax.device_put(lax.dynamic_slice_in_dim(flat, first, steps, axis=0), to_device)

        compiled = jax.jit(run).lower(np.int32(0), self.flat).compile()
        # A different span each iteration (as pinned_copy), so the bytes come from memory, not a cache.
        return lambda i: jax.block_until_ready(compiled(np.int32(i * steps % starts), self.flat))

    def describe(self) -> str:
        return f"{self.name} holds its rows on {where(self.flat)}; {self.measured_as}"

    def close(self) -> None:
        self.flat.delete()


REFERENCE_SYSTEMS: dict[str, type[System]] = {
    PINNED_COPY: PinnedCopySystem,
    PINNED_COPY_JIT: PinnedCopyJitSystem,
    PRIORITY_READ: PriorityReadSystem,
}

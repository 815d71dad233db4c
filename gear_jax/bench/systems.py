"""The systems a selection suite times: gear_jax and the in-process baselines.

Each system holds the rows of one `Dataset` and, for a batch size B, makes a `step(i)` that selects B
rows (or windows of `window` steps) with the workload's method and, when `collect` is set, copies them
out, returning only when the work is complete. Building a baseline that is not installed or fails
raises `Unavailable`; the suite then skips it with a note.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import gear_jax as gj
from gear_jax.bench.common import GEAR, Unavailable, time_calls
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
    """

    data: Dataset
    method: str = "uniform"
    priority_exponent: float = 1.0
    window: int = 0
    collect: bool = True

    @property
    def steps_out(self) -> int:
        """Steps per selected row in the output."""
        return self.window or 1

    def bytes_per_pick(self) -> int:
        """Bytes one pick copies out (0 when only selecting)."""
        return self.steps_out * self.data.item_bytes if self.collect else 0


class System:
    """One system holding the workload's rows. Subclasses set `name` and implement `make_step`."""

    name = ""

    def __init__(self, work: Workload):
        self.work = work

    def make_step(self, batch_size: int) -> Step:
        """A function of the iteration number doing one complete step of `batch_size` picks."""
        raise NotImplementedError

    def latencies(
        self, batch_sizes: list[int], warmup: int, iters: int, tick: Callable[[], None]
    ) -> dict[int, np.ndarray]:
        """Seconds per step for each batch size."""
        return {b: time_calls(self.make_step(b), warmup, iters, tick) for b in batch_sizes}

    def close(self) -> None:
        """Frees the system's copy of the rows."""


def _window_rows(work: Workload, rows: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Flat step ids int64[B * window] of windows starting at `starts` in `rows` (numpy)."""
    first = rows.astype(np.int64) * work.data.steps + starts
    return (first[:, None] + np.arange(work.window)).reshape(-1)


class GearSystem(System):
    """gear_jax: a shared-memory table; one jitted function samples (and gathers)."""

    name = GEAR

    def __init__(self, work: Workload):
        super().__init__(work)
        data = work.data
        spec = gj.TableSpec(
            fields={"x": gj.Field((data.item_bytes,), "uint8")}, capacity=data.rows, max_steps=data.steps
        )
        self.table = gj.Table.create(spec)
        priorities = data.priorities()
        for start, chunk in data.chunks():
            rows = chunk if data.steps > 1 else chunk[:, 0]
            self.table.insert({"x": rows}, priorities=priorities[start : start + len(chunk)])

    def make_step(self, batch_size: int) -> Step:
        work, table = self.work, self.table
        window = work.window or None

        @jax.jit
        def run(i: jax.Array) -> Any:
            key = jax.random.fold_in(jax.random.key(0), i)
            s = gj.sample(table, key, batch_size, method=work.method,
                          priority_exponent=work.priority_exponent, window=window)
            return gj.gather(table, s, fields=("x",)) if work.collect else s

        return lambda i: jax.block_until_ready(run(i))

    def close(self) -> None:
        self.table.close()


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
        write = jax.jit(lambda buf, chunk, at: jax.lax.dynamic_update_slice(buf, chunk, (at, 0)),
                        donate_argnums=0)
        for start, chunk in data.chunks():
            self.flat = write(self.flat, chunk.reshape(-1, data.item_bytes), start * data.steps)
        self.weights = jnp.asarray(data.priorities())
        self.seq = jnp.arange(data.rows, dtype=jnp.int32)

    def make_step(self, batch_size: int) -> Step:
        work = self.work
        n, steps, window = work.data.rows, work.data.steps, work.window

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
                starts = jax.random.randint(window_key, (batch_size,), 0, steps - window + 1)
                rows = ((rows * steps + starts)[:, None] + jnp.arange(window)).reshape(-1)
            return jnp.take(flat, rows, axis=0)

        return lambda i: jax.block_until_ready(run(i, self.flat, self.weights, self.seq))

    def close(self) -> None:
        self.flat.delete()


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
                add_batch_size=n, sample_batch_size=batch_size, sample_sequence_length=work.window,
                period=1, min_length_time_axis=work.window, max_length_time_axis=work.data.steps,
            )
        if work.method == "prioritized":
            return fbx.make_prioritised_item_buffer(
                max_length=n, min_length=1, sample_batch_size=batch_size, add_sequences=True,
                priority_exponent=work.priority_exponent,
            )
        return fbx.make_item_buffer(max_length=n, min_length=1, sample_batch_size=batch_size, add_sequences=True)

    def make_step(self, batch_size: int) -> Step:
        sample = jax.jit(self._buffer(batch_size).sample)
        key = jax.random.key(0)
        return lambda i: jax.block_until_ready(sample(self.state, jax.random.fold_in(key, i)))

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
                    sampler = rl.SliceSampler(slice_len=work.window, traj_key="episode", cache_values=True,
                                           strict_length=True)
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
    "numpy": NumpySystem,
    "jnp_take": JnpSystem,
    "flashbax": FlashbaxSystem,
    "torchrl": TorchrlSystem,
}

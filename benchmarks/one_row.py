"""One-row inserts, part of the `insert` suite: the loop of a single environment that cannot batch.

Each call stores one CartPole transition as gymnasium hands it out (float32 observations, an int64 action
from `action_space.sample()`, a Python float reward, a Python bool flag) into a table of 5 fields. A
timed iteration is `ROWS_PER_ITER` calls, so that the timer's own cost does not count.

Systems (op `add_one_row`): gear_jax `table.add(row)`; numpy, the row write of a replay buffer kept as
preallocated arrays (SB3's ReplayBuffer.add: one `buffer[pos] = value` per field); flashbax (a jitted,
donated item-buffer `add` of one item); torchrl (`ReplayBuffer.add` of one TensorDict). And op
`insert_one_row`: gear_jax `table.insert` of a batch of one row, the batch API used for one row.
"""

from __future__ import annotations

import argparse
import gc
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import gear_jax as gj
from gear_jax.bench.common import GEAR, Unavailable, make_record, time_calls
from gear_jax.bench.display import progress
from gear_jax.bench.systems import import_torchrl

ROWS_PER_ITER = 100
FIELDS = {
    "obs": gj.Field((4,), "float32"),
    "action": gj.Field((), "int32"),
    "reward": gj.Field((), "float32"),
    "next_obs": gj.Field((4,), "float32"),
    "terminated": gj.Field((), "bool"),
}
ROW_BYTES = sum(f.step_bytes for f in FIELDS.values())
SYSTEMS = (GEAR, "numpy", "flashbax", "torchrl")
Step = Callable[[int], Any]


def transitions(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """`count` rows with the types a gymnasium CartPole loop produces."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(count + 1, 4)).astype(np.float32)
    return [
        {
            "obs": obs[i],
            "action": np.int64(rng.integers(2)),
            "reward": 1.0,
            "next_obs": obs[i + 1],
            "terminated": bool(i % 50 == 49),
        }
        for i in range(count)
    ]


def gear_add(table: gj.Table, rows: list[dict[str, Any]]) -> Step:
    def step(i: int) -> None:
        for row in rows:
            table.add(row)

    return step


def gear_insert(table: gj.Table, rows: list[dict[str, Any]]) -> Step:
    batches = [{k: np.asarray(v)[None] for k, v in row.items()} for row in rows]

    def step(i: int) -> None:
        for batch in batches:
            table.insert(batch)

    return step


def numpy_add(capacity: int, rows: list[dict[str, Any]]) -> Step:
    buffers = {name: np.zeros((capacity, *f.shape), f.dtype) for name, f in FIELDS.items()}
    obs, action, reward = buffers["obs"], buffers["action"], buffers["reward"]
    next_obs, terminated = buffers["next_obs"], buffers["terminated"]
    position = [0]

    def step(i: int) -> None:
        pos = position[0]
        for row in rows:
            obs[pos] = row["obs"]
            action[pos] = row["action"]
            reward[pos] = row["reward"]
            next_obs[pos] = row["next_obs"]
            terminated[pos] = row["terminated"]
            pos = (pos + 1) % capacity
        position[0] = pos

    return step


def flashbax_add(capacity: int, rows: list[dict[str, Any]]) -> Step:
    try:
        import flashbax as fbx
    except ImportError as e:
        raise Unavailable(f"flashbax is not installed ({e})") from None
    buffer = fbx.make_item_buffer(max_length=capacity, min_length=1, sample_batch_size=1)
    example = {name: jnp.zeros(f.shape, f.dtype) for name, f in FIELDS.items()}
    state = {"s": buffer.init(example)}
    add = jax.jit(buffer.add, donate_argnums=0)

    def step(i: int) -> None:
        for row in rows:
            state["s"] = add(state["s"], row)
        jax.block_until_ready(state["s"])

    return step


def torchrl_add(capacity: int, rows: list[dict[str, Any]]) -> Step:
    torch, rl = import_torchrl()
    from tensordict import TensorDict

    buffer = rl.ReplayBuffer(storage=rl.LazyTensorStorage(capacity))

    def step(i: int) -> None:
        for row in rows:
            buffer.add(TensorDict({k: torch.as_tensor(np.asarray(v)) for k, v in row.items()}, batch_size=[]))

    return step


def run(args: argparse.Namespace, capacity: int, note: Callable[[str], None]) -> list[dict[str, Any]]:
    """Records of every system adding rows one call at a time into `capacity` rows."""
    point = {"table_rows": capacity, "writers": 1, "item_bytes": ROW_BYTES, "batch_size": 1}
    rows = transitions(ROWS_PER_ITER)
    records = []

    def measure(system: str, op: str, step: Step) -> None:
        with progress(args.iters, f"{system} {op}") as bar:
            latencies = time_calls(step, args.warmup, args.iters, bar.update)
        records.append(make_record(point, system, op, latencies, ROWS_PER_ITER, ROWS_PER_ITER * ROW_BYTES))

    if GEAR in args.systems:
        with gj.Table.create(gj.TableSpec(FIELDS, capacity)) as table:
            measure(GEAR, "add_one_row", gear_add(table, rows))
            measure(GEAR, "insert_one_row", gear_insert(table, rows))
    makers = {"numpy": numpy_add, "flashbax": flashbax_add, "torchrl": torchrl_add}
    for name in [s for s in args.systems if s in makers]:
        try:
            measure(name, "add_one_row", makers[name](capacity, rows))
        except Exception as e:  # noqa: BLE001 - a baseline failing is reported, not fatal
            note(f"skipped {name} add_one_row: {type(e).__name__}: {e}")
        finally:
            gc.collect()
    return records

"""One-row inserts, part of the `insert` suite: the loop of a single environment that cannot batch.

Each call stores one CartPole transition into a table of 5 fields in the SB3 / CleanRL layout (float32
obs and next_obs, int32 action, float32 reward, float32 `done`, so that a learner computes 1 - done). A
timed iteration is `ROWS_PER_ITER` calls, so that the timer's own cost does not count.

The values come as gymnasium hands them out (`transitions`: float32 observations, an int64 action from
`action_space.sample()`, a Python float reward, a Python bool flag), or already typed as the fields are
(`typed_transitions`: int32, float32), to show what the casts cost.

Systems and ops: gear_jax `add_one_row` (`table.add(row)`, gymnasium's values), `add_one_row_typed` (the
same, typed values), `insert_one_row` (`table.insert` of a batch of one row as a gymnasium vector env
with one environment hands it out: int64[1] actions, float64[1] rewards, bool[1] flags) and
`insert_one_row_typed`; numpy `add_one_row`, the row write of a replay buffer kept as preallocated arrays
(SB3's ReplayBuffer.add: one `buffer[pos] = value` per field); sb3 `add_one_row`, stable-baselines3's own
`ReplayBuffer.add` of a batch of one environment (where it is installed); flashbax (a jitted, donated
item-buffer `add` of one item); torchrl (`ReplayBuffer.add` of one TensorDict).
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
    "done": gj.Field((), "float32"),
}
ROW_BYTES = sum(f.step_bytes for f in FIELDS.values())
SYSTEMS = (GEAR, "numpy", "sb3", "flashbax", "torchrl")
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
            "done": bool(i % 50 == 49),
        }
        for i in range(count)
    ]


def typed_transitions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` with every value already of its field's dtype (numpy scalars and arrays)."""
    return [{k: np.asarray(v, FIELDS[k].dtype)[()] for k, v in row.items()} for row in rows]


def vector_env_batches(rows: list[dict[str, Any]], typed: bool) -> list[dict[str, np.ndarray]]:
    """`rows` as batches of one: gymnasium's vector-env dtypes (int64, float64, bool), or typed."""
    gym = {"action": np.int64, "reward": np.float64, "done": np.bool_}
    return [
        {
            k: np.asarray(v, FIELDS[k].dtype if typed else gym.get(k, FIELDS[k].dtype))[None]
            for k, v in row.items()
        }
        for row in rows
    ]


def gear_add(table: gj.Table, rows: list[dict[str, Any]]) -> Step:
    def step(i: int) -> None:
        for row in rows:
            table.add(row)

    return step


def gear_insert(table: gj.Table, batches: list[dict[str, np.ndarray]]) -> Step:
    def step(i: int) -> None:
        for batch in batches:
            table.insert(batch)

    return step


def numpy_add(capacity: int, rows: list[dict[str, Any]]) -> Step:
    buffers = {name: np.zeros((capacity, *f.shape), f.dtype) for name, f in FIELDS.items()}
    obs, action, reward = buffers["obs"], buffers["action"], buffers["reward"]
    next_obs, done = buffers["next_obs"], buffers["done"]
    position = [0]

    def step(i: int) -> None:
        pos = position[0]
        for row in rows:
            obs[pos] = row["obs"]
            action[pos] = row["action"]
            reward[pos] = row["reward"]
            next_obs[pos] = row["next_obs"]
            done[pos] = row["done"]
            pos = (pos + 1) % capacity
        position[0] = pos

    return step


def sb3_add(capacity: int, rows: list[dict[str, Any]]) -> Step:
    try:
        import gymnasium
        from stable_baselines3.common.buffers import ReplayBuffer
    except ImportError as e:
        raise Unavailable(f"stable-baselines3 is not installed ({e})") from None
    obs_space = gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    buffer = ReplayBuffer(capacity, obs_space, gymnasium.spaces.Discrete(2), device="cpu", n_envs=1)
    infos: list[dict[str, Any]] = [{}]
    batches = [
        (
            r["obs"][None],
            r["next_obs"][None],
            np.array([r["action"]]),
            np.array([r["reward"]]),
            np.array([r["done"]]),
        )
        for r in rows
    ]

    def step(i: int) -> None:
        for obs, next_obs, action, reward, done in batches:
            buffer.add(obs, next_obs, action, reward, done, infos)

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
        typed = typed_transitions(rows)
        with gj.Table.create(gj.TableSpec(FIELDS, capacity)) as table:
            measure(GEAR, "add_one_row", gear_add(table, rows))
            measure(GEAR, "add_one_row_typed", gear_add(table, typed))
            measure(GEAR, "insert_one_row", gear_insert(table, vector_env_batches(rows, typed=False)))
            measure(GEAR, "insert_one_row_typed", gear_insert(table, vector_env_batches(rows, typed=True)))
    makers = {"numpy": numpy_add, "sb3": sb3_add, "flashbax": flashbax_add, "torchrl": torchrl_add}
    for name in [s for s in args.systems if s in makers]:
        try:
            measure(name, "add_one_row", makers[name](capacity, rows))
        except Exception as e:  # noqa: BLE001 - a baseline failing is reported, not fatal
            note(f"skipped {name} add_one_row: {type(e).__name__}: {e}")
        finally:
            gc.collect()
    return records

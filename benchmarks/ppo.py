"""The `ppo` suite: PPO's update over a rollout, from a gear_jax table or from a pytree of jax arrays.

One op, `ppo_update`: the learner of examples/ppo.py over rollouts of `table_rows` rows whose
observations are `item_bytes` bytes (float32): per rollout `epochs` (4) epochs of minibatches of
`batch_size` rows, each minibatch a clipped-surrogate Adam step of the example's actor-critic (two
hidden layers of 64 units). One jitted call runs UPDATES_PER_CALL (8) updates in a `lax.scan`, one per
rollout, as a fused training program does: a program with a side effect (`gj.insert` is one) takes
JAX's Python dispatch, which costs per argument leaf (here about 4 ms a call for the ~80 leaves of the
parameters and Adam's state on the 2-core CPU VM), so that one update per call would time dispatch.
  * gear_jax: `gj.insert` of the rollout into a table of `table_rows` rows, then per epoch `gj.epoch`
    and per minibatch `gj.gather`;
  * pytree: the rollout stays a dict of jax arrays; per epoch a `jax.random.permutation` indexes them.
The minibatches differ (gj.epoch shuffles natively on the CPU), the work is the same. Systems are timed in
turns, one call each per round. The rollout is fresh random data (the update's speed does not depend
on its values).

The suite loads the learner from examples/ppo.py beside the benchmarks (a checkout installed with
`pip install -e .`, as the README's commands do).
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import gear_jax as gj
from gear_jax.bench.common import GEAR, Unavailable, make_record, parse_ints

DEFAULTS = {"table_rows": "512,8192", "item_bytes": "16,4096", "batch_size": "128"}
PLOT = {"x": "table_rows", "y": "items_per_s", "label": "rollout rows visited per second (4 epochs)"}
SYSTEMS = (GEAR, "pytree")
EPOCHS = 4
UPDATES_PER_CALL = 8
EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "ppo.py"


def load_example() -> ModuleType:
    """examples/ppo.py as a module (its absl flags are defined, not parsed)."""
    if not EXAMPLE.exists():
        raise Unavailable(f"{EXAMPLE} is not beside the benchmarks: run from a checkout (pip install -e .)")
    name = "gear_jax_bench_ppo_example"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def rollouts(rows: int, obs_dim: int, seed: int) -> dict[str, jax.Array]:
    """UPDATES_PER_CALL rollouts of random data, [UPDATES_PER_CALL, rows, ...] per field."""
    rng = np.random.default_rng(seed)
    n = (UPDATES_PER_CALL, rows)
    return {
        "obs": jnp.asarray(rng.normal(size=(*n, obs_dim)).astype(np.float32)),
        "action": jnp.asarray(rng.integers(0, 2, n).astype(np.int32)),
        "log_prob": jnp.full(n, np.log(0.5), jnp.float32),
        "advantage": jnp.asarray(rng.normal(size=n).astype(np.float32)),
        "target": jnp.asarray(rng.normal(size=n).astype(np.float32)),
    }


def learner(
    ppo: ModuleType, rows: int, obs_dim: int, minibatch: int, system: str, table: gj.Table | None
) -> tuple[Callable, tuple[Any, Any]]:
    """The jitted (params, opt_state, rollouts, key) -> (params, opt_state) of UPDATES_PER_CALL updates,
    and its first state."""
    c = ppo.Config(num_envs=1, num_steps=rows, minibatch_size=minibatch, epochs=EPOCHS)
    net = ppo.ActorCritic(2, c.hidden)
    params = net.init(jax.random.key(0), jnp.zeros((1, obs_dim)))
    optimizer = ppo.make_optimizer(c)
    learn = ppo.make_learner(c, "gear_jax" if system == GEAR else "pytree", table, net.apply, optimizer)

    def updates(params: Any, opt_state: Any, data: dict[str, jax.Array], key: jax.Array) -> Any:
        def one(state: Any, step: tuple[dict[str, jax.Array], jax.Array]) -> tuple[Any, None]:
            return learn(*state, *step)[0], None

        keys = jax.random.split(key, UPDATES_PER_CALL)
        return jax.lax.scan(one, (params, opt_state), (data, keys))[0]

    return jax.jit(updates), (params, optimizer.init(params))


def run(args: argparse.Namespace, note: Callable[[str], None]) -> list[dict[str, Any]]:
    try:
        ppo = load_example()
    except Unavailable as e:
        note(f"ppo suite skipped: {e}")
        return []
    records = []
    for rows in parse_ints(args.table_rows):
        for item_bytes in parse_ints(args.item_bytes):
            obs_dim = max(1, item_bytes // 4)
            for minibatch in parse_ints(args.batch_size):
                if rows % minibatch:
                    note(f"table_rows={rows} skipped for batch_size={minibatch}: it must divide the rollout")
                    continue
                records += measure(args, ppo, rows, obs_dim, minibatch)
    return records


def measure(
    args: argparse.Namespace, ppo: ModuleType, rows: int, obs_dim: int, minibatch: int
) -> list[dict[str, Any]]:
    point = {"table_rows": rows, "item_bytes": obs_dim * 4, "batch_size": minibatch, "epochs": EPOCHS}
    data = rollouts(rows, obs_dim, seed=rows + obs_dim)
    spec = gj.TableSpec(ppo.row_fields((obs_dim,)), capacity=rows)
    row_bytes = obs_dim * 4 + 16
    with gj.Table.create(spec) as table:
        systems = {}
        for system in args.systems:
            update, state = learner(ppo, rows, obs_dim, minibatch, system, table if system == GEAR else None)
            systems[system] = [update, state]
        latencies: dict[str, list[float]] = {s: [] for s in systems}
        for i in range(args.warmup + args.iters):
            for system, entry in systems.items():  # in turns
                update, state = entry
                key = jax.random.key(i)
                began = time.perf_counter()
                entry[1] = jax.block_until_ready(update(*state, data, key))
                if i >= args.warmup:
                    latencies[system].append(time.perf_counter() - began)
    items = rows * EPOCHS * UPDATES_PER_CALL
    return [
        make_record(point, system, "ppo_update", lat, items, items * row_bytes)
        for system, lat in latencies.items()
    ]

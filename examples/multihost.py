"""A multi-host DQN: one sharded replay table over every device of a `jax.distributed` job, actor
processes on each host writing into that host's shards, a data-parallel learner over the mesh.

What this shows:
  * `gj.ShardedTable.create(spec, mesh, axis="replay", name=...)` on every process of the job: one shard
    per device, each in the host memory of the process that owns the device;
  * actor processes (multiprocessing, "spawn") that attach to their host's shards by name
    (`gj.ShardedTable.attach_shard(name, s)`) and insert CartPole transitions (gymnax) into them, acting
    epsilon-greedily with the learner's recent parameters, which the learner publishes in a small
    shared-memory array on each host;
  * with `--actors=remote`, remote writers instead of attached shards: each process serves its shards
    over the network (`server = gj.serve(table, host=..., token=...)`, a token drawn per process and
    given to its own actors; the address is logged) and its actors write with `gj.remote.Writer(
    server.address, shard=s, token=...)`, whose `insert` reads as a table's (the row ids come back once
    the rows are in the shard). The experience path crosses the network (Arrow Flight over gRPC); the
    parameter path is still local in this example: the actors read the learner's parameters from the
    host's shared-memory array, so they run on the learner's host. An actor elsewhere needs only the
    address and the token to write (and `--serve_host` an address it can reach; the loopback, the
    default, only takes writers on this host), plus its own way of getting the parameters. The server
    is closed once the actors have stopped, before the shards are;
  * one jitted learner step, a `jax.shard_map` over the mesh: a global prioritized sample
    (`gj.sharded.sample`, `mode="global"`: the law of one table holding every shard's rows, the rows
    moved to the devices that consume them), importance weights (`gj.sharded.importance_weights`), a
    double-DQN loss whose gradients are summed over the axis (data parallelism: every device applies the
    same update to its replica), and the priority update (`gj.sharded.update_priorities`: each priority
    reaches the shard that owns its row).

A rate limiter on each host keeps its actors' transitions at `--transitions_per_update` per learner
update (actors wait when they are ahead, the learner when they are behind), so that the run learns
the same way however fast the machine is.

With `--checkpoint_dir=DIR`, every `--checkpoint_every` updates each process writes its copy of the
learner's state (parameters, target parameters, optimizer state) to DIR, then the sharded replay is saved
(`table.save(DIR/replay, metadata={"step": ...})`: each process writes its own shards, and the save
replaces the previous one only once every process's are durable). A job killed at any moment (preempted,
a process lost: the survivors' next collective fails and the launcher, or the cluster, ends them) and
started again with the same command loads the newest checkpoint (`gj.ShardedTable.load`) and goes on from
its update, with the replay's rows and priorities intact; its actors add to them (with `--actors=remote`,
through a server of the loaded shards).

Run:

    python examples/multihost.py --num_processes=2          # 2 processes on this machine, 1 CPU device each
    python examples/multihost.py --num_processes=2 --smoke  # 50 updates (a few seconds), for tests
    python examples/multihost.py --num_processes=2 --actors=remote  # actors write over the network
    python examples/multihost.py --num_processes=2 --actors=remote --serve_host=0.0.0.0  # every interface

With --num_processes=N and no --process_id, the script is the launcher: it picks a free port on
127.0.0.1 and re-executes itself N times with --process_id=i --coordinator_address=127.0.0.1:PORT,
bounds each process by --timeout, and ends them all if one fails (SIGTERM, then SIGKILL for those still
running after --stop_grace seconds). SIGTERM (or Ctrl-C) to the launcher
ends the job the same way; SIGTERM to a process (the launcher's, or a cluster scheduler's) makes it close
its actors and shards and leave at once, with exit code 143, without jax.distributed's shutdown barrier
(which would wait minutes for processes that are ending too); one process of one test run in a loaded CI
machine was aborted instead (SIGABRT), likely in a collective whose peer had already left. On a
cluster, start one process per host (or per GPU) yourself:

    python examples/multihost.py --coordinator_address=HOST0:1234 --num_processes=N --process_id=i
    python examples/multihost.py --cluster_detection        # SLURM, Open MPI, ...: jax detects them

Every process of a job must get the same flags. Every log line starts with `[process i/N]`; process 0
evaluates the greedy policy and prints a `summary: ` line last (`shard_inserts`: transitions each shard
received; `shard_sizes`: rows each holds; `shard_priority_updates`: rows whose priority the learner's
updates changed in each shard; `steps`: the updates the devices applied; `wall_s`: the training loop;
`process_s`: process 0 in all).
On this project's 2-core CPU machine, `--num_processes=2` with the default flags, in the fresh venv of
the README's test command on a fresh clone (commit 23d2043), took 85 s in all (compilation included; a
cold JAX compilation cache) and printed:
    evaluations (update: mean greedy return): 0: 10.8, 1000: 192.8, 2000: 271.8, 3000: 339.7
    summary: eval_return=339.7 initial_eval_return=10.8 eval_episodes=20 processes=2 shards=2 actors=2
        steps=3000 global_batch=128 transitions=25088 shard_inserts=12544,12544 shard_sizes=12544,12544
        shard_priority_updates=190993,193007 capacity=50000 final_loss=0.01316 resumed_from=0
        steps_per_s=63.4 learner_wait_s=0.1 wall_s=47.3 process_s=80.1
(earlier runs of the same flags ended at 214.4, 220.8 and 255.3: actors and learner interleave
differently each run).
On an H100 (docs/BENCHMARKS.md, "On an NVIDIA H100 (measured 2026-11-26)"), `--num_processes=1
--platform=cuda --steps=1500` (one process, one GPU: a 1-shard job) ran 545-561 updates/s and ended at
eval_return 196.6 and 330.4 in two runs.
With --steps=1500 (about 45 s with a warm compilation cache), seed 0 ended at eval_return 255.1-397.1
in four runs and seeds 1-3 at 120.8, 289.2 and 166.5 (the maximum is 500; an untrained policy scores
about 10).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import glob
import logging as std_logging
import multiprocessing
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags, logging
from jax import lax
from jax.flatten_util import ravel_pytree
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import gear_jax as gj

ENV_NAME = "CartPole-v1"
OBS_SHAPE = (4,)
AXIS = "replay"

FLAGS = flags.FLAGS
# -- the job --
flags.DEFINE_integer("num_processes", None,
                     "jax.distributed processes; without --process_id this script launches them here")
flags.DEFINE_integer("process_id", None, "this process's index in the job (with --coordinator_address)")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0's coordinator")
flags.DEFINE_bool("cluster_detection", False,
                  "let jax.distributed.initialize() detect the cluster (SLURM, Open MPI, ...)")
flags.DEFINE_integer("devices_per_process", 1, "CPU devices (shards) per process (--platform=cpu)")
flags.DEFINE_enum("platform", "cpu", ["cpu", "cuda"], "where the learner runs (actors use the CPU)")
flags.DEFINE_integer("timeout", 600, "launcher: seconds each process may run before all are killed")
flags.DEFINE_float("stop_grace", 10.0,
                   "launcher: seconds the processes get, all together, to end once told to stop (SIGTERM) "
                   "before the launcher kills them")
flags.DEFINE_string("table_name", None,
                    "name of the sharded table (its shards: NAME.shard<s>); default: drawn by process 0")
flags.DEFINE_integer("init_timeout", 300, "seconds jax.distributed.initialize waits for every process")
# -- actors --
flags.DEFINE_integer("actors_per_process", 1, "actor processes per process of the job")
flags.DEFINE_enum("actors", "attach", ["attach", "remote"],
                  "how actors write into their host's shards: attach them by shared-memory name, or write "
                  "through a server of the shards (gj.serve) with gj.remote.Writer")
flags.DEFINE_string("serve_host", "127.0.0.1",
                    "--actors=remote: the address each process's server listens on (0.0.0.0: every "
                    "interface; the server takes only writers with its process's token)")
flags.DEFINE_integer("envs_per_actor", 4, "environments each actor steps in parallel")
flags.DEFINE_integer("chunk", 8, "environment steps an actor runs per jitted call before inserting them")
flags.DEFINE_integer("transitions_per_update", 4,
                     "transitions each process's actors write per learner update (the rate limiter)")
# -- learner --
flags.DEFINE_integer("steps", 3000, "learner updates")
flags.DEFINE_integer("seed", 0, "seed of the network, the actors, the sampler and the evaluations")
flags.DEFINE_integer("batch_size", 64, "rows per device per update (the global batch is this x devices)")
flags.DEFINE_integer("capacity", 50_000, "rows per shard")
flags.DEFINE_integer("learning_starts", 500, "transitions in each process's shards before the first update")
flags.DEFINE_integer("hidden", 256, "units in each of the two hidden layers")
flags.DEFINE_float("lr", 1e-3, "Adam learning rate at the start (decays linearly to 1e-5)")
flags.DEFINE_float("gamma", 0.99, "discount")
flags.DEFINE_float("tau", 0.005, "Polyak averaging of the target network per update")
flags.DEFINE_float("priority_exponent", 0.6, "alpha of prioritized replay")
flags.DEFINE_float("beta_start", 0.4, "importance-weight exponent, annealed to 1")
flags.DEFINE_float("priority_eps", 1e-3, "added to |TD error| for priorities")
flags.DEFINE_float("eps_start", 1.0, "exploration epsilon at the start")
flags.DEFINE_float("eps_end", 0.04, "exploration epsilon after the annealing")
flags.DEFINE_float("eps_fraction", 0.16, "fraction of the updates over which epsilon anneals")
flags.DEFINE_integer("publish_every", 10, "updates between publications of the parameters to the actors")
flags.DEFINE_integer("eval_every", 1000, "updates between greedy evaluations (process 0)")
flags.DEFINE_integer("eval_episodes", 20, "episodes of each greedy evaluation (run in parallel)")
flags.DEFINE_float("actor_timeout", 120.0, "seconds to wait for the actors to write, and to stop")
flags.DEFINE_bool("smoke", False, "a tiny run for tests: a few seconds of training")
# -- checkpoints --
flags.DEFINE_string("checkpoint_dir", None,
                    "directory of the job's checkpoints (the sharded replay and the learner's state, on a "
                    "file system every process shares or the same path on each host); a job started again "
                    "with the same flags resumes from the newest checkpoint there")
flags.DEFINE_integer("checkpoint_every", 500, "updates between checkpoints (with --checkpoint_dir)")


@dataclasses.dataclass(frozen=True)
class Config:
    """The flags the learner and the actors read, with --smoke applied."""

    devices_per_process: int
    platform: str
    actors_per_process: int
    actors: str
    serve_host: str
    envs_per_actor: int
    chunk: int
    transitions_per_update: int
    steps: int
    seed: int
    batch_size: int
    capacity: int
    learning_starts: int
    hidden: int
    lr: float
    gamma: float
    tau: float
    priority_exponent: float
    beta_start: float
    priority_eps: float
    eps_start: float
    eps_end: float
    eps_fraction: float
    publish_every: int
    eval_every: int
    eval_episodes: int
    actor_timeout: float
    smoke: bool
    checkpoint_dir: str | None
    checkpoint_every: int


def config_from_flags() -> Config:
    config = Config(**{f.name: FLAGS[f.name].value for f in dataclasses.fields(Config)})
    if config.smoke:  # flags given on the command line keep their values
        smoke = dict(steps=50, learning_starts=64, eval_every=50, eval_episodes=4, publish_every=10)
        config = dataclasses.replace(config, **{n: v for n, v in smoke.items() if not FLAGS[n].present})
    return config


def linear(start: float, end: float, fraction: float) -> float:
    return start + (end - start) * min(max(fraction, 0.0), 1.0)


def epsilon_at(config: Config, step: int) -> float:
    return linear(config.eps_start, config.eps_end, step / (config.steps * config.eps_fraction))


class PrefixFilter(std_logging.Filter):
    """Puts `prefix` before every message that absl's handler writes (jax's own included)."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: std_logging.LogRecord) -> bool:
        record.msg = f"{self.prefix} {record.msg}"
        return True


def set_log_prefix(prefix: str) -> None:
    handler = logging.get_absl_handler()
    for f in list(handler.filters):
        if isinstance(f, PrefixFilter):
            handler.removeFilter(f)
    handler.addFilter(PrefixFilter(prefix))


def die_with_parent(parent: int) -> None:
    """Linux: asks for SIGTERM when the parent process ends; exits if it already has."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        sys.exit(f"parent process {parent} has exited")


# -- the network and the environment ---------------------------------------------------------------------


class QNetwork(nn.Module):
    """MLP from observations float32[B, 4] to action values float32[B, num_actions]."""

    num_actions: int
    hidden: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = nn.relu(nn.Dense(self.hidden)(obs))
        x = nn.relu(nn.Dense(self.hidden)(x))
        return nn.Dense(self.num_actions)(x)


def make_spec(capacity: int) -> gj.TableSpec:
    """One transition per row: (obs, action, reward, next_obs, discount)."""
    return gj.TableSpec(
        fields={
            "obs": gj.Field(OBS_SHAPE, "float32"),
            "action": gj.Field((), "int32"),
            "reward": gj.Field((), "float32"),
            "next_obs": gj.Field(OBS_SHAPE, "float32"),
            "discount": gj.Field((), "float32"),  # gamma, or 0 where the episode terminated
        },
        capacity=capacity,
        max_steps=1,
    )


def make_evaluate(env: Any, env_params: Any, network: QNetwork, num_episodes: int):
    """The jitted greedy evaluation: `(params, key) -> float32[num_episodes]` episode returns."""
    reset = jax.vmap(env.reset, in_axes=(0, None))
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    @jax.jit
    def evaluate(params, key):
        key_reset, key_steps = jax.random.split(key)
        obs, env_state = reset(jax.random.split(key_reset, num_episodes), env_params)

        def body(carry, key):
            obs, env_state, returns, alive = carry
            action = jnp.argmax(network.apply(params, obs), axis=1)
            obs, env_state, reward, terminated, truncated, _ = step(
                jax.random.split(key, num_episodes), env_state, action, env_params
            )
            returns = returns + jnp.where(alive, reward, 0.0)
            return (obs, env_state, returns, alive & ~(terminated | truncated)), None

        init = (obs, env_state, jnp.zeros(num_episodes), jnp.ones(num_episodes, bool))
        keys = jax.random.split(key_steps, env_params.max_steps_in_episode)
        (_, _, returns, _), _ = jax.lax.scan(body, init, keys)
        return returns

    return evaluate


# -- what the learner shares with its host's actors ------------------------------------------------------


class Published:
    """What the learner and its host's actors share, in shared memory (one lock for all).

    `params`: the learner's flat parameters; `control`: [their version, learner updates so far, priority
    for new rows, the update the job resumed after]. The actors count what they wrote: `transitions` per
    actor (the rate limiter's measure), `shard_inserts` per local shard, and their finished episodes in
    `episodes` (count, sum of returns).

    The lock is taken with a timeout (`locked`): a process SIGKILLed while it held it (an actor killed
    mid-update) would otherwise stop the learner for good; the learner raises instead, and the job,
    started again, resumes from its last checkpoint.
    """

    def __init__(self, context: Any, num_params: int, num_actors: int, num_shards: int, resumed: int = 0):
        self.params = context.Array("f", num_params)
        lock = self.params.get_lock()
        self.control = context.Array("d", 4, lock=lock)
        self.control[3] = resumed
        self.transitions = context.Array("q", num_actors, lock=lock)
        self.shard_inserts = context.Array("q", num_shards, lock=lock)
        self.episodes = context.Array("d", 2, lock=lock)
        self.stop = context.Event()

    @contextlib.contextmanager
    def locked(self, timeout: float = 60.0) -> Any:
        lock = self.params.get_lock()
        if not lock.acquire(timeout=timeout):
            raise RuntimeError(f"the block shared with the actors stayed locked for {timeout:.0f} s: a "
                               "process that held its lock died (an actor killed mid-update?)")
        try:
            yield
        finally:
            lock.release()

    def publish(self, flat_params: np.ndarray | None, updates: int, max_priority: float) -> None:
        with self.locked():
            if flat_params is not None:
                np.frombuffer(self.params.get_obj(), np.float32)[:] = flat_params
                self.control[0] += 1
            self.control[1] = updates
            self.control[2] = max_priority

    def read(self, version: float) -> tuple[np.ndarray | None, float, int, float, int]:
        """(parameters if newer than `version`, else None; their version; updates; max priority; the update
        the job resumed after)."""
        with self.locked():
            current, updates, priority, resumed = self.control[:]
            flat = None
            if current != version:
                flat = np.frombuffer(self.params.get_obj(), np.float32).copy()
        return flat, current, int(updates), priority, int(resumed)

    def total_transitions(self) -> int:
        return int(sum(self.transitions[:]))


# -- actors -----------------------------------------------------------------------------------------------


def make_rollout(env: Any, env_params: Any, network: QNetwork, num_envs: int, chunk: int):
    """The actor's jitted `(params, obs, env_state, returns, key, epsilon) -> (obs, env_state, returns,
    transitions, finished)`: `chunk` epsilon-greedy steps of `num_envs` environments; `transitions` holds
    [chunk, num_envs, ...] arrays, `finished` the return of each episode that ended (NaN elsewhere)."""
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def body(carry, key, params, epsilon, gamma):
        obs, env_state, returns = carry
        k_explore, k_action, k_env = jax.random.split(key, 3)
        greedy = jnp.argmax(network.apply(params, obs), axis=1)
        explore = jax.random.uniform(k_explore, (num_envs,)) < epsilon
        random_action = jax.random.randint(k_action, (num_envs,), 0, env.num_actions)
        action = jnp.where(explore, random_action, greedy).astype(jnp.int32)
        next_obs, env_state, reward, terminated, truncated, info = step(
            jax.random.split(k_env, num_envs), env_state, action, env_params
        )
        # gymnax resets an ended environment inside step; the true next observation is final_observation.
        out = {"obs": obs, "action": action, "reward": reward, "next_obs": info["final_observation"],
               "discount": jnp.where(terminated, 0.0, gamma).astype(jnp.float32)}
        returns = returns + reward
        ended = terminated | truncated
        finished = jnp.where(ended, returns, jnp.nan)
        return (next_obs, env_state, jnp.where(ended, 0.0, returns)), (out, finished)

    @jax.jit
    def rollout(params, obs, env_state, returns, key, epsilon, gamma):
        (obs, env_state, returns), (out, finished) = jax.lax.scan(
            lambda c, k: body(c, k, params, epsilon, gamma), (obs, env_state, returns),
            jax.random.split(key, chunk),
        )
        return obs, env_state, returns, out, finished

    return rollout


def run_actor(table_name: str, shards: dict[int, int], actor: int, local_actors: int, prefix: str,
              config: Config, published: Published, parent: int, server: tuple[str, str] | None) -> None:
    """An actor process: attaches by name to its shards of the sharded table (`shards`: shard index ->
    position among this host's shards), or with `server` (address, token: --actors=remote) connects a
    `gj.remote.Writer` to each of them, and inserts its chunks of transitions into them in turn, acting
    with the parameters the learner last published, until `published.stop` is set.

    Rate limit: it writes a chunk only while its transitions stay below its share of
    `learning_starts + updates * transitions_per_update` plus one chunk (after a resume: of
    `(updates - resumed) * transitions_per_update`, what the learner waits for).
    """
    die_with_parent(parent)
    jax.config.update("jax_platforms", "cpu")  # the actors never take the learner's accelerator
    import gymnax  # importing it starts jax's backends: after the configuration
    FLAGS.mark_as_parsed()  # the actor's settings come in `config`; absl logs without a warning
    logging.use_absl_handler()
    logging.set_verbosity(logging.INFO)
    set_log_prefix(f"{prefix} actor {actor}:")
    env, env_params = gymnax.make(ENV_NAME)
    network = QNetwork(env.num_actions, config.hidden)
    _, unravel = ravel_pytree(network.init(jax.random.key(0), jnp.zeros((1, *OBS_SHAPE))))
    rollout = make_rollout(env, env_params, network, config.envs_per_actor, config.chunk)
    seed_key = jax.random.fold_in(jax.random.key(config.seed), 1 + min(shards) * local_actors + actor)
    key, reset_key = jax.random.split(seed_key)
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(reset_key, config.envs_per_actor), env_params
    )
    returns = jnp.zeros(config.envs_per_actor)
    per_chunk = config.chunk * config.envs_per_actor
    tables: dict[int, Any] = {}  # shard -> gj.Table, or gj.remote.Writer (the same insert)
    version, params, written, turn = -1.0, None, 0, 0
    try:
        for s in shards:
            tables[s] = (gj.ShardedTable.attach_shard(table_name, s) if server is None
                         else gj.remote.Writer(server[0], shard=s, token=server[1]))
        if server is None:
            logging.info("attached to %s", ", ".join(gj.sharded.shard_name(table_name, s) for s in shards))
        else:
            logging.info("writing into shards %s of %s through the server at %s", sorted(shards), table_name,
                         server[0])
        while not published.stop.is_set():
            if os.getppid() != parent:
                raise RuntimeError("the learner process has exited")
            flat, version_now, updates, priority, resumed = published.read(version)
            if flat is not None:
                params, version = unravel(jnp.asarray(flat)), version_now
            # What the learner waits for: a resumed job's replay holds its transitions already, and its
            # actors write only those of the updates since the resume (no burst of the earlier ones).
            starts = 0 if resumed else config.learning_starts
            allowed = (starts + (updates - resumed) * config.transitions_per_update) / local_actors
            if params is None or written >= allowed + per_chunk:
                published.stop.wait(0.002)
                continue
            key, rollout_key = jax.random.split(key)
            obs, env_state, returns, out, finished = rollout(
                params, obs, env_state, returns, rollout_key, epsilon_at(config, updates), config.gamma
            )
            out, finished = jax.device_get((out, finished))
            rows = {name: value.reshape(per_chunk, *value.shape[2:]) for name, value in out.items()}
            shard = list(shards)[turn % len(shards)]
            turn += 1
            tables[shard].insert(rows, priorities=priority)  # new rows: the largest priority so far
            written += per_chunk
            done = finished[~np.isnan(finished)]
            with published.locked():
                published.transitions.get_obj()[actor] = written
                published.shard_inserts.get_obj()[shards[shard]] += per_chunk
                published.episodes.get_obj()[0] += done.size
                published.episodes.get_obj()[1] += float(done.sum())
    finally:
        for table in tables.values():
            table.close()


class Actors:
    """This process's actor processes ("spawn"), one shared `Published` block; `with Actors(...)`.
    `server`: (address, token) of the server of this process's shards, for actors that write through it
    (--actors=remote); None: they attach the shards."""

    def __init__(self, table: gj.ShardedTable, config: Config, num_params: int, prefix: str,
                 server: tuple[str, str] | None = None, resumed: int = 0):
        context = multiprocessing.get_context("spawn")
        self.config = config
        self.shards = sorted(table.local_shards)  # this host's shards
        actors = config.actors_per_process
        self.published = Published(context, num_params, actors, len(self.shards), resumed)
        # Every local shard gets an actor: with fewer actors than shards, actor i writes into shards
        # i, i + actors, ... in turn; with more, actors i, i + shards, ... share shard i.
        n = len(self.shards)
        self.shards_of = [{self.shards[j]: j for j in (range(i, n, actors) if actors < n else [i % n])}
                          for i in range(actors)]
        self.processes = [
            context.Process(
                target=run_actor, name=f"actor-{i}", daemon=True,
                args=(table.name, self.shards_of[i], i, actors, prefix, config, self.published,
                      os.getpid(), server),
            )
            for i in range(actors)
        ]

    def __enter__(self) -> Actors:
        for process in self.processes:
            process.start()
        return self

    def check(self) -> None:
        """Raises if an actor ended before it was asked to."""
        for process in self.processes:
            if process.exitcode is not None:
                raise RuntimeError(f"{process.name} exited with code {process.exitcode}")

    def wait_for(self, transitions: int) -> None:
        """Waits until the actors wrote `transitions` (an actor failing or the timeout raises)."""
        deadline = time.monotonic() + self.config.actor_timeout
        while self.published.total_transitions() < transitions:
            self.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the actors wrote {self.published.total_transitions()} of "
                                   f"{transitions} transitions in {self.config.actor_timeout} s")
            time.sleep(0.001)

    def __exit__(self, *exc: object) -> None:
        self.published.stop.set()
        for process in self.processes:
            process.join(self.config.actor_timeout)
        for process in self.processes:
            if process.is_alive():
                logging.warning("%s did not stop; terminating it", process.name)
                process.terminate()
                process.join(5)
        failed = [f"{p.name}: {p.exitcode}" for p in self.processes if p.exitcode != 0]
        if failed and exc[0] is None:
            raise RuntimeError(f"actors failed (exit codes): {', '.join(failed)}")


@contextlib.contextmanager
def serving(table: gj.ShardedTable, config: Config):
    """With --actors=remote: serves this process's shards of `table` for the length of the block and
    yields (address, token) for its actors (the token is drawn here: only this process's actors get it);
    with --actors=attach: yields None. Closes the server on the way out, errors included."""
    if config.actors != "remote":
        yield None
        return
    token = secrets.token_hex(16)
    server = gj.serve(table, host=config.serve_host, token=token)
    logging.info("serving shards %s of %s at %s", server.shard_list(), table.name, server.address)
    try:
        yield server.address, token
    finally:
        server.close()
        logging.info("server %s closed: it wrote %d rows from %d messages (%d refused) over %d streams",
                     server.address, server.stats["rows"], server.stats["messages"], server.stats["refused"],
                     server.stats["streams"])


# -- the learner ------------------------------------------------------------------------------------------


class TrainState(NamedTuple):
    """Replicated: every device holds the same values."""

    params: Any
    target_params: Any
    opt_state: Any


class DeviceState(NamedTuple):
    """Sharded along the axis: one value per device."""

    updated: jax.Array  # int32[S]: rows the last priority update changed on each shard (orders the next
    # sample after it)
    max_priority: jax.Array  # float32[S]: largest priority each device has computed (new rows get it)
    priority_updates: jax.Array  # int32[S]: rows each shard's priority updates changed, over the run


def make_learner_step(table: gj.ShardedTable, network: QNetwork, optimizer: optax.GradientTransformation,
                      config: Config):
    """The jitted learner step over the mesh: `(state, device_state, key_data, step, beta) -> (state,
    device_state, loss)`.

    Cross-process collectives cost milliseconds each (gloo on CPUs), so the step keeps them few: the
    sample's (an all-gather of the S totals, an all-to-all per field), one pmax for the importance
    weights, one psum for the gradients and the loss together, and the priority update's all-gathers.
    """
    global_batch = config.batch_size * table.num_shards

    def body(state: TrainState, device: DeviceState, key_data: jax.Array, step: jax.Array,
             beta: jax.Array):
        key = jax.random.fold_in(jax.random.wrap_key_data(key_data), step)  # the same on every device
        smp, batch = gj.sharded.sample(table, key, global_batch, method="prioritized", mode="global",
                                       priority_exponent=config.priority_exponent, after=device.updated[0])
        valid = batch["valid"]  # False for rows overwritten between sample and gather
        weights = gj.sharded.importance_weights(table, smp, beta) * valid  # beta annealed, traced

        def loss_fn(params):
            q = network.apply(params, batch["obs"])
            q_taken = jnp.take_along_axis(q, batch["action"][:, None], axis=1)[:, 0]
            next_action = jnp.argmax(network.apply(params, batch["next_obs"]), axis=1)  # double DQN
            next_q = network.apply(state.target_params, batch["next_obs"])
            next_q = jnp.take_along_axis(next_q, next_action[:, None], axis=1)[:, 0]
            target = lax.stop_gradient(batch["reward"] + batch["discount"] * next_q)
            td = q_taken - target
            # This device's part of the global batch's mean loss.
            return jnp.sum(weights * optax.huber_loss(td)) / global_batch, td

        (loss, td), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        flat, unravel = ravel_pytree((grads, loss))
        grads, loss = unravel(lax.psum(flat, AXIS))  # the global batch's gradient, on every device
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        target_params = optax.incremental_update(params, state.target_params, config.tau)
        priorities = jnp.abs(td) + config.priority_eps
        updated = gj.sharded.update_priorities(table, smp, priorities)  # to the shards that own the rows
        max_priority = jnp.maximum(device.max_priority, jnp.max(jnp.where(valid, priorities, 0.0)))
        device = DeviceState(updated[None], max_priority, device.priority_updates + updated)
        return TrainState(params, target_params, opt_state), device, loss

    replicated, sharded = P(), P(AXIS)
    device_specs = DeviceState(sharded, sharded, sharded)
    mapped = jax.shard_map(
        body, mesh=table.mesh, in_specs=(replicated, device_specs, replicated, replicated, replicated),
        out_specs=(replicated, device_specs, replicated), check_vma=False,
    )
    return jax.jit(mapped, donate_argnums=(0, 1))


def global_array(mesh: Any, spec: P, value: Any) -> jax.Array:
    """A global array from a host value that every process holds alike."""
    value = np.asarray(value)
    return jax.make_array_from_callback(value.shape, NamedSharding(mesh, spec), lambda index: value[index])


def local(x: Any) -> Any:
    """This process's copy of a replicated global array (or tree of them)."""
    return jax.tree.map(lambda a: a.addressable_data(0), x)


def gather_per_shard(num_shards: int, *values: dict[int, int]) -> list[np.ndarray]:
    """Each {shard: count} of this process's shards, completed with every other process's: int64[S]
    arrays (one collective)."""
    from jax.experimental import multihost_utils

    mine = np.zeros((len(values), num_shards), np.int64)
    for row, entries in zip(mine, values):
        for s, v in entries.items():
            row[s] = v
    every = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, len(values), num_shards)
    return list(every.sum(0))


# -- checkpoints ------------------------------------------------------------------------------------------
#
# A checkpoint is the sharded replay (`table.save(dir/replay, metadata=...)`: each process writes its own
# shards, and the save becomes the newest only once every process's are durable) and the learner's state,
# which every process holds alike and writes to its own file first, before the replay's save commits:
# a replay checkpoint of update k implies every process's learner file of update k.


def learner_file(checkpoint_dir: str, step: int) -> str:
    return os.path.join(checkpoint_dir, f"learner-p{jax.process_index()}-{step:08d}.npz")


def save_learner(checkpoint_dir: str, step: int, state: TrainState) -> None:
    """This process's copy of the (replicated) learner state at update `step`, durable on return."""
    leaves = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(local(state)))]
    path = learner_file(checkpoint_dir, step)
    temporary = f"{path}.{secrets.token_hex(4)}.tmp"
    with open(temporary, "wb") as f:
        np.savez(f, *leaves)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def load_learner(checkpoint_dir: str, step: int, like: TrainState) -> TrainState:
    """The learner state saved at update `step`, in the structure (and dtypes) of `like`."""
    with np.load(learner_file(checkpoint_dir, step)) as saved:
        leaves = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    treedef = jax.tree.structure(like)
    return jax.tree.unflatten(treedef, leaves)


def remove_other_learner_files(checkpoint_dir: str, step: int) -> None:
    keep = learner_file(checkpoint_dir, step)
    for path in glob.glob(os.path.join(checkpoint_dir, f"learner-p{jax.process_index()}-*.npz*")):
        if path != keep:
            with contextlib.suppress(OSError):
                os.unlink(path)


def replay_checkpoint_exists(replay_dir: str) -> bool:
    """Whether the job resumes: whether every process finds a replay checkpoint (they must agree)."""
    from jax.experimental import multihost_utils

    mine = np.array([os.path.isdir(replay_dir) and bool(os.listdir(replay_dir))], np.int32)
    every = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1)
    if every.min() != every.max():
        found = np.flatnonzero(every).tolist()
        raise RuntimeError(f"--checkpoint_dir: only processes {found} find a checkpoint in {replay_dir}; "
                           "every process must see the same checkpoint directory (shared, or the same path "
                           "on each host with its own processes' shards)")
    return bool(every[0])


def train(config: Config, prefix: str, table_name: str | None, started: float) -> None:
    import gymnax
    from jax.experimental import multihost_utils

    process, num_processes = jax.process_index(), jax.process_count()
    mesh = jax.make_mesh((jax.device_count(),), (AXIS,))
    env, env_params = gymnax.make(ENV_NAME)
    network = QNetwork(env.num_actions, config.hidden)
    learning_rate = optax.linear_schedule(config.lr, 1e-5, config.steps)
    optimizer = optax.chain(optax.clip_by_global_norm(10.0), optax.adam(learning_rate))
    key_init, key_eval, key_learn = jax.random.split(jax.random.key(config.seed), 3)
    params = jax.device_get(network.init(key_init, jnp.zeros((1, *OBS_SHAPE))))  # alike on every process
    state = jax.tree.map(lambda x: global_array(mesh, P(), x),
                         TrainState(params, params, jax.device_get(optimizer.init(params))))
    evals: list[tuple[int, float]] = []  # (update, mean greedy return), on process 0

    # Every process creates its own shards (or loads them from the newest checkpoint); actors find them by
    # the table's name, or write through this process's server of them (--actors=remote).
    replay_dir = os.path.join(config.checkpoint_dir, "replay") if config.checkpoint_dir else None
    resumed, max_priority = 0, 1.0  # the update the job resumes after (0: a new job)
    if replay_dir is not None and replay_checkpoint_exists(replay_dir):
        table = gj.ShardedTable.load(replay_dir, mesh, axis=AXIS, name=table_name)
        resumed = int(table.checkpoint_metadata["step"])
        max_priority = float(table.checkpoint_metadata["max_priority"])
        state = jax.tree.map(lambda x: global_array(mesh, P(), x),
                             load_learner(config.checkpoint_dir, resumed, local(state)))
        params = jax.device_get(local(state.params))
        logging.info("resumed from the checkpoint of update %d in %s: shards hold %s rows", resumed,
                     config.checkpoint_dir, {s: t.size for s, t in table.local_shards.items()})
    else:
        if config.checkpoint_dir:
            os.makedirs(config.checkpoint_dir, exist_ok=True)
        table = gj.ShardedTable.create(make_spec(config.capacity), mesh, axis=AXIS, name=table_name)
    # The server (--actors=remote) closes after the actors have stopped and before the shards do.
    with table, serving(table, config) as server:
        logging.info("%d devices, %d shards of %d rows; this process owns shards %s", jax.device_count(),
                     table.num_shards, config.capacity, sorted(table.local_shards))
        flat_params = np.asarray(ravel_pytree(params)[0])
        with Actors(table, config, flat_params.size, prefix, server, resumed) as actors:
            published = actors.published
            published.publish(flat_params, resumed, max_priority)
            logging.info("started %d actor processes writing into shards %s of %s", config.actors_per_process,
                         actors.shards, table.name)
            # While the actors start: compile the learner step, evaluate the untrained policy.
            zeros = np.zeros(table.num_shards, np.int32)
            priorities = np.full(table.num_shards, max_priority, np.float32)
            device_state = DeviceState(*(global_array(mesh, P(AXIS), x) for x in (zeros, priorities, zeros)))
            key_data = np.asarray(jax.random.key_data(key_learn))
            learner_step = make_learner_step(table, network, optimizer, config).lower(
                state, device_state, key_data, np.int32(0), np.float32(0)).compile()
            evaluate = make_evaluate(env, env_params, network, config.eval_episodes) if process == 0 else None
            if evaluate is not None:  # host copies of the parameters: the same compiled program every time
                evals.append((resumed, float(jnp.mean(evaluate(params, key_eval)))))
                logging.info("%s policy: eval_return=%.1f", "restored" if resumed else "untrained",
                             evals[-1][1])
            # A resumed job's replay holds its transitions already: its actors write only the new ones.
            learning_starts = 0 if resumed else config.learning_starts
            actors.wait_for(learning_starts)
            multihost_utils.sync_global_devices("learning starts")
            logging.info("every process's shards hold %d transitions: training starts%s",
                         learning_starts if not resumed else min(t.size for t in table.local_shards.values()),
                         f" again after update {resumed}" if resumed else "")
            start = time.perf_counter()
            waited = 0.0  # seconds the learner waited for its actors
            episodes_seen = (0.0, 0.0)
            slack = config.chunk * config.envs_per_actor * config.actors_per_process  # a chunk per actor
            for step in range(resumed + 1, config.steps + 1):
                # The rate limiter: update `step` needs this process's share of its transitions.
                before = time.perf_counter()
                written = (step - 1 - resumed) * config.transitions_per_update
                actors.wait_for(learning_starts + written - slack)
                waited += time.perf_counter() - before
                beta = np.float32(linear(config.beta_start, 1.0, step / config.steps))
                state, device_state, loss = learner_step(state, device_state, key_data, np.int32(step), beta)
                # The largest priority of this process's devices, for its actors' new rows (waits for the
                # step: the loop never runs ahead of the device).
                max_priority = max(float(x.data[0]) for x in device_state.max_priority.addressable_shards)
                publish = step % config.publish_every == 0 or step == config.steps
                flat = np.asarray(ravel_pytree(local(state.params))[0]) if publish else None
                published.publish(flat, step, max_priority)
                if config.checkpoint_dir and (step % config.checkpoint_every == 0 or step == config.steps):
                    saving = time.perf_counter()
                    save_learner(config.checkpoint_dir, step, state)  # durable before the replay commits
                    everyone = float(np.max(multihost_utils.process_allgather(np.float32(max_priority))))
                    table.save(replay_dir, metadata={"step": step, "max_priority": everyone})
                    remove_other_learner_files(config.checkpoint_dir, step)
                    sizes = {s: t.size for s, t in table.local_shards.items()}
                    logging.info("checkpoint of update %d saved in %.2f s: shards hold %s rows", step,
                                 time.perf_counter() - saving, sizes)
                if step % config.eval_every == 0 or step == config.steps:
                    actors.check()
                    episodes = tuple(published.episodes[:])
                    finished = episodes[0] - episodes_seen[0]
                    train_return = (episodes[1] - episodes_seen[1]) / finished if finished else float("nan")
                    episodes_seen = episodes
                    if evaluate is not None:
                        params = jax.device_get(local(state.params))
                        evals.append((step, float(jnp.mean(evaluate(params, key_eval)))))
                    logging.info(
                        "update %d: loss=%.4f, %d transitions written here, training return %.1f%s", step,
                        float(local(loss)), published.total_transitions(), train_return,
                        f", eval_return={evals[-1][1]:.1f}" if evaluate is not None else "",
                    )
            seconds = time.perf_counter() - start
            loss = float(local(loss)) if config.steps > resumed else float("nan")
            # Updates the devices applied: Adam's count (the state of chain(clip, adam) is (clip's, (Adam's,
            # the schedule's))).
            applied = int(local(state.opt_state[1][0].count))
        # The actors have stopped: what they wrote into each shard, each shard's rows, and the rows whose
        # priorities the learner's updates changed in each shard.
        inserted, sizes, prioritized = gather_per_shard(
            table.num_shards,
            dict(zip(actors.shards, published.shard_inserts[:])),
            {s: t.size for s, t in table.local_shards.items()},
            {x.index[0].start: int(x.data[0]) for x in device_state.priority_updates.addressable_shards},
        )
        multihost_utils.sync_global_devices("done")
    if process == 0:
        logging.info("evaluations (update: mean greedy return): %s",
                     ", ".join(f"{s}: {r:.1f}" for s, r in evals))
        print(
            f"summary: eval_return={evals[-1][1]:.1f} initial_eval_return={evals[0][1]:.1f} "
            f"eval_episodes={config.eval_episodes} processes={num_processes} shards={table.num_shards} "
            f"actors={num_processes * config.actors_per_process} steps={applied} "
            f"global_batch={config.batch_size * table.num_shards} transitions={int(inserted.sum())} "
            f"shard_inserts={','.join(map(str, inserted))} shard_sizes={','.join(map(str, sizes))} "
            f"shard_priority_updates={','.join(map(str, prioritized))} "
            f"capacity={config.capacity} final_loss={loss:.5f} resumed_from={resumed} "
            f"steps_per_s={(config.steps - resumed) / seconds:.1f} "
            f"learner_wait_s={waited:.1f} wall_s={seconds:.1f} process_s={time.perf_counter() - started:.1f}",
            flush=True,
        )


# -- starting the processes -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(num_processes: int, timeout: float, stop_grace: float) -> int:
    """Runs `num_processes` copies of this script as one jax.distributed job on 127.0.0.1; returns the
    exit status (0 when every process succeeded). All are ended when one fails or time runs out."""
    set_log_prefix("[launcher]")
    port = free_port()
    table_name = FLAGS.table_name or f"gear_jax_multihost_{secrets.token_hex(8)}"
    argv = [a for a in sys.argv[1:] if not a.startswith(("--process_id", "--coordinator_address"))]
    env = dict(os.environ, MULTIHOST_LAUNCHER_PID=str(os.getpid()))
    logging.info("starting %d processes, coordinator 127.0.0.1:%d, table %s", num_processes, port, table_name)
    # SIGTERM or SIGINT to the launcher ends the job as a failed process does: the processes are told
    # to stop (they close their actors and shards), killed if they linger, and their shared memory goes.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, frame: sys.exit(f"[launcher] {signal.Signals(signum).name}: "
                                                              "ending the job"))
    procs: list[subprocess.Popen] = []
    status = 0
    try:
        for i in range(num_processes):
            own = [f"--num_processes={num_processes}", f"--process_id={i}",
                   f"--coordinator_address=127.0.0.1:{port}", f"--table_name={table_name}"]
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv, *own], env=env))
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed:
                logging.error("process %d exited with code %d; ending the others", failed[0],
                              procs[failed[0]].returncode)
                status = 1
                break
            if time.monotonic() > deadline:
                logging.error("the job ran past --timeout=%d s; ending it", timeout)
                status = 1
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()  # SIGTERM: the process closes its actors and shards
        grace_ends = time.monotonic() + stop_grace
        for p in procs:
            try:
                p.wait(max(grace_ends - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if any(p.returncode != 0 for p in procs):
            status = 1
            logging.error("exit codes: %s", [p.returncode for p in procs])
        # A killed process leaves its shards' shared memory behind (Linux keeps it in /dev/shm).
        for path in glob.glob(os.path.join("/dev/shm", glob.escape(table_name) + ".shard*")):
            logging.warning("removing %s, left by a killed process", path)
            with contextlib.suppress(OSError):
                os.unlink(path)
    return status


def main(argv: list[str]) -> None:
    started = time.perf_counter()
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    num_processes = FLAGS.num_processes
    joining = FLAGS.coordinator_address is not None or FLAGS.cluster_detection
    if not joining and FLAGS.process_id is None and num_processes is not None and num_processes > 1:
        sys.exit(launch(num_processes, FLAGS.timeout, FLAGS.stop_grace))
    if not FLAGS.cluster_detection and (FLAGS.coordinator_address is None) != (FLAGS.process_id is None):
        raise app.UsageError("--coordinator_address and --process_id go together (with --num_processes), "
                             "or pass --cluster_detection")
    if FLAGS.coordinator_address is not None and num_processes is None and not FLAGS.cluster_detection:
        raise app.UsageError("--coordinator_address needs --num_processes")

    config = config_from_flags()
    if config.steps < 1 or config.actors_per_process < 1 or config.envs_per_actor < 1 or config.chunk < 1:
        raise app.UsageError("--steps, --actors_per_process, --envs_per_actor and --chunk must be positive")
    if "MULTIHOST_LAUNCHER_PID" in os.environ:
        die_with_parent(int(os.environ["MULTIHOST_LAUNCHER_PID"]))
    if FLAGS.process_id is not None and num_processes is not None:  # jax's own lines below get it too
        set_log_prefix(f"[process {FLAGS.process_id}/{num_processes}]")
    jax.config.update("jax_platforms", config.platform)
    if config.platform == "cpu":
        jax.config.update("jax_num_cpu_devices", config.devices_per_process)
    if FLAGS.cluster_detection:  # what is given overrides what is detected
        try:
            jax.distributed.initialize(FLAGS.coordinator_address, num_processes=num_processes,
                                       process_id=FLAGS.process_id, initialization_timeout=FLAGS.init_timeout)
        except ValueError as e:  # not inside a cluster jax knows
            raise app.UsageError(f"--cluster_detection: jax.distributed.initialize() found no cluster ({e}); "
                                 "pass --coordinator_address, --num_processes and --process_id") from None
    elif FLAGS.coordinator_address is not None:
        host = FLAGS.coordinator_address.rsplit(":", 1)[0]
        local_job = host in ("127.0.0.1", "localhost")
        jax.distributed.initialize(
            FLAGS.coordinator_address, num_processes=num_processes, process_id=FLAGS.process_id,
            cluster_detection_method="deactivate", initialization_timeout=FLAGS.init_timeout,
            coordinator_bind_address=FLAGS.coordinator_address if local_job else None,
        )
    # SIGTERM (from the launcher, or a cluster's scheduler) ends actors and shards cleanly; installed
    # after initialize(), whose preemption notifier takes SIGTERM otherwise. A process so ended then
    # leaves without jax.distributed's shutdown, whose barrier would wait minutes for processes that are
    # ending too (this exit hook, registered after jax's, runs before it).
    terminated = []

    def on_sigterm(signum: int, frame: Any) -> None:
        terminated.append(signum)
        sys.exit("terminated")

    def leave_if_terminated() -> None:
        if terminated:
            std_logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
    atexit.register(leave_if_terminated)
    prefix = f"[process {jax.process_index()}/{jax.process_count()}]"
    set_log_prefix(prefix)
    logging.info("%d local devices of %d: %s", jax.local_device_count(), jax.device_count(),
                 jax.local_devices())
    train(config, prefix, FLAGS.table_name, started)


if __name__ == "__main__":
    app.run(main)

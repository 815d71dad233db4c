"""Anakin: acting, inserting into a gear_jax table, sampling and learning in one jitted program.

What this shows:
  * `gj.insert` inside `jax.jit` and `lax.scan`. One compiled program runs `--scan_steps` iterations of:
    step `--num_envs` gymnax CartPole-v1 environments (`jax.vmap`, epsilon-greedy) -> insert their
    transitions into a gear_jax table with priority "max" (the largest priority so far, kept in the
    table's header) -> sample a prioritized batch ordered after the insert (`after=`) -> gather ->
    double-DQN update -> `update_priorities`, whose count orders the next iteration's insert. Acting
    and learning in one program is the "Anakin" architecture of Hessel et al. (2021, "Podracer
    architectures for scalable reinforcement learning"); here the replay stays in host memory;
  * a table of `--capacity` rows (1,000,000 by default, 103 MiB of shared host memory): on a GPU
    machine the program runs on the GPU and the replay lives in host RAM, not in GPU memory;
  * two comparisons in the same run, with the same environments, network, hyperparameters, seeds and
    numbers of environment steps and learner updates (`--compare`):
      host_insert: the quickstart's structure. A Python loop calls a jitted acting step, brings the
        transitions to the host and inserts them with `table.insert`, then calls a jitted learner step
        (sample, gather, loss, update, `update_priorities`, all inside jit). It makes the same run as
        gear_jax (the same rows, priorities and keys): in every run here both ended with the same loss
        and returns, so the difference between them is the cost of the loop alone;
      flashbax: the same fused program with a flashbax prioritized item buffer (flashbax 0.1.3,
        `make_prioritised_item_buffer`) in device memory instead of the table, holding
        `--flashbax_capacity` items (by default as many as the table: 44 MB of transitions and an 8 MB
        sum tree, which fit; on the CPU, device memory is host RAM). Its picks differ from gear_jax's,
        so its learning differs too. It now and then picks an empty slot (probability 0; see
        `flashbax_replay`), which made a default run's loss NaN: such picks are masked.

Every comparison first collects `--learning_starts` transitions without learning, then trains for
`--steps` iterations (one step of every environment and one learner update each). The times are of
those iterations alone: compilation and the greedy evaluations are timed apart. The comparisons run in
turns, one call (`--scan_steps` iterations) of each per round, so that the changing load of a shared
machine falls on all of them alike.

Run (CPU by default; about 2 minutes on a 2-core CPU):

    python examples/anakin.py --plot anakin.png
    python examples/anakin.py --steps=30000      # the quickstart's length: about 5 minutes
    python examples/anakin.py --compare=gear_jax,flashbax --capacity=10000000
    python examples/anakin.py --smoke            # 1000 steps, 100,000-row replays: for tests

It shows a progress bar (with the mean return of each comparison's last 20 training episodes), logs each
greedy evaluation with absl.logging (stderr), and prints a table of the comparisons and a summary line
last (stdout).

Figures, all measured on this project's 2-core CPU machine, which other jobs shared (jax 0.10.2, flax
0.12.8, optax 0.2.8, gymnax 1.0.1, flashbax 0.1.3; seed 0). The default command printed (124 s for the
whole process, wall_s=117.7):

    comparison    capacity env steps/s updates/s train s compile s eval return
    gear_jax       1000000        2216       541    18.5       5.5       121.4
    host_insert    1000000         837       204    49.0       3.6       121.4
    flashbax       1000000        1770       432    23.2      10.1       111.3

Mean greedy return of 20 episodes: 13.2 untrained; after 3000, 5000, 8000 and 10000 steps 144.7, 142.1,
123.5, 121.4 for gear_jax and host_insert (the same numbers, and the same losses), 130.4, 113.5, 104.0,
111.3 for flashbax. Two earlier runs of the command (host inserts then passed `table.max_priority`
instead of "max": the same priorities, the same learning) measured 673, 252 and 604 updates/s, and 297,
141 and 240 while other jobs loaded the machine more. `--steps=30000` (308 s for the whole process,
wall_s=301.4): 552, 207 and 509 updates/s; final returns 500.0, 500.0 and 381.9 (gear_jax's evaluations
from 20000 steps on: 210.2, 500.0, 492.1, 500.0, 500.0).

What they say: the fused program made 2.1 to 2.7 times the steps per second of the quickstart's loop,
which per step waits for the acting step's result on the host, inserts it from Python and dispatches two
jitted calls, for the same learning. With the gear_jax table the fused program was 8-25% faster than with
flashbax in these runs (and 2% slower in two runs of an earlier version): on this CPU an iteration's
time goes mostly to the network and the environments. Timed apart in a `lax.scan` of those calls alone,
the 1,000,000-row table's `gj.insert` of 4 rows + prioritized sample + gather of 64 +
`update_priorities` took 37-44 us per iteration, flashbax's add + sample + set_priorities 76-78 us, of
an iteration of about 2 ms. What the table changes most is where the replay lives (host RAM, shared with
other processes), which matters on a GPU. On an H100 (docs/BENCHMARKS.md, "On an NVIDIA H100 (measured
2026-11-26)"), `--platform=cuda --steps=5000` made 2,888-3,145 updates/s for gear_jax, 503-533 for
host_insert and 1,014-1,119 for flashbax with its buffer in HBM (two runs): there the fused program with
the replay in host memory was 2.6-3.1x faster than with flashbax's buffer in GPU memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags, logging
from tqdm import tqdm

import gear_jax as gj

COMPARISONS = {  # name: what holds the replay, and how transitions get into it
    "gear_jax": "gear_jax table (host memory), gj.insert inside the fused program",
    "host_insert": "gear_jax table (host memory), table.insert from a Python loop",
    "flashbax": "flashbax prioritised item buffer (device memory), inside the fused program",
}

FLAGS = flags.FLAGS
flags.DEFINE_list("compare", list(COMPARISONS), f"comparisons to run, in order: any of {list(COMPARISONS)}")
flags.DEFINE_integer("steps", 10_000, "training iterations: each steps every env once and makes one update")
flags.DEFINE_integer("seed", 0, "seed of the network, the environments, exploration and the samplers")
flags.DEFINE_enum("platform", "cpu", ["cpu", "cuda"], "where jax runs")
flags.DEFINE_integer("num_envs", 4, "environments stepped in parallel (jax.vmap)")
flags.DEFINE_integer("batch_size", 64, "rows per learner update")
flags.DEFINE_integer("capacity", 1_000_000, "rows of the gear_jax table (host memory)")
flags.DEFINE_integer(
    "flashbax_capacity", None, "items of the flashbax buffer (device memory); default --capacity"
)
flags.DEFINE_integer("learning_starts", 1_000, "transitions collected (acting only) before the first update")
flags.DEFINE_integer(
    "scan_steps", 1_000, "iterations per call of the fused program; --steps must be a multiple"
)
flags.DEFINE_float("lr", 1e-3, "Adam learning rate at the start, decayed linearly to --lr_end")
flags.DEFINE_float("lr_end", 1e-5, "learning rate after --steps updates")
flags.DEFINE_float("gamma", 0.99, "discount")
flags.DEFINE_integer("hidden", 256, "units in each of the two hidden layers")
flags.DEFINE_float("tau", 0.005, "Polyak averaging of the target network per update")
flags.DEFINE_float("priority_exponent", 0.6, "alpha of prioritized replay")
flags.DEFINE_float("beta_start", 0.4, "importance-weight exponent, annealed to 1")
flags.DEFINE_float("priority_eps", 1e-3, "added to |TD error| for priorities")
flags.DEFINE_float("eps_start", 1.0, "exploration epsilon at the start")
flags.DEFINE_float("eps_end", 0.04, "exploration epsilon after the annealing")
flags.DEFINE_float("eps_fraction", 0.16, "fraction of all iterations over which epsilon is annealed")
flags.DEFINE_integer("eval_episodes", 20, "episodes of each greedy evaluation (run in parallel)")
flags.DEFINE_integer(
    "eval_every", 2_500, "training iterations between greedy evaluations (at the end of a call)"
)
flags.DEFINE_string("plot", None, "save a PNG of the learning curves here")
flags.DEFINE_bool("smoke", False, "a short run for tests: 1000 steps, 100,000-row replays")


@dataclasses.dataclass(frozen=True)
class Config:
    """The flags' values, with --smoke applied: what the functions below read."""

    compare: tuple[str, ...]
    steps: int
    seed: int
    platform: str
    num_envs: int
    batch_size: int
    capacity: int
    flashbax_capacity: int
    learning_starts: int
    scan_steps: int
    lr: float
    lr_end: float
    gamma: float
    hidden: int
    tau: float
    priority_exponent: float
    beta_start: float
    priority_eps: float
    eps_start: float
    eps_end: float
    eps_fraction: float
    eval_episodes: int
    eval_every: int
    plot: str | None
    smoke: bool

    @property
    def prefill_steps(self) -> int:
        """Iterations that only act, before the first update."""
        return -(-self.learning_starts // self.num_envs)

    @property
    def iterations(self) -> int:
        """Every iteration: the prefill's, then the training's."""
        return self.prefill_steps + self.steps


def config_from_flags() -> Config:
    values = {f.name: FLAGS[f.name].value for f in dataclasses.fields(Config)}
    values["compare"] = tuple(values["compare"])
    if values["smoke"]:
        values.update(steps=1_000, capacity=100_000, scan_steps=500, eval_every=1_000)
    if values["flashbax_capacity"] is None:
        values["flashbax_capacity"] = values["capacity"]
    config = Config(**values)
    unknown = [name for name in config.compare if name not in COMPARISONS]
    if unknown or not config.compare:
        raise app.UsageError(f"--compare={','.join(config.compare)}: choose among {list(COMPARISONS)}")
    if config.steps <= 0 or config.steps % config.scan_steps:
        raise app.UsageError(f"--steps={config.steps} must be a positive multiple of --scan_steps")
    if config.learning_starts < config.batch_size:
        raise app.UsageError("--learning_starts must be at least --batch_size: the first update samples")
    if min(config.capacity, config.flashbax_capacity) < config.prefill_steps * config.num_envs:
        raise app.UsageError("the replay capacities must hold at least --learning_starts transitions")
    return config


class QNetwork(nn.Module):
    """MLP from observations float32[B, 4] to action values float32[B, num_actions]."""

    num_actions: int
    hidden: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = nn.relu(nn.Dense(self.hidden)(obs))
        x = nn.relu(nn.Dense(self.hidden)(x))
        return nn.Dense(self.num_actions)(x)


class Learner(NamedTuple):
    params: Any
    target_params: Any
    opt_state: Any


class Envs(NamedTuple):
    state: Any  # gymnax states, batched over num_envs
    obs: jax.Array  # float32[num_envs, 4]
    returns: jax.Array  # float32[num_envs], return so far of each running episode


class Replay(NamedTuple):
    """A replay's three operations on a state that the programs carry (a pytree of arrays).

    insert: `(state, rows) -> state`; rows: the transition fields, each `[num_envs, *shape]`.
    sample: `(state, key) -> (state, batch, probabilities, picks)`; batch: the fields and "valid", each
      `[batch_size, ...]`; probabilities: float32[batch_size]; picks: what `update` needs.
    update: `(state, picks, priorities) -> state`; priorities: float32[batch_size].
    """

    insert: Callable[[Any, dict[str, jax.Array]], Any]
    sample: Callable[[Any, jax.Array], tuple[Any, dict[str, jax.Array], jax.Array, Any]]
    update: Callable[[Any, Any, jax.Array], Any]


def make_spec(env: Any, env_params: Any, capacity: int) -> gj.TableSpec:
    """One (obs, action, reward, next_obs, discount) transition per row."""
    obs_space = env.observation_space(env_params)
    return gj.TableSpec.from_spaces(
        {
            "obs": obs_space,
            "action": env.action_space(env_params),
            "reward": gj.Field(),
            "next_obs": obs_space,
            "discount": gj.Field(),
        },  # discount of the bootstrap: 0 if terminated
        capacity,
    )


def table_replay(table: gj.Table, config: Config) -> Replay:
    """The gear_jax table as a Replay. Its state is an int32 scalar that orders the table's custom calls:
    each insert runs after the previous priority update, each sample after the insert."""

    def insert(token: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        return gj.insert(table, rows, priorities="max", after=token)[0]

    def sample(token: jax.Array, key: jax.Array):
        picks, batch = table.sample_batch(
            key,
            config.batch_size,
            method="prioritized",
            priority_exponent=config.priority_exponent,
            after=token,
        )
        return token, batch, picks.probabilities, picks

    def update(token: jax.Array, picks: gj.Sample, priorities: jax.Array) -> jax.Array:
        # Rows overwritten since they were sampled keep their new priority: update_priorities skips them.
        return table.update_priorities(picks, priorities)

    return Replay(insert, sample, update)


def flashbax_replay(spec: gj.TableSpec, config: Config) -> tuple[Replay, Any]:
    """A flashbax prioritised item buffer of `--flashbax_capacity` items as a Replay, and its state.

    New items get the largest priority set so far, as the table's "max" does."""
    import flashbax as fbx  # only this comparison needs it (requirements-test.txt, not requirements.txt)

    buffer = fbx.make_prioritised_item_buffer(
        max_length=config.flashbax_capacity,
        min_length=config.batch_size,
        sample_batch_size=config.batch_size,
        add_batches=True,
        priority_exponent=config.priority_exponent,
        device="gpu" if config.platform == "cuda" else "cpu",
    )
    state = buffer.init({name: jnp.zeros(f.shape, f.dtype) for name, f in spec.fields.items()})

    def sample(state: Any, key: jax.Array):
        picked = buffer.sample(state, key)
        # Rounding in flashbax's float32 sum tree (its sums follow the leaves by added deltas) makes it pick
        # empty slots now and then: zero data and probability 0, which makes the weights (p / p_min)^-beta
        # NaN. Unmasked, that ended a default run (2 of its 640,000 picks, the first with 21,800 items in
        # the 1,000,000-item buffer). Masked as gear_jax masks overwritten rows; their priority stays 0.
        batch = dict(picked.experience, valid=picked.probabilities > 0)
        return state, batch, picked.probabilities, picked.indices

    return Replay(buffer.add, sample, buffer.set_priorities), state


def linear(start: float, end: float, fraction: jax.Array) -> jax.Array:
    return start + (end - start) * jnp.clip(fraction, 0.0, 1.0)


def make_act(env: Any, env_params: Any, network: QNetwork, config: Config, key: jax.Array):
    """`(params, envs, t) -> (envs, rows, finished)`: iteration t's epsilon-greedy step of every env.

    rows: the transitions, each field `[num_envs, *shape]`; finished: float32[num_envs], the return of each
    episode that ended at this step, NaN elsewhere. Randomness comes from `fold_in(key, t)`.
    """
    env_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def act(params: Any, envs: Envs, t: jax.Array):
        epsilon = linear(config.eps_start, config.eps_end, t / (config.iterations * config.eps_fraction))
        key_explore, key_action, key_env = jax.random.split(jax.random.fold_in(key, t), 3)
        greedy = jnp.argmax(network.apply(params, envs.obs), axis=1)
        random_action = jax.random.randint(key_action, (config.num_envs,), 0, env.num_actions)
        explore = jax.random.uniform(key_explore, (config.num_envs,)) < epsilon
        action = jnp.where(explore, random_action, greedy).astype(jnp.int32)
        obs, state, reward, terminated, truncated, info = env_step(
            jax.random.split(key_env, config.num_envs), envs.state, action, env_params
        )
        # gymnax resets finished envs inside step; the true next observation is in `final_observation`.
        rows = {
            "obs": envs.obs,
            "action": action,
            "reward": reward,
            "next_obs": info["final_observation"],
            "discount": jnp.where(terminated, 0.0, config.gamma).astype(jnp.float32),
        }
        ended = terminated | truncated
        returns = envs.returns + reward
        return Envs(state, obs, jnp.where(ended, 0.0, returns)), rows, jnp.where(ended, returns, jnp.nan)

    return act


def make_learner_step(
    replay: Replay, network: QNetwork, optimizer: optax.GradientTransformation, config: Config, key: jax.Array
):
    """`(learner, replay_state, t) -> (learner, replay_state, loss)`: iteration t's double-DQN update.

    Samples a prioritized batch (key `fold_in(key, t)`), weighs it by (N * P)^-beta normalized by the
    batch's maximum, beta annealed over the iterations, and writes |TD error| + eps back as priorities.
    """

    def learner_step(learner: Learner, replay_state: Any, t: jax.Array):
        beta = linear(config.beta_start, 1.0, t / config.iterations)
        replay_state, batch, probabilities, picks = replay.sample(replay_state, jax.random.fold_in(key, t))
        valid = batch["valid"]  # False for rows overwritten since the sample, or empty: their data is zeros
        p_min = jnp.min(jnp.where(valid, probabilities, jnp.inf))
        weights = jnp.where(valid, (probabilities / p_min) ** -beta, 0.0)

        def loss_fn(params):
            q = network.apply(params, batch["obs"])
            q_taken = jnp.take_along_axis(q, batch["action"][:, None], axis=1)[:, 0]
            next_action = jnp.argmax(network.apply(params, batch["next_obs"]), axis=1)  # double DQN
            next_q = network.apply(learner.target_params, batch["next_obs"])
            next_q = jnp.take_along_axis(next_q, next_action[:, None], axis=1)[:, 0]
            td = q_taken - jax.lax.stop_gradient(batch["reward"] + batch["discount"] * next_q)
            return jnp.sum(weights * optax.huber_loss(td)) / jnp.maximum(jnp.sum(valid), 1), td

        (loss, td), grads = jax.value_and_grad(loss_fn, has_aux=True)(learner.params)
        updates, opt_state = optimizer.update(grads, learner.opt_state, learner.params)
        params = optax.apply_updates(learner.params, updates)
        target_params = optax.incremental_update(params, learner.target_params, config.tau)
        priorities = jnp.where(valid, jnp.abs(td) + config.priority_eps, 0.0)
        replay_state = replay.update(replay_state, picks, priorities)
        return Learner(params, target_params, opt_state), replay_state, loss

    return learner_step


def make_fused(act, replay: Replay, learner_step, length: int, learn: bool):
    """The Anakin program: `length` iterations of act -> insert [-> learner step] in one `lax.scan`.

    `((learner, envs, replay_state), t0) -> ((learner, envs, replay_state), (finished, loss))`, for
    iterations t0 .. t0 + length - 1; finished: float32[length, num_envs], loss: float32[length] (NaN
    without `learn`). The carry is donated: flashbax's buffer is updated in place.
    """

    def program(carry, t0: jax.Array):
        def body(carry, t):
            learner, envs, replay_state = carry
            envs, rows, finished = act(learner.params, envs, t)
            replay_state = replay.insert(replay_state, rows)
            loss = jnp.float32(jnp.nan)
            if learn:
                learner, replay_state, loss = learner_step(learner, replay_state, t)
            return (learner, envs, replay_state), (finished, loss)

        return jax.lax.scan(body, carry, t0 + jnp.arange(length, dtype=jnp.int32))

    return jax.jit(program, donate_argnums=0)


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
        return jax.lax.scan(body, init, keys)[0][2]

    return evaluate


@dataclasses.dataclass
class Record:
    """What one comparison measured."""

    name: str
    capacity: int
    evals: list[tuple[int, float]]  # (transitions, mean greedy return), the untrained policy first
    episodes: list[tuple[int, float]] = dataclasses.field(default_factory=list)  # (transitions, return)
    train_s: float = 0.0  # the iterations alone: no compilation, no evaluation
    compile_s: float = 0.0
    final_loss: float = math.nan
    size: int = 0  # rows in the replay at the end


def chunks(config: Config) -> list[tuple[int, int]]:
    """(first iteration, iterations) of each call: the prefill, then `--scan_steps` at a time."""
    training = range(config.prefill_steps, config.iterations, config.scan_steps)
    return [(0, config.prefill_steps)] + [(t, config.scan_steps) for t in training]


class Run:
    """One comparison's bookkeeping: times its iterations, follows its episodes, evaluates it now and then."""

    def __init__(self, record: Record, config: Config, evaluate: Callable[[Any], float], progress: tqdm):
        self.record, self.config, self.evaluate, self.progress = record, config, evaluate, progress
        self.recent: deque[float] = deque(maxlen=20)  # returns of the last training episodes
        self.done = 0  # iterations

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        """Adds the time of the block to the comparison's training time."""
        start = time.perf_counter()
        yield
        self.record.train_s += time.perf_counter() - start

    def report(self, finished: np.ndarray, loss: float, params: Any, size: int) -> None:
        """Takes the host copy of the last iterations' `finished` [k, num_envs] and the last loss (NaN
        before the first update); evaluates the greedy policy after every `--eval_every` steps and the last.
        """
        config, record = self.config, self.record
        steps_before = max(self.done - config.prefill_steps, 0)
        for i, returns in enumerate(finished, start=self.done + 1):
            for r in returns[~np.isnan(returns)]:
                record.episodes.append((i * config.num_envs, float(r)))
                self.recent.append(float(r))
        self.done += len(finished)
        record.size, record.final_loss = size, loss
        self.progress.update(len(finished))
        steps = self.done - config.prefill_steps
        if steps == config.steps or (
            steps > 0 and steps // config.eval_every > steps_before // config.eval_every
        ):
            record.evals.append((self.done * config.num_envs, self.evaluate(params)))
            self.progress.clear()  # the log line goes above the bar, which the next update redraws
            logging.info(
                "%s: step %d (%d transitions): eval_return=%.1f loss=%.5f",
                record.name,
                steps,
                self.done * config.num_envs,
                record.evals[-1][1],
                loss,
            )

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.recent)) if self.recent else math.nan


def fused_run(
    run: Run, replay: Replay, replay_state: Any, size: Callable[[Any], int], act, learner_step, carry: Any
) -> Iterator[None]:
    """A comparison run as fused programs: compiles them, yields, then makes each call of `chunks` (the
    prefill, then `--scan_steps` iterations per call) and yields after each."""
    config, t0 = run.config, jnp.zeros((), jnp.int32)
    carry = (*carry, replay_state)
    start = time.perf_counter()
    prefill = make_fused(act, replay, learner_step, config.prefill_steps, learn=False)
    prefill = prefill.lower(carry, t0).compile()
    train = make_fused(act, replay, learner_step, config.scan_steps, learn=True).lower(carry, t0).compile()
    run.record.compile_s = time.perf_counter() - start
    yield
    for t, _ in chunks(config):
        with run.timed():
            carry, (finished, loss) = (train if t else prefill)(carry, jnp.int32(t))
            finished, loss = np.asarray(finished), float(loss[-1])
        run.report(finished, loss, carry[0].params, size(carry[2]))
        yield


def host_insert_run(run: Run, table: gj.Table, act, learner_step, carry: Any) -> Iterator[None]:
    """A comparison run as the quickstart runs: a Python loop over a jitted acting step, a host insert and a
    jitted learner step. Compiles the steps, yields, then runs the iterations of each of `chunks` and
    yields after each."""
    config, (learner, envs) = run.config, carry
    token = jnp.zeros((), jnp.int32)  # the previous update_priorities count: orders the next sample
    start = time.perf_counter()
    act_step = jax.jit(act).lower(learner.params, envs, 0).compile()
    learn = jax.jit(learner_step).lower(learner, token, 0).compile()
    run.record.compile_s = time.perf_counter() - start
    yield
    for t0, length in chunks(config):
        with run.timed():
            finished, loss = [], math.nan
            for t in range(t0, t0 + length):
                envs, rows, done = act_step(learner.params, envs, t)
                rows, done = jax.device_get((rows, done))  # waits for the step, which waits for the update
                table.insert(rows, priorities="max")  # as gj.insert: the largest so far, from the header
                finished.append(done)
                if t >= config.prefill_steps:
                    learner, token, loss = learn(learner, token, t)
            finished, loss = np.stack(finished), float(loss)
        run.report(finished, loss, learner.params, table.size)
        yield


def compare(config: Config) -> list[Record]:
    """Runs the comparisons of `--compare` side by side; returns what each measured."""
    env, env_params = gymnax.make("CartPole-v1")
    network = QNetwork(env.num_actions, config.hidden)
    optimizer = optax.chain(
        optax.clip_by_global_norm(10.0),
        optax.adam(optax.linear_schedule(config.lr, config.lr_end, config.steps)),
    )
    key_init, key_reset, key_eval, key_act, key_learn = jax.random.split(jax.random.key(config.seed), 5)
    params = network.init(key_init, jnp.zeros((1, *env.observation_space(env_params).shape)))
    evaluate_returns = make_evaluate(env, env_params, network, config.eval_episodes)

    def evaluate(params: Any) -> float:
        return float(jnp.mean(evaluate_returns(params, key_eval)))

    initial_return = evaluate(params)
    logging.info("untrained greedy policy: eval_return=%.1f", initial_return)
    reset = jax.vmap(env.reset, in_axes=(0, None))
    act = make_act(env, env_params, network, config, key_act)
    spec = make_spec(env, env_params, config.capacity)
    runs: list[tuple[Run, Iterator[None]]] = []
    with contextlib.ExitStack() as stack:  # closes the tables (freeing their shared memory) and the bar
        progress = stack.enter_context(
            tqdm(total=len(config.compare) * config.iterations, desc="training", unit="step", mininterval=0.5)
        )
        for name in config.compare:
            # Every comparison starts from the same network, environments and keys. The fused programs take
            # their carry's buffers (donation): each comparison gets its own copies.
            learner = jax.tree.map(jnp.copy, Learner(params, params, optimizer.init(params)))
            obs, env_state = reset(jax.random.split(key_reset, config.num_envs), env_params)
            carry = (learner, Envs(env_state, obs, jnp.zeros(config.num_envs)))
            capacity = config.flashbax_capacity if name == "flashbax" else config.capacity
            run = Run(Record(name, capacity, evals=[(0, initial_return)]), config, evaluate, progress)
            if name == "flashbax":
                replay, state = flashbax_replay(spec, config)
                learner_step = make_learner_step(replay, network, optimizer, config, key_learn)

                def size(state: Any) -> int:
                    return min(int(state.running_index), capacity)

                runs.append((run, fused_run(run, replay, state, size, act, learner_step, carry)))
                continue
            table = stack.enter_context(gj.Table.create(spec))
            replay = table_replay(table, config)
            learner_step = make_learner_step(replay, network, optimizer, config, key_learn)
            if name == "gear_jax":
                token = jnp.zeros((), jnp.int32)
                runs.append(
                    (run, fused_run(run, replay, token, lambda _, t=table: t.size, act, learner_step, carry))
                )
            else:
                runs.append((run, host_insert_run(run, table, act, learner_step, carry)))
        # In turns: one call (--scan_steps iterations) of each comparison, then the next round, so that the
        # changes of a shared machine's load fall on every comparison alike.
        for _ in itertools.zip_longest(*(steps for _, steps in runs)):
            progress.set_postfix({run.record.name: f"{run.mean_return:.1f}" for run, _ in runs})
    return [run.record for run, _ in runs]


def save_plot(path: str, records: list[Record]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    styles = {
        "gear_jax": ("tab:blue", "-"),
        "host_insert": ("tab:orange", "--"),
        "flashbax": ("tab:green", ":"),
    }
    for record in records:  # gear_jax and host_insert coincided in every run here: dashes show both
        color, line = styles[record.name]
        if len(record.episodes) >= 2:
            x, y = np.array(record.episodes).T
            window = min(50, len(y))
            smooth = np.convolve(y, np.ones(window) / window, mode="valid")
            label = f"{record.name}: training, mean of {window}"
            ax.plot(x[window - 1 :], smooth, line, color=color, alpha=0.6, label=label)
        x, y = np.array(record.evals).T
        ax.plot(x, y, "o" + line, color=color, label=f"{record.name}: greedy evaluation")
    ax.set_xlabel("environment transitions")
    ax.set_ylabel("episode return")
    ax.set_title("Double DQN + prioritized replay on CartPole-v1, Anakin style")
    ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    config = config_from_flags()
    if config.platform not in gj.build_info()["ffi_platforms"]:
        raise app.UsageError(
            f"this gear_jax was built without {config.platform} handlers; use --platform=cpu"
        )
    if "flashbax" in config.compare:
        try:
            import flashbax  # noqa: F401
        except ImportError as e:
            raise app.UsageError(
                f"the flashbax comparison needs flashbax ({e}): pip install flashbax, "
                "or leave it out of --compare"
            ) from None
    try:
        device = jax.devices(config.platform)[0]
    except RuntimeError as e:
        raise app.UsageError(f"--platform={config.platform}: no such JAX device ({e})") from None
    start = time.perf_counter()
    with jax.default_device(device):  # every array and jitted program below runs there
        records = compare(config)
    wall_s = time.perf_counter() - start

    if config.plot:
        save_plot(config.plot, records)
        logging.info("saved the learning curves to %s", config.plot)
    transitions = config.iterations * config.num_envs
    print(
        f"{config.steps} updates and {transitions} transitions each ({config.num_envs} envs, batch "
        f"{config.batch_size}, {config.prefill_steps} acting-only iterations first), on {device}:"
    )
    print(
        f"{'comparison':<12} {'capacity':>9} {'env steps/s':>11} {'updates/s':>9} {'train s':>7} "
        f"{'compile s':>9} {'eval return':>11}  replay"
    )
    for r in records:
        print(
            f"{r.name:<12} {r.capacity:>9} {transitions / r.train_s:>11.0f} {config.steps / r.train_s:>9.0f} "
            f"{r.train_s:>7.1f} {r.compile_s:>9.1f} {r.evals[-1][1]:>11.1f}  {COMPARISONS[r.name]}"
        )
    fields = [
        f"steps={config.steps}",
        f"transitions={transitions}",
        f"num_envs={config.num_envs}",
        f"initial_eval_return={records[0].evals[0][1]:.1f}",
        f"eval_episodes={config.eval_episodes}",
    ]
    for r in records:
        fields += [
            f"{r.name}_eval_return={r.evals[-1][1]:.1f}",
            f"{r.name}_env_steps_per_s={transitions / r.train_s:.1f}",
            f"{r.name}_updates_per_s={config.steps / r.train_s:.1f}",
            f"{r.name}_train_s={r.train_s:.1f}",
            f"{r.name}_compile_s={r.compile_s:.1f}",
            f"{r.name}_capacity={r.capacity}",
            f"{r.name}_size={r.size}",
            f"{r.name}_final_loss={r.final_loss:.5f}",
        ]
    print("summary: " + " ".join(fields + [f"wall_s={wall_s:.1f}"]))


if __name__ == "__main__":
    app.run(main)

"""PPO with its rollouts in a gear_jax table: acting, GAE, and epochs of minibatches in one jitted program.

What this shows:
  * an on-policy learner on gear_jax. One compiled program runs `--iterations_per_call` PPO iterations
    (`lax.scan`), each: step `--num_envs` gymnax CartPole-v1 environments for `--num_steps` steps
    (`jax.vmap`) -> advantages by GAE -> `gj.insert` of the rollout's `num_envs x num_steps` rows into a
    table of exactly that many rows (each rollout overwrites the last) -> `--epochs` epochs, each
    `gj.epoch` (every row once, in a fresh permutation, ordered after the insert by `after=`) and a
    `lax.scan` over its minibatches of `gj.gather` + a clipped-surrogate Adam step. A table larger than
    the rollout would keep older rollouts too: `gj.epoch(..., num_rows=R)` takes the R newest rows, and
    `gj.retire` makes a rollout's rows unselectable once it has served;
  * the same PPO with the rollout in a pytree of jax arrays (`--compare=...,pytree`), the usual way:
    each epoch a `jax.random.permutation` of the rows indexes the arrays. Everything else is the same
    (environments, network, keys, hyperparameters); the minibatches differ (on the CPU `gj.epoch`
    shuffles natively, so another permutation comes from the same key), so the two learn alike but not
    identically, and the difference in speed is the replay's alone.

Both comparisons run in turns, one call (`--iterations_per_call` iterations) of each per round, so that
the changing load of a shared machine falls on both alike. Compilation is timed apart.

Run (CPU by default; about 10 seconds on a 2-core CPU):

    python examples/ppo.py --plot ppo.png
    python examples/ppo.py --smoke          # 60 iterations (30,720 env steps): for tests

It shows a progress bar, logs each call's mean training return with absl.logging (stderr), and prints a
table of the comparisons and a summary line last (stdout).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags, logging
from gymnax.wrappers.purerl import LogWrapper
from tqdm import tqdm

import gear_jax as gj

COMPARISONS = {
    "gear_jax": "rollout in a gear_jax table (host memory): gj.insert, gj.epoch, gj.gather",
    "pytree": "rollout in a pytree of jax arrays: jax.random.permutation, indexing",
}

FLAGS = flags.FLAGS
flags.DEFINE_list("compare", list(COMPARISONS), f"comparisons to run, in order: any of {list(COMPARISONS)}")
flags.DEFINE_integer("iterations", 240, "PPO iterations (each: one rollout, then --epochs epochs over it)")
flags.DEFINE_integer("iterations_per_call", 20, "iterations per call of the program; divides --iterations")
flags.DEFINE_integer("seed", 0, "seed of the network, the environments, the actions and the permutations")
flags.DEFINE_enum("platform", "cpu", ["cpu", "cuda"], "where jax runs")
flags.DEFINE_integer("num_envs", 4, "environments stepped in parallel (jax.vmap)")
flags.DEFINE_integer("num_steps", 128, "steps of every environment per rollout")
flags.DEFINE_integer("epochs", 4, "epochs over each rollout")
flags.DEFINE_integer("minibatch_size", 128, "rows per minibatch; divides num_envs x num_steps")
flags.DEFINE_float("lr", 2.5e-3, "Adam learning rate at the start, decayed linearly to 0")
flags.DEFINE_float("gamma", 0.99, "discount")
flags.DEFINE_float("gae_lambda", 0.95, "GAE lambda")
flags.DEFINE_float("clip", 0.2, "PPO's ratio clip")
flags.DEFINE_float("value_coef", 0.5, "weight of the value loss")
flags.DEFINE_float("entropy_coef", 0.01, "weight of the entropy bonus")
flags.DEFINE_float("max_grad_norm", 0.5, "gradients clipped to this global norm")
flags.DEFINE_integer("hidden", 64, "units in each of the two hidden layers (actor and critic)")
flags.DEFINE_string("plot", None, "save a PNG of the learning curves here")
flags.DEFINE_bool("smoke", False, "a short run for tests: 60 iterations")


@dataclasses.dataclass(frozen=True)
class Config:
    compare: tuple[str, ...] = tuple(COMPARISONS)
    iterations: int = 240
    iterations_per_call: int = 20
    seed: int = 0
    platform: str = "cpu"
    num_envs: int = 4
    num_steps: int = 128
    epochs: int = 4
    minibatch_size: int = 128
    lr: float = 2.5e-3
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip: float = 0.2
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    max_grad_norm: float = 0.5
    hidden: int = 64
    plot: str | None = None
    smoke: bool = False

    @property
    def rollout_rows(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatches(self) -> int:
        return self.rollout_rows // self.minibatch_size


def config_from_flags() -> Config:
    values = {f.name: FLAGS[f.name].value for f in dataclasses.fields(Config)}
    values["compare"] = tuple(values["compare"])
    if values["smoke"]:
        values.update(iterations=60)
    config = Config(**values)
    unknown = [name for name in config.compare if name not in COMPARISONS]
    if unknown or not config.compare:
        raise app.UsageError(f"--compare={','.join(config.compare)}: choose among {list(COMPARISONS)}")
    if config.iterations <= 0 or config.iterations % config.iterations_per_call:
        raise app.UsageError(
            f"--iterations={config.iterations} must be a positive multiple of --iterations_per_call"
        )
    if config.rollout_rows % config.minibatch_size:
        raise app.UsageError("--minibatch_size must divide --num_envs x --num_steps")
    return config


class ActorCritic(nn.Module):
    """Observations float32[B, obs] -> (action logits float32[B, actions], values float32[B])."""

    actions: int
    hidden: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        def mlp(x: jax.Array, out: int, scale: float) -> jax.Array:
            for _ in range(2):
                x = nn.tanh(nn.Dense(self.hidden, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
            return nn.Dense(out, kernel_init=nn.initializers.orthogonal(scale))(x)

        return mlp(obs, self.actions, 0.01), mlp(obs, 1, 1.0)[..., 0]


class Carry(NamedTuple):
    """What one iteration hands the next."""

    params: Any
    opt_state: Any
    env_state: Any
    obs: jax.Array
    key: jax.Array


def row_fields(obs_shape: tuple[int, ...]) -> dict[str, gj.Field]:
    """One row per environment step: what the PPO loss reads."""
    return {
        "obs": gj.Field(obs_shape, "float32"),
        "action": gj.Field((), "int32"),
        "log_prob": gj.Field((), "float32"),
        "advantage": gj.Field((), "float32"),
        "target": gj.Field((), "float32"),
    }


def gae(rewards, values, dones, last_value, gamma, lam):
    """Advantages and value targets of a [T, N] rollout by generalized advantage estimation."""

    def back(carry, step):
        advantage, next_value = carry
        reward, value, done = step
        delta = reward + gamma * next_value * (1 - done) - value
        advantage = delta + gamma * lam * (1 - done) * advantage
        return (advantage, value), advantage

    _, advantages = jax.lax.scan(
        back, (jnp.zeros_like(last_value), last_value), (rewards, values, dones), reverse=True
    )
    return advantages, advantages + values


def ppo_loss(params, apply, batch, mask, c: Config):
    """The clipped surrogate, value and entropy losses over a minibatch, averaged over `mask`."""
    logits, values = apply(params, batch["obs"])
    log_probs = jax.nn.log_softmax(logits)
    log_prob = jnp.take_along_axis(log_probs, batch["action"][:, None], axis=1)[:, 0]
    ratio = jnp.exp(log_prob - batch["log_prob"])
    weight = mask / jnp.maximum(mask.sum(), 1.0)
    adv = batch["advantage"]
    mean = (adv * weight).sum()
    adv = (adv - mean) / (jnp.sqrt((jnp.square(adv - mean) * weight).sum()) + 1e-8)
    surrogate = jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - c.clip, 1 + c.clip) * adv)
    value_loss = jnp.square(values - batch["target"])
    entropy = -(jnp.exp(log_probs) * log_probs).sum(-1)
    per_row = -surrogate + c.value_coef * value_loss - c.entropy_coef * entropy
    return (per_row * weight).sum()


def make_optimizer(c: Config) -> optax.GradientTransformation:
    """Adam on globally clipped gradients, its rate decayed linearly to 0 over the run's updates."""
    updates = c.iterations * c.epochs * c.minibatches
    return optax.chain(
        optax.clip_by_global_norm(c.max_grad_norm),
        optax.adam(optax.linear_schedule(c.lr, 0.0, updates), eps=1e-5),
    )


def make_learner(
    c: Config,
    comparison: str,
    table: gj.Table | None,
    apply: Callable,
    optimizer: optax.GradientTransformation,
) -> Callable:
    """learn(params, opt_state, rollout, key) -> ((params, opt_state), losses[epochs, minibatches]): the
    PPO update over one rollout (a dict of [rows, ...] arrays), from the table or from the pytree."""
    rows = c.rollout_rows
    grad = jax.value_and_grad(ppo_loss)

    def sgd(state, batch, mask):
        params, opt_state = state
        loss, grads = grad(params, apply, batch, mask, c)
        change, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, change), opt_state), loss

    def learn_from_table(params, opt_state, rollout, key):
        written = gj.insert(table, rollout)

        def one_epoch(state, epoch_key):
            picks = gj.epoch(table, epoch_key, c.minibatch_size, num_rows=rows, after=written)

            def minibatch(state, s):
                batch = gj.gather(table, s)
                return sgd(state, batch, batch["valid"].astype(jnp.float32))

            return jax.lax.scan(minibatch, state, picks)

        return jax.lax.scan(one_epoch, (params, opt_state), jax.random.split(key, c.epochs))

    def learn_from_pytree(params, opt_state, rollout, key):
        mask = jnp.ones(c.minibatch_size, jnp.float32)

        def one_epoch(state, epoch_key):
            order = jax.random.permutation(epoch_key, rows)

            def minibatch(state, idx):
                return sgd(state, jax.tree_util.tree_map(lambda x: x[idx], rollout), mask)

            return jax.lax.scan(minibatch, state, order.reshape(c.minibatches, c.minibatch_size))

        return jax.lax.scan(one_epoch, (params, opt_state), jax.random.split(key, c.epochs))

    return learn_from_table if comparison == "gear_jax" else learn_from_pytree


def make_program(c: Config, comparison: str, table: gj.Table | None) -> tuple[Callable, Carry]:
    """The jitted program of `--iterations_per_call` iterations, and its first carry."""
    env, env_params = gymnax.make("CartPole-v1")
    env = LogWrapper(env)
    net = ActorCritic(env.action_space(env_params).n, c.hidden)
    key = jax.random.key(c.seed)
    key, init_key, reset_key = jax.random.split(key, 3)
    obs_shape = env.observation_space(env_params).shape
    params = net.init(init_key, jnp.zeros((1, *obs_shape)))
    optimizer = make_optimizer(c)
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(reset_key, c.num_envs), env_params
    )
    carry = Carry(params, optimizer.init(params), env_state, obs, key)
    rows = c.rollout_rows

    def act(state, _):
        params, env_state, obs, key = state
        key, action_key, step_key = jax.random.split(key, 3)
        logits, value = net.apply(params, obs)
        action = jax.random.categorical(action_key, logits)
        log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], axis=1)[:, 0]
        steps = jax.random.split(step_key, c.num_envs)
        obs2, env_state, reward, terminated, truncated, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            steps, env_state, action, env_params
        )
        done = jnp.logical_or(terminated, truncated).astype(jnp.float32)
        step = (obs, action.astype(jnp.int32), log_prob, value, reward, done)
        finished = (info["returned_episode_returns"] * done, done)
        return (params, env_state, obs2, key), (step, finished)

    learn = make_learner(c, comparison, table, net.apply, optimizer)

    def iteration(carry: Carry, _):
        key, learn_key = jax.random.split(carry.key)
        (_, env_state, obs, key), (steps, finished) = jax.lax.scan(
            act, (carry.params, carry.env_state, carry.obs, key), None, length=c.num_steps
        )
        obs_t, action, log_prob, value, reward, done = steps
        _, last_value = net.apply(carry.params, obs)
        advantage, target = gae(reward, value, done, last_value, c.gamma, c.gae_lambda)
        flat = lambda x: x.reshape(rows, *x.shape[2:])  # noqa: E731  [T, N, ...] -> [T * N, ...]
        rollout = {
            "obs": flat(obs_t),
            "action": flat(action),
            "log_prob": flat(log_prob),
            "advantage": flat(advantage),
            "target": flat(target),
        }
        (params, opt_state), losses = learn(carry.params, carry.opt_state, rollout, learn_key)
        returns, episodes = finished
        metrics = {"return_sum": returns.sum(), "episodes": episodes.sum(), "loss": losses.mean()}
        return Carry(params, opt_state, env_state, obs, key), metrics

    program = jax.jit(lambda carry: jax.lax.scan(iteration, carry, None, length=c.iterations_per_call))
    return program, carry


@dataclasses.dataclass
class Run:
    """One comparison's program, state and measurements."""

    name: str
    program: Callable
    carry: Carry
    table: gj.Table | None
    compile_s: float = 0.0
    train_s: float = 0.0
    initial_return: float = float("nan")  # the first iteration's, of the untrained policy
    returns: list[float] = dataclasses.field(default_factory=list)  # mean training return per call
    losses: list[float] = dataclasses.field(default_factory=list)

    def iterations_per_s(self, c: Config) -> float:
        return c.iterations / self.train_s


def start(c: Config, name: str) -> Run:
    table = None
    if name == "gear_jax":
        env, env_params = gymnax.make("CartPole-v1")
        spec = gj.TableSpec(row_fields(env.observation_space(env_params).shape), capacity=c.rollout_rows)
        table = gj.Table.create(spec)
    program, carry = make_program(c, name, table)
    began = time.perf_counter()
    compiled = program.lower(carry).compile()
    return Run(name, compiled, carry, table, compile_s=time.perf_counter() - began)


def call(run: Run) -> None:
    began = time.perf_counter()
    run.carry, metrics = jax.block_until_ready(run.program(run.carry))
    run.train_s += time.perf_counter() - began
    if not run.returns:
        run.initial_return = float(metrics["return_sum"][0]) / max(float(metrics["episodes"][0]), 1.0)
    episodes = float(metrics["episodes"].sum())
    run.returns.append(float(metrics["return_sum"].sum()) / max(episodes, 1.0))
    run.losses.append(float(metrics["loss"][-1]))


def plot(c: Config, runs: list[Run], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    steps_per_call = c.iterations_per_call * c.rollout_rows
    for run in runs:
        x = steps_per_call * (1 + np.arange(len(run.returns)))
        ax.plot(x, run.returns, label=f"{run.name}: {run.iterations_per_s(c):.1f} iterations/s")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("mean training episode return")
    ax.set_title("PPO on CartPole-v1: rollout in a gear_jax table vs a pytree")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str]) -> None:
    del argv
    c = config_from_flags()
    jax.config.update("jax_platforms", c.platform)
    logging.info(
        "PPO on CartPole-v1, %d iterations of %d env steps: %s", c.iterations, c.rollout_rows, c.compare
    )
    runs = [start(c, name) for name in c.compare]
    try:
        calls = c.iterations // c.iterations_per_call
        with tqdm(total=calls * len(runs), desc="PPO calls") as bar:
            for i in range(calls):
                for run in runs:  # in turns: a shared machine's load falls on every comparison alike
                    call(run)
                    bar.update()
                logging.info(
                    "call %d/%d: mean training return %s",
                    i + 1,
                    calls,
                    ", ".join(f"{r.name} {r.returns[-1]:.1f}" for r in runs),
                )
        env_steps = c.iterations * c.rollout_rows
        updates = c.iterations * c.epochs * c.minibatches
        header = ("comparison", "env steps/s", "updates/s", "train s", "compile s", "return")
        print(f"{header[0]:<10} " + " ".join(f"{h:>11}" for h in header[1:]))
        for run in runs:
            print(
                f"{run.name:<10} {env_steps / run.train_s:>11.0f} {updates / run.train_s:>11.0f} "
                f"{run.train_s:>11.1f} {run.compile_s:>11.1f} {run.returns[-1]:>11.1f}"
            )
        if c.plot:
            plot(c, runs, c.plot)
            logging.info("wrote %s", c.plot)
        fields = {"iterations": c.iterations, "env_steps": env_steps, "updates": updates}
        fields["initial_return"] = f"{runs[0].initial_return:.1f}"
        for run in runs:
            fields[f"{run.name}_env_steps_per_s"] = f"{env_steps / run.train_s:.0f}"
            fields[f"{run.name}_updates_per_s"] = f"{updates / run.train_s:.0f}"
            fields[f"{run.name}_return"] = f"{run.returns[-1]:.1f}"
            fields[f"{run.name}_final_loss"] = f"{run.losses[-1]:.6g}"
        if "gear_jax" in c.compare and "pytree" in c.compare:
            by = {run.name: run for run in runs}
            fields["speed_ratio"] = f"{by['pytree'].train_s / by['gear_jax'].train_s:.3f}"
        print("summary: " + " ".join(f"{k}={v}" for k, v in fields.items()))
    finally:
        for run in runs:
            if run.table is not None:
                run.table.close()


if __name__ == "__main__":
    app.run(main)

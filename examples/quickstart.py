"""Double DQN with prioritized replay on CartPole-v1, with a gear_jax table as the replay buffer.

What this shows:
  * a transition table (`max_steps=1`) in shared host memory, filled from the host with `table.insert`;
  * one `jax.jit` learner step that samples (prioritized), gathers, computes an importance-weighted
    double-DQN loss, applies an optax update and writes the new priorities back, all inside jit;
  * ordering by data dependency: each step passes the count returned by `gj.update_priorities` as
    `after=` to the next step's `gj.sample`, so the sample sees the priorities the update wrote.

Each training step runs the `--num_envs` vectorized gymnax environments one step (epsilon-greedy),
inserts the transitions into the table, and makes one learner update.

Run (CPU by default; about 2 minutes on a 2-core machine, reaching the maximum return of 500):

    python examples/quickstart.py --plot curve.png
    python examples/quickstart.py --smoke          # a few hundred steps, for tests

It prints a progress bar (mean training return, loss, table size), the greedy evaluations, and last a
summary line. The final policy is the trained one (no checkpoint is picked): a Polyak-averaged target,
a learning rate that decays to 1e-5, and a table that keeps every transition keep it from forgetting.
With the defaults, seed 0 printed (seeds 1-4 also ended at 500):
    evaluations (transitions: mean greedy return): 0: 13.2, 10000: 124.1, ..., 100000: 490.2,
        110000: 500.0, 120000: 500.0
    summary: eval_return=500.0 initial_eval_return=13.2 eval_episodes=20 steps=30000 transitions=120000 ...
"""

from __future__ import annotations

import argparse
import math
import time
from collections import deque
from typing import Any, NamedTuple

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

import gear_jax as gj

OBS_SHAPE = (4,)  # CartPole-v1: cart position, cart velocity, pole angle, pole angular velocity


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30_000, help="training steps (env step + learner update)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--platform", default="cpu", choices=("cpu", "cuda"),
                   help="where jax runs; the small network trains fastest on the CPU")
    p.add_argument("--num_envs", type=int, default=4, help="environments stepped in parallel (jax.vmap)")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--capacity", type=int, default=120_000,
                   help="rows of the replay table (the default keeps every transition of a default run)")
    p.add_argument("--learning_starts", type=int, default=1_000, help="transitions before the first update")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate at the start")
    p.add_argument("--lr_end", type=float, default=1e-5, help="learning rate after --steps (linear decay)")
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--hidden", type=int, default=256, help="units in each of the two hidden layers")
    p.add_argument("--tau", type=float, default=0.005,
                   help="Polyak averaging of the target network per update (0: periodic copies instead)")
    p.add_argument("--target_period", type=int, default=250, help="with --tau=0: updates between copies")
    p.add_argument("--priority_exponent", type=float, default=0.6, help="alpha of prioritized replay")
    p.add_argument("--beta_start", type=float, default=0.4, help="importance-weight exponent, annealed to 1")
    p.add_argument("--priority_eps", type=float, default=1e-3, help="added to |TD error| for priorities")
    p.add_argument("--eps_start", type=float, default=1.0)
    p.add_argument("--eps_end", type=float, default=0.04)
    p.add_argument("--eps_fraction", type=float, default=0.16, help="fraction of steps to anneal epsilon")
    p.add_argument("--eval_episodes", type=int, default=20)
    p.add_argument("--eval_every", type=int, default=2_500, help="steps between greedy evaluations")
    p.add_argument("--log_every", type=int, default=250, help="steps between progress-bar updates")
    p.add_argument("--plot", type=str, default=None, help="save a PNG of the learning curve here")
    p.add_argument("--smoke", action="store_true", help="a tiny run for tests: 300 steps, small table")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.capacity, args.learning_starts = 300, 1_000, 256
        args.eval_episodes, args.eval_every = 4, 150
    return args


class QNetwork(nn.Module):
    """MLP from observations float32[B, 4] to action values float32[B, num_actions]."""

    num_actions: int
    hidden: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = nn.relu(nn.Dense(self.hidden)(obs))
        x = nn.relu(nn.Dense(self.hidden)(x))
        return nn.Dense(self.num_actions)(x)


class TrainState(NamedTuple):
    params: Any
    target_params: Any
    opt_state: Any
    updates: jax.Array  # int32[], learner updates so far
    max_priority: jax.Array  # float32[], largest priority written so far (new rows get it)


def make_table(capacity: int) -> gj.Table:
    """A transition table: one (obs, action, reward, next_obs, done) per row."""
    spec = gj.TableSpec(
        fields={
            "obs": gj.Field(OBS_SHAPE, "float32"),
            "action": gj.Field((), "int32"),
            "reward": gj.Field((), "float32"),
            "next_obs": gj.Field(OBS_SHAPE, "float32"),
            "done": gj.Field((), "bool"),  # terminated (not truncated): no bootstrap from next_obs
        },
        capacity=capacity,
        max_steps=1,
    )
    return gj.Table.create(spec)


def make_learner_step(table: gj.Table, network: QNetwork, optimizer: optax.GradientTransformation,
                      args: argparse.Namespace):
    """The jitted learner step: sample -> gather -> loss/grad -> optax update -> update_priorities.

    `(state, key, step, beta, after) -> (state, metrics)`; the step's key is `fold_in(key, step)`.
    `after` is the previous step's `update_priorities` count, so this step's sample sees the priorities
    the previous step wrote.
    """

    @jax.jit
    def learner_step(state: TrainState, key: jax.Array, step: jax.Array, beta: jax.Array, after: jax.Array):
        sample = gj.sample(table, jax.random.fold_in(key, step), args.batch_size, method="prioritized",
                           priority_exponent=args.priority_exponent, after=after)
        batch = gj.gather(table, sample)
        valid = batch["valid"]  # False for rows overwritten between sample and gather: their data is zeros

        # Importance weights (N * P(i))^-beta, normalized by their maximum over the batch; N cancels.
        p_min = jnp.min(jnp.where(valid, sample.probabilities, jnp.inf))
        weights = jnp.where(valid, (sample.probabilities / p_min) ** -beta, 0.0)

        def loss_fn(params):
            q = network.apply(params, batch["obs"])
            q_taken = jnp.take_along_axis(q, batch["action"][:, None], axis=1)[:, 0]
            next_action = jnp.argmax(network.apply(params, batch["next_obs"]), axis=1)  # double DQN
            next_q = network.apply(state.target_params, batch["next_obs"])
            next_q = jnp.take_along_axis(next_q, next_action[:, None], axis=1)[:, 0]
            not_done = 1.0 - batch["done"].astype(jnp.float32)
            target = jax.lax.stop_gradient(batch["reward"] + args.gamma * not_done * next_q)
            td = q_taken - target
            loss = jnp.sum(weights * optax.huber_loss(td)) / jnp.maximum(jnp.sum(valid), 1)
            return loss, td

        (loss, td), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        if args.tau > 0:  # a target that moves a little every update: steadier than periodic copies
            target_params = optax.incremental_update(params, state.target_params, args.tau)
        else:
            target_params = optax.periodic_update(params, state.target_params, state.updates + 1,
                                                  args.target_period)
        # Rows overwritten since they were sampled keep their new priority: update_priorities skips them.
        priorities = jnp.abs(td) + args.priority_eps
        count = gj.update_priorities(table, sample, priorities)
        max_priority = jnp.maximum(state.max_priority, jnp.max(jnp.where(valid, priorities, 0.0)))
        new_state = TrainState(params, target_params, opt_state, state.updates + 1, max_priority)
        return new_state, {"loss": loss, "updated": count}

    return learner_step


def make_actor_step(env: Any, env_params: Any, network: QNetwork, num_envs: int):
    """The jitted actor step: epsilon-greedy actions, one step of every env, the transitions.

    `(params, env_state, obs, returns, key, step, epsilon) -> (env_state, obs, returns, transitions,
    finished)`; the step's key is `fold_in(key, step)`; `finished` is float32[num_envs], the return of
    each episode that ended this step, NaN elsewhere.
    """
    env_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    @jax.jit
    def actor_step(params, env_state, obs, returns, key, step, epsilon):
        key_explore, key_action, key_env = jax.random.split(jax.random.fold_in(key, step), 3)
        greedy = jnp.argmax(network.apply(params, obs), axis=1)
        random_action = jax.random.randint(key_action, (num_envs,), 0, env.num_actions)
        explore = jax.random.uniform(key_explore, (num_envs,)) < epsilon
        action = jnp.where(explore, random_action, greedy).astype(jnp.int32)
        next_obs, env_state, reward, terminated, truncated, info = env_step(
            jax.random.split(key_env, num_envs), env_state, action, env_params
        )
        # gymnax resets finished envs inside step; the true next observation is in `final_observation`.
        transitions = {"obs": obs, "action": action, "reward": reward,
                       "next_obs": info["final_observation"], "done": terminated}
        returns = returns + reward
        ended = terminated | truncated
        finished = jnp.where(ended, returns, jnp.nan)
        return env_state, next_obs, jnp.where(ended, 0.0, returns), transitions, finished

    return actor_step


def make_evaluate(env: Any, env_params: Any, network: QNetwork, num_episodes: int):
    """The jitted greedy evaluation: `(params, key) -> float32[num_episodes]` episode returns."""
    max_steps = env_params.max_steps_in_episode
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
            alive = alive & ~(terminated | truncated)
            return (obs, env_state, returns, alive), None

        init = (obs, env_state, jnp.zeros(num_episodes), jnp.ones(num_episodes, bool))
        (_, _, returns, _), _ = jax.lax.scan(body, init, jax.random.split(key_steps, max_steps))
        return returns

    return evaluate


def linear(start: float, end: float, fraction: float) -> float:
    return start + (end - start) * min(max(fraction, 0.0), 1.0)


def save_plot(path: str, episodes: list[tuple[int, float]], evals: list[tuple[int, float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if episodes:
        x, y = np.array(episodes).T
        ax.plot(x, y, ".", alpha=0.15, color="tab:blue", label="training episode (epsilon-greedy)")
        window = min(50, len(y))
        smooth = np.convolve(y, np.ones(window) / window, mode="valid")
        ax.plot(x[window - 1:], smooth, color="tab:blue", label=f"training, mean of {window}")
    if evals:
        x, y = np.array(evals).T
        ax.plot(x, y, "o-", color="tab:orange", label="greedy evaluation")
    ax.set_xlabel("environment transitions")
    ax.set_ylabel("episode return")
    ax.set_title("Double DQN + prioritized replay (gear_jax) on CartPole-v1")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def train(args: argparse.Namespace) -> None:
    env, env_params = gymnax.make("CartPole-v1")
    network = QNetwork(env.num_actions, args.hidden)
    learning_rate = optax.linear_schedule(args.lr, args.lr_end, args.steps)
    optimizer = optax.chain(optax.clip_by_global_norm(10.0), optax.adam(learning_rate))
    actor_step = make_actor_step(env, env_params, network, args.num_envs)
    evaluate = make_evaluate(env, env_params, network, args.eval_episodes)

    key_init, key_reset, key_eval, key_act, key_learn = jax.random.split(jax.random.key(args.seed), 5)
    params = network.init(key_init, jnp.zeros((1, *OBS_SHAPE)))
    state = TrainState(params, params, optimizer.init(params), jnp.zeros((), jnp.int32), jnp.ones(()))
    reset = jax.vmap(env.reset, in_axes=(0, None))
    obs, env_state = reset(jax.random.split(key_reset, args.num_envs), env_params)
    returns = jnp.zeros(args.num_envs)
    initial_return = float(jnp.mean(evaluate(state.params, key_eval)))

    episodes: list[tuple[int, float]] = []  # (transitions so far, return) of each training episode
    evals: list[tuple[int, float]] = [(0, initial_return)]  # (transitions so far, mean greedy return)
    recent: deque[float] = deque(maxlen=20)
    loss = math.nan
    transitions = 0
    max_priority = 1.0
    after = jnp.zeros((), jnp.int32)
    with make_table(args.capacity) as table:  # closing the table frees its shared memory
        learner_step = make_learner_step(table, network, optimizer, args)
        start = time.perf_counter()
        progress = tqdm(range(1, args.steps + 1), desc="training", unit="step", mininterval=0.5)
        for step in progress:
            fraction = step / args.steps
            epsilon = linear(args.eps_start, args.eps_end, fraction / args.eps_fraction)
            env_state, obs, returns, batch, finished = actor_step(
                state.params, env_state, obs, returns, key_act, step, epsilon
            )
            batch, finished = jax.device_get((batch, finished))
            # New transitions get the largest priority so far, so each is likely replayed at least once.
            table.insert(batch, priorities=max_priority)
            transitions += args.num_envs
            for r in finished[~np.isnan(finished)]:
                episodes.append((transitions, float(r)))
                recent.append(float(r))

            if transitions >= args.learning_starts:
                beta = linear(args.beta_start, 1.0, fraction)
                state, metrics = learner_step(state, key_learn, step, beta, after)
                after = metrics["updated"]
                max_priority = float(state.max_priority)  # waits for the step; the next act would too
            if step % args.log_every == 0 or step == args.steps:
                if transitions >= args.learning_starts:
                    loss = float(metrics["loss"])
                progress.set_postfix(
                    ret=f"{np.mean(recent) if recent else math.nan:.1f}", loss=f"{loss:.4f}",
                    eps=f"{epsilon:.2f}", size=str(table.size),
                )
            if step % args.eval_every == 0 or step == args.steps:
                evals.append((transitions, float(jnp.mean(evaluate(state.params, key_eval)))))
        progress.close()
        elapsed = time.perf_counter() - start
        table_size = table.size

    if args.plot:
        save_plot(args.plot, episodes, evals)
        print(f"saved learning curve to {args.plot}")
    print("evaluations (transitions: mean greedy return): "
          + ", ".join(f"{t}: {r:.1f}" for t, r in evals))
    print(
        f"summary: eval_return={evals[-1][1]:.1f} initial_eval_return={initial_return:.1f} "
        f"eval_episodes={args.eval_episodes} steps={args.steps} transitions={transitions} "
        f"table_size={table_size} capacity={args.capacity} final_loss={loss:.5f} "
        f"steps_per_s={args.steps / elapsed:.1f} wall_s={elapsed:.1f}"
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.platform not in gj.build_info()["ffi_platforms"]:
        raise SystemExit(f"this gear_jax was built without {args.platform} handlers; use --platform=cpu")
    try:
        device = jax.devices(args.platform)[0]
    except RuntimeError as e:
        raise SystemExit(f"--platform={args.platform}: no such JAX device ({e})") from None
    with jax.default_device(device):  # every array and jitted step below runs there
        train(args)


if __name__ == "__main__":
    main()

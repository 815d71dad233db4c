"""Double DQN with prioritized replay on CartPole-v1, with a gear_jax table as the replay buffer.

What this shows:
  * a transition table (`max_steps=1`) in shared host memory, filled from the host with `table.insert`;
  * one `jax.jit` learner step that samples (prioritized), gathers, computes an importance-weighted
    double-DQN loss, applies an optax update and writes the new priorities back, all inside jit;
  * ordering by data dependency: each step passes the count returned by `gj.update_priorities` as
    `after=` to the next step's `gj.sample`, so the sample sees the priorities the update wrote.

Each training step runs the `--num_envs` vectorized gymnax environments one step (epsilon-greedy),
inserts the transitions into the table, and makes one learner update.

Run (CPU by default; about a minute on a 2-core machine; the default seed ends at the maximum return of
500):

    python examples/quickstart.py --plot curve.png
    python examples/quickstart.py --smoke          # a few hundred steps, for tests

It shows a progress bar (mean training return, loss, table size), logs each greedy evaluation with
absl.logging (stderr) and prints a summary line last (stdout). The final policy is the trained one (no
checkpoint is picked), with a Polyak-averaged target, a learning rate that decays to 1e-5, and a table
that keeps every transition; not every seed keeps what it learned (below).
The README's first command, run in a fresh Python 3.11.7 venv on a fresh clone (jax 0.10.2, gymnax
1.0.1, flax 0.12.8, optax 0.2.8 from constraints.txt; a 2-core CPU; 2026-11-28), printed for the
default seed 0:
    evaluations (transitions: mean greedy return): 0: 13.2, 10000: 112.4, 20000: 127.5, 30000: 116.1,
        40000: 119.3, 50000: 165.8, 60000: 113.6, 70000: 128.0, 80000: 126.0, 90000: 142.8,
        100000: 308.6, 110000: 500.0, 120000: 500.0
    summary: eval_return=500.0 initial_eval_return=13.2 eval_episodes=20 steps=30000 transitions=120000
        table_size=120000 capacity=120000 final_loss=0.04864 steps_per_s=610.3 wall_s=49.2
In the same venv, --seed=1, 2, 3 and 4 ended at eval_return=346.6, 194.7, 500.0 and 230.4 (40-41 s of
training each); seeds 2, 3 and 4 had reached 500.0 at an earlier evaluation (90,000, 90,000 and 60,000
transitions), and seed 1's best was its last.
"""

from __future__ import annotations

import dataclasses
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
from absl import app, flags, logging
from tqdm import tqdm

import gear_jax as gj

OBS_SHAPE = (4,)  # CartPole-v1: cart position, cart velocity, pole angle, pole angular velocity


FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 30_000, "training steps (env step + learner update)")
flags.DEFINE_integer("seed", 0, "seed of the network, the environments, exploration and the sampler")
flags.DEFINE_enum("platform", "cpu", ["cpu", "cuda"],
                  "where jax runs; the small network trains fastest on the CPU")
flags.DEFINE_integer("num_envs", 4, "environments stepped in parallel (jax.vmap)")
flags.DEFINE_integer("batch_size", 64, "rows per learner update")
flags.DEFINE_integer("capacity", 120_000,
                     "rows of the replay table (the default keeps every transition of a default run)")
flags.DEFINE_integer("learning_starts", 1_000, "transitions before the first update")
flags.DEFINE_float("lr", 1e-3, "Adam learning rate at the start")
flags.DEFINE_float("lr_end", 1e-5, "learning rate after --steps")
flags.DEFINE_enum("lr_decay", "linear", ["linear", "cosine"], "how the learning rate goes to --lr_end")
flags.DEFINE_float("adam_eps", 1e-8, "epsilon of Adam")
flags.DEFINE_float("gamma", 0.99, "discount")
flags.DEFINE_integer("n_step", 1, "steps of reward summed in each transition before bootstrapping")
flags.DEFINE_bool("dueling", False, "dueling head: Q = V + A - mean(A)")
flags.DEFINE_integer("hidden", 256, "units in each of the two hidden layers")
flags.DEFINE_float("tau", 0.005,
                   "Polyak averaging of the target network per update (0: periodic copies instead)")
flags.DEFINE_integer("target_period", 250, "with --tau=0: updates between copies")
flags.DEFINE_float("priority_exponent", 0.6, "alpha of prioritized replay")
flags.DEFINE_float("beta_start", 0.4, "importance-weight exponent, annealed to 1")
flags.DEFINE_float("priority_eps", 1e-3, "added to |TD error| for priorities")
flags.DEFINE_float("eps_start", 1.0, "exploration epsilon at the start")
flags.DEFINE_float("eps_end", 0.04, "exploration epsilon after the annealing")
flags.DEFINE_float("eps_fraction", 0.16, "fraction of steps to anneal epsilon")
flags.DEFINE_integer("eval_episodes", 20, "episodes of each greedy evaluation (run in parallel)")
flags.DEFINE_integer("eval_every", 2_500, "steps between greedy evaluations")
flags.DEFINE_integer("log_every", 250, "steps between progress-bar updates")
flags.DEFINE_string("plot", None, "save a PNG of the learning curve here")
flags.DEFINE_bool("smoke", False, "a tiny run for tests: 300 steps, small table")


@dataclasses.dataclass(frozen=True)
class Config:
    """The flags' values, with --smoke applied: what the functions below read."""

    steps: int
    seed: int
    platform: str
    num_envs: int
    batch_size: int
    capacity: int
    learning_starts: int
    lr: float
    lr_end: float
    lr_decay: str
    adam_eps: float
    gamma: float
    n_step: int
    dueling: bool
    hidden: int
    tau: float
    target_period: int
    priority_exponent: float
    beta_start: float
    priority_eps: float
    eps_start: float
    eps_end: float
    eps_fraction: float
    eval_episodes: int
    eval_every: int
    log_every: int
    plot: str | None
    smoke: bool


def config_from_flags() -> Config:
    config = Config(**{f.name: FLAGS[f.name].value for f in dataclasses.fields(Config)})
    if config.smoke:  # flags given on the command line keep their values
        smoke = dict(steps=300, capacity=1_000, learning_starts=256, eval_episodes=4, eval_every=150)
        config = dataclasses.replace(config, **{n: v for n, v in smoke.items() if not FLAGS[n].present})
    return config


class QNetwork(nn.Module):
    """MLP from observations float32[B, 4] to action values float32[B, num_actions]."""

    num_actions: int
    hidden: int
    dueling: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = nn.relu(nn.Dense(self.hidden)(obs))
        x = nn.relu(nn.Dense(self.hidden)(x))
        if not self.dueling:
            return nn.Dense(self.num_actions)(x)
        advantage = nn.Dense(self.num_actions)(x)
        return nn.Dense(1)(x) + advantage - jnp.mean(advantage, axis=1, keepdims=True)


class TrainState(NamedTuple):
    params: Any
    target_params: Any
    opt_state: Any
    updates: jax.Array  # int32[], learner updates so far
    max_priority: jax.Array  # float32[], largest priority written so far (new rows get it)


def make_table(env: Any, env_params: Any, capacity: int) -> gj.Table:
    """A transition table: one (obs, action, reward, next_obs, discount) per row."""
    obs_space = env.observation_space(env_params)
    spec = gj.TableSpec.from_spaces(
        {"obs": obs_space, "action": env.action_space(env_params), "reward": gj.Field(),
         "next_obs": obs_space, "discount": gj.Field()},  # discount of the bootstrap: 0 if terminated
        capacity,
    )
    return gj.Table.create(spec)


def make_learner_step(table: gj.Table, network: QNetwork, optimizer: optax.GradientTransformation,
                      config: Config):
    """The jitted learner step: sample -> gather -> loss/grad -> optax update -> update_priorities.

    `(state, key, step, beta, after) -> (state, metrics)`; the step's key is `fold_in(key, step)`.
    `after` is the previous step's `update_priorities` count, so this step's sample sees the priorities
    the previous step wrote.
    """

    @jax.jit
    def learner_step(state: TrainState, key: jax.Array, step: jax.Array, beta: jax.Array, after: jax.Array):
        sample, batch = table.sample_batch(jax.random.fold_in(key, step), config.batch_size,
                                           method="prioritized", priority_exponent=config.priority_exponent,
                                           after=after)
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
            target = jax.lax.stop_gradient(batch["reward"] + batch["discount"] * next_q)
            td = q_taken - target
            loss = jnp.sum(weights * optax.huber_loss(td)) / jnp.maximum(jnp.sum(valid), 1)
            return loss, td

        (loss, td), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        if config.tau > 0:  # a target that moves a little every update: steadier than periodic copies
            target_params = optax.incremental_update(params, state.target_params, config.tau)
        else:
            target_params = optax.periodic_update(params, state.target_params, state.updates + 1,
                                                  config.target_period)
        # Rows overwritten since they were sampled keep their new priority: update_priorities skips them.
        priorities = jnp.abs(td) + config.priority_eps
        count = table.update_priorities(sample, priorities)
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
        ended = terminated | truncated
        transitions = {"obs": obs, "action": action, "reward": reward,
                       "next_obs": info["final_observation"], "terminated": terminated, "ended": ended}
        returns = returns + reward
        finished = jnp.where(ended, returns, jnp.nan)
        return env_state, next_obs, jnp.where(ended, 0.0, returns), transitions, finished

    return actor_step


class NStepTransitions:
    """Turns the actor's one-step transitions into n-step ones, for all environments at once.

    `push(step)` takes one step's `{obs, action, reward, next_obs, terminated, ended}` (arrays with a
    leading num_envs axis) and, once it holds n steps, returns the rows for the oldest one: its `obs` and
    `action`, the discounted reward of its next n steps (fewer where its episode ends), the observation
    to bootstrap from and the bootstrap's discount (gamma**steps, 0 where the episode terminated; a
    truncated episode bootstraps from its final observation).
    """

    def __init__(self, n: int, gamma: float):
        self.n, self.gamma = n, gamma
        self.window: deque[dict[str, np.ndarray]] = deque(maxlen=n)

    def push(self, step: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        self.window.append(step)
        if len(self.window) < self.n:
            return None
        ended = np.stack([s["ended"] for s in self.window])  # [n, num_envs]
        # Steps k of the oldest step's episode: no end among steps 0..k-1.
        in_episode = np.cumsum(np.concatenate([np.zeros_like(ended[:1]), ended[:-1]]), axis=0) == 0
        last = in_episode.sum(axis=0) - 1  # [num_envs]: the last of those steps
        envs = np.arange(ended.shape[1])
        rewards = np.stack([s["reward"] for s in self.window])
        powers = self.gamma ** np.arange(self.n, dtype=np.float32)[:, None]
        terminated = np.stack([s["terminated"] for s in self.window])[last, envs]
        first = self.window[0]
        return {
            "obs": first["obs"],
            "action": first["action"],
            "reward": np.sum(np.where(in_episode, powers * rewards, 0.0), axis=0, dtype=np.float32),
            "next_obs": np.stack([s["next_obs"] for s in self.window])[last, envs],
            "discount": np.where(terminated, 0.0, self.gamma ** (last + 1.0)).astype(np.float32),
        }


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


def train(config: Config) -> None:
    env, env_params = gymnax.make("CartPole-v1")
    network = QNetwork(env.num_actions, config.hidden, config.dueling)
    if config.lr_decay == "cosine":
        learning_rate = optax.cosine_decay_schedule(config.lr, config.steps, alpha=config.lr_end / config.lr)
    else:
        learning_rate = optax.linear_schedule(config.lr, config.lr_end, config.steps)
    optimizer = optax.chain(optax.clip_by_global_norm(10.0), optax.adam(learning_rate, eps=config.adam_eps))
    actor_step = make_actor_step(env, env_params, network, config.num_envs)
    evaluate = make_evaluate(env, env_params, network, config.eval_episodes)

    key_init, key_reset, key_eval, key_act, key_learn = jax.random.split(jax.random.key(config.seed), 5)
    params = network.init(key_init, jnp.zeros((1, *OBS_SHAPE)))
    state = TrainState(params, params, optimizer.init(params), jnp.zeros((), jnp.int32), jnp.ones(()))
    reset = jax.vmap(env.reset, in_axes=(0, None))
    obs, env_state = reset(jax.random.split(key_reset, config.num_envs), env_params)
    returns = jnp.zeros(config.num_envs)
    initial_return = float(jnp.mean(evaluate(state.params, key_eval)))

    episodes: list[tuple[int, float]] = []  # (transitions so far, return) of each training episode
    evals: list[tuple[int, float]] = [(0, initial_return)]  # (transitions so far, mean greedy return)
    recent: deque[float] = deque(maxlen=20)
    loss = math.nan
    transitions = 0
    max_priority = 1.0
    after = jnp.zeros((), jnp.int32)
    n_step = NStepTransitions(config.n_step, config.gamma)
    with make_table(env, env_params, config.capacity) as table:  # closing the table frees its shared memory
        learner_step = make_learner_step(table, network, optimizer, config)
        start = time.perf_counter()
        progress = tqdm(range(1, config.steps + 1), desc="training", unit="step", mininterval=0.5)
        for step in progress:
            fraction = step / config.steps
            epsilon = linear(config.eps_start, config.eps_end, fraction / config.eps_fraction)
            env_state, obs, returns, one_step, finished = actor_step(
                state.params, env_state, obs, returns, key_act, step, epsilon
            )
            one_step, finished = jax.device_get((one_step, finished))
            transitions += config.num_envs
            rows = n_step.push(one_step)
            if rows is not None:
                # New rows get the largest priority so far, so each is likely replayed at least once.
                table.insert(rows, priorities=max_priority)
            for r in finished[~np.isnan(finished)]:
                episodes.append((transitions, float(r)))
                recent.append(float(r))

            if transitions >= config.learning_starts:
                beta = linear(config.beta_start, 1.0, fraction)
                state, metrics = learner_step(state, key_learn, step, beta, after)
                after = metrics["updated"]
                max_priority = float(state.max_priority)  # waits for the step; the next act would too
            if step % config.log_every == 0 or step == config.steps:
                if transitions >= config.learning_starts:
                    loss = float(metrics["loss"])
                progress.set_postfix(
                    ret=f"{np.mean(recent) if recent else math.nan:.1f}", loss=f"{loss:.4f}",
                    eps=f"{epsilon:.2f}", size=str(table.size),
                )
            if step % config.eval_every == 0 or step == config.steps:
                evals.append((transitions, float(jnp.mean(evaluate(state.params, key_eval)))))
                progress.clear()  # the log line goes above the bar, which the next update redraws
                logging.info("step %d (%d transitions): eval_return=%.1f", step, transitions, evals[-1][1])
        progress.close()
        elapsed = time.perf_counter() - start
        table_size = table.size

    if config.plot:
        save_plot(config.plot, episodes, evals)
        logging.info("saved the learning curve to %s", config.plot)
    logging.info("evaluations (transitions: mean greedy return): %s",
                 ", ".join(f"{t}: {r:.1f}" for t, r in evals))
    print(
        f"summary: eval_return={evals[-1][1]:.1f} initial_eval_return={initial_return:.1f} "
        f"eval_episodes={config.eval_episodes} steps={config.steps} transitions={transitions} "
        f"table_size={table_size} capacity={config.capacity} final_loss={loss:.5f} "
        f"steps_per_s={config.steps / elapsed:.1f} wall_s={elapsed:.1f}"
    )


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    config = config_from_flags()
    if config.platform not in gj.build_info()["ffi_platforms"]:
        raise app.UsageError(f"this gear_jax was built without {config.platform} handlers; "
                             "use --platform=cpu")
    try:
        device = jax.devices(config.platform)[0]
    except RuntimeError as e:
        raise app.UsageError(f"--platform={config.platform}: no such JAX device ({e})") from None
    with jax.default_device(device):  # every array and jitted step below runs there
        train(config)


if __name__ == "__main__":
    app.run(main)

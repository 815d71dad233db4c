"""Actor processes write episodes into a trajectory table; a recurrent learner trains on windows of them.

What this shows:
  * a trajectory table (`max_steps=500`: one CartPole episode per row);
  * actor processes (multiprocessing, "spawn": fresh interpreters) that attach to the table by name with
    `gj.Table.attach(name)` and write episodes step by step with `table.writer()`: `append(step)` for
    every environment step, `end_episode(priority=length)` at its end, while the learner trains. The
    ring is small (100 episodes), so actors overwrite rows the learner may have just sampled;
  * the table's rate limiter (`gj.RateLimiter(min_size_to_sample=8, samples_per_insert=256, ...)`, kept in
    the table's shared header, so the actors' processes obey it too): the learner calls
    `table.await_samples(64)` before each update, and `end_episode` waits while the learner is behind, so
    a run trains on one new episode per 4 updates whichever side is faster;
  * one `jax.jit` learner step that samples windows (`gj.sample(..., window=16)`, prioritized by episode
    length so that windows are spread about uniformly over steps), gathers them (`gj.gather`: fields
    `[B, 16, ...]` and a `valid` mask, False for steps past an episode's end and for rows overwritten
    since they were sampled) and trains a GRU (flax.linen `nn.RNN`, a scan over time) with a masked loss.

The task needs memory. The actors run a known good controller on the full CartPole-v1 state (x, x_dot,
theta, theta_dot), with random actions 20% of the time, and store only the partial observation
(x, theta), the action taken and the controller's action. The learner clones the controller's action
from the partial observations: velocities must be inferred from the history. In the same jitted step a
baseline, the same model trained on windows of one step, learns what a memoryless policy can. Both are
evaluated greedily in the environment from partial observations (the GRU carries its state through the
episode; the baseline starts from a zero state every step), beside the untrained model.

Run (CPU by default; about 16 s on this project's 2-core machine, start-up included):

    python examples/trajectories.py
    python examples/trajectories.py --smoke        # a tiny run

It logs with absl.logging, shows a progress bar while training, and prints a summary line last. With the
default flags, seed 0 printed (the table's name is random; the counts of episodes are the rate
limiter's, the same on any machine give or take its tolerance of 8):
    untrained policy: eval_return=9.3
    started 2 actor processes writing into table gear_jax_d61d74dd8bfb1b2efa50a965727bee90
    16 episodes in the table: training starts
    update 500: memory eval_return=500.0, memoryless eval_return=41.6; 141 episodes written
    update 1000: memory eval_return=500.0, memoryless eval_return=41.2; 266 episodes written
    update 1500: memory eval_return=500.0, memoryless eval_return=39.2; 391 episodes written
    summary: eval_return=500.0 memoryless_eval_return=39.2 initial_eval_return=9.3 accuracy=0.860
        memoryless_accuracy=0.500 final_loss=0.3375 masked_steps=16 updates=1500 window=16 actors=2
        episodes=391 episodes_during_training=375 steps_written=196200 table_size=92 capacity=100
        updates_per_s=235.9 wall_s=6.4 held_updates=0
Seeds 1-4 also ended at eval_return=500.0 (the maximum), the baseline at 41.6-45.3 (runs in a fresh
venv made by the README's test command, 2026-11-27). `accuracy` (over
the valid steps of the last batch) stays near 0.8 while the policy balances the pole for all 500 steps:
balancing does not need every one of the controller's actions. `masked_steps` counts the steps of the
memory model's windows that the valid mask left out over the run (episodes shorter than the window, rows
overwritten between sample and gather): 16 in the run above, 609 in a run with --epsilon=0.7
--capacity=64 --steps=200 (short episodes). `table_size` counts committed rows; rows being rewritten (at
most one per writer) are not. `wall_s` is the training loop's, compilation and evaluations included;
`held_updates` counts the updates the rate limiter held back until the actors wrote more.
"""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import time
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

ENV_NAME = "CartPole-v1"
EPISODE_STEPS = 500  # CartPole-v1 truncates episodes at 500 steps: one row holds a whole episode
VISIBLE = (0, 2)  # of the state (x, x_dot, theta, theta_dot), the policy sees cart position and pole angle
OBS_SCALE = np.array([2.0, 20.0], np.float32)  # brings both to about unit size for the network

FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 1500, "learner updates")
flags.DEFINE_integer("seed", 0, "seed of the actors, the models, the sampler and the evaluations")
flags.DEFINE_enum("platform", "cpu", ["cpu", "cuda"], "where the learner's jax runs (the actors use the CPU)")
flags.DEFINE_integer("actors", 2, "actor processes")
flags.DEFINE_integer("envs_per_actor", 4, "environments each actor steps in parallel (one writer each)")
flags.DEFINE_integer("chunk", 50, "environment steps an actor computes per jitted call before writing them")
flags.DEFINE_integer("actor_rate", 0,
                     "environment steps per second each actor writes at most, as a slower environment "
                     "would (0: no cap but the rate limiter's)")
flags.DEFINE_float("epsilon", 0.2,
                   "probability that an actor's action is random (the label stays the expert's)")
flags.DEFINE_integer("capacity", 100, "rows (episodes) of the table; the oldest are overwritten")
flags.DEFINE_integer("min_episodes", 8, "episodes in the table before the first update")
flags.DEFINE_float("samples_per_episode", 256.0,
                   "windows the learner samples per episode the actors write (4 updates of 64), held by "
                   "the table's rate limiter (gj.RateLimiter's samples_per_insert): the learner waits when "
                   "the actors fall behind, the actors when the learner does; 0: no limiter")
flags.DEFINE_integer("window", 16, "steps per sampled window")
flags.DEFINE_integer("batch_size", 64, "windows per update")
flags.DEFINE_integer("hidden", 64, "units of the GRU and of the input layer")
flags.DEFINE_float("lr", 3e-3, "Adam learning rate")
flags.DEFINE_bool("baseline", True,
                  "also train the same model on windows of one step (no memory), in the same jitted step")
flags.DEFINE_integer("eval_every", 500, "updates between greedy evaluations")
flags.DEFINE_integer("eval_episodes", 16, "episodes per evaluation (run in parallel)")
flags.DEFINE_float("actor_timeout", 60.0, "seconds to wait for the actors to start writing, and to stop")
flags.DEFINE_bool("smoke", False, "a tiny run for tests")


@dataclasses.dataclass(frozen=True)
class Config:
    """The flags' values, with --smoke applied."""

    steps: int
    seed: int
    platform: str
    actors: int
    envs_per_actor: int
    chunk: int
    actor_rate: int
    epsilon: float
    capacity: int
    min_episodes: int
    samples_per_episode: float
    window: int
    batch_size: int
    hidden: int
    lr: float
    baseline: bool
    eval_every: int
    eval_episodes: int
    actor_timeout: float
    smoke: bool


def config_from_flags() -> Config:
    config = Config(**{f.name: FLAGS[f.name].value for f in dataclasses.fields(Config)})
    if config.smoke:  # flags given on the command line keep their values
        smoke = dict(steps=40, actors=1, envs_per_actor=2, min_episodes=2, eval_every=20, eval_episodes=4)
        config = dataclasses.replace(config, **{n: v for n, v in smoke.items() if not FLAGS[n].present})
    return config


def make_spec(capacity: int) -> gj.TableSpec:
    """One episode per row, up to 500 steps: what the policy saw, what it did, what the expert would do."""
    return gj.TableSpec(
        fields={
            "obs": gj.Field((len(VISIBLE),), "float32"),  # the partial observation only
            "action": gj.Field((), "int32"),  # the action taken (the expert's, or a random one)
            "expert_action": gj.Field((), "int32"),  # the label for behaviour cloning
        },
        capacity=capacity,
        max_steps=EPISODE_STEPS,
    )


def expert(state: jax.Array) -> jax.Array:
    """A linear controller on the full state [B, 4] that holds the pole up for all 500 steps."""
    return (state[:, 2] * 10 + state[:, 3] * 2 + state[:, 1] * 0.5 + state[:, 0] * 0.1 > 0).astype(jnp.int32)


# -- actors ------------------------------------------------------------------------------------------


def make_rollout(env: Any, env_params: Any, num_envs: int, chunk: int, epsilon: float):
    """The actor's jitted `(obs, env_state, key) -> (obs, env_state, steps)`: `chunk` steps of `num_envs`
    environments driven by the epsilon-noisy expert; `steps` holds [chunk, num_envs] arrays."""
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def body(carry, key):
        obs, env_state = carry
        k_noise, k_action, k_env = jax.random.split(key, 3)
        label = expert(obs)
        noisy = jax.random.uniform(k_noise, (num_envs,)) < epsilon
        action = jnp.where(noisy, jax.random.randint(k_action, (num_envs,), 0, 2), label).astype(jnp.int32)
        next_obs, env_state, _, terminated, truncated, _ = step(
            jax.random.split(k_env, num_envs), env_state, action, env_params
        )  # gymnax resets an ended environment inside step: next_obs is then the next episode's first
        out = {"obs": obs[:, VISIBLE], "action": action, "expert_action": label,
               "done": terminated | truncated}
        return (next_obs, env_state), out

    @jax.jit
    def rollout(obs, env_state, key):
        (obs, env_state), steps = jax.lax.scan(body, (obs, env_state), jax.random.split(key, chunk))
        return obs, env_state, steps

    return rollout


def run_actor(table_name: str, seed: int, num_envs: int, chunk: int, epsilon: float, rate: int,
              stop: Any, episodes: Any, steps_written: Any) -> None:
    """An actor process: attaches to the table by name and writes episodes step by step until `stop`.

    Each environment has its own `EpisodeWriter`: `append` copies a step straight into the row the
    writer holds (not sampled while being written), `end_episode` publishes the row. The priority is the
    episode's length, so the learner's prioritized sample (exponent 1) picks windows about uniformly
    over all steps rather than over episodes. `episodes` and `steps_written` are shared counters;
    `rate` caps the steps written per second (0: no cap), as a slower environment would.
    """
    # Actors step their environments on the CPU, so that they never take GPU memory from the learner
    # (set before this process's first jax computation starts a backend).
    jax.config.update("jax_platforms", "cpu")
    env, env_params = gymnax.make(ENV_NAME)
    rollout = make_rollout(env, env_params, num_envs, chunk, epsilon)
    key, reset_key = jax.random.split(jax.random.key(seed))
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_key, num_envs), env_params)
    table = gj.Table.attach(table_name)
    writers = [table.writer() for _ in range(num_envs)]
    period = chunk * num_envs / rate if rate > 0 else 0.0  # seconds per chunk at the capped rate
    due = time.monotonic()
    try:
        while not stop.is_set():
            key, rollout_key = jax.random.split(key)
            obs, env_state, steps = rollout(obs, env_state, rollout_key)
            steps = jax.device_get(steps)
            done = steps.pop("done")
            for t in range(chunk):
                for e, writer in enumerate(writers):
                    writer.append({name: value[t, e] for name, value in steps.items()})
                    if done[t, e]:
                        if not publish(writer, stop):
                            return  # asked to stop while the limiter held the episode back
                        with episodes.get_lock():
                            episodes.value += 1
            with steps_written.get_lock():
                steps_written.value += chunk * num_envs
            due = max(due + period, time.monotonic() - period)  # no bursts to catch up after a stall
            stop.wait(max(0.0, due - time.monotonic()))
    finally:
        for writer in writers:
            writer.close()  # gives back the row of an unfinished episode
        table.close()


def publish(writer: gj.EpisodeWriter, stop: Any) -> bool:
    """Ends the writer's episode (priority: its length), waiting as long as the rate limiter holds it
    back (the learner is behind) but no longer than `stop` is unset; returns whether it was published."""
    while not stop.is_set():
        try:
            writer.end_episode(priority=writer.steps, timeout=0.1)
            return True
        except gj.RateLimiterTimeout:
            continue  # the episode stays in its row; try again
    return False  # closing the writer gives the row back


def rate_limiter(config: Config) -> gj.RateLimiter | None:
    """The learner's and the actors' shared pace: `samples_per_episode` windows sampled per episode
    written. The tolerance lets every writer end an episode at once (the actors' environments often end
    theirs at the same step) and the learner run 8 updates ahead; sampling starts at `min_episodes`."""
    if config.samples_per_episode <= 0:
        return None
    writers = config.actors * config.envs_per_actor
    tolerance = max(8 * config.batch_size, config.batch_size + writers * config.samples_per_episode)
    return gj.RateLimiter(min_size_to_sample=config.min_episodes,
                          samples_per_insert=config.samples_per_episode, error_buffer=tolerance)


class Actors:
    """Starts actor processes ("spawn": fresh interpreters) and ends them cleanly (`with Actors(...)`)."""

    def __init__(self, table: gj.Table, config: Config):
        context = multiprocessing.get_context("spawn")
        self.stop = context.Event()
        self.episodes = context.Value("q", 0)
        self.steps = context.Value("q", 0)
        self.timeout = config.actor_timeout
        self.processes = [
            context.Process(
                target=run_actor, name=f"actor-{i}", daemon=True,
                args=(table.name, config.seed * 1000 + i + 1, config.envs_per_actor, config.chunk,
                      config.epsilon, config.actor_rate, self.stop, self.episodes, self.steps),
            )
            for i in range(config.actors)
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

    def wait_for(self, table: gj.Table, rows: int) -> None:
        """Waits until `table` holds `rows` episodes (or an actor fails, or the timeout passes)."""
        deadline = time.monotonic() + self.timeout
        while table.size < rows:
            self.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the actors wrote {table.size} of {rows} episodes in {self.timeout} s")
            time.sleep(0.05)

    def await_samples(self, table: gj.Table, n: int) -> bool:
        """Waits until the table's rate limiter lets the learner sample `n` windows (checking that the
        actors still run); returns whether it had to wait (the limiter did not admit them at once)."""
        try:
            table.await_samples(n, timeout=0)  # tries once
            return False
        except gj.RateLimiterTimeout:
            pass
        start = time.monotonic()
        while True:
            try:
                table.await_samples(n, timeout=0.5)
                return True
            except gj.RateLimiterTimeout:
                self.check()
                if time.monotonic() - start > self.timeout:
                    raise TimeoutError(
                        f"the rate limiter held the learner for {self.timeout} s: the actors wrote "
                        f"{self.episodes.value} episodes ({table.rate_limiter_counts()})"
                    ) from None

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for process in self.processes:
            process.join(self.timeout)
        for process in self.processes:
            if process.is_alive():
                logging.warning("%s did not stop within %.0f s; terminating it", process.name, self.timeout)
                process.terminate()
                process.join(5)
        failed = [f"{p.name}: {p.exitcode}" for p in self.processes if p.exitcode != 0]
        if failed and exc[0] is None:
            raise RuntimeError(f"actors failed (exit codes): {', '.join(failed)}")


# -- learner -----------------------------------------------------------------------------------------


class Policy(nn.Module):
    """A GRU policy: partial observations [B, T, 2] and a carry [B, hidden] -> (carry, logits [B, T, 2])."""

    hidden: int

    @nn.compact
    def __call__(self, carry: jax.Array, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = nn.relu(nn.Dense(self.hidden)(obs * OBS_SCALE))
        carry, y = nn.RNN(nn.GRUCell(self.hidden), return_carry=True)(x, initial_carry=carry)
        return carry, nn.Dense(2)(nn.relu(nn.Dense(self.hidden)(y)))


class TrainState(NamedTuple):
    params: Any
    opt_state: Any


def make_learner_step(table: gj.Table, model: Policy, optimizer: optax.GradientTransformation,
                      config: Config):
    """The jitted learner step: `(states, key) -> (states, metrics)` for a dict of train states.

    "memory" trains on windows of `config.window` steps, "memoryless" (the baseline) on windows of one
    step, both sampled from the same table in the same step.
    """
    windows = {"memory": config.window, "memoryless": 1} if config.baseline else {"memory": config.window}

    def update(state: TrainState, key: jax.Array, window: int):
        sample = gj.sample(table, key, config.batch_size, method="prioritized", priority_exponent=1.0,
                           window=window)
        batch = gj.gather(table, sample, fields=("obs", "expert_action"))  # [B, window, ...] and valid
        valid = batch["valid"]  # False for steps past an episode's end and for rows overwritten meanwhile
        carry = jnp.zeros((config.batch_size, config.hidden))

        def loss_fn(params):
            _, logits = model.apply(params, carry, batch["obs"])
            losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["expert_action"])
            count = jnp.maximum(jnp.sum(valid), 1)
            accuracy = jnp.sum(valid * (jnp.argmax(logits, -1) == batch["expert_action"])) / count
            return jnp.sum(jnp.where(valid, losses, 0.0)) / count, accuracy

        (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        metrics = {"loss": loss, "accuracy": accuracy, "masked_steps": jnp.sum(~valid)}
        return TrainState(optax.apply_updates(state.params, updates), opt_state), metrics

    @jax.jit
    def learner_step(states: dict[str, TrainState], key: jax.Array):
        keys = dict(zip(windows, jax.random.split(key, len(windows))))
        out = {name: update(states[name], keys[name], window) for name, window in windows.items()}
        return {n: s for n, (s, _) in out.items()}, {n: m for n, (_, m) in out.items()}

    return learner_step


def make_evaluate(env: Any, env_params: Any, model: Policy, num_episodes: int, hidden: int):
    """The jitted greedy evaluation `(params, key, memory) -> float32[num_episodes]` episode returns.

    The policy sees the partial observation only. With `memory` the GRU carries its state through the
    episode; without, it starts from a zero state at every step (what a window of one step trains).
    """
    reset = jax.vmap(env.reset, in_axes=(0, None))
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    @functools.partial(jax.jit, static_argnames="memory")
    def evaluate(params, key, memory: bool):
        key_reset, key_steps = jax.random.split(key)
        obs, env_state = reset(jax.random.split(key_reset, num_episodes), env_params)

        def body(carry, key):
            obs, env_state, state, returns, alive = carry
            if not memory:
                state = jnp.zeros_like(state)
            state, logits = model.apply(params, state, obs[:, None, VISIBLE])
            action = jnp.argmax(logits[:, 0], axis=-1)
            obs, env_state, reward, terminated, truncated, _ = step(
                jax.random.split(key, num_episodes), env_state, action, env_params
            )
            returns = returns + jnp.where(alive, reward, 0.0)
            alive = alive & ~(terminated | truncated)
            return (obs, env_state, state, returns, alive), None

        init = (obs, env_state, jnp.zeros((num_episodes, hidden)), jnp.zeros(num_episodes),
                jnp.ones(num_episodes, bool))
        (*_, returns, _), _ = jax.lax.scan(body, init, jax.random.split(key_steps, EPISODE_STEPS))
        return returns

    return evaluate


def train(config: Config) -> None:
    env, env_params = gymnax.make(ENV_NAME)
    model = Policy(config.hidden)
    optimizer = optax.adam(config.lr)
    evaluate = make_evaluate(env, env_params, model, config.eval_episodes, config.hidden)
    key_init, key_eval, key_learn = jax.random.split(jax.random.key(config.seed), 3)
    params = model.init(key_init, jnp.zeros((1, config.hidden)), jnp.zeros((1, 1, len(VISIBLE))))
    names = ("memory", "memoryless") if config.baseline else ("memory",)
    states = {name: TrainState(params, optimizer.init(params)) for name in names}  # same start
    initial_return = float(jnp.mean(evaluate(params, key_eval, memory=True)))
    logging.info("untrained policy: eval_return=%.1f", initial_return)

    def evaluate_all(states):
        return {name: float(jnp.mean(evaluate(s.params, key_eval, memory=name == "memory")))
                for name, s in states.items()}

    table = gj.Table.create(make_spec(config.capacity), rate_limiter=rate_limiter(config))
    try:
        with Actors(table, config) as actors:
            logging.info("started %d actor processes writing into table %s", config.actors, table.name)
            actors.wait_for(table, config.min_episodes)
            episodes_at_start = actors.episodes.value
            logging.info("%d episodes in the table: training starts", table.size)
            learner_step = make_learner_step(table, model, optimizer, config)
            evals: list[tuple[int, dict[str, float]]] = []
            masked_steps = jnp.zeros((), jnp.int32)  # of the memory model's windows, summed on the device
            held = 0  # updates the rate limiter held back until the actors wrote more
            start = time.perf_counter()
            progress = tqdm(range(1, config.steps + 1), desc="learner", unit="update", mininterval=0.5)
            for step in progress:
                # The memory model's windows are the ones counted (the baseline's are a side experiment).
                held += actors.await_samples(table, config.batch_size)
                states, metrics = learner_step(states, jax.random.fold_in(key_learn, step))
                masked_steps = masked_steps + metrics["memory"]["masked_steps"]
                if step % 50 == 0 or step == config.steps:
                    actors.check()
                    memory = jax.device_get(metrics["memory"])
                    progress.set_postfix(loss=f"{memory['loss']:.3f}", acc=f"{memory['accuracy']:.3f}",
                                         episodes=actors.episodes.value)
                if step % config.eval_every == 0 or step == config.steps:
                    evals.append((step, evaluate_all(states)))
                    progress.clear()
                    logging.info("update %d: %s; %d episodes written", step,
                                 ", ".join(f"{n} eval_return={r:.1f}" for n, r in evals[-1][1].items()),
                                 actors.episodes.value)
            progress.close()
            seconds = time.perf_counter() - start
            episodes_during_training = actors.episodes.value - episodes_at_start
            table_size = table.size
        episodes, steps_written = actors.episodes.value, actors.steps.value
    finally:
        table.close()
    metrics = jax.device_get(metrics)
    final = evals[-1][1]
    memoryless = f"memoryless_eval_return={final['memoryless']:.1f} " if config.baseline else ""
    memoryless_accuracy = (f"memoryless_accuracy={metrics['memoryless']['accuracy']:.3f} "
                           if config.baseline else "")
    print(
        f"summary: eval_return={final['memory']:.1f} {memoryless}initial_eval_return={initial_return:.1f} "
        f"accuracy={metrics['memory']['accuracy']:.3f} {memoryless_accuracy}"
        f"final_loss={metrics['memory']['loss']:.4f} masked_steps={int(masked_steps)} "
        f"updates={config.steps} window={config.window} actors={config.actors} episodes={episodes} "
        f"episodes_during_training={episodes_during_training} steps_written={steps_written} "
        f"table_size={table_size} capacity={config.capacity} updates_per_s={config.steps / seconds:.1f} "
        f"wall_s={seconds:.1f} held_updates={held}"
    )


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    config = config_from_flags()
    if config.steps < 1 or config.actors < 1 or config.envs_per_actor < 1 or config.chunk < 1:
        raise app.UsageError("--steps, --actors, --envs_per_actor and --chunk must be at least 1")
    try:
        device = jax.devices(config.platform)[0]
    except RuntimeError as e:
        raise app.UsageError(f"--platform={config.platform}: no such JAX device ({e})") from None
    with jax.default_device(device):
        train(config)


if __name__ == "__main__":
    app.run(main)

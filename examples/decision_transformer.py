"""A decision transformer learns CartPole from offline episodes of mixed quality held in a step ring.

What this shows:
  * an offline data set of mixed quality: gymnasium CartPole-v1 episodes of a good controller that takes
    a random action with a probability drawn per episode, uniform in [--min_epsilon, --max_epsilon], so
    episode returns spread from about 10 to 500;
  * a step-ring trajectory table (`gj.TableSpec(fields, capacity=EPISODES, step_capacity=STEPS,
    max_steps=500)`) of observation, action, return-to-go and timestep: every episode takes exactly its
    steps of the ring;
  * return-to-go (the sum of the rewards from a step to the episode's end) is known only once the
    episode ends: the collector's `EpisodeWriter` defers it (`table.writer(deferred=["rtg"])`). Each
    `append` takes the step's observation, action and timestep as the environment gives them, and
    `end_episode(deferred={"rtg": values})` gives return-to-go for every step at once, written before the
    episode is published (no reader ever sees it without);
  * one `jax.jit` learner step: `gj.sample_gather(table, key, B, window=K, short_episodes="pad")` draws B
    context windows of K steps, every window start inside an episode equally likely (windows never cross
    an episode's end; an episode shorter than K gives one window, its steps past the end zeroed and
    `valid` False), and makes an optax Adam update of a causal transformer (flax.linen) over interleaved
    (return-to-go, observation, action) tokens that predicts each step's action, with a cross-entropy
    masked by `valid`. The library pads a short window at its end, where the reference implementation
    pads at the front; with causal attention the padded tokens come after every real one, so no real
    token attends to them and only the loss needs the mask. (The reference implementation draws a start
    uniformly over every step, so a window may run past the episode's end and is then padded; here a
    window lies inside its episode, so an episode's first and last K - 1 steps are in fewer windows than
    its middle steps, its last step in one window start instead of K.) The step also checks the gather
    against the `Sample`: `valid` is the first min(length, K) steps of each window, `timestep` is
    `starts` + i, and return-to-go is length - timestep (CartPole gives a reward of 1 per step). The
    timestep could come from `Sample.starts` alone; the table stores it so that every input of the model
    comes from the one gather;
  * evaluation in the environment conditioned on target returns (--targets, default 500, 300, 150 and
    50): the return-to-go token starts at the target and loses each reward received; actions are sampled
    from the predicted distribution, as the data's policy sampled them (the most likely action would be
    the controller's in almost every state, whatever the target).

The data's controller is the one examples/episodes.py uses; the random actions make its episodes end
sooner the more there are of them. The transformer reads the return-to-go at every step: to follow a low
target it must act like the noisier episodes, and to reach 500 like the cleanest ones.

Run (CPU by default; about 2 minutes on this project's 2-core machine, start-up included):

    python examples/decision_transformer.py
    python examples/decision_transformer.py --targets=500,400,250   # other target returns
    python examples/decision_transformer.py --smoke                 # a tiny run (about 8 s in all)

It logs with absl.logging, shows progress bars while collecting, training and evaluating, and prints a
summary line last (`eval_return_<target>`: the mean return of the --eval_episodes episodes conditioned on
that target; `data_return_*`: the offline episodes' returns; `initial_loss`: the first update's loss;
`final_loss` and `final_accuracy`: the means over the last --log_every updates, on valid steps;
`masked_windows`: sampled windows with a step the valid mask left out, over the run, and
`expected_masked_windows` the number the uniform law over window starts predicts; `inconsistent_windows`:
windows whose gather disagreed with the Sample, 0 unless the library is wrong). With the default flags,
seed 0 printed (the table's name is random):
    step ring gear_jax_aa55...: 400 episodes, 73865 steps (5.41 MiB); returns 8 to 500, median 82, 48
        shorter than the window
    update 500: loss=0.5311 accuracy=0.763
    update 1000: loss=0.4647 accuracy=0.809
    update 2000: loss=0.4113 accuracy=0.829
    update 3000: loss=0.3677 accuracy=0.847
    target 500: mean return 483.8 (min 240, max 500)
    target 300: mean return 275.4 (min 77, max 323)
    target 150: mean return 149.5 (min 101, max 169)
    target 50: mean return 51.6 (min 15, max 61)
    summary: eval_return_500=483.8 eval_return_300=275.4 eval_return_150=149.5 eval_return_50=51.6
        data_return_min=8 data_return_median=82 data_return_mean=184.7 data_return_max=500 episodes=400
        table_steps=73865 initial_loss=0.9600 final_loss=0.3677 final_accuracy=0.847 masked_windows=136
        expected_masked_windows=138.6 inconsistent_windows=0 updates=3000 window=20 eval_episodes=16
        updates_per_s=25.6 wall_s=117.0
The mean return follows the target from 50 to 500; half the data's episodes last 82 steps or fewer. The
loss stays well above 0: the data's random actions (a probability of 0.2 to 1 per episode) cannot be
predicted. Seed 1 ended at eval_return_500=470.4 eval_return_300=275.2 eval_return_150=142.5
eval_return_50=52.8 (masked_windows=161, 164.2 expected). The wall time is the training loop's (compilation
included); collecting the data takes under a second and each target's evaluation about one.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, NamedTuple

import flax.linen as nn
import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags, logging
from tqdm import tqdm

import gear_jax as gj

ENV_NAME = "CartPole-v1"
MAX_STEPS = 500  # CartPole-v1 truncates episodes at 500 steps: the longest episode the table accepts
OBS_SCALE = np.array([2.4, 2.0, 0.21, 2.0], np.float32)  # brings the observation to about unit size
RTG_SCALE = 500.0  # the largest return-to-go, scaled to 1

FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 3000, "learner updates")
flags.DEFINE_integer("seed", 0, "seed of the data, the model, the sampler and the evaluations")
flags.DEFINE_enum("platform", "cpu", ["cpu", "cuda"], "where the learner's jax runs")
flags.DEFINE_integer("episodes", 400, "offline episodes collected (the table's index holds as many)")
flags.DEFINE_integer("step_capacity", 200_000, "steps the ring holds; the oldest episodes are retired")
flags.DEFINE_float("min_epsilon", 0.2, "lowest probability of a random action an episode draws (uniformly)")
flags.DEFINE_float("max_epsilon", 1.0, "highest probability of a random action an episode draws")
flags.DEFINE_integer("window", 20, "steps per context window (K)")
flags.DEFINE_integer("batch_size", 64, "windows per update")
flags.DEFINE_integer("embed", 64, "width of the tokens")
flags.DEFINE_integer("layers", 2, "transformer blocks")
flags.DEFINE_integer("heads", 4, "attention heads")
flags.DEFINE_float("lr", 1e-3, "peak Adam learning rate (linear warm-up, then cosine decay)")
flags.DEFINE_list("targets", ["500", "300", "150", "50"], "target returns the evaluation conditions on")
flags.DEFINE_integer("eval_episodes", 16, "episodes per target (run side by side)")
flags.DEFINE_integer("log_every", 500, "updates between logged losses (and those final_loss averages)")
flags.DEFINE_bool("smoke", False, "a tiny run for tests (flags given explicitly keep their values)")


@dataclasses.dataclass(frozen=True)
class Config:
    """The flags' values, with --smoke applied."""

    steps: int
    seed: int
    platform: str
    episodes: int
    step_capacity: int
    min_epsilon: float
    max_epsilon: float
    window: int
    batch_size: int
    embed: int
    layers: int
    heads: int
    lr: float
    targets: tuple[float, ...]
    eval_episodes: int
    log_every: int
    smoke: bool


def config_from_flags() -> Config:
    values = {f.name: FLAGS[f.name].value for f in dataclasses.fields(Config)}
    values["targets"] = tuple(float(t) for t in values["targets"])
    config = Config(**values)
    if config.smoke:  # flags given on the command line keep their values
        smoke = {"steps": 60, "episodes": 60, "embed": 32, "layers": 1, "eval_episodes": 2, "log_every": 20}
        config = dataclasses.replace(config, **{n: v for n, v in smoke.items() if not FLAGS[n].present})
    return config


FIELDS = {
    "obs": gj.Field((4,), "float32"),  # CartPole's state: x, x_dot, theta, theta_dot
    "action": gj.Field((), "int32"),  # the action taken
    "rtg": gj.Field((), "float32"),  # return-to-go: the rewards from this step to the episode's end
    "timestep": gj.Field((), "int32"),  # the step's index in its episode
}


def expert(state: np.ndarray) -> int:
    """A linear controller on the state (x, x_dot, theta, theta_dot) that holds the pole up for 500
    steps."""
    return int(state[2] * 10 + state[3] * 2 + state[1] * 0.5 + state[0] * 0.1 > 0)


def returns_to_go(rewards: np.ndarray) -> np.ndarray:
    """rewards: float[L] of one episode -> float32[L], rtg[t] = rewards[t] + ... + rewards[L - 1]."""
    return np.cumsum(rewards[::-1])[::-1].astype(np.float32)


def run_episode(
    env: gymnasium.Env, writer: gj.EpisodeWriter, rng: np.random.Generator, epsilon: float, seed: int
) -> float:
    """Writes one episode of the noisy controller, step by step; returns its return."""
    obs, _ = env.reset(seed=seed)
    rewards: list[float] = []
    done = False
    while not done:
        action = int(rng.integers(2)) if rng.uniform() < epsilon else expert(obs)
        writer.append({"obs": obs.astype(np.float32), "action": action, "timestep": len(rewards)})
        obs, reward, terminated, truncated, _ = env.step(action)
        rewards.append(float(reward))
        done = terminated or truncated
    rtg = returns_to_go(np.asarray(rewards, np.float64))
    writer.end_episode(deferred={"rtg": rtg})  # written with the episode: readers never see it without
    return float(rtg[0])


def collect(table: gj.Table, config: Config) -> np.ndarray:
    """Runs `config.episodes` episodes, each written as it runs; returns their returns."""
    env = gymnasium.make(ENV_NAME)
    rng = np.random.default_rng(config.seed)
    returns = np.zeros(config.episodes)
    with table.writer(deferred=["rtg"]) as writer:
        for e in tqdm(range(config.episodes), desc="collect", unit="episode", mininterval=0.5):
            epsilon = rng.uniform(config.min_epsilon, config.max_epsilon)
            returns[e] = run_episode(env, writer, rng, epsilon, seed=config.seed * 100_000 + e)
    env.close()
    return returns


# -- the model ---------------------------------------------------------------------------------------


class Block(nn.Module):
    """A pre-norm transformer block with causal self-attention: [B, T, D] -> [B, T, D]."""

    heads: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2], bool))
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads)(nn.LayerNorm()(x), mask=mask)
        width = x.shape[-1]
        return x + nn.Dense(width)(nn.gelu(nn.Dense(4 * width)(nn.LayerNorm()(x))))


class DecisionTransformer(nn.Module):
    """Windows of K steps -> logits of each step's action, float32[B, K, 2].

    Inputs: rtg float32[B, K], obs float32[B, K, 4], action int32[B, K], timestep int32[B, K]. Each step
    becomes three tokens (return-to-go, observation, action), each plus the step's timestep embedding;
    the action of step t is predicted from the observation token of step t, which attends to that step's
    return-to-go and to every earlier token (never to step t's action).
    """

    embed: int
    layers: int
    heads: int

    @nn.compact
    def __call__(self, rtg: jax.Array, obs: jax.Array, action: jax.Array, timestep: jax.Array) -> jax.Array:
        b, k = action.shape
        time = nn.Embed(MAX_STEPS, self.embed)(timestep)
        tokens = jnp.stack(
            [
                nn.Dense(self.embed)(rtg[..., None] / RTG_SCALE) + time,
                nn.Dense(self.embed)(obs / OBS_SCALE) + time,
                nn.Embed(2, self.embed)(action) + time,
            ],
            axis=2,
        ).reshape(b, 3 * k, self.embed)  # r_0, s_0, a_0, r_1, s_1, a_1, ...
        x = nn.LayerNorm()(tokens)
        for _ in range(self.layers):
            x = Block(self.heads)(x)
        x = nn.LayerNorm()(x)
        return nn.Dense(2)(x.reshape(b, k, 3, self.embed)[:, :, 1])  # from the observation tokens


class TrainState(NamedTuple):
    params: Any
    opt_state: Any


def window_checks(sample: gj.Sample, batch: dict[str, jax.Array], window: int) -> jax.Array:
    """Windows (int32 scalar) whose gathered steps disagree with the Sample: `valid` must be the first
    min(length, K) steps, `timestep` starts + i, return-to-go length - timestep (a reward of 1 per
    step). No episode is retired while the learner trains, so every sampled window is valid where it lies
    inside its episode."""
    i = jnp.arange(window)
    expected_valid = i < jnp.minimum(sample.lengths, window)[:, None]
    timestep = sample.starts[:, None] + i
    rtg = (sample.lengths[:, None] - timestep).astype(jnp.float32)
    wrong = (batch["valid"] != expected_valid) | (
        batch["valid"] & ((batch["timestep"] != timestep) | (batch["rtg"] != rtg))
    )
    return jnp.sum(jnp.any(wrong, axis=1))


def make_learner_step(
    table: gj.Table, model: DecisionTransformer, optimizer: optax.GradientTransformation, config: Config
):
    """The jitted learner step `(state, key) -> (state, metrics)`: one sample of windows, one update."""

    @jax.jit
    def learner_step(state: TrainState, key: jax.Array):
        sample, batch = gj.sample_gather(
            table, key, config.batch_size, window=config.window, short_episodes="pad"
        )
        valid = batch["valid"]

        def loss_fn(params):
            logits = model.apply(params, batch["rtg"], batch["obs"], batch["action"], batch["timestep"])
            losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["action"])
            count = jnp.maximum(jnp.sum(valid), 1)
            loss = jnp.sum(jnp.where(valid, losses, 0.0)) / count
            correct = jnp.sum(valid & (jnp.argmax(logits, axis=-1) == batch["action"])) / count
            return loss, correct

        (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        metrics = {
            "loss": loss,
            "accuracy": accuracy,
            "masked_windows": jnp.sum(~jnp.all(valid, axis=1)),
            "inconsistent_windows": window_checks(sample, batch, config.window),
        }
        return TrainState(optax.apply_updates(state.params, updates), opt_state), metrics

    return learner_step


def expected_masked(lengths: np.ndarray, window: int) -> float:
    """The probability that a window is padded: a uniform draw over window starts, where an episode of
    L >= K steps has L - K + 1 starts and a shorter one a single (padded) window."""
    starts = np.where(lengths >= window, lengths - window + 1, 1)
    return float(starts[lengths < window].sum() / starts.sum())


# -- evaluation in the environment -------------------------------------------------------------------


def make_act(model: DecisionTransformer, window: int):
    """The jitted policy `(params, context, position, key) -> int32[N]`: an action sampled for each of N
    episodes from the logits at `position` of its context (the last K steps, the current one at
    `position`; steps after it are zeros that causal attention never reads)."""

    @jax.jit
    def act(params: Any, context: dict[str, jax.Array], position: jax.Array, key: jax.Array):
        logits = model.apply(params, context["rtg"], context["obs"], context["action"], context["timestep"])
        return jax.random.categorical(key, logits[:, position])

    return act


def evaluate(act, params: Any, target: float, config: Config, seed: int) -> np.ndarray:
    """Runs `config.eval_episodes` episodes side by side, each conditioned on `target`; returns their
    returns. Each keeps its whole history; the model reads the last K steps."""
    n, k = config.eval_episodes, config.window
    envs = [gymnasium.make(ENV_NAME) for _ in range(n)]
    history = {
        "rtg": np.zeros((n, MAX_STEPS + k), np.float32),
        "obs": np.zeros((n, MAX_STEPS + k, 4), np.float32),
        "action": np.zeros((n, MAX_STEPS + k), np.int32),
        "timestep": np.zeros((n, MAX_STEPS + k), np.int32),
    }
    for i, env in enumerate(envs):
        history["obs"][i, 0], _ = env.reset(seed=seed + i)
    history["rtg"][:, 0] = target
    returns = np.zeros(n)
    running = np.ones(n, bool)
    key = jax.random.key(seed)
    for t in tqdm(range(MAX_STEPS), desc=f"eval {target:g}", unit="step", mininterval=0.5, leave=False):
        start = max(0, t - k + 1)
        context = {name: h[:, start : start + k] for name, h in history.items()}
        actions = np.asarray(act(params, context, t - start, jax.random.fold_in(key, t)))
        for i in np.flatnonzero(running):
            obs, reward, terminated, truncated, _ = envs[i].step(int(actions[i]))
            returns[i] += reward
            history["action"][i, t] = actions[i]
            history["obs"][i, t + 1] = obs
            history["rtg"][i, t + 1] = history["rtg"][i, t] - reward
            history["timestep"][i, t + 1] = t + 1
            running[i] = not (terminated or truncated)
        if not running.any():
            break
    for env in envs:
        env.close()
    return returns


# -- training ----------------------------------------------------------------------------------------


def train(config: Config) -> dict[str, Any]:
    """Collects the offline data, trains the model on windows of it and evaluates it; returns the
    summary's fields."""
    spec = gj.TableSpec(
        FIELDS, capacity=config.episodes, step_capacity=config.step_capacity, max_steps=MAX_STEPS
    )
    table = gj.Table.create(spec)
    try:
        data_returns = collect(table, config)
        lengths = data_returns.astype(np.int64)  # a reward of 1 per step: the return is the length
        logging.info(
            "step ring %s: %d episodes, %d steps (%.2f MiB); returns %d to %d, median %d, %d shorter "
            "than the window",
            table.name,
            table.size,
            lengths.sum(),
            table.nbytes / 2**20,
            lengths.min(),
            lengths.max(),
            np.median(lengths),
            np.sum(lengths < config.window),
        )
        if table.size != config.episodes or lengths.sum() > config.step_capacity:
            raise app.UsageError("--step_capacity is too small for the data: the ring retired episodes")

        model = DecisionTransformer(config.embed, config.layers, config.heads)
        schedule = optax.warmup_cosine_decay_schedule(
            0.0, config.lr, max(1, config.steps // 10), config.steps, end_value=config.lr / 20
        )
        optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(schedule))
        key_init, key_learn, key_eval = jax.random.split(jax.random.key(config.seed), 3)
        k = config.window
        example = (jnp.zeros((1, k)), jnp.zeros((1, k, 4)), jnp.zeros((1, k), jnp.int32))
        params = model.init(key_init, *example, jnp.zeros((1, k), jnp.int32))
        state = TrainState(params, optimizer.init(params))
        learner_step = make_learner_step(table, model, optimizer, config)

        totals = None  # metrics summed on the device since the last log
        masked_windows = inconsistent = 0
        start = time.perf_counter()
        progress = tqdm(range(1, config.steps + 1), desc="learner", unit="update", mininterval=0.5)
        for step in progress:
            state, metrics = learner_step(state, jax.random.fold_in(key_learn, step))
            if step == 1:
                initial_loss = float(metrics["loss"])
            totals = metrics if totals is None else jax.tree.map(jnp.add, totals, metrics)
            if step % config.log_every == 0 or step == config.steps:
                period = (step - 1) % config.log_every + 1
                means = {name: float(value) / period for name, value in totals.items()}
                masked_windows += int(totals["masked_windows"])
                inconsistent += int(totals["inconsistent_windows"])
                totals = None
                progress.clear()
                logging.info("update %d: loss=%.4f accuracy=%.3f", step, means["loss"], means["accuracy"])
        progress.close()
        seconds = time.perf_counter() - start
    finally:
        table.close()

    act = make_act(model, config.window)
    eval_returns = {}
    for j, target in enumerate(config.targets):
        returns = evaluate(act, state.params, target, config, seed=10_000 * (config.seed + 1) + 100 * j)
        eval_returns[target] = returns
        logging.info(
            "target %g: mean return %.1f (min %d, max %d)",
            target,
            returns.mean(),
            returns.min(),
            returns.max(),
        )
    draws = config.steps * config.batch_size
    return {
        **{f"eval_return_{t:g}": f"{r.mean():.1f}" for t, r in eval_returns.items()},
        "data_return_min": int(lengths.min()),
        "data_return_median": int(np.median(lengths)),
        "data_return_mean": f"{lengths.mean():.1f}",
        "data_return_max": int(lengths.max()),
        "episodes": config.episodes,
        "table_steps": int(lengths.sum()),
        "initial_loss": f"{initial_loss:.4f}",
        "final_loss": f"{means['loss']:.4f}",
        "final_accuracy": f"{means['accuracy']:.3f}",
        "masked_windows": masked_windows,
        "expected_masked_windows": f"{draws * expected_masked(lengths, k):.1f}",
        "inconsistent_windows": inconsistent,
        "updates": config.steps,
        "window": k,
        "eval_episodes": config.eval_episodes,
        "updates_per_s": f"{config.steps / seconds:.1f}",
        "wall_s": f"{seconds:.1f}",
    }


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    config = config_from_flags()
    if config.steps < 1 or config.episodes < 1 or config.eval_episodes < 1:
        raise app.UsageError("--steps, --episodes and --eval_episodes must be at least 1")
    if not 0.0 <= config.min_epsilon <= config.max_epsilon <= 1.0:
        raise app.UsageError("need 0 <= --min_epsilon <= --max_epsilon <= 1")
    if not 1 <= config.window <= MAX_STEPS:
        raise app.UsageError(f"--window must be in [1, {MAX_STEPS}]")
    try:
        device = jax.devices(config.platform)[0]
    except RuntimeError as e:
        raise app.UsageError(f"--platform={config.platform}: no such JAX device ({e})") from None
    with jax.default_device(device):
        summary = train(config)
    print("summary: " + " ".join(f"{name}={value}" for name, value in summary.items()))


if __name__ == "__main__":
    app.run(main)

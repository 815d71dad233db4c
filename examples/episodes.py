"""Episodes of any length in a step-ring table; a GRU world model learns CartPole's dynamics from windows.

What this shows:
  * a step-ring trajectory table (`gj.TableSpec(fields, capacity=EPISODES, step_capacity=STEPS,
    max_steps=500)`): the steps of every episode lie back to back in one ring of `STEPS` steps, with an
    index of up to `EPISODES` episodes, so a 12-step episode takes 12 steps of memory, not 500. The
    oldest episodes are overwritten when the ring (or the index) is full. `--table=padded` runs the
    same program on the padded trajectory table (one row of 500 steps per episode) of the same
    memory, which then holds far fewer episodes;
  * actor processes (multiprocessing, "spawn") that attach to the table by name (`gj.Table.attach`) and
    write gymnasium CartPole-v1 episodes step by step with an `EpisodeWriter` (`append` per step,
    `end_episode` at its end) while the learner trains. Each episode runs a good controller with its
    own share of random actions (uniform in [0, --max_epsilon]), so episodes last from about 10 to 500 steps;
  * the table's rate limiter (`gj.RateLimiter(min_size_to_sample=16, samples_per_insert=64, ...)`, kept
    in the table's shared header, so the actors' processes obey it too): the learner calls
    `table.await_samples(64)` before each update and `end_episode` waits while the learner is behind,
    so a run trains on one new episode per update (64 windows per episode) whichever side is faster.
    `--actor_rate` slows the actors down as a slower environment would; the learner then waits;
  * whole episodes inserted at once (`table.insert(batch, lengths=...)`): the held-out episodes;
  * one `jax.jit` learner step: `gj.sample_gather(table, key, B, window=W, short_episodes="skip")`
    draws B windows of W steps uniformly over every window start that fits inside an episode (windows
    never cross an episode's end; episodes shorter than W are skipped), gathers them (`[B, W, ...]`
    and `valid`), and makes an optax update of the model and of a memoryless baseline with a loss
    masked by `valid` (False for windows whose episode an actor overwrote between sample and gather).
    On the padded table the same uniform law over window starts comes from a prioritized sample, each
    row's priority being its number of window starts.

The task is a sequence model's: a world model. The actors store only the partial observation (cart
position x, pole angle theta) and the action; the model reads a window of them and predicts, at every
step, the change of the observation at the next step (in units of velocity: (obs[t+1] - obs[t]) / dt).
That change is the cart's and the pole's velocity, which no single observation holds: it must be
inferred from the history. A GRU (flax.linen `nn.RNN` over `nn.GRUCell`) is compared, on windows of
held-out episodes, with the same network without the recurrence (trained in the same jitted step on the
same windows) and with the trivial persistence forecast (the observation does not change). The first
`--burn_in` steps of each window only warm the GRU's state (they are left out of the loss and the
metrics), as in R2D2.

Run (CPU by default; 6 to 8 s on this project's 2-core machine, start-up included):

    python examples/episodes.py
    python examples/episodes.py --table=padded     # the padded table of the same memory
    python examples/episodes.py --actor_rate=2000  # actors as slow as a slower environment: the learner waits
    python examples/episodes.py --smoke            # a tiny run

It logs with absl.logging, shows a progress bar while training, and prints a summary line last
(`eval_mse`: the GRU's mean squared error on the held-out windows, in (units / s)^2; `memoryless_eval_mse`:
the baseline's; `persistence_mse`: predicting no change; `table_episodes`: episodes the table held at the
end; `masked_windows`: windows with a step the valid mask left out, over the run; `held_updates`: updates the
rate limiter held back until the actors wrote more). With the default flags, seed 0 printed (the table's
name is random; the counts of episodes are the rate limiter's, the same on any machine give or take its
tolerance of 8):
    ring table gear_jax_2388...: up to 1000 episodes of up to 500 steps, 0.65 MiB of shared memory
    held-out: 64 episodes inserted whole, 17241 steps (lengths 11 to 500, median 184)
    untrained: eval_mse=0.1343, persistence_mse=0.0988
    update 200: eval_mse=0.0181, memoryless_eval_mse=0.0813; 224 episodes written
    update 400: eval_mse=0.0125, memoryless_eval_mse=0.0808; 424 episodes written
    update 600: eval_mse=0.0108, memoryless_eval_mse=0.0805; 624 episodes written
    summary: eval_mse=0.0108 memoryless_eval_mse=0.0805 persistence_mse=0.0988 initial_eval_mse=0.1343
        final_loss=0.0082 masked_windows=0 table=ring updates=600 window=16 actors=2 episodes=624
        episodes_during_training=600 steps_during_training=144200 steps_written=151200 table_episodes=203
        table_mib=0.65 updates_per_s=208.7 wall_s=2.9 held_updates=44
The GRU's error is a ninth of the persistence forecast's; the memoryless network gets only the part
that the position and the angle predict. Seeds 1 and 2 ended at 0.0105 and 0.0075 (memoryless 0.0780
and 0.0559, persistence 0.0976 and 0.0753). `--table=padded` ended at eval_mse=0.0117, memoryless
0.0824 (its sample law is the same, its draws are not), its 100 rows of 500 steps holding 98 episodes
(rows being written are not counted) in the same 0.64 MiB where the ring held 203. Most of the
remaining error is the cart's velocity (the pole's is predicted about ten times better): the cart's
change per step is small against its position, and the GRU takes longer to read it from the history.
(Runs in a fresh venv made by the README's test command, 2026-11-27.)
"""

from __future__ import annotations

import dataclasses
import multiprocessing
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
DT = 0.02  # CartPole's time step: (obs[t+1] - obs[t]) / DT is the velocity at step t
VISIBLE = (0, 2)  # of the state (x, x_dot, theta, theta_dot), the actors store cart position and pole angle
OBS_SCALE = np.array([0.2, 0.1], np.float32)  # a step's change of either is then about 0.01-0.1

FLAGS = flags.FLAGS
flags.DEFINE_enum(
    "table",
    "ring",
    ["ring", "padded"],
    "ring: episodes back to back in a ring of steps; padded: one row of 500 steps per episode",
)
flags.DEFINE_integer("steps", 600, "learner updates")
flags.DEFINE_integer("seed", 0, "seed of the actors, the models, the sampler and the held-out episodes")
flags.DEFINE_enum("platform", "cpu", ["cpu", "cuda"], "where the learner's jax runs (the actors use the CPU)")
flags.DEFINE_integer("actors", 2, "actor processes, each stepping one environment")
flags.DEFINE_integer(
    "actor_rate",
    0,
    "environment steps per second each actor writes at most, as a slower environment would (0: no cap "
    "but the rate limiter's)",
)
flags.DEFINE_float(
    "max_epsilon", 1.0, "each episode takes a random action with a probability drawn uniformly up to this"
)
flags.DEFINE_integer(
    "step_capacity",
    50_000,
    "steps the table holds (the padded table: step_capacity // 500 rows of 500 steps)",
)
flags.DEFINE_integer("episodes", 1_000, "episodes the ring table's index holds")
flags.DEFINE_integer("min_episodes", 16, "episodes in the table before the first update")
flags.DEFINE_float(
    "samples_per_episode",
    64.0,
    "windows the learner samples per episode the actors write, held by the table's rate limiter "
    "(gj.RateLimiter's samples_per_insert): the learner waits when the actors fall behind, the actors "
    "when the learner does, so what a run trains on does not depend on which is faster; 0: no limiter",
)
flags.DEFINE_integer("window", 16, "steps per sampled window")
flags.DEFINE_integer("burn_in", 2, "first steps of each window that only warm the GRU (not in the loss)")
flags.DEFINE_integer("batch_size", 64, "windows per update")
flags.DEFINE_integer("hidden", 64, "units of the GRU and of the other layers")
flags.DEFINE_float("lr", 3e-3, "Adam learning rate")
flags.DEFINE_integer("eval_every", 200, "updates between evaluations on the held-out episodes")
flags.DEFINE_integer("eval_episodes", 64, "held-out episodes (made by the learner, inserted whole)")
flags.DEFINE_integer(
    "eval_windows", 1024, "windows of the held-out episodes per evaluation (always the same)"
)
flags.DEFINE_float("actor_timeout", 60.0, "seconds to wait for the actors to start writing, and to stop")
flags.DEFINE_bool("smoke", False, "a tiny run for tests")


@dataclasses.dataclass(frozen=True)
class Config:
    """The flags' values, with --smoke applied."""

    table: str
    steps: int
    seed: int
    platform: str
    actors: int
    actor_rate: int
    max_epsilon: float
    step_capacity: int
    episodes: int
    min_episodes: int
    samples_per_episode: float
    window: int
    burn_in: int
    batch_size: int
    hidden: int
    lr: float
    eval_every: int
    eval_episodes: int
    eval_windows: int
    actor_timeout: float
    smoke: bool


def config_from_flags() -> Config:
    config = Config(**{f.name: FLAGS[f.name].value for f in dataclasses.fields(Config)})
    if config.smoke:  # flags given on the command line keep their values
        smoke = dict(steps=40, actors=1, min_episodes=4, eval_every=20, eval_episodes=16, eval_windows=128)
        config = dataclasses.replace(config, **{n: v for n, v in smoke.items() if not FLAGS[n].present})
    return config


FIELDS = {
    "obs": gj.Field((len(VISIBLE),), "float32"),  # the partial observation only
    "action": gj.Field((), "int32"),  # the action taken
}


def make_spec(kind: str, step_capacity: int, episodes: int) -> gj.TableSpec:
    """The ring: `episodes` episodes of any length up to 500 steps in `step_capacity` steps. Padded: rows
    of 500 steps in the same memory."""
    if kind == "ring":
        return gj.TableSpec(FIELDS, capacity=episodes, step_capacity=step_capacity, max_steps=MAX_STEPS)
    return gj.TableSpec(FIELDS, capacity=max(step_capacity // MAX_STEPS, 1), max_steps=MAX_STEPS)


def window_priority(kind: str, length: int, window: int) -> float:
    """The priority an episode is written with. The ring samples window starts uniformly by itself
    (priority 1). On the padded table, a prioritized sample (exponent 1) with each row's number of
    window starts as its priority gives the same law, and priority 0 skips episodes shorter than a
    window."""
    return 1.0 if kind == "ring" else float(max(length - window + 1, 0))


def expert(state: np.ndarray) -> int:
    """A linear controller on the full state (x, x_dot, theta, theta_dot) that holds the pole up for 500
    steps."""
    return int(state[2] * 10 + state[3] * 2 + state[1] * 0.5 + state[0] * 0.1 > 0)


class Episodes:
    """CartPole-v1 episodes of the noisy controller: each episode draws its share of random actions."""

    def __init__(self, seed: int, max_epsilon: float):
        self.env = gymnasium.make(ENV_NAME)
        self.rng = np.random.default_rng(seed)
        self.max_epsilon = max_epsilon
        self.obs, _ = self.env.reset(seed=seed)
        self.epsilon = self.rng.uniform(0.0, max_epsilon)

    def step(self) -> tuple[dict[str, Any], bool]:
        """One environment step: (the step to store, whether the episode ended with it)."""
        action = expert(self.env.unwrapped.state)
        if self.rng.uniform() < self.epsilon:
            action = int(self.rng.integers(2))
        step = {"obs": self.obs[list(VISIBLE)], "action": action}
        self.obs, _, terminated, truncated, _ = self.env.step(action)
        if terminated or truncated:
            self.obs, _ = self.env.reset()
            self.epsilon = self.rng.uniform(0.0, self.max_epsilon)
        return step, terminated or truncated


# -- actors ------------------------------------------------------------------------------------------


def run_actor(
    table_name: str,
    kind: str,
    window: int,
    seed: int,
    max_epsilon: float,
    rate: int,
    stop: Any,
    episodes: Any,
    steps_written: Any,
) -> None:
    """An actor process: attaches to the table by name and writes episodes step by step until `stop`.

    `append` takes each step (a ring stages the episode natively and copies it into the ring at its end;
    a padded table's writer copies each step straight into the row it holds); `end_episode` publishes
    the episode, which is never sampled before, once the table's rate limiter admits it. `episodes` and
    `steps_written` are shared counters; `rate` caps the steps written per second (0: no cap), as a
    slower environment would.
    """
    jax.config.update("jax_platforms", "cpu")  # an actor never takes GPU memory from the learner
    source = Episodes(seed, max_epsilon)
    table = gj.Table.attach(table_name)
    chunk = 100  # steps between checks of `stop` and of the rate
    period = chunk / rate if rate > 0 else 0.0
    due = time.monotonic()
    try:
        with table.writer() as writer:
            while not stop.is_set():
                for _ in range(chunk):
                    step, ended = source.step()
                    writer.append(step)
                    if ended:
                        if not publish(writer, window_priority(kind, writer.steps, window), stop):
                            return  # asked to stop while the limiter held the episode back
                        with episodes.get_lock():
                            episodes.value += 1
                with steps_written.get_lock():
                    steps_written.value += chunk
                due = max(due + period, time.monotonic() - period)  # no bursts to catch up after a stall
                stop.wait(max(0.0, due - time.monotonic()))
    finally:
        table.close()  # the writer gave back the episode it had open


def publish(writer: gj.EpisodeWriter, priority: float, stop: Any) -> bool:
    """Ends the writer's episode, waiting as long as the rate limiter holds it back (the learner is
    behind) but no longer than `stop` is unset; returns whether the episode was published."""
    while not stop.is_set():
        try:
            writer.end_episode(priority=priority, timeout=0.1)
            return True
        except gj.RateLimiterTimeout:
            continue  # the episode stays staged; try again
    return False  # closing the table abandons the staged episode


def rate_limiter(config: Config) -> gj.RateLimiter | None:
    """The learner's and the actors' shared pace: `samples_per_episode` windows sampled per episode
    written, with a tolerance of 8 updates either way (or one update plus one episode's samples, if
    larger); sampling starts once `min_episodes` episodes are in the table."""
    if config.samples_per_episode <= 0:
        return None
    tolerance = max(8 * config.batch_size, config.batch_size + config.samples_per_episode)
    return gj.RateLimiter(
        min_size_to_sample=config.min_episodes,
        samples_per_insert=config.samples_per_episode,
        error_buffer=tolerance,
    )


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
                target=run_actor,
                name=f"actor-{i}",
                daemon=True,
                args=(
                    table.name,
                    config.table,
                    config.window,
                    config.seed * 1000 + i + 1,
                    config.max_epsilon,
                    config.actor_rate,
                    self.stop,
                    self.episodes,
                    self.steps,
                ),
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

    def wait_for(self, episodes: int) -> None:
        """Waits until the actors wrote `episodes` episodes (or one fails, or the timeout passes)."""
        deadline = time.monotonic() + self.timeout
        while self.episodes.value < episodes:
            self.check()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the actors wrote {self.episodes.value} of {episodes} episodes in {self.timeout} s"
                )
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


def held_out_table(config: Config) -> tuple[gj.Table, np.ndarray]:
    """Episodes from another seed, inserted whole (`insert(batch, lengths=...)`) into a table of the same
    kind: the evaluation's data. Returns the table and the episodes' lengths."""
    source = Episodes(config.seed * 1000 + 999, config.max_epsilon)
    n = config.eval_episodes
    batch = {name: np.zeros((n, MAX_STEPS, *f.shape), f.dtype) for name, f in FIELDS.items()}
    lengths = np.zeros(n, np.int32)
    for e in range(n):
        ended = False
        while not ended:
            step, ended = source.step()
            for name, value in step.items():
                batch[name][e, lengths[e]] = value
            lengths[e] += 1
    spec = (
        make_spec(config.table, int(lengths.sum()), n)
        if config.table == "ring"
        else gj.TableSpec(FIELDS, capacity=n, max_steps=MAX_STEPS)
    )
    table = gj.Table.create(spec)
    priorities = [window_priority(config.table, int(length), config.window) for length in lengths]
    table.insert(batch, lengths=lengths, priorities=np.asarray(priorities, np.float32))
    return table, lengths


# -- learner -----------------------------------------------------------------------------------------


class WorldModel(nn.Module):
    """Windows of partial observations [B, T, 2] and actions [B, T] -> predicted velocities [B, T, 2].

    With `memory`, a GRU carries what it saw through the window; without, every step is predicted from
    that step alone (the same layers, the recurrence left out).
    """

    hidden: int
    memory: bool = True

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        x = jnp.concatenate([obs / OBS_SCALE, jax.nn.one_hot(action, 2)], axis=-1)
        x = nn.relu(nn.Dense(self.hidden)(x))
        if self.memory:
            x = nn.RNN(nn.GRUCell(self.hidden))(x)
        return nn.Dense(len(VISIBLE))(nn.relu(nn.Dense(self.hidden)(x)))


class TrainState(NamedTuple):
    params: Any
    opt_state: Any


def sample_windows(table: gj.Table, kind: str, key: jax.Array, batch_size: int, window: int):
    """`batch_size` windows of `window` steps, uniform over every window start inside an episode."""
    if kind == "ring":
        return gj.sample_gather(table, key, batch_size, window=window, short_episodes="skip")
    return gj.sample_gather(
        table, key, batch_size, method="prioritized", priority_exponent=1.0, window=window
    )


def errors(model: WorldModel, params: Any, batch: dict[str, jax.Array], burn_in: int):
    """Squared errors of the predicted velocities [B, W - 1] and where they count (a bool mask [B, W - 1]):
    both steps valid, past the burn-in."""
    target = (batch["obs"][:, 1:] - batch["obs"][:, :-1]) / DT
    predicted = model.apply(params, batch["obs"][:, :-1], batch["action"][:, :-1])
    mask = batch["valid"][:, 1:] & batch["valid"][:, :-1]
    mask = mask & (jnp.arange(mask.shape[1]) >= burn_in)
    return jnp.mean((predicted - target) ** 2, axis=-1), mask, jnp.mean(target**2, axis=-1)


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.sum(jnp.where(mask, values, 0.0)) / jnp.maximum(jnp.sum(mask), 1)


def make_learner_step(
    table: gj.Table, models: dict[str, WorldModel], optimizer: optax.GradientTransformation, config: Config
):
    """The jitted learner step `(states, key) -> (states, metrics)`: one sample of windows, one update of
    each model on it."""

    def update(model: WorldModel, state: TrainState, batch: dict[str, jax.Array]):
        def loss_fn(params):
            squared, mask, _ = errors(model, params, batch, config.burn_in)
            return masked_mean(squared, mask)

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        return TrainState(optax.apply_updates(state.params, updates), opt_state), loss

    @jax.jit
    def learner_step(states: dict[str, TrainState], key: jax.Array):
        _, batch = sample_windows(table, config.table, key, config.batch_size, config.window)
        out = {name: update(model, states[name], batch) for name, model in models.items()}
        metrics = {f"{name}_loss": loss for name, (_, loss) in out.items()}
        metrics["masked_windows"] = jnp.sum(~jnp.all(batch["valid"], axis=1))
        return {name: state for name, (state, _) in out.items()}, metrics

    return learner_step


def make_evaluate(table: gj.Table, models: dict[str, WorldModel], config: Config):
    """The jitted evaluation `params -> metrics` on the same `eval_windows` windows of the held-out table
    every time: each model's mean squared error, and the persistence forecast's (velocity 0)."""
    key = jax.random.key(config.seed + 1)

    @jax.jit
    def evaluate(params: dict[str, Any]):
        _, batch = sample_windows(table, config.table, key, config.eval_windows, config.window)
        out = {}
        for name, model in models.items():
            squared, mask, persistence = errors(model, params[name], batch, config.burn_in)
            out[name] = masked_mean(squared, mask)
        out["persistence"] = masked_mean(persistence, mask)
        return out

    return evaluate


def train(config: Config) -> dict[str, Any]:
    """Trains the models on windows of the actors' episodes; returns the summary's fields."""
    models = {"memory": WorldModel(config.hidden), "memoryless": WorldModel(config.hidden, memory=False)}
    optimizer = optax.adam(optax.cosine_decay_schedule(config.lr, config.steps, alpha=0.01))
    key_init, key_learn = jax.random.split(jax.random.key(config.seed))
    example = (jnp.zeros((1, config.window - 1, len(VISIBLE))), jnp.zeros((1, config.window - 1), jnp.int32))
    params = {name: model.init(key_init, *example) for name, model in models.items()}
    states = {name: TrainState(p, optimizer.init(p)) for name, p in params.items()}

    spec = make_spec(config.table, config.step_capacity, config.episodes)
    table = gj.Table.create(spec, rate_limiter=rate_limiter(config))
    table_mib = table.nbytes / 2**20
    eval_table = None
    try:
        logging.info(
            "%s table %s: up to %d episodes of up to %d steps, %.2f MiB of shared memory",
            config.table,
            table.name,
            spec.capacity,
            MAX_STEPS,
            table_mib,
        )
        with Actors(table, config) as actors:
            logging.info("started %d actor processes writing into table %s", config.actors, table.name)
            eval_table, eval_lengths = held_out_table(config)  # while the actors start
            logging.info(
                "held-out: %d episodes inserted whole, %d steps (lengths %d to %d, median %d)",
                len(eval_lengths),
                eval_lengths.sum(),
                eval_lengths.min(),
                eval_lengths.max(),
                np.median(eval_lengths),
            )
            evaluate = make_evaluate(eval_table, models, config)
            initial = jax.device_get(evaluate({n: s.params for n, s in states.items()}))
            logging.info(
                "untrained: eval_mse=%.4f, persistence_mse=%.4f", initial["memory"], initial["persistence"]
            )
            actors.wait_for(config.min_episodes)
            episodes_at_start = actors.episodes.value
            logging.info("%d episodes in the table: training starts", table.size)
            learner_step = make_learner_step(table, models, optimizer, config)
            masked_windows = jnp.zeros((), jnp.int32)  # summed on the device
            held = 0  # updates the rate limiter held back until the actors wrote more
            steps_at_start = actors.steps.value
            start = time.perf_counter()
            progress = tqdm(range(1, config.steps + 1), desc="learner", unit="update", mininterval=0.5)
            for step in progress:
                held += actors.await_samples(table, config.batch_size)
                states, metrics = learner_step(states, jax.random.fold_in(key_learn, step))
                masked_windows = masked_windows + metrics["masked_windows"]
                if step % 50 == 0 or step == config.steps:
                    actors.check()
                    progress.set_postfix(
                        loss=f"{float(metrics['memory_loss']):.4f}", episodes=actors.episodes.value
                    )
                if step % config.eval_every == 0 or step == config.steps:
                    evaluation = jax.device_get(evaluate({n: s.params for n, s in states.items()}))
                    progress.clear()
                    logging.info(
                        "update %d: eval_mse=%.4f, memoryless_eval_mse=%.4f; %d episodes written",
                        step,
                        evaluation["memory"],
                        evaluation["memoryless"],
                        actors.episodes.value,
                    )
            progress.close()
            seconds = time.perf_counter() - start
            episodes_during_training = actors.episodes.value - episodes_at_start
            steps_during_training = actors.steps.value - steps_at_start
            table_episodes = table.size
        episodes, steps_written = actors.episodes.value, actors.steps.value
    finally:
        table.close()
        if eval_table is not None:
            eval_table.close()
    metrics = jax.device_get(metrics)
    return {
        "eval_mse": f"{evaluation['memory']:.4f}",
        "memoryless_eval_mse": f"{evaluation['memoryless']:.4f}",
        "persistence_mse": f"{evaluation['persistence']:.4f}",
        "initial_eval_mse": f"{initial['memory']:.4f}",
        "final_loss": f"{metrics['memory_loss']:.4f}",
        "masked_windows": int(masked_windows),
        "table": config.table,
        "updates": config.steps,
        "window": config.window,
        "actors": config.actors,
        "episodes": episodes,
        "episodes_during_training": episodes_during_training,
        "steps_during_training": steps_during_training,
        "steps_written": steps_written,
        "table_episodes": table_episodes,
        "table_mib": f"{table_mib:.2f}",
        "updates_per_s": f"{config.steps / seconds:.1f}",
        "wall_s": f"{seconds:.1f}",
        "held_updates": held,
    }


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    config = config_from_flags()
    if config.steps < 1 or config.actors < 1:
        raise app.UsageError("--steps and --actors must be at least 1")
    if not 0 <= config.burn_in < config.window - 1:
        raise app.UsageError("--burn_in must leave at least one predicted step: 0 <= burn_in < window - 1")
    try:
        device = jax.devices(config.platform)[0]
    except RuntimeError as e:
        raise app.UsageError(f"--platform={config.platform}: no such JAX device ({e})") from None
    with jax.default_device(device):
        summary = train(config)
    print("summary: " + " ".join(f"{name}={value}" for name, value in summary.items()))


if __name__ == "__main__":
    app.run(main)

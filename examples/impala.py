"""IMPALA-style learning through a gear_jax queue: actor processes -> queue -> one jitted learner.

What this shows:
  * a queue (`gj.Table.create(spec, queue=True)`) between actors and a learner. `--actors` processes
    each step `--num_envs` gymnax CartPole-v1 environments (`jax.vmap`) for unrolls of `--unroll`
    steps (`lax.scan`) under the latest policy they read, and insert each batch of unrolls into the
    queue with `table.insert`, which waits while the queue is full: actors slow down to the learner's
    pace instead of overwriting experience it has not seen;
  * the learner's jitted step: `gj.dequeue` (the oldest unrolls, each delivered exactly once) -> a
    V-trace actor-critic loss (the actors' policy lags the learner's by a few updates; V-trace corrects
    for it) -> Adam. After each step the learner publishes its parameters in a second table, of one row,
    which the actors read with `gear_jax.host` (a row is read whole or not at all, never torn);
  * the exactly-once check: every unroll carries its actor's id and number, and the learner verifies
    that it received each one once.

Run (CPU by default; about a minute on a 2-core CPU):

    python examples/impala.py
    python examples/impala.py --smoke      # 150 learner steps: for tests

It logs the learner's progress with absl.logging (stderr) and prints a summary line last (stdout).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags, logging
from jax.flatten_util import ravel_pytree
from tqdm import tqdm

import gear_jax as gj

FLAGS = flags.FLAGS
flags.DEFINE_integer("actors", 2, "actor processes")
flags.DEFINE_integer("num_envs", 8, "environments per actor (jax.vmap)")
flags.DEFINE_integer("unroll", 20, "environment steps per unroll")
flags.DEFINE_integer("batch_size", 16, "unrolls per learner step")
flags.DEFINE_integer("steps", 400, "learner steps")
flags.DEFINE_integer("queue_size", 64, "unrolls the queue holds; actors wait while it is full")
flags.DEFINE_float("lr", 1e-3, "Adam learning rate")
flags.DEFINE_float("gamma", 0.99, "discount")
flags.DEFINE_float("entropy_coef", 0.01, "weight of the entropy bonus")
flags.DEFINE_float("value_coef", 0.5, "weight of the value loss")
flags.DEFINE_integer("hidden", 64, "units of the hidden layer")
flags.DEFINE_integer("seed", 0, "seed of the network and the environments")
flags.DEFINE_bool("smoke", False, "a short run for tests: 150 learner steps")

WAIT_S = 120.0  # the longest wait for a row or for room: a stuck process fails instead of hanging


class ActorCritic(nn.Module):
    """Observations float32[..., 4] -> (action logits float32[..., 2], values float32[...])."""

    hidden: int

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = nn.tanh(nn.Dense(self.hidden)(obs))
        return nn.Dense(2, kernel_init=nn.initializers.orthogonal(0.01))(x), nn.Dense(1)(x)[..., 0]


def unroll_fields(unroll: int) -> dict[str, gj.Field]:
    """One row per unroll, unroll + 1 steps (the last: the observation the value bootstraps from)."""
    return {
        "obs": gj.Field((4,), "float32"),
        "action": gj.Field((), "int32"),
        "logits": gj.Field((2,), "float32"),  # the actor's policy, for V-trace's ratios
        "reward": gj.Field((), "float32"),
        "done": gj.Field((), "bool"),
        "episode_return": gj.Field((), "float32"),  # the return of an episode that ended at this step
        "unroll_id": gj.Field((), "int32"),  # actor * 2**20 + the actor's unroll number
    }


def initial_params(hidden: int, seed: int) -> Any:
    return ActorCritic(hidden).init(jax.random.key(seed), jnp.zeros((1, 4)))


def latest_params(table: gj.Table, rng: np.random.Generator) -> np.ndarray | None:
    """The newest published parameter vector (None while none is)."""
    try:
        _, row = gj.host.sample_gather(table, rng, 1, method="lifo")
    except gj.NotEnoughRowsError:
        return None
    return row["w"][0] if row["valid"][0] else None


def actor(index: int, queue_name: str, params_name: str, config: dict[str, Any], stop: Any) -> None:
    """An actor process: unrolls under the latest published policy, inserted into the queue."""
    import gymnax
    from gymnax.wrappers.purerl import LogWrapper

    queue, params_table = gj.Table.attach(queue_name), gj.Table.attach(params_name)
    env, env_params = gymnax.make("CartPole-v1")
    env = LogWrapper(env)
    net = ActorCritic(config["hidden"])
    _, unravel = ravel_pytree(initial_params(config["hidden"], 0))
    n, t = config["num_envs"], config["unroll"]

    @jax.jit
    def run(flat: jax.Array, env_state: Any, obs: jax.Array, key: jax.Array):
        params = unravel(flat)

        def step(carry, key):
            env_state, obs = carry
            logits, _ = net.apply(params, obs)
            k_act, k_env = jax.random.split(key)
            action = jax.random.categorical(k_act, logits)
            next_obs, env_state, reward, terminated, truncated, info = jax.vmap(
                env.step, in_axes=(0, 0, 0, None)
            )(jax.random.split(k_env, n), env_state, action, env_params)
            done = terminated | truncated
            ended = jnp.where(done, info["returned_episode_returns"], jnp.nan)
            return (env_state, next_obs), (obs, action, logits, reward, done, ended)

        (env_state, last_obs), out = jax.lax.scan(step, (env_state, obs), jax.random.split(key, t))
        return env_state, last_obs, out

    key = jax.random.key(config["seed"] * 1000 + index)
    key, reset_key = jax.random.split(key)
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_key, n), env_params)
    rng = np.random.default_rng(index)
    flat = None
    while flat is None:
        flat = latest_params(params_table, rng)
    number = 0
    while not stop.is_set():
        key, unroll_key = jax.random.split(key)
        env_state, last_obs, (o, a, lg, r, d, ret) = run(flat, env_state, obs, unroll_key)

        # time-major [t, n] -> rows [n, t + 1]: the last step holds the bootstrap observation. The rows
        # are copied into a new C-contiguous array, which the insert's native short path takes (an
        # np.concatenate of the swapped axes would keep their strides and take the slow general path).
        def rows(x, last=None):
            x = np.asarray(x)
            out = np.empty((x.shape[1], x.shape[0] + 1, *x.shape[2:]), x.dtype)
            out[:, :-1] = np.swapaxes(x, 0, 1)
            out[:, -1] = 0 if last is None else np.asarray(last)
            return out

        ids = index * 2**20 + number + np.arange(n)
        batch = {
            "obs": rows(o, last_obs),
            "action": rows(a),
            "logits": rows(lg),
            "reward": rows(r),
            "done": rows(d),
            "episode_return": np.nan_to_num(rows(ret), nan=-1.0),
            "unroll_id": np.repeat(ids[:, None], t + 1, axis=1).astype(np.int32),
        }
        while not stop.is_set():
            try:
                queue.insert(batch, timeout=0.1)  # waits while the queue is full
                number += n
                break
            except gj.RateLimiterTimeout:
                continue
        obs = last_obs
        newer = latest_params(params_table, rng)
        flat = flat if newer is None else newer


def vtrace_loss(params: Any, net: ActorCritic, batch: dict[str, jax.Array], gamma: float, c: dict) -> Any:
    """IMPALA's V-trace actor-critic loss over a batch of unrolls [B, T + 1] (rho and c clipped at 1)."""
    logits, values = net.apply(params, batch["obs"])  # [B, T + 1, 2], [B, T + 1]
    mask = batch["valid"][:, 0].astype(jnp.float32)  # picks past the queue's rows: weight 0
    actions = batch["action"][:, :-1]
    log_pi = jax.nn.log_softmax(logits[:, :-1])
    log_mu = jax.nn.log_softmax(batch["logits"][:, :-1])
    take = lambda lp: jnp.take_along_axis(lp, actions[..., None], axis=-1)[..., 0]  # noqa: E731
    ratio = jnp.exp(take(log_pi) - take(log_mu))
    rho, cs = jnp.minimum(ratio, 1.0), jnp.minimum(ratio, 1.0)
    discounts = gamma * (1.0 - batch["done"][:, :-1].astype(jnp.float32))
    v, v_next = values[:, :-1], values[:, 1:]
    deltas = rho * (batch["reward"][:, :-1] + discounts * v_next - v)

    def backward(acc, x):
        delta, discount, c_t = x
        acc = delta + discount * c_t * acc
        return acc, acc

    _, vs_minus_v = jax.lax.scan(backward, jnp.zeros(v.shape[0]), (deltas.T, discounts.T, cs.T), reverse=True)
    vs = jax.lax.stop_gradient(vs_minus_v.T + v)
    vs_next = jnp.concatenate([vs[:, 1:], jax.lax.stop_gradient(v_next[:, -1:])], axis=1)
    advantage = jax.lax.stop_gradient(rho * (batch["reward"][:, :-1] + discounts * vs_next - v))
    weight = mask[:, None] / jnp.maximum(mask.sum() * actions.shape[1], 1.0)
    policy = -(take(log_pi) * advantage * weight).sum()
    value = 0.5 * (((vs - v) ** 2) * weight).sum()
    entropy = -((jnp.exp(log_pi) * log_pi).sum(-1) * weight).sum()
    return policy + c["value_coef"] * value - c["entropy_coef"] * entropy


def wait_for_unrolls(queue: gj.Table, n: int, actors: list[Any]) -> None:
    """Waits until the queue holds `n` unrolls; raises when an actor died or none came for WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            return queue.await_samples(n, timeout=1.0)
        except gj.RateLimiterTimeout:
            dead = [p.pid for p in actors if p.exitcode is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"no unrolls: actors {dead} exited (see their errors above)") from None


def main(argv: list[str]) -> None:
    del argv
    steps = 150 if FLAGS.smoke else FLAGS.steps
    config = {
        "hidden": FLAGS.hidden,
        "num_envs": FLAGS.num_envs,
        "unroll": FLAGS.unroll,
        "seed": FLAGS.seed,
    }
    queue = gj.Table.create(
        gj.TableSpec(unroll_fields(FLAGS.unroll), capacity=FLAGS.queue_size, max_steps=FLAGS.unroll + 1),
        queue=True,
    )
    params = initial_params(FLAGS.hidden, FLAGS.seed)
    flat, unravel = ravel_pytree(params)
    params_table = gj.Table.create(gj.TableSpec({"w": gj.Field(flat.shape, "float32")}, capacity=2))
    params_table.insert({"w": np.asarray(flat)[None]})

    net = ActorCritic(FLAGS.hidden)
    optimizer = optax.chain(optax.clip_by_global_norm(40.0), optax.adam(FLAGS.lr))
    coefs = {"value_coef": FLAGS.value_coef, "entropy_coef": FLAGS.entropy_coef}

    @jax.jit
    def learn(params: Any, opt_state: Any):
        _, batch = gj.dequeue(queue, FLAGS.batch_size)
        loss, grads = jax.value_and_grad(vtrace_loss)(params, net, batch, FLAGS.gamma, coefs)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        first = batch["valid"][:, 0]
        returns = batch["episode_return"][:, :-1]  # the last step only holds the bootstrap observation
        ended = (returns >= 0) & batch["valid"][:, :-1]
        return params, opt_state, loss, batch["unroll_id"][:, 0], first, returns, ended

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    actors = [
        ctx.Process(target=actor, args=(i, queue.name, params_table.name, config, stop), daemon=True)
        for i in range(FLAGS.actors)
    ]
    for p in actors:
        p.start()
    opt_state = optimizer.init(params)
    received: list[int] = []
    returns: list[float] = []
    first_returns: list[float] = []
    start = None
    try:
        for step in tqdm(range(steps), desc="learner steps", disable=None):
            wait_for_unrolls(queue, FLAGS.batch_size, actors)
            if start is None:
                start = time.perf_counter()  # the actors are running: time from the first batch
            params, opt_state, loss, ids, first, ep_returns, ended = learn(params, opt_state)
            params_table.insert({"w": np.asarray(ravel_pytree(params)[0])[None]})
            received += np.asarray(ids)[np.asarray(first)].tolist()
            done_returns = np.asarray(ep_returns)[np.asarray(ended)].tolist()
            returns += done_returns
            if step < 20:
                first_returns += done_returns
            if step % 25 == 0:
                logging.info(
                    "step %d: loss %.3f, mean return of the last 100 episodes %.1f",
                    step,
                    float(loss),
                    float(np.mean(returns[-100:])) if returns else float("nan"),
                )
        elapsed = time.perf_counter() - start
    finally:
        stop.set()
        for p in actors:
            p.join(30)
            if p.is_alive():
                p.kill()
    left = queue.unconsumed
    drained: list[int] = []  # what the actors inserted and the learner had not taken: still queued
    while queue.unconsumed:
        _, rest = gj.host.dequeue(queue, FLAGS.batch_size, fields=("unroll_id",), window=1)
        drained += rest["unroll_id"][rest["valid"][:, 0], 0].tolist()
    duplicates = len(received) - len(set(received))
    # No unroll lost: each actor's inserts are numbered 0, 1, 2, ... so what the learner received and
    # what was still queued must be exactly 0 .. n - 1 for each actor.
    per_actor: dict[int, list[int]] = {}
    for unroll_id in received + drained:
        per_actor.setdefault(unroll_id >> 20, []).append(unroll_id & (2**20 - 1))
    lost = sum(max(v) + 1 - len(set(v)) for v in per_actor.values())
    unrolls = len(received)
    print(
        f"{unrolls} unrolls ({unrolls * FLAGS.unroll} env steps) consumed in {elapsed:.1f} s by {steps} "
        f"learner steps from {FLAGS.actors} actors; {left} were still queued, {duplicates} delivered twice, "
        f"{lost} lost"
    )
    print(
        "summary: "
        + " ".join(
            f"{k}={v}"
            for k, v in {
                "steps": steps,
                "unrolls": unrolls,
                "duplicates": duplicates,
                "lost": lost,
                "env_steps_per_s": round(unrolls * FLAGS.unroll / elapsed, 1),
                "initial_return": round(float(np.mean(first_returns)) if first_returns else 0.0, 1),
                "final_return": round(float(np.mean(returns[-100:])) if returns else 0.0, 1),
            }.items()
        )
    )
    queue.close()
    params_table.close()


if __name__ == "__main__":
    app.run(main)

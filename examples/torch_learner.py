"""A PyTorch learner fed by a gear_jax table: behaviour cloning of a CartPole controller.

What this shows:
  * experience made with JAX (vectorized gymnax CartPole-v1, a good controller with epsilon noise)
    inserted into a gear_jax transition table;
  * a PyTorch model trained from `gj.torch.Sampler` batches (dicts of torch tensors), with prioritized
    replay on the per-example loss and importance weights (N * P)^-beta from the batch's `probabilities`
    and `selectable`. With the default `--device=cpu` each batch is one `gj.host.sample_gather` call
    into numpy arrays that torch shares (no JAX dispatch); with `--device=cuda` it is a jitted
    `gj.sample` + `gj.gather` on the GPU, handed to torch through DLPack without a copy;
  * priorities written back with `sampler.update_priorities(torch_tensor)` (`gj.host.update_priorities`
    on the CPU, a jitted `gj.update_priorities` on the GPU);
  * the torch policy evaluated in the JAX environment, observations and actions crossing with
    `gj.torch.to_torch` / `gj.torch.from_torch`.

Run (CPU by default; about 20 seconds on a 2-core machine):

    python examples/torch_learner.py
    python examples/torch_learner.py --smoke        # a tiny run, for tests

It logs the evaluations with absl.logging and prints a summary line last, e.g. (default flags):
    summary: eval_return=500.0 initial_eval_return=9.4 accuracy=0.97 ...
"""

from __future__ import annotations

import time

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import torch
from absl import app, flags, logging
from tqdm import tqdm

import gear_jax as gj
import gear_jax.torch as gjt

FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 1500, "learner updates")
flags.DEFINE_integer("seed", 0, "seed of the data, the model and the sampler")
flags.DEFINE_integer("num_envs", 32, "environments stepped in parallel to make the data")
flags.DEFINE_integer("collect_steps", 1000, "steps of each environment: num_envs * collect_steps rows")
flags.DEFINE_float("epsilon", 0.3, "probability that the data's action is random (the label stays expert)")
flags.DEFINE_integer("batch_size", 256, "rows per learner update")
flags.DEFINE_float("lr", 3e-3, "Adam learning rate")
flags.DEFINE_float("priority_exponent", 0.6, "alpha of prioritized replay")
flags.DEFINE_float("beta", 0.4, "importance-weight exponent")
flags.DEFINE_integer("eval_every", 500, "updates between greedy evaluations")
flags.DEFINE_integer("eval_episodes", 16, "episodes per evaluation (run in parallel)")
flags.DEFINE_string("device", "cpu", "torch device of the learner: cpu or cuda")
flags.DEFINE_bool("smoke", False, "a tiny run for tests")

OBS = 4  # cart position, cart velocity, pole angle, pole angular velocity


def expert(obs: jax.Array) -> jax.Array:
    """A linear controller that holds CartPole up for all 500 steps: int32[B] actions."""
    return (obs[:, 2] * 10 + obs[:, 3] * 2 + obs[:, 1] * 0.5 + obs[:, 0] * 0.1 > 0).astype(jnp.int32)


def collect(env, params, key, num_envs: int, steps: int, epsilon: float) -> dict[str, jax.Array]:
    """Observations and expert labels from `num_envs` environments driven by the noisy expert."""

    @jax.jit
    def run(key):
        key, reset_key = jax.random.split(key)
        obs, state = jax.vmap(env.reset, (0, None))(jax.random.split(reset_key, num_envs), params)

        def step(carry, k):
            obs, state = carry
            k_noise, k_action, k_env = jax.random.split(k, 3)
            label = expert(obs)
            noisy = jax.random.uniform(k_noise, (num_envs,)) < epsilon
            action = jnp.where(noisy, jax.random.randint(k_action, (num_envs,), 0, 2), label)
            out = jax.vmap(env.step, (0, 0, 0, None))(
                jax.random.split(k_env, num_envs), state, action, params
            )
            return (out[0], out[1]), (obs, label)

        _, (obs, labels) = jax.lax.scan(step, (obs, state), jax.random.split(key, steps))
        return {"obs": obs.reshape(-1, OBS), "action": labels.reshape(-1)}

    return run(key)


def evaluate(model: torch.nn.Module, env, params, key, episodes: int, device: str) -> float:
    """Mean return of the greedy torch policy over `episodes` parallel episodes (at most 500 steps)."""
    reset = jax.jit(jax.vmap(env.reset, (0, None)))
    step = jax.jit(jax.vmap(env.step, (0, 0, 0, None)))
    key, reset_key = jax.random.split(key)
    obs, state = reset(jax.random.split(reset_key, episodes), params)
    returns = np.zeros(episodes)
    alive = np.ones(episodes, bool)
    with torch.no_grad():
        for _ in range(500):
            logits = model(gjt.to_torch(obs).to(device))
            action = gjt.from_torch(logits.argmax(-1).to(torch.int32).cpu().contiguous())
            key, k = jax.random.split(key)
            obs, state, reward, done, _ = step(jax.random.split(k, episodes), state, action, params)[:5]
            returns += np.asarray(reward) * alive
            alive &= ~np.asarray(done)
            if not alive.any():
                break
    return float(returns.mean())


def main(argv: list[str]) -> None:
    del argv
    steps, collect_steps, eval_every = FLAGS.steps, FLAGS.collect_steps, FLAGS.eval_every
    if FLAGS.smoke:
        steps, collect_steps, eval_every = 60, 100, 30
    torch.manual_seed(FLAGS.seed)
    env, params = gymnax.make("CartPole-v1")
    key = jax.random.key(FLAGS.seed)
    key, data_key, eval_key = jax.random.split(key, 3)

    data = collect(env, params, data_key, FLAGS.num_envs, collect_steps, FLAGS.epsilon)
    rows = int(data["obs"].shape[0])
    spec = gj.TableSpec({"obs": gj.Field((OBS,), "float32"), "action": gj.Field((), "int32")}, capacity=rows)
    table = gj.Table.create(spec)
    try:
        table.insert(data)
        logging.info("table: %d rows of expert-labelled CartPole states", table.size)

        model = torch.nn.Sequential(
            torch.nn.Linear(OBS, 64),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 64),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 2),
        ).to(FLAGS.device)
        optimizer = torch.optim.Adam(model.parameters(), lr=FLAGS.lr)
        initial = evaluate(model, env, params, eval_key, FLAGS.eval_episodes, FLAGS.device)
        logging.info("untrained policy: eval_return=%.1f", initial)

        sampler = gjt.Sampler(
            table,
            FLAGS.batch_size,
            method="prioritized",
            priority_exponent=FLAGS.priority_exponent,
            device=FLAGS.device,
            seed=FLAGS.seed,
        )
        eval_return, correct, seen, loss_value = initial, 0, 0, float("nan")
        start = time.perf_counter()
        progress = tqdm(range(1, steps + 1), desc="learner", unit="update")
        for step, batch in zip(progress, sampler):
            logits = model(batch["obs"])
            labels = batch["action"].long()
            per_example = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
            weights = (batch["selectable"] * batch["probabilities"]) ** -FLAGS.beta
            loss = (weights / weights.max() * per_example).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            sampler.update_priorities(per_example.detach() + 1e-3)
            correct += int((logits.argmax(-1) == labels).sum())
            seen += labels.numel()
            loss_value = float(loss.detach())
            if step % 50 == 0:
                progress.set_postfix(loss=f"{loss_value:.3f}", accuracy=f"{correct / seen:.3f}")
            if step % eval_every == 0 or step == steps:
                eval_return = evaluate(model, env, params, eval_key, FLAGS.eval_episodes, FLAGS.device)
                logging.info(
                    "update %d: loss=%.4f accuracy=%.3f eval_return=%.1f",
                    step,
                    loss_value,
                    correct / seen,
                    eval_return,
                )
                correct = seen = 0
        seconds = time.perf_counter() - start
        accuracy = evaluate_accuracy(model, table, FLAGS.device)
    finally:
        table.close()
    print(
        f"summary: eval_return={eval_return:.1f} initial_eval_return={initial:.1f} accuracy={accuracy:.3f} "
        f"final_loss={loss_value:.4f} steps={steps} table_size={rows} updates_per_s={steps / seconds:.1f}"
    )


def evaluate_accuracy(model: torch.nn.Module, table: gj.Table, device: str) -> float:
    """The share of the table's rows whose expert label the model predicts (one uniform batch of 4096)."""
    batch = next(gjt.Sampler(table, 4096, device=device, seed=12345))
    with torch.no_grad():
        return float((model(batch["obs"]).argmax(-1) == batch["action"].long()).float().mean())


if __name__ == "__main__":
    app.run(main)

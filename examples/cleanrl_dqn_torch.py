"""CleanRL's single-file DQN for PyTorch, with a gear_jax table as its replay buffer.

Adapted from CleanRL's `cleanrl/dqn.py` (https://github.com/vwxyzjn/cleanrl/blob/
fe8d8a03c41a7ef5b523e2e354bd01c363e786bb/cleanrl/dqn.py, MIT license, notice below). Only the replay buffer
is ported: `cleanrl_utils.buffers.ReplayBuffer` becomes a gear_jax table made from the environment's spaces,
`rb.add` becomes `rb.insert`, and `rb.sample(batch_size)` becomes a draw of a `gj.torch.Sampler` (a dict of
torch tensors, read as attributes as SB3's samples are). The actions are stored as int64 `(1,)` (the index
torch's `gather` takes) and the dones as float32 (`1 - dones` of a bool tensor raises in torch). The
README's "Porting a CleanRL script" shows that diff, and tests/examples/test_cleanrl_ports.py checks that it
matches this file.

The rest follows the repository's house style and today's packages, not the DQN: absl flags instead of
tyro (`args` is absl's FLAGS, so every `args.x` reads as before); absl.logging instead of tensorboard and
print (`writer` logs its scalars); gymnasium 1.x's vector API (`autoreset_mode=SAME_STEP`, whose
`final_obs` and `final_info` are the 0.29 API's `final_observation` and `final_info`); no wandb, video,
model saving or Hugging Face upload.

Run (CPU; CleanRL's defaults: 500,000 steps):

    python examples/cleanrl_dqn_torch.py --total_timesteps=50000 --learning_starts=1000
    python examples/cleanrl_dqn_torch.py --total_timesteps=400 --learning_starts=100   # a smoke run

It logs with absl.logging (stderr) and prints a summary line last (stdout).

CleanRL's license:

    MIT License

    Copyright (c) 2019 CleanRL developers

    Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
    associated documentation files (the "Software"), to deal in the Software without restriction,
    including without limitation the rights to use, copy, modify, merge, publish, distribute,
    sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is
    furnished to do so, subject to the following conditions:

    The above copyright notice and this permission notice shall be included in all copies or
    substantial portions of the Software.

    THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT
    NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
    NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES
    OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN
    CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
"""

# docs and experiment results can be found at https://docs.cleanrl.dev/rl-algorithms/dqn/#dqnpy
import os
import random
import sys
import time
import types

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from absl import app, flags, logging

import gear_jax as gj
import gear_jax.torch  # noqa: F401  (gj.torch)

flags.DEFINE_string("exp_name", os.path.basename(__file__)[: -len(".py")], "the name of this experiment")
flags.DEFINE_integer("seed", 1, "seed of the experiment")
flags.DEFINE_bool("torch_deterministic", True, "if toggled, `torch.backends.cudnn.deterministic=False`")
flags.DEFINE_bool("cuda", True, "if toggled, cuda will be enabled by default")
# Algorithm specific arguments
flags.DEFINE_string("env_id", "CartPole-v1", "the id of the environment")
flags.DEFINE_integer("total_timesteps", 500000, "total timesteps of the experiments")
flags.DEFINE_float("learning_rate", 2.5e-4, "the learning rate of the optimizer")
flags.DEFINE_integer("num_envs", 1, "the number of parallel game environments")
flags.DEFINE_integer("buffer_size", 10000, "the replay memory buffer size")
flags.DEFINE_float("gamma", 0.99, "the discount factor gamma")
flags.DEFINE_float("tau", 1.0, "the target network update rate")
flags.DEFINE_integer("target_network_frequency", 500, "the timesteps it takes to update the target network")
flags.DEFINE_integer("batch_size", 128, "the batch size of sample from the reply memory")
flags.DEFINE_float("start_e", 1, "the starting epsilon for exploration")
flags.DEFINE_float("end_e", 0.05, "the ending epsilon for exploration")
flags.DEFINE_float(
    "exploration_fraction", 0.5, "the fraction of `total-timesteps` it takes from start-e to go end-e"
)
flags.DEFINE_integer("learning_starts", 10000, "timestep to start learning")
flags.DEFINE_integer("train_frequency", 10, "the frequency of training")


class LogWriter:
    """tensorboard's SummaryWriter as far as the script uses it, logging with absl.logging; keeps the last
    value of each scalar for the summary line."""

    def __init__(self):
        self.last = {}

    def add_text(self, tag, text):
        logging.info("%s:\n%s", tag, text)

    def add_scalar(self, tag, value, step):
        self.last[tag] = value = float(value.item() if hasattr(value, "item") else value)
        logging.info("step=%d %s=%.6g", step, tag, value)

    def close(self):
        pass


def make_env(env_id, seed, idx, capture_video, run_name):
    def thunk():
        env = gym.make(env_id)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env.action_space.seed(seed)

        return env

    return thunk


# ALGO LOGIC: initialize agent here:
class QNetwork(nn.Module):
    def __init__(self, env):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(np.array(env.single_observation_space.shape).prod(), 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, env.single_action_space.n),
        )

    def forward(self, x):
        return self.network(x)


def linear_schedule(start_e: float, end_e: float, duration: int, t: int):
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


def main(_):
    args = flags.FLAGS
    assert args.num_envs == 1, "vectorized envs are not supported at the moment"
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    writer = LogWriter()
    writer.add_text(
        "hyperparameters",
        "|param|value|\n|-|-|\n%s"
        % ("\n".join([f"|{f.name}|{f.value}|" for f in args.get_flags_for_module(sys.argv[0])])),
    )

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    # env setup
    envs = gym.vector.SyncVectorEnv(
        [make_env(args.env_id, args.seed + i, i, False, run_name) for i in range(args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    assert isinstance(envs.single_action_space, gym.spaces.Discrete), (
        "only discrete action space is supported"
    )

    q_network = QNetwork(envs).to(device)
    optimizer = optim.Adam(q_network.parameters(), lr=args.learning_rate)
    target_network = QNetwork(envs).to(device)
    target_network.load_state_dict(q_network.state_dict())

    rb = gj.Table.create(
        gj.TableSpec.from_spaces(
            {
                "observations": envs.single_observation_space,
                "next_observations": envs.single_observation_space,
                "actions": gj.Field((1,), "int64"),  # (batch_size, 1) int64: the index torch's gather takes
                "rewards": gj.Field(),
                "dones": gj.Field(),  # float32, as the learner computes 1 - dones
            },
            capacity=args.buffer_size,
        )
    )
    sampler = gj.torch.Sampler(rb, args.batch_size, device=device, seed=args.seed)
    start_time = time.time()
    updates, loss = 0, None

    # TRY NOT TO MODIFY: start the game
    obs, _ = envs.reset(seed=args.seed)
    for global_step in range(args.total_timesteps):
        # ALGO LOGIC: put action logic here
        epsilon = linear_schedule(
            args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps, global_step
        )
        if random.random() < epsilon:
            actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
        else:
            q_values = q_network(torch.Tensor(obs).to(device))
            actions = torch.argmax(q_values, dim=1).cpu().numpy()

        # TRY NOT TO MODIFY: execute the game and log data.
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)

        # TRY NOT TO MODIFY: record rewards for plotting purposes
        if "final_info" in infos:
            episodes = infos["final_info"]
            for idx in np.flatnonzero(episodes.get("_episode", [])):
                logging.info(f"global_step={global_step}, episodic_return={episodes['episode']['r'][idx]}")
                writer.add_scalar("charts/episodic_return", episodes["episode"]["r"][idx], global_step)
                writer.add_scalar("charts/episodic_length", episodes["episode"]["l"][idx], global_step)

        # TRY NOT TO MODIFY: save data to reply buffer; handle `final_observation`
        real_next_obs = next_obs.copy()
        for idx, trunc in enumerate(truncations):
            if trunc:
                real_next_obs[idx] = infos["final_obs"][idx]
        rb.insert(
            {
                "observations": obs,
                "next_observations": real_next_obs,
                "actions": actions.reshape(-1, 1),
                "rewards": rewards,
                "dones": terminations,
            }
        )

        # TRY NOT TO MODIFY: CRUCIAL step easy to overlook
        obs = next_obs

        # ALGO LOGIC: training.
        if global_step > args.learning_starts:
            if global_step % args.train_frequency == 0:
                data = types.SimpleNamespace(**next(sampler))  # data.observations, ... as SB3's samples
                with torch.no_grad():
                    target_max, _ = target_network(data.next_observations).max(dim=1)
                    td_target = data.rewards.flatten() + args.gamma * target_max * (1 - data.dones.flatten())
                old_val = q_network(data.observations).gather(1, data.actions).squeeze()
                loss = F.mse_loss(td_target, old_val)
                updates += 1

                if global_step % 100 == 0:
                    writer.add_scalar("losses/td_loss", loss, global_step)
                    writer.add_scalar("losses/q_values", old_val.mean().item(), global_step)
                    logging.info(f"SPS: {int(global_step / (time.time() - start_time))}")
                    writer.add_scalar(
                        "charts/SPS", int(global_step / (time.time() - start_time)), global_step
                    )

                # optimize the model
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

            # update target network
            if global_step % args.target_network_frequency == 0:
                for target_network_param, q_network_param in zip(
                    target_network.parameters(), q_network.parameters()
                ):
                    target_network_param.data.copy_(
                        args.tau * q_network_param.data + (1.0 - args.tau) * target_network_param.data
                    )

    print(
        f"summary: steps={args.total_timesteps} updates={updates} table_size={rb.size} "
        f"capacity={rb.capacity} final_loss={float('nan') if loss is None else loss.item():.5g} "
        f"last_episodic_return={writer.last.get('charts/episodic_return', float('nan')):.1f} "
        f"wall_s={time.time() - start_time:.1f}"
    )
    rb.close()
    envs.close()
    writer.close()


if __name__ == "__main__":
    app.run(main)

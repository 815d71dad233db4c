"""examples/ppo.py: PPO with its rollouts in a gear_jax table (gj.insert, gj.epoch, gj.gather inside one
jitted program), against the same PPO with the rollout in a pytree of jax arrays.

One `--smoke` run (60 iterations of 512 environment steps per comparison, about 50 s on this project's
2-core CPU machine, most of it compilation) checks that both comparisons learned CartPole and made the
same numbers of environment steps and updates, and report their speeds.
"""

import math

from tests.helpers import examples


def test_smoke_run_learns_from_the_table_as_from_the_pytree(tmp_path):
    # Seed 0, --smoke: measured initial 25.6; after 30,720 steps gear_jax 343.8, pytree 336.4.
    plot = tmp_path / "ppo.png"
    fields, done = examples.run_example("ppo.py", "--smoke", "--plot", str(plot), timeout=300)
    summary = examples.numbers(fields)
    assert summary["iterations"] == 60 and summary["env_steps"] == 60 * 512
    assert summary["updates"] == 60 * 4 * 4
    assert summary["initial_return"] < 40  # a random policy keeps CartPole up for about 22 steps
    for name in ("gear_jax", "pytree"):
        assert summary[f"{name}_return"] >= 150, (name, summary)
        assert summary[f"{name}_env_steps_per_s"] > 0 and summary[f"{name}_updates_per_s"] > 0
        ratio = summary[f"{name}_env_steps_per_s"] / summary[f"{name}_updates_per_s"]
        assert math.isclose(ratio, 512 / 16, rel_tol=1e-2)  # both rates come from the same time
    assert plot.stat().st_size > 10_000
    assert "gear_jax" in done.stdout and "pytree" in done.stdout

"""The examples run end to end, and the quickstart's DQN actually learns."""

import math

from tests.helpers import examples


def run_quickstart(*args: str) -> dict[str, float]:
    """Runs examples/quickstart.py with `args`; returns the numbers of its summary line."""
    return examples.numbers(examples.run_example("quickstart.py", *args, timeout=300)[0])


def test_quickstart_smoke_runs_and_reports(tmp_path):
    plot = tmp_path / "curve.png"
    summary = run_quickstart("--smoke", "--plot", str(plot))
    assert math.isfinite(summary["eval_return"]) and summary["eval_return"] >= 1
    assert math.isfinite(summary["final_loss"])
    assert summary["transitions"] == summary["steps"] * 4  # --num_envs defaults to 4
    assert summary["table_size"] == min(summary["transitions"], summary["capacity"])
    assert summary["steps_per_s"] > 0
    assert plot.stat().st_size > 0


def test_quickstart_learns_cartpole():
    # 3000 steps (12000 transitions, about 25 s). The untrained greedy policy of this seed scores about
    # 10 (the maximum is 500); with the default flags it measured 173.6 after these steps.
    summary = run_quickstart("--steps=3000", "--seed=1", "--eval_episodes=10", "--eval_every=3000")
    assert summary["table_size"] == summary["transitions"]  # below capacity: nothing overwritten
    assert summary["initial_eval_return"] < 50
    assert summary["eval_return"] >= 100

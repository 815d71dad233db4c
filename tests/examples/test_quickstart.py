"""The examples run end to end, and the quickstart's DQN actually learns."""

import math
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.py"


def run_quickstart(*args: str) -> dict[str, float]:
    """Runs examples/quickstart.py with `args`; returns the numbers of its summary line."""
    result = subprocess.run(
        [sys.executable, str(QUICKSTART), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, f"quickstart failed:\n{result.stdout}\n{result.stderr[-4000:]}"
    lines = [line for line in result.stdout.splitlines() if line.startswith("summary: ")]
    assert len(lines) == 1, f"expected one summary line in:\n{result.stdout}"
    return {k: float(v) for k, v in re.findall(r"(\w+)=(\S+)", lines[0])}


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

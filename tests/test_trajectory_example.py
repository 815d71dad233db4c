"""examples/trajectories.py: actor processes write episodes while a recurrent learner trains on windows.

One run of the example (about 35 s on this project's 2-core CPU machine) checks that the actors, separate
processes attached by name, wrote episodes while the learner trained, that the table's ring wrapped,
and that the GRU trained on 16-step windows balances CartPole from partial observations (cart position
and pole angle only), where the same model trained on 1-step windows (no memory) cannot.
"""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "trajectories.py"


def run_example(*args: str) -> dict[str, float]:
    """Runs the example with `args`; returns the numbers of its summary line."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *args], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, f"the example failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("summary: ")]
    assert len(lines) == 1, f"expected one summary line in:\n{done.stdout}"
    return {k: float(v) for k, v in re.findall(r"(\w+)=(\S+)", lines[0])}


def test_actors_write_episodes_and_the_recurrent_learner_needs_its_memory():
    # 300 updates, 2 actors, a 64-episode ring. Measured with these flags (seeds 0, 1, 5): eval_return 500
    # (the maximum), memoryless 37.9-40.5, untrained 9.0-14.5, 147-186 episodes written during training;
    # with the default 200-episode table, seeds 0-7 gave 442-500, memoryless 38.2-46.1.
    summary = run_example(
        "--steps=300", "--eval_every=300", "--eval_episodes=8", "--capacity=64", "--seed=1"
    )
    # The actors really wrote: episodes kept arriving while the learner trained, and the ring wrapped.
    assert summary["actors"] == 2
    assert summary["episodes_during_training"] >= 20
    assert summary["episodes"] > summary["capacity"] == 64
    assert 32 <= summary["table_size"] <= 64  # rows being rewritten (one per writer) are not counted
    assert summary["steps_written"] >= 500 * summary["episodes"] * 0.5  # the expert's episodes are long
    # Learning, and memory is what makes it possible.
    assert summary["initial_eval_return"] < 50
    assert summary["memoryless_eval_return"] < 100
    assert summary["eval_return"] >= 250

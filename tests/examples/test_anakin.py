"""examples/anakin.py: gymnax environments, gj.insert, sampling and learning in one jitted lax.scan program.

One `--smoke` run of the example (1000 updates per comparison, 37-54 s on this project's 2-core CPU
machine, most of it compilation) checks that all three comparisons (the fused program with the gear_jax
table, the host-insert loop, the fused program with a flashbax buffer) ran the same numbers of
environment steps and updates, report their speeds, filled their replays, and learned, and that the
in-jit insert and the host loop's insert made the same run.
"""

import math
import re

from tests.helpers import examples

COMPARISONS = ("gear_jax", "host_insert", "flashbax")


def run_example(*args: str) -> tuple[dict[str, float], str]:
    """Runs the example with `args`; returns the numbers of its summary line and its stdout."""
    fields, done = examples.run_example("anakin.py", *args, timeout=300)
    return examples.numbers(fields), done.stdout


def test_smoke_run_compares_three_replays_that_all_learn(tmp_path):
    # Seed 0, --smoke: 1000 updates after 1000 acting-only transitions. Measured: untrained 13.2;
    # gear_jax and host_insert 118.0 (the same run: same rows, priorities and keys), flashbax 105.3.
    plot = tmp_path / "curves.png"
    summary, stdout = run_example("--smoke", "--plot", str(plot))
    assert summary["steps"] == 1000 and summary["transitions"] == 5000
    assert summary["initial_eval_return"] < 30
    for name in COMPARISONS:
        assert summary[f"{name}_env_steps_per_s"] > 0 and summary[f"{name}_updates_per_s"] > 0
        # Both rates come from the same time: transitions / updates.
        ratio = summary[f"{name}_env_steps_per_s"] / summary[f"{name}_updates_per_s"]
        assert math.isclose(ratio, 5, rel_tol=1e-2)
        assert summary[f"{name}_size"] == summary["transitions"]  # below capacity: every transition kept
        assert math.isfinite(summary[f"{name}_final_loss"])
        assert summary[f"{name}_eval_return"] >= summary["initial_eval_return"] + 50, name
        assert re.search(rf"^{name} .*\d", stdout, re.MULTILINE), f"no table row for {name}:\n{stdout}"
    # gj.insert inside the program wrote what the host loop's table.insert wrote (the same rows, with the
    # same "max" priorities, in the same order), so the two made the same run. This relies on XLA computing
    # the learner step alike in the jitted step and in the scan's body, as it did in every run here.
    for key in ("eval_return", "final_loss"):
        assert summary[f"gear_jax_{key}"] == summary[f"host_insert_{key}"], key
    assert plot.stat().st_size > 0

"""examples/cleanrl_dqn_jax.py and examples/cleanrl_dqn_torch.py: CleanRL's DQNs ported to a gear_jax table.

Each port runs a few hundred CartPole-v1 steps (8-12 s each on this project's 2-core CPU machine, most of
it imports and compilation) and must have filled its table and made finite updates; and the README's
"Porting a CleanRL script" diffs must match the examples, so that the section stays runnable.
"""

import math
import pathlib
import re

import pytest

from tests.helpers import examples

ROOT = pathlib.Path(__file__).resolve().parents[2]
SECTION = "### Porting a CleanRL script"


@pytest.mark.parametrize("script", ["cleanrl_dqn_jax.py", "cleanrl_dqn_torch.py"])
def test_the_port_runs_inserts_and_learns_from_samples(script):
    fields, done = examples.run_example(
        script, "--total_timesteps=400", "--learning_starts=100", "--seed=1", timeout=120
    )
    summary = examples.numbers(fields)
    assert summary["steps"] == 400 and summary["capacity"] == 10_000
    assert summary["table_size"] == 400  # every step inserted (below capacity)
    assert summary["updates"] == 29  # steps 110, 120, ..., 390: train_frequency=10 after learning_starts
    assert math.isfinite(summary["final_loss"]) and summary["final_loss"] > 0
    assert "episodic_return=" in done.stderr  # the episodes ended and were logged


def readme_diffs() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index(SECTION + "\n") :]
    section = section[: re.search(r"^#+ ", section[len(SECTION) :], re.MULTILINE).start() + len(SECTION)]
    return re.findall(r"```diff\n(.*?)```", section, re.DOTALL)


def hunks(diff: str) -> tuple[str, list[list[str]]]:
    """The diff's new file and, per hunk, its lines."""
    target = re.search(r"^\+\+\+ (\S+)$", diff, re.MULTILINE).group(1)
    body = diff.split("\n", 2)[2]  # after the --- and +++ lines
    return target, [h.splitlines()[1:] for h in re.split(r"^@@", body, flags=re.MULTILINE)[1:]]


def test_the_readme_diffs_match_the_examples():
    diffs = readme_diffs()
    assert len(diffs) == 2
    targets = set()
    for diff in diffs:
        target, parts = hunks(diff)
        targets.add(target)
        example = (ROOT / target).read_text()
        assert len(parts) >= 3, target
        for lines in parts:
            assert all(line == "" or line[0] in " +-" for line in lines), lines
            new_side = "\n".join(line[1:] for line in lines if not line.startswith("-"))
            assert new_side + "\n" in example, (
                f"{target}: this hunk's new side is not in the example:\n{new_side}"
            )
            assert any(line[:1] in "+-" for line in lines if line), lines  # a hunk changes something
        # The port's replay buffer (its code, after the docstring): no CleanRL buffer left, the table's in.
        code = example.split('"""', 2)[2]
        assert "ReplayBuffer" not in code and "rb.add(" not in code and "rb.sample(" not in code
        assert "rb.insert(" in code and "gj.TableSpec.from_spaces(" in code
    assert targets == {"examples/cleanrl_dqn_jax.py", "examples/cleanrl_dqn_torch.py"}

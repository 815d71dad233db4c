"""The README's code runs as written: "Coming from SB3, flashbax or torchrl" on a real gymnasium CartPole,
n-step transitions, and checkpoints; and CI runs the README's test command."""

import pathlib
import re

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gear_jax as gj

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def blocks_of(heading: str) -> list[str]:
    """The python code blocks of the README section that starts at `heading`, up to the next heading."""
    text = README.read_text()
    start = text.index(heading + "\n")
    rest = text[start + len(heading) :]
    end = re.search(r"^#+ ", rest, re.MULTILINE)
    return re.findall(r"```python\n(.*?)```", rest[: end.start() if end else None], re.DOTALL)


def test_ci_runs_the_readmes_test_command():
    """.ci/run's last line is the README's "Install and run the tests" command, word for word."""
    section = README.read_text().split("Install and run the tests", 1)[1]
    command = re.search(r"```bash\n(.*?)\n```", section, re.DOTALL).group(1).strip()
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1].strip()
    assert ci == command


@pytest.fixture
def namespace():
    env = gymnasium.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    action = env.action_space.sample()  # np.int64, as gymnasium hands it out
    next_obs, reward, terminated, _, _ = env.step(action)
    names = {
        "gj": gj,
        "jax": jax,
        "jnp": jnp,
        "np": np,
        "gymnasium": gymnasium,
        "env": env,
        "obs": obs,
        "action": action,
        "reward": reward,
        "next_obs": next_obs,
        "terminated": terminated,
    }
    yield names
    if "table" in names:
        names["table"].close()
    env.close()


def test_coming_from_other_buffers(namespace):
    (first,) = blocks_of("## Coming from SB3, flashbax or torchrl")
    exec(compile(first, "README.md", "exec"), namespace)
    table = namespace["table"]
    assert table.size == 1 and table.spec.fields["action"].dtype == np.int32
    assert table.columns["action"][0, 0] == namespace["action"]
    for _ in range(3):
        table.add(
            {"obs": namespace["obs"], "action": 1, "reward": 1.0, "next_obs": namespace["obs"], "done": False}
        )
    state, key = namespace["train_step"](0, table, jax.random.key(0))
    assert int(state) == 0 and not jnp.array_equal(
        jax.random.key_data(key), jax.random.key_data(jax.random.key(0))
    )


def test_transitions_from_trajectories(namespace):
    (code,) = blocks_of("### Transitions from trajectories, with n-step returns")
    exec(compile(code, "README.md", "exec"), namespace)  # 2,000 CartPole steps through the writer
    table = namespace["table"]
    assert table.size > 20 and table.row_status()["priority"].sum() > 1_900  # priorities count transitions
    namespace["q"] = lambda params, x: x @ params
    assert namespace["learner_step"](jnp.ones((4, 2)), jnp.ones((4, 2)), jax.random.key(1)) is None


def test_checkpoints(tmp_path):
    (code,) = blocks_of("### Checkpoints")
    assert '"/data/replay"' in code
    spec = gj.TableSpec({"obs": gj.Field((3,), "float32"), "action": gj.Field((), "int32")}, capacity=8)
    with gj.Table.create(spec) as table:
        table.insert({"obs": np.arange(15, dtype=np.float32).reshape(5, 3), "action": np.arange(5)})
        names = {"gj": gj, "table": table}
        code = code.replace('"/data/replay"', repr(str(tmp_path / "replay")))
        exec(compile(code, "README.md", "exec"), names)
        with names["restored"] as restored:
            assert restored.size == 5 and restored.name != table.name
            np.testing.assert_array_equal(restored.columns["obs"], table.columns["obs"])
            for key, value in table.row_status().items():
                np.testing.assert_array_equal(restored.row_status()[key], value)


def test_outside_jit():
    (code,) = blocks_of("### Outside jit: `gj.host`")
    spec = gj.TableSpec({"obs": gj.Field((4,), "float32"), "action": gj.Field((), "int32")}, capacity=512)
    with gj.Table.create(spec) as table:
        table.insert(
            {"obs": np.ones((300, 4), np.float32), "action": np.arange(300)}, priorities=np.ones(300)
        )
        names = {"gj": gj, "np": np, "table": table, "td_errors": np.linspace(-1, 1, 256)}
        exec(compile(code, "README.md", "exec"), names)
        assert names["batch"]["obs"].shape == (256, 4) and names["batch"]["valid"].all()
        assert names["out"]["obs"] is not names["batch"]["obs"]  # the sampler's own arrays
        np.testing.assert_array_equal(names["batch"]["action"], names["s"].indices)
        # The sampler's update set |td| + 1e-3 on its last draw's rows.
        last = table.row_status()["priority"][names["s"].indices[-1]]
        assert last == np.float32(abs(names["td_errors"][-1]) + 1e-3)

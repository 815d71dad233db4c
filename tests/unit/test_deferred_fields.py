"""Episode writers with deferred fields: values known only once the episode ends (return-to-go), given for
every step at end_episode and written before the episode is published, in padded tables and step rings."""

import jax
import numpy as np
import pytest

import gear_jax as gj

FIELDS = {
    "obs": gj.Field((3,), "float32"),
    "reward": gj.Field((), "float32"),
    "return_to_go": gj.Field((), "float32"),
    "goal": gj.Field((2,), "int32"),
}
KINDS = ["padded", "ring"]


def make(kind, capacity=4, max_steps=16):
    ring = {"step_capacity": 64} if kind == "ring" else {}
    return gj.Table.create(gj.TableSpec(FIELDS, capacity=capacity, max_steps=max_steps, **ring), reuse=False)


def episode_values(table, row, name):
    """Field `name` of the published episode in `row`, one value per step."""
    status = table.row_status()
    length = int(status["length"][row])
    if table.spec.step_ring:
        first = int(status["first_step"][row])
        return table.columns[name][first : first + length]
    return table.columns[name][row, :length]


def write_episode(writer, rewards, start=0.0):
    for k, r in enumerate(rewards):
        writer.append({"obs": np.full(3, start + k, np.float32), "reward": r})
    return np.cumsum(np.asarray(rewards, np.float32)[::-1])[::-1]


@pytest.mark.parametrize("kind", KINDS)
def test_deferred_fields_are_written_with_the_episode(kind):
    with make(kind) as table, table.writer(deferred=["return_to_go", "goal"]) as writer:
        rows = []
        for e, rewards in enumerate([[1.0, 0.0, 2.0, 1.0], [5.0, 1.0]]):
            rtg = write_episode(writer, rewards, start=10.0 * e)
            goals = np.tile(np.array([e, -e], np.int64), (len(rewards), 1))  # int64 in range: cast by "fit"
            rows.append(writer.end_episode(priority=3.0, deferred={"return_to_go": rtg, "goal": goals}))
        assert table.size == 2 and writer.steps == 0
        np.testing.assert_array_equal(episode_values(table, rows[0], "return_to_go"), [4.0, 3.0, 3.0, 1.0])
        np.testing.assert_array_equal(episode_values(table, rows[1], "return_to_go"), [6.0, 1.0])
        np.testing.assert_array_equal(episode_values(table, rows[1], "goal"), [[1, -1], [1, -1]])
        np.testing.assert_array_equal(episode_values(table, rows[1], "obs")[:, 0], [10.0, 11.0])
        np.testing.assert_array_equal(episode_values(table, rows[0], "reward"), [1.0, 0.0, 2.0, 1.0])
        assert table.row_status()["priority"][rows].tolist() == [3.0, 3.0]
        # What a jitted learner reads: windows of the second episode carry its return-to-go.
        s, batch = gj.sample_gather(table, jax.random.key(0), 8, method="prioritized", window=2)
        for i, row in enumerate(np.asarray(s.indices)):
            start = int(np.asarray(s.starts)[i])
            expected = episode_values(table, row, "return_to_go")[start : start + 2]
            np.testing.assert_array_equal(np.asarray(batch["return_to_go"])[i], expected)


@pytest.mark.parametrize("kind", KINDS)
def test_bad_deferred_values_are_refused_by_name_and_the_episode_is_kept(kind):
    with make(kind) as table, table.writer(deferred=["return_to_go", "goal"]) as writer:
        with pytest.raises(
            gj.InvalidArgumentError,
            match=r"deferred ones \['return_to_go', 'goal'\].*missing \[\], unknown or deferred \['return_to",
        ):
            writer.append({"obs": np.zeros(3, np.float32), "reward": 1.0, "return_to_go": 1.0})
        assert writer.steps == 0
        rtg = write_episode(writer, [1.0, 1.0, 1.0])
        goal = np.zeros((3, 2), np.int32)
        refusals = [
            (None, r"must map each deferred field \['return_to_go', 'goal'\].*3 steps; got NoneType"),
            ({"return_to_go": rtg}, r"got \['return_to_go'\]"),
            (
                {"return_to_go": rtg[:2], "goal": goal},
                r"deferred\['return_to_go'\] has shape \(2,\), expected \(3,\)",
            ),
            ({"return_to_go": rtg, "goal": goal + 0.5}, r"deferred\['goal'\] has dtype float64"),
        ]
        for deferred, message in refusals:
            with pytest.raises(gj.InvalidArgumentError, match=message):
                writer.end_episode(deferred=deferred)
            assert table.size == 0 and writer.steps == 3  # nothing published, the episode kept
        row = writer.end_episode(deferred={"return_to_go": rtg, "goal": goal})
        np.testing.assert_array_equal(episode_values(table, row, "return_to_go"), [3.0, 2.0, 1.0])


def test_deferred_is_checked_when_the_writer_is_made():
    with make("ring") as table:
        refusals = [
            ("return_to_go", r"deferred=\['return_to_go'\], not a str"),
            (["rtg"], r"\['rtg'\], which are not fields"),
            (["goal", "goal"], "names a field twice"),
            (list(FIELDS), "names every field"),
            (3, "must be a list of field names, got int"),
        ]
        for deferred, message in refusals:
            with pytest.raises(gj.InvalidArgumentError, match=message):
                table.writer(deferred=deferred)
        with table.writer() as writer:
            step = {"obs": np.zeros(3, np.float32), "reward": 0.0, "return_to_go": 0.0}
            writer.append({**step, "goal": np.zeros(2, np.int32)})
            with pytest.raises(gj.InvalidArgumentError, match=r"deferred= is for writers made with"):
                writer.end_episode(deferred={"return_to_go": np.zeros(1, np.float32)})
            assert writer.end_episode() == 0


def test_deferred_values_may_be_torch_tensors():
    torch = pytest.importorskip("torch")
    with make("padded") as table, table.writer(deferred=["return_to_go", "goal"]) as writer:
        write_episode(writer, [2.0, 1.0])
        row = writer.end_episode(
            deferred={"return_to_go": torch.tensor([3.0, 1.0]), "goal": torch.ones((2, 2), dtype=torch.int32)}
        )
        np.testing.assert_array_equal(episode_values(table, row, "return_to_go"), [3.0, 1.0])
        np.testing.assert_array_equal(episode_values(table, row, "goal"), np.ones((2, 2)))

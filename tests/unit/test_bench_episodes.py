"""Tests of the `episodes` benchmark suite (`benchmarks/episodes.py`), not of speed.

The suite runs once in a tiny configuration, as a subprocess of `python -m gear_jax.bench`; its report
must cover the requested point with every system that can run here, and its memory figures must agree
with each other. The episode lengths and the steps every system is filled with are checked in process.
Without the step-ring table (`gear_jax`) or a baseline, the suite skips it with a note, and so do these
tests.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gear_jax.bench import episodes
from gear_jax.bench.common import Unavailable
from gear_jax.bench.episodes import PADDED, PADDED_SKIP, EpisodeData
from tests.unit.test_bench import PNG_MAGIC, check_report, grid, run_bench

STEP_BYTES = 64


def test_episodes_report_memory_and_plot(tmp_path: Path) -> None:
    steps, window = 3000, 4
    report = run_bench(
        tmp_path,
        "episodes",
        "--lengths=lognormal",
        f"--steps={steps}",
        f"--step_bytes={STEP_BYTES}",
        "--batch_size=8",
        f"--window={window}",
    )
    points = grid(
        lengths=["lognormal"], steps=[steps], step_bytes=[STEP_BYTES], window=[window], batch_size=[8]
    )
    check_report(report, "episodes", points, always=[PADDED])
    assert any(n.startswith("skipped reverb") for n in report["notes"]), report["notes"]
    memory = {r["system"]: r["memory"] for r in report["records"]}
    for system, m in memory.items():
        assert m["step_bytes_total"] == steps * STEP_BYTES and m["index_bytes"] > 0, system
        assert m["bytes_per_step"] == pytest.approx(m["bytes"] / steps), system
        assert m["ratio_to_step_bytes"] == pytest.approx(m["bytes"] / m["step_bytes_total"]), system
        assert m["bytes_per_step"] >= STEP_BYTES and m["measured_as"], system
    # Rows of 1,000 steps for episodes a tenth as long: the padded table is the largest by far.
    padded = (PADDED, PADDED_SKIP)  # one kind of table, sampled two ways
    assert memory[PADDED_SKIP]["bytes"] == memory[PADDED]["bytes"], memory
    assert all(memory[PADDED]["bytes"] > 4 * m["bytes"] for s, m in memory.items() if s not in padded), memory
    gear = [r for r in report["records"] if r["system"] == "gear_jax"]
    for r in gear:  # the step ring, where this build has it
        assert memory[PADDED]["bytes_per_step"] >= memory["gear_jax"]["bytes_per_step"]
        assert r[f"speedup_vs_{PADDED}"] > 0
    if not gear:
        assert any(n.startswith("skipped gear_jax at") for n in report["notes"]), report["notes"]
    # The ring is also timed against the padded table sampled as it is (short_episodes="skip").
    like = {r["system"]: r for r in report["records"] if "like_for_like" in r}
    assert set(like) == ({"gear_jax"} if gear else set()), sorted(like)
    if gear:
        assert like["gear_jax"]["like_for_like"] == PADDED_SKIP
        assert like["gear_jax"]["like_for_like_speedup"] > 0
    assert (tmp_path / "episodes.png").read_bytes()[:8] == PNG_MAGIC


def test_episode_lengths_fill_the_step_budget() -> None:
    cartpole = episodes.episode_lengths("cartpole", 3000, 500)
    lognormal = episodes.episode_lengths("lognormal", 200_000, 1000)
    for lengths, budget, longest in ((cartpole, 3000, 500), (lognormal, 200_000, 1000)):
        assert lengths.sum() == budget and lengths.min() >= 1 and lengths.max() <= longest
    assert 0.08 < lognormal.mean() / 1000 < 0.11
    assert episodes.clip_to_budget(np.array([5, 5, 5]), 7).tolist() == [5, 2]


def test_episode_data_is_one_stream_of_stamped_steps() -> None:
    data = EpisodeData(np.array([3, 1, 6, 2]), step_bytes=16, max_steps=6)
    stream = data.steps_between(0, data.steps)
    stamps = stream[:, :8].copy().view("<u4")
    assert stamps[:, 0].tolist() == [0, 0, 0, 1, 2, 2, 2, 2, 2, 2, 3, 3]
    assert stamps[:, 1].tolist() == [0, 1, 2, 0, 0, 1, 2, 3, 4, 5, 0, 1]
    blocks = list(data.step_blocks(5))
    assert [len(ids) for _, ids in blocks] == [5, 5, 2]
    np.testing.assert_array_equal(np.concatenate([b for b, _ in blocks]), stream)
    padded, lengths = zip(*data.padded_chunks())
    padded, lengths = np.concatenate(padded), np.concatenate(lengths)
    assert padded.shape == (4, 6, 16) and lengths.tolist() == [3, 1, 6, 2]
    np.testing.assert_array_equal(padded[np.arange(6) < lengths[:, None]], stream)
    assert not padded[np.arange(6) >= lengths[:, None]].any()


@pytest.mark.parametrize("name", [PADDED, "gear_jax", PADDED_SKIP])
def test_gear_tables_gather_windows_of_one_episode(name: str) -> None:
    window = 4
    data = EpisodeData(episodes.lognormal_lengths(2000, 100), step_bytes=16, max_steps=100)
    try:
        system = episodes.EPISODE_SYSTEMS[name](episodes.EpisodeWorkload(data, window))
    except Unavailable as e:
        pytest.skip(str(e))
    try:
        assert system.nbytes() >= data.step_bytes_total
        batch = system.make_step(64)(0)
    finally:
        system.close()
    stamps = np.asarray(batch["x"])[..., :8].copy().view("<u4")  # [B, W, 2]: episode, step in it
    valid = np.asarray(batch["valid"])
    skips = episodes.EPISODE_SYSTEMS[name].sample_options.get("short_episodes") == "skip"
    assert valid[:, 0].all() and (valid.all() or not skips)  # "skip": every window W steps of one episode
    if not skips:  # "pad": short episodes are picked, their windows masked past the episode's end
        assert not valid.all()
    episode, step = stamps[..., 0], stamps[..., 1]
    assert (episode == episode[:, :1])[valid].all()
    assert (step == step[:, :1] + np.arange(window))[valid].all()
    assert (step + 1 <= data.lengths[episode])[valid].all()


def test_episode_inserts_report_both_tables_and_both_ways(tmp_path: Path) -> None:
    """The `episode_inserts` suite: whole-episode inserts and step-by-step writers, ring and padded."""
    report = run_bench(
        tmp_path,
        "episode_inserts",
        "--lengths=lognormal",
        "--steps=3000",
        f"--step_bytes={STEP_BYTES}",
        "--batch_size=1,4",
    )
    ops = {(r["system"], r["op"], r["point"]["batch_size"]) for r in report["records"]}
    for system in ("gear_jax", PADDED):
        assert {
            (system, "insert_episodes", 1),
            (system, "insert_episodes", 4),
            (system, "writer_steps", 1),
        } <= ops
    for r in report["records"]:
        assert r["latency_s"]["p50"] > 0 and r["iters"] > 0
        if r["system"] == "gear_jax":
            assert r[f"speedup_vs_{PADDED}"] > 0


def test_a_variant_samples_the_table_of_its_owner_and_leaves_it_open() -> None:
    """`gear_jax_padded_skip` made while `gear_jax_padded` is open samples that table (no second copy)
    by its own law, and closing it leaves the owner's table open."""
    data = EpisodeData(episodes.lognormal_lengths(2000, 100), step_bytes=16, max_steps=100)
    work = episodes.EpisodeWorkload(data, 4)
    owner = episodes.EPISODE_SYSTEMS[PADDED](work)
    try:
        variant = episodes.PaddedSkipSystem(work, table=owner.table)
        assert variant.table is owner.table and not variant.owns_table
        assert "the table of gear_jax_padded" in variant.describe()
        batch = variant.make_step(64)(0)
        assert np.asarray(batch["valid"]).all()  # short episodes skipped: every window whole
        variant.close()
        assert not owner.table.closed
    finally:
        owner.close()
    assert owner.table.closed

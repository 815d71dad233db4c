"""Sharded tables over real processes: 1 process with 4 CPU devices, and 2 or 4 `jax.distributed`
processes on 127.0.0.1 with 1 or 2 devices each (tests/helpers/sharded_worker.py is one process).

Every process is bounded by a timeout and all are killed when one fails: a process that skips a
collective would leave the others waiting forever.
"""

import json
import os
import pathlib
import random
import signal
import time
import socket
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

import gear_jax as gj
import gear_jax.cleanup
from tests.helpers.sampling import P_THRESHOLD

pytestmark = pytest.mark.multiprocess
WORKER = pathlib.Path(__file__).resolve().parents[1] / "helpers" / "sharded_worker.py"
TIMEOUT = 180
LAYOUTS = [(1, 4), (2, 1), (2, 2), (4, 1)]  # (processes, CPU devices per process)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_job(scenario: str, processes: int, devices: int, env: dict | None = None) -> list[subprocess.Popen]:
    port = free_port()
    return [
        subprocess.Popen(
            [sys.executable, str(WORKER), scenario, str(i), str(processes), str(devices), str(port)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
        )
        for i in range(processes)
    ]


def run_job(scenario: str, processes: int, devices: int, env: dict | None = None) -> list[dict]:
    """Runs the scenario on `processes` processes; returns each process's RESULT, in process order."""
    procs = start_job(scenario, processes, devices, env)
    results = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=TIMEOUT)
            assert p.returncode == 0, stderr[-4000:]
            lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
            assert lines, stdout[-2000:] + stderr[-2000:]
            results.append(json.loads(lines[-1][len("RESULT "):]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return results


@pytest.mark.parametrize("processes,devices", LAYOUTS)
def test_global_picks_equal_the_one_table_reference(processes, devices):
    results = run_job("exact", processes, devices)
    for method in ("prioritized", "uniform"):
        first = results[0][method]
        for r in results[1:]:  # every process sees the same global selection
            assert r[method]["indices"] == first["indices"]
        assert first["indices"] == first["reference"], method
        assert first["ids"] == first["indices"]  # rows owned by other processes arrive intact
        assert first["x_ok"] and all(first["valid"])
        np.testing.assert_allclose(first["probabilities"], first["expected_probabilities"], rtol=1e-6)
        assert first["selectable"] == expected_rows(processes * devices)


@pytest.mark.parametrize("processes,devices", LAYOUTS)
def test_the_exchange_gives_the_same_picks_and_rows_at_every_capacity(processes, devices):
    # The global exchange packs each shard's picks for each consumer into blocks of a capacity every
    # device picks alike; full-size blocks, the default and a tiny factor (its first blocks overflow, so
    # a later branch runs) must give the same picks, rows and probabilities. Shard 1 is empty and the
    # others hold 5 + 7 s rows: unequal shares.
    results = run_job("exchange", processes, devices)
    check_exchange_runs(results, processes * devices, windows=False)


@pytest.mark.parametrize("processes,devices", [(2, 2)])
def test_the_exchange_of_windows_gives_the_same_picks_and_steps_at_every_capacity(processes, devices):
    # As above, for windows of 2 steps of 4-step trajectory rows: the same picks, starts and steps.
    results = run_job("exchange_windows", processes, devices)
    check_exchange_runs(results, processes * devices, windows=True)


def check_exchange_runs(results: list[dict], shards: int, windows: bool) -> None:
    """Every capacity factor gave the full-size exchange's picks, rows and probabilities, for every
    method, on every process; the tiny factor overflowed its first blocks."""
    for method in ("uniform", "prioritized", "fifo", "lifo", "topk"):
        r = results[0][method]
        full = r["runs"]["None"]
        for factor, run in r["runs"].items():
            assert run == full, (method, factor)
        assert all(full["valid"]) and full["ids"] == full["indices"]
        if windows:  # each window's steps are its start and the next step of its row
            starts = np.asarray(full["starts"])
            assert (np.asarray(full["steps"]) == starts[:, None] + np.arange(2)).all()
        for other in results[1:]:
            assert other[method]["runs"] == r["runs"]
        if shards > 1 and not windows and method in ("uniform", "prioritized"):
            assert r["branches"]["0.01"] > 0, r["branches"]  # the tiny factor's first blocks overflowed
    if shards > 1:  # some method's fullest block overflowed the tiny factor's first capacity
        overflowed = [m for m in results[0] if results[0][m]["branches"]["0.01"] > 0]
        assert overflowed, {m: results[0][m]["branches"] for m in results[0]}


def expected_rows(shards: int) -> int:
    """Rows the worker fills: shard 1 empty (with several shards), shard s 5 + 7 s rows otherwise."""
    return sum(0 if (s == 1 and shards > 1) else min(64, 5 + 7 * s) for s in range(shards))


@pytest.mark.parametrize("processes,devices", [(1, 4), (2, 2)])
def test_global_sampling_follows_the_exact_distribution(processes, devices):
    results = run_job("counts", processes, devices)
    for method in ("uniform", "prioritized"):
        r = results[0][method]
        counts = np.asarray(r["counts"])
        expected = np.asarray(r["expected"]) * counts.sum()
        assert r["outside"] == 0 and r["invalid"] == 0
        p = stats.chisquare(counts, expected).pvalue
        assert p > P_THRESHOLD, (method, p)


@pytest.mark.parametrize("processes,devices", [(1, 4), (2, 2)])
def test_local_mode_probabilities_and_weights(processes, devices):
    r = run_job("local", processes, devices)[0]
    shards = processes * devices
    b = len(r["indices"]) // shards
    capacity = 64
    for slot, (g, pid, p, w) in enumerate(zip(r["indices"], r["ids"], r["probabilities"], r["weights"])):
        device = slot // b
        assert g // capacity == device  # a device's picks come from its own shard
        assert pid == g
    # The worker's priorities: shard 1 refilled with 2, 3, 5; others 1 + (3 s + row) % 5.
    def shard_weights(s):
        rows = 3 if s == 1 else min(64, 5 + 7 * s)
        return [2.0, 3.0, 5.0] if s == 1 else [1.0 + (3 * s + row) % 5 for row in range(rows)]
    for g, p in zip(r["indices"], r["probabilities"]):
        s, row = divmod(g, capacity)
        w = shard_weights(s)
        assert p == pytest.approx(w[row] / (shards * sum(w)), rel=1e-5)
    n = sum(len(shard_weights(s)) for s in range(shards))
    assert r["selectable"] == n
    raw = (n * np.asarray(r["probabilities"])) ** -0.4
    np.testing.assert_allclose(r["weights"], raw / raw.max(), rtol=1e-5)


@pytest.mark.parametrize("processes,devices", [(1, 4), (2, 1), (4, 1)])
def test_decentralized_fifo_lifo_topk_equal_the_one_table_answer(processes, devices):
    results = run_job("ordered", processes, devices)
    first = results[0]
    shards = processes * devices
    for r in results[1:]:  # every process sees the same selection
        assert {k: v for k, v in r.items() if k != "too_few"} == {
            k: v for k, v in first.items() if k != "too_few"}
    checked = 0
    for name, r in first.items():
        if not isinstance(r, dict):
            continue
        assert r["indices"] == r["reference"], name
        assert r["ids"] == r["indices"] and all(r["valid"]), name
        checked += 1
    assert checked == 6
    # Local fifo: each device's two picks are its own shard's two oldest rows.
    assert first["local_fifo"] == [s * 64 + k for s in range(shards) for k in range(2)]
    for r in results:  # each process's shards refuse with the single-table error
        assert r["too_few"] is not None and "fewer than batch_size" in r["too_few"]


@pytest.mark.parametrize("processes,devices", [(2, 1), (1, 2)])
def test_priority_updates_reach_the_owner_and_stale_ones_are_ignored(processes, devices):
    results = run_job("updates", processes, devices)
    capacity = 64
    status = {}
    for r in results:
        status.update({int(s): p for s, p in r["status"].items()})
    indices = results[0]["indices"]
    for g in indices:
        s, row = divmod(g, capacity)
        if s == 0:
            assert status[0][row] == 1.0  # overwritten after the sample: the update was stale
        else:
            assert status[s][row] == float(g % 97 + 10)
    assert any(g // capacity != 0 for g in indices)


@pytest.mark.parametrize("processes,devices", [(2, 1)])
def test_writers_inserting_while_the_learner_samples_never_yield_a_torn_valid_row(processes, devices):
    for r in run_job("writer", processes, devices):
        assert all(r["alive"])  # the writers were still inserting when sampling ended
        assert r["valid"] > 0
        assert r["torn"] == 0


def test_windows_of_trajectories_move_to_their_consumers_in_every_mode():
    results = run_job("windows", 2, 1)
    assert results[0] == results[1]
    assert len(results[0]) == 5
    for name, r in results[0].items():
        for g, start, ids, valid in zip(r["indices"], r["starts"], r["ids"], r["valid"]):
            assert all(valid), name
            assert 0 <= start <= 2, name
            assert ids == [g * 100 + start, g * 100 + start + 1], name


def test_errors_name_the_argument():
    r = run_job("errors", 1, 2)[0]
    assert "axis='data' is not an axis of the mesh" in r["axis"]
    assert "batch_size=9 must be a positive multiple of the 2 shards" in r["batch"]
    assert r["empty"] is not None and "selectable" in r["empty"]


def test_specs_that_differ_across_processes_are_refused():
    results = run_job("spec_mismatch", 2, 1)
    for r in results:
        assert r["error"] is not None and "differ across processes" in r["error"]


def test_a_create_that_fails_on_one_process_fails_on_every_process_at_once():
    # Process 1 passes a bad name: it raises its own error, process 0 one naming process 1, both at once
    # (they waited 30 s for a collective and raised Gloo's DEADLINE_EXCEEDED before).
    own, other = run_job("bad_arguments", 2, 1)[1], run_job("bad_arguments", 2, 1)[0]
    assert "name must be a str" in own["error"]
    assert "process 1 failed" in other["error"] and "name must be a str" in other["error"]
    assert own["seconds"] < 20 and other["seconds"] < 20


@pytest.mark.parametrize("saved,loaded", [((2, 1), (2, 1)), ((2, 1), (1, 2))])
def test_a_sharded_checkpoint_loads_whole_into_as_many_shards(tmp_path, saved, loaded):
    # Saved by 2 processes, loaded by 2 (the same layout) or by 1 process of 2 devices (the shards move
    # between processes on a shared file system): the same rows, priorities and generations, the same
    # picks for the same key, and the loaded shards take inserts.
    env = {"GEAR_JAX_TEST_CHECKPOINT": str(tmp_path / "replay")}
    before = run_job("checkpoint_save", *saved, env=env)
    after = run_job("checkpoint_load", *loaded, env=env)
    assert before[0]["saves"] == before[1]["saves"] and len(before[0]["saves"]) == 1  # the first replaced
    assert all(r["picks"] == before[0]["picks"] for r in before + after)
    rows_before = {s: v for r in before for s, v in r["rows"].items()}
    rows_after = {s: v for r in after for s, v in r["rows"].items()}
    assert rows_after == rows_before and len(rows_after) == 2
    assert rows_before["0"]["size"] == 6  # fill's 5 rows and the one inserted before the second save
    assert sum(r["size_after_insert"] for r in after) == sum(v["size"] for v in rows_after.values()) + 4
    assert all(r["metadata"] == {"step": 2, "note": "second"} for r in after)
    # A save whose metadata one process can not write is refused on both, and the last save stays.
    own, other = before[1]["refused"], before[0]["refused"]
    assert own.startswith("InvalidArgumentError") and "metadata" in own
    assert other.startswith("InvalidArgumentError") and "process 1 failed" in other


def test_a_checkpoint_of_another_number_of_shards_is_refused_on_every_process(tmp_path):
    env = {"GEAR_JAX_TEST_CHECKPOINT": str(tmp_path / "replay")}
    run_job("checkpoint_save", 2, 1, env=env)
    for r in run_job("checkpoint_refused", 2, 2, env=env):
        assert "it holds 2 shards and the mesh has 4 devices" in r["error"]


@pytest.mark.parametrize("delay", [random.Random(7).uniform(0.0, 0.4), random.Random(8).uniform(0.0, 0.4)])
def test_every_process_killed_mid_save_leaves_the_last_checkpoint_loadable(tmp_path, delay):
    # Two processes insert a round of rows into each shard and save, again and again; both are SIGKILLed
    # a random time after the third save returned. A load then finds one whole save on every shard: the
    # same rounds 0..k everywhere, k at least the last one reported saved, each row's bytes its own round's.
    env = {"GEAR_JAX_TEST_CHECKPOINT": str(tmp_path / "replay")}
    procs = start_job("checkpoint_loop", 2, 1, env)
    try:
        saved = -1
        deadline = time.monotonic() + TIMEOUT
        while saved < 2:
            assert time.monotonic() < deadline and procs[0].poll() is None, procs[0].stderr.read()[-3000:]
            line = procs[0].stdout.readline()
            if line.startswith("SAVED "):
                saved = int(line.split()[1])
        time.sleep(delay)
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
        for line in procs[0].stdout.read().splitlines():  # what process 0 reported before the kill
            if line.startswith("SAVED "):
                saved = max(saved, int(line.split()[1]))
    finally:
        for p in procs:
            p.kill()
            p.communicate()
        gj.cleanup.remove_dead_tables(match="gear_jax_test_ckpt_loop_*")  # the killed processes' shards
    shards = {s: v for r in run_job("checkpoint_verify", 2, 1, env=env) for s, v in r.items()}
    rounds = {tuple(v["rounds"]) for v in shards.values()}
    assert len(rounds) == 1, shards  # every shard from the same save
    (kept,) = rounds
    assert kept == tuple(range(len(kept))) and len(kept) - 1 >= saved, (kept, saved)
    assert all(v["exact"] and v["size"] == 8 * len(kept) for v in shards.values()), shards


def test_a_sharded_table_in_an_orbax_checkpoint_manager_step(tmp_path):
    # Two processes save the sharded table with a train state in orbax steps 1 and 2 (max_to_keep=1),
    # then restore step 2 into new shards: the same rows and picks, the metadata and the state's step.
    results = run_job("checkpoint_orbax", 2, 1, env={"GEAR_JAX_TEST_CHECKPOINT": str(tmp_path / "orbax")})
    for r in results:
        assert r["steps"] == [2] and r["state_step"] == 2 and r["metadata"] == {"step": 2}
        assert r["after"] == r["before"]
    sizes = {s: v["size"] for r in results for s, v in r["after"][1].items()}
    assert sizes == {"0": 5 + 2, "1": 0 + 2}


@pytest.mark.parametrize("processes,devices", [(1, 4), (2, 2)])
def test_local_epochs_visit_each_shards_rows_once_and_retire_them(processes, devices):
    shards = processes * devices
    rows = [0 if (s == 1 and shards > 1) else min(64, 5 + 7 * s) for s in range(shards)]
    for r in run_job("epochs", processes, devices):
        assert r["selectable"] == sum(rows)
        for s in range(shards):
            valid = np.asarray(r["valid"][s])
            real = valid.sum()
            assert real == rows[s] and valid[:real].all(), (s, r["valid"][s])  # real picks first
            ids, indices = np.asarray(r["ids"][s])[:real], np.asarray(r["indices"][s])[:real]
            assert sorted(ids.tolist()) == list(range(s * 64, s * 64 + rows[s]))  # each row once
            assert (ids == indices).all()  # the rows gathered are the rows picked
            if rows[s] > 2:
                assert ids.tolist() != sorted(ids.tolist())  # shuffled
        assert r["retired"] == rows  # every shard retired its own rows
        assert r["selectable_after"] == [0] * len(r["selectable_after"])

"""Sharded tables over real processes: 1 process with 4 CPU devices, and 2 or 4 `jax.distributed`
processes on 127.0.0.1 with 1 or 2 devices each (tests/helpers/sharded_worker.py is one process).

Every process is bounded by a timeout and all are killed when one fails: a process that skips a
collective would leave the others waiting forever.
"""

import json
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from tests.helpers.sampling import P_THRESHOLD

pytestmark = pytest.mark.multiprocess
WORKER = pathlib.Path(__file__).resolve().parents[1] / "helpers" / "sharded_worker.py"
TIMEOUT = 180
LAYOUTS = [(1, 4), (2, 1), (2, 2), (4, 1)]  # (processes, CPU devices per process)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(scenario: str, processes: int, devices: int) -> list[dict]:
    """Runs the scenario on `processes` processes; returns each process's RESULT, in process order."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), scenario, str(i), str(processes), str(devices), str(port)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i in range(processes)
    ]
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

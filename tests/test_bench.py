"""Smoke tests of `python -m gear_jax.bench`: one tiny configuration per suite, run as a subprocess.

They check the report's structure, not speed. Baselines that are not installed are skipped by the
suites with a note, so they never fail these tests.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RECORD_KEYS = {"point", "system", "op", "iters", "latency_s", "throughput"}
REPORT_KEYS = {"suite", "available", "config", "machine", "notes", "plot", "records"}
TINY = ["--iters=4", "--warmup=1"]


def run_bench(out: Path, suite: str, *flags: str, module: str = "gear_jax.bench") -> dict[str, Any]:
    """Runs one suite with --json/--plot under `out`; returns the report."""
    report, plot = out / f"{suite}.json", out / f"{suite}.png"
    cmd = [sys.executable, "-m", module, suite, *TINY, *flags, f"--json={report}", f"--plot={plot}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(report.read_text())


def check_report(report: dict[str, Any], suite: str, points: list[dict[str, Any]], always: list[str]) -> None:
    """Structure: keys, one record per point x system x op, ordered percentiles, positive throughput;
    `always` systems have every point, others a subset; a requested system with no record has a note."""
    assert REPORT_KEYS <= set(report)
    assert report["suite"] == suite and report["available"] is True
    assert report["machine"]["cpu_count"] >= 1 and "version" in report["machine"]["gear_jax"]
    records = report["records"]
    counts = Counter((json.dumps(r["point"], sort_keys=True), r["system"], r["op"]) for r in records)
    assert all(n == 1 for n in counts.values()), counts
    for r in records:
        assert RECORD_KEYS <= set(r)
        lat = r["latency_s"]
        assert 0 < lat["p50"] <= lat["p75"] <= lat["p90"] <= lat["p95"], lat
        assert r["throughput"]["items_per_s"] > 0
        assert r["iters"] >= 1
    wanted = {json.dumps(p, sort_keys=True) for p in points}
    for system in {r["system"] for r in records} | set(always):
        have = {json.dumps(r["point"], sort_keys=True) for r in records if r["system"] == system}
        assert have == wanted if system in always else have <= wanted, (system, have ^ wanted)
    for name in set(report["config"]["systems"]) - {r["system"] for r in records}:
        assert any(f"skipped {name}" in n for n in report["notes"]), (name, report["notes"])


def grid(**axes: list[Any]) -> list[dict[str, Any]]:
    """Every combination of the axes, as points."""
    return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


@pytest.fixture(scope="module")
def gather_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("gather")
    return out, run_bench(out, "gather", "--table_rows=1000", "--item_bytes=64,256", "--batch_size=8,32")


def test_gather_report_and_plot(gather_report: tuple[Path, dict[str, Any]]) -> None:
    out, report = gather_report
    points = grid(table_rows=[1000], item_bytes=[64, 256], window=[0], batch_size=[8, 32])
    check_report(report, "gather", points, always=["gear_jax", "numpy", "jnp_take"])
    gear = [r for r in report["records"] if r["system"] == "gear_jax"]
    assert all("speedup_vs_numpy" in r and r["speedup_vs_numpy"] > 0 for r in gear)
    assert all(r["iters"] == 4 for r in report["records"])
    assert (out / "gather.png").read_bytes()[:8] == PNG_MAGIC


def test_gather_windows(tmp_path: Path) -> None:
    report = run_bench(tmp_path, "gather", "--table_rows=200", "--item_bytes=32", "--batch_size=8",
                       "--window=4", "--systems=gear_jax,numpy,jnp_take")
    points = grid(table_rows=[200], item_bytes=[32], window=[4], batch_size=[8])
    check_report(report, "gather", points, always=["gear_jax", "numpy", "jnp_take"])
    assert report["records"][0]["throughput"]["bytes_per_s"] > 0


def test_sample(tmp_path: Path) -> None:
    report = run_bench(tmp_path, "sample", "--table_rows=300", "--batch_size=8,16",
                       "--methods=uniform,prioritized,fifo,lifo,topk", "--systems=gear_jax,numpy,jnp_take")
    points = grid(table_rows=[300], item_bytes=[8], batch_size=[8, 16])
    check_report(report, "sample", points, always=["gear_jax", "numpy", "jnp_take"])
    assert {r["op"] for r in report["records"]} == {"uniform", "prioritized", "fifo", "lifo", "topk"}
    assert (tmp_path / "sample.png").read_bytes()[:8] == PNG_MAGIC


def test_insert_with_writer_processes(tmp_path: Path) -> None:
    report = run_bench(tmp_path, "insert", "--table_rows=500", "--item_bytes=64", "--batch_size=8",
                       "--writers=1,2", "--systems=gear_jax,numpy")
    gear = grid(table_rows=[500], writers=[1, 2], item_bytes=[64], batch_size=[8])
    check_report(report, "insert", gear, always=["gear_jax"])
    numpy_points = [r["point"]["writers"] for r in report["records"] if r["system"] == "numpy"]
    assert numpy_points == [1]
    assert (tmp_path / "insert.png").read_bytes()[:8] == PNG_MAGIC


def test_actor_learner(tmp_path: Path) -> None:
    report = run_bench(tmp_path, "actor_learner", "--table_rows=500", "--item_bytes=64", "--batch_size=16",
                       "--world_size=1,2", "--insert_batch=8")
    points = grid(table_rows=[500], item_bytes=[64], batch_size=[16], world_size=[1, 2])
    check_report(report, "actor_learner", points, always=["gear_jax"])
    assert {r["op"] for r in report["records"]} == {"insert", "learner_step"}
    assert (tmp_path / "actor_learner.png").read_bytes()[:8] == PNG_MAGIC


def test_sharded_reports_unavailable(tmp_path: Path) -> None:
    report = run_bench(tmp_path, "sharded")
    assert report["available"] is False and report["records"] == []
    assert any("not available" in n for n in report["notes"])
    assert not (tmp_path / "sharded.png").exists()


def test_diff_of_two_reports(gather_report: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    out, report = gather_report
    slower = json.loads(json.dumps(report))
    for r in slower["records"]:
        r["latency_s"]["p50"] *= 2
        r["throughput"]["items_per_s"] /= 2
    (tmp_path / "test.json").write_text(json.dumps(slower))
    cmd = [sys.executable, "-m", "gear_jax.bench.diff", str(out / "gather.json"), str(tmp_path / "test.json")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "+100.0%" in done.stdout and "-50.0%" in done.stdout

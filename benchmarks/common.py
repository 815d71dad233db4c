"""Shared pieces of the benchmark suites: sweeps, timing, statistics, records, machine info, reports.

A report is a JSON-ready dict:

    {"suite": str, "available": bool, "config": {flag: value}, "machine": {...}, "notes": [str],
     "plot": {"x": point key, "y": throughput key, "label": str},
     "records": [{"point": {key: value}, "system": str, "op": str, "iters": int,
                  "latency_s": {"p50", "p75", "p90", "p95", "mean", "min", "max"},
                  "throughput": {"items_per_s", "bytes_per_s"},
                  "speedup_vs_<system>": float (gear_jax records only),
                  "bandwidth_fraction_vs_<reference>", "time_ratio_vs_<reference>": float (gear_jax
                  records, where a reference system ran at the same point),
                  "measured_as": str (reference records: what was timed)}]}

Throughput is work divided by the summed latency of the timed iterations (total items / total time);
`speedup_vs_<system>` is that system's p50 latency divided by gear_jax's p50 at the same point and op.
A reference system (`REFERENCES`) times a plain copy or read of the same bytes over the same memory
path instead of doing the work: `bandwidth_fraction_vs_<reference>` is gear_jax's bytes/s over the
reference's bytes/s, `time_ratio_vs_<reference>` gear_jax's p50 over the reference's p50.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

GEAR = "gear_jax"
# gear_jax.host: the same kernels called from Python outside jit (numpy results), timed beside the jitted
# path; its records get speedups over the baselines too.
GEAR_HOST = "gear_jax_host"
# The priorities suite's learner step with the update as a JAX effect: a baseline of gear_jax's own.
GEAR_EFFECT = "gear_jax_effect"
GEAR_SYSTEMS = (GEAR, GEAR_HOST)
PINNED_COPY = "pinned_copy"
# The same bytes as pinned_copy, moved by XLA inside one jitted call (a JAX array in pinned_host memory):
# the copy with JAX's dispatch around it, as every jitted system is timed.
PINNED_COPY_JIT = "pinned_copy_jit"
PRIORITY_READ = "priority_read"
REFERENCES = (PINNED_COPY, PINNED_COPY_JIT, PRIORITY_READ)
PERCENTILES = (50, 75, 90, 95)


class Unavailable(Exception):
    """A baseline cannot run here (not installed, or it failed); the suite skips it with a note."""


def parse_ints(text: str) -> list[int]:
    """`"32,64,128"` -> [32, 64, 128]; raises ValueError for an empty or non-positive entry."""
    values = [int(v) for v in str(text).split(",") if v.strip()]
    if not values or any(v < 1 for v in values):
        raise ValueError(f"{text!r} must be a comma-separated list of positive ints")
    return values


def parse_floats(text: str) -> list[float]:
    """`"0.5,4"` -> [0.5, 4.0]; raises ValueError for an empty, non-finite or non-positive entry."""
    values = [float(v) for v in str(text).split(",") if v.strip()]
    if not values or any(not 0 < v < float("inf") for v in values):
        raise ValueError(f"{text!r} must be a comma-separated list of positive numbers")
    return values


def parse_names(text: str) -> list[str]:
    """`"uniform,fifo"` -> ["uniform", "fifo"]."""
    return [v.strip() for v in str(text).split(",") if v.strip()]


def time_calls(
    step: Callable[[int], Any], warmup: int, iters: int, tick: Callable[[], None] | None = None
) -> np.ndarray:
    """Latencies in seconds, float64[iters], of `step(i)` after `warmup` untimed calls.

    `step(i)` must return only when its work is complete (it calls `jax.block_until_ready` itself).
    """
    for i in range(warmup):
        step(i)
    latencies = np.empty(iters, np.float64)
    for i in range(iters):
        start = time.perf_counter()
        step(warmup + i)
        latencies[i] = time.perf_counter() - start
        if tick is not None:
            tick()
    return latencies


def latency_stats(latencies: Sequence[float] | np.ndarray) -> dict[str, float]:
    """p50/p75/p90/p95, mean, min and max of latencies in seconds."""
    lat = np.asarray(latencies, np.float64)
    stats = {f"p{p}": float(np.percentile(lat, p)) for p in PERCENTILES}
    stats.update(mean=float(lat.mean()), min=float(lat.min()), max=float(lat.max()))
    return stats


def make_record(
    point: dict[str, Any],
    system: str,
    op: str,
    latencies: Sequence[float] | np.ndarray,
    items_per_iter: float,
    bytes_per_iter: float,
    wall_s: float | None = None,
) -> dict[str, Any]:
    """One measurement: latency percentiles and throughput of `system` doing `op` at `point`.

    Args:
      latencies: seconds per timed iteration.
      items_per_iter, bytes_per_iter: work of one iteration (rows, samples; bytes moved).
      wall_s: elapsed time for all iterations when they overlap (several processes); default the sum.
    """
    lat = np.asarray(latencies, np.float64)
    total = float(wall_s) if wall_s is not None else float(lat.sum())
    n = len(lat)
    return {
        "point": dict(point),
        "system": system,
        "op": op,
        "iters": n,
        "latency_s": latency_stats(lat),
        "throughput": {
            "items_per_s": items_per_iter * n / total,
            "bytes_per_s": bytes_per_iter * n / total,
        },
    }


def add_speedups(records: list[dict[str, Any]]) -> None:
    """Adds `speedup_vs_<system>` (baseline p50 / gear_jax p50) to every gear_jax record (and every
    gear_jax_host record: the host path's p50 in the denominator), in place, and
    for a reference system also `bandwidth_fraction_vs_<reference>` (gear_jax bytes/s / reference
    bytes/s) and `time_ratio_vs_<reference>` (gear_jax p50 / reference p50)."""
    for system in GEAR_SYSTEMS:
        _add_speedups_of(system, records)


def _add_speedups_of(system: str, records: list[dict[str, Any]]) -> None:
    gear = {_key(r): r for r in records if r["system"] == system}
    for r in records:
        target = gear.get(_key(r))
        if r["system"] in GEAR_SYSTEMS or target is None:
            continue
        name = r["system"]
        target[f"speedup_vs_{name}"] = r["latency_s"]["p50"] / target["latency_s"]["p50"]
        if name in REFERENCES and r["throughput"]["bytes_per_s"] > 0:
            target[f"bandwidth_fraction_vs_{name}"] = (
                target["throughput"]["bytes_per_s"] / r["throughput"]["bytes_per_s"]
            )
            target[f"time_ratio_vs_{name}"] = target["latency_s"]["p50"] / r["latency_s"]["p50"]


def _key(record: dict[str, Any]) -> tuple[Any, ...]:
    return (json.dumps(record["point"], sort_keys=True), record["op"])


def record_key(record: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies a record within a report: point, system and op."""
    return (*_key(record), record["system"])


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, or what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def source_revision(path: str) -> str | None:
    """The git commit of the checkout holding `path` (with "-dirty" if it has changes), or None."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        commit = subprocess.run(
            ["git", "-C", folder, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "-C", folder, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if commit.returncode != 0:
        return None
    return commit.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def machine_info() -> dict[str, Any]:
    """The machine and software a report was measured on."""
    import jax

    import gear_jax

    devices = jax.devices()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gib": round(memory / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "jax_backend": jax.default_backend(),
        "devices": [str(d) for d in devices],
        "gpus": [d.device_kind for d in devices if d.platform == "gpu"],
        "load_avg_start": list(os.getloadavg()),
        "gear_jax": gear_jax.build_info(),
        "gear_jax_revision": source_revision(gear_jax.__file__),
        "malloc_tuning": gear_jax.malloc_tuning(),  # result buffers reused or not: gear_jax/malloc.py
        # the variables that change what gear_jax does (GEAR_JAX_HUGE_PAGES, the CUDA launch overrides, ...)
        "gear_jax_environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith("GEAR_JAX_")},
        "versions": {p: _version(p) for p in ("numpy", "jax", "flashbax", "torch", "torchrl", "tensordict")},
    }


def make_report(
    suite: str,
    config: dict[str, Any],
    machine: dict[str, Any],
    records: list[dict[str, Any]],
    notes: Iterable[str],
    plot: dict[str, str] | None,
    available: bool = True,
) -> dict[str, Any]:
    """A report (see the module docstring), with speedups filled in. `available` is False for a suite
    whose feature this build lacks (its notes say why, and it has no records)."""
    add_speedups(records)
    return {
        "suite": suite,
        "available": available,
        "config": config,
        "machine": machine,
        "notes": list(notes),
        "plot": plot,
        "records": records,
    }


def write_json(report: dict[str, Any], path: str) -> None:
    """Writes the report as indented JSON, creating the folder if needed."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")


def read_json(path: str) -> dict[str, Any]:
    """Reads a report written by `write_json`."""
    with open(path) as f:
        return json.load(f)

"""PNG plots of a report: throughput against the swept variable, one line per system (and op)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from gear_jax.bench.display import highlighted_system  # noqa: E402

MAX_PANELS = 16


def panels(records: list[dict[str, Any]], x: str) -> list[dict[str, Any]]:
    """One panel per distinct op and value of the point keys other than `x` that vary across records."""
    keys = [
        k for k in records[0]["point"] if k != x and len({json.dumps(r["point"][k]) for r in records}) > 1
    ]
    seen: dict[str, dict[str, Any]] = {}
    for r in records:
        fixed = {"op": r["op"], **{k: r["point"][k] for k in keys}}
        seen.setdefault(json.dumps(fixed, sort_keys=True), fixed)
    return list(seen.values())


def _matches(record: dict[str, Any], fixed: dict[str, Any]) -> bool:
    return all((record["op"] if k == "op" else record["point"][k]) == v for k, v in fixed.items())


def plot_report(report: dict[str, Any], path: str) -> bool:
    """Writes the plot to `path`; returns False (writing nothing) when there is nothing to plot."""
    spec, records = report.get("plot"), report["records"]
    if not spec or not records:
        return False
    x, y = spec["x"], spec["y"]
    scale = 1e-9 if y == "bytes_per_s" else 1.0
    groups = panels(records, x)[:MAX_PANELS]
    cols = min(len(groups), 2)
    rows = (len(groups) + cols - 1) // cols
    colors: dict[str, str] = {}
    gear = highlighted_system(records)  # drawn bold
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.2 * rows), squeeze=False)
    for ax, fixed in itertools.zip_longest(axes.flat, groups):
        if fixed is None:
            ax.axis("off")
            continue
        lines: dict[str, list[tuple[float, float]]] = {}
        for r in records:
            if _matches(r, fixed):
                lines.setdefault(r["system"], []).append((r["point"][x], r["throughput"][y] * scale))
        for system, xy in sorted(lines.items()):
            xs, ys = zip(*sorted(xy))
            ax.plot(
                xs,
                ys,
                marker="o",
                linewidth=2.5 if system == gear else 1.2,
                label=system,
                color=colors.setdefault(system, f"C{len(colors)}"),
            )
        if len({p for xy in lines.values() for p, _ in xy}) > 1:
            ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(x)
        ax.set_ylabel(spec["label"])
        ax.set_title(", ".join(f"{k}={v}" for k, v in fixed.items()), fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    machine = report["machine"]
    fig.suptitle(
        f"gear_jax.bench {report['suite']} - {machine['cpu']}, {machine['cpu_count']} cores", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True

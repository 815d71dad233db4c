"""`python -m gear_jax.bench.summary REPORT.json...`: a compact plain-text digest of reports.

For each report: its suite, machine and notes, the point values every record shares, then one line
per point and op with every system's p50 and GB/s side by side and, where a reference system ran,
gear_jax's GB/s over the reference's and its p50 over the reference's. Short enough to read in the
tail of a log; a missing report is named and skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from gear_jax.bench.common import GEAR, REFERENCES, read_json
from gear_jax.bench.display import format_seconds

NOTE_CHARS = 300


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The digest of one report, line by line."""
    machine = report["machine"]
    lines = [
        f"{report['suite']}: {machine['cpu']}, GPUs: {', '.join(machine['gpus']) or 'none'}, "
        f"jax {machine['versions'].get('jax')}, gear_jax {machine.get('gear_jax_revision')}"
    ]
    lines += [f"  note: {n[:NOTE_CHARS]}" for n in report["notes"]]
    records = report["records"]
    keys = list(records[0]["point"]) if records else []
    fixed = [k for k in keys if len({json.dumps(r["point"][k]) for r in records}) == 1]
    if fixed:
        lines.append("  every point: " + " ".join(f"{k}={records[0]['point'][k]}" for k in fixed))
    points: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        points.setdefault(json.dumps([r["point"], r["op"]]), []).append(r)
    for group in points.values():
        point = " ".join(f"{k}={group[0]['point'][k]}" for k in keys if k not in fixed)
        cells = [
            f"{r['system']} {format_seconds(r['latency_s']['p50']).replace(' ', '')} "
            f"{r['throughput']['bytes_per_s'] / 1e9:.3g}GB/s"
            for r in group
        ]
        gear = next((r for r in group if r["system"] == GEAR), None)
        for ref in REFERENCES:
            if gear is not None and f"time_ratio_vs_{ref}" in gear:
                cells.append(
                    f"gear/{ref}: GB/s {gear[f'bandwidth_fraction_vs_{ref}']:.2f}, "
                    f"p50 {gear[f'time_ratio_vs_{ref}']:.2f}"
                )
        lines.append(f"  {point} {group[0]['op']}: " + " | ".join(cells))
    return lines


def main(argv: list[str] | None = None) -> int:
    """Prints the digest of each report given."""
    p = argparse.ArgumentParser(prog="python -m gear_jax.bench.summary", description=__doc__.splitlines()[0])
    p.add_argument(
        "reports", nargs="+", help="report JSON files written by `python -m gear_jax.bench ... --json`"
    )
    for path in p.parse_args(argv).reports:
        if not os.path.exists(path):
            print(f"{path}: no report")
            continue
        print("\n".join(summary_lines(read_json(path))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

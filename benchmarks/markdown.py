"""`python -m gear_jax.bench.markdown REPORT.json`: a report's table as Markdown (for docs/BENCHMARKS.md).

One row per record: the point, system, op, p50/p75/p90/p95 latency, throughput, and for a baseline
the gear_jax speedup at the same point (its p50 / gear_jax's p50).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gear_jax.bench.common import read_json
from gear_jax.bench.display import table_cells


def markdown_table(report: dict[str, Any]) -> str:
    """The report's records as a Markdown table (or a line saying there are none)."""
    if not report["records"]:
        return "No measurements" + "".join(f": {n}" for n in report["notes"][:1])
    header, rows = table_cells(report["records"], "items")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Prints the Markdown table of one report."""
    p = argparse.ArgumentParser(prog="python -m gear_jax.bench.markdown", description=__doc__.splitlines()[0])
    p.add_argument("report", help="report JSON written by `python -m gear_jax.bench ... --json`")
    print(markdown_table(read_json(p.parse_args(argv).report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m gear_jax.bench.diff BASE.json TEST.json`: two reports side by side, per point.

For every (point, system, op) in either report it prints the p50 latency and throughput of both and
their relative difference, (test - base) / base. A point present in only one report shows "-".
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.table import Table as RichTable

from gear_jax.bench.common import read_json, record_key
from gear_jax.bench.display import console, format_seconds


def relative(base: float | None, test: float | None) -> str:
    """(test - base) / base as a signed percentage, or "-" when either is missing."""
    if base is None or test is None or base == 0:
        return "-"
    return f"{(test - base) / base * 100:+.1f}%"


def _values(record: dict[str, Any] | None) -> tuple[float | None, float | None]:
    if record is None:
        return None, None
    return record["latency_s"]["p50"], record["throughput"]["items_per_s"]


def diff_rows(base: dict[str, Any], test: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per record key in either report: point, system, op, both p50s and throughputs."""
    left = {record_key(r): r for r in base["records"]}
    right = {record_key(r): r for r in test["records"]}
    keys = list(left) + [k for k in right if k not in left]
    rows = []
    for key in keys:
        b, t = left.get(key), right.get(key)
        any_record = b if b is not None else t
        assert any_record is not None
        (b_p50, b_tp), (t_p50, t_tp) = _values(b), _values(t)
        rows.append(
            {
                "point": any_record["point"],
                "system": any_record["system"],
                "op": any_record["op"],
                "base_p50": b_p50,
                "test_p50": t_p50,
                "base_tp": b_tp,
                "test_tp": t_tp,
            }
        )
    return rows


def print_diff(base: dict[str, Any], test: dict[str, Any], base_name: str, test_name: str) -> None:
    """Prints the side-by-side table of `diff_rows`."""
    console.print(
        f"base: {base_name} ({base['suite']}, {base['machine']['cpu']}, "
        f"gear_jax {base['machine']['gear_jax']['version']})"
    )
    console.print(
        f"test: {test_name} ({test['suite']}, {test['machine']['cpu']}, "
        f"gear_jax {test['machine']['gear_jax']['version']})"
    )
    rows = diff_rows(base, test)
    if not rows:
        console.print("no measurements in either report")
        return
    table = RichTable()
    for col in (
        "point",
        "system",
        "op",
        "base p50",
        "test p50",
        "p50 diff",
        "base items/s",
        "test items/s",
        "items/s diff",
    ):
        table.add_column(col, justify="left" if col in ("point", "system", "op") else "right")
    for r in rows:
        table.add_row(
            json.dumps(r["point"]),
            r["system"],
            r["op"],
            format_seconds(r["base_p50"]) if r["base_p50"] is not None else "-",
            format_seconds(r["test_p50"]) if r["test_p50"] is not None else "-",
            relative(r["base_p50"], r["test_p50"]),
            f"{r['base_tp']:.4g}" if r["base_tp"] is not None else "-",
            f"{r['test_tp']:.4g}" if r["test_tp"] is not None else "-",
            relative(r["base_tp"], r["test_tp"]),
        )
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    """Reads both reports and prints their comparison."""
    p = argparse.ArgumentParser(prog="python -m gear_jax.bench.diff", description=__doc__.splitlines()[0])
    p.add_argument("base", help="report JSON written by `python -m gear_jax.bench ... --json`")
    p.add_argument("test", help="report JSON to compare against the base")
    args = p.parse_args(argv)
    print_diff(read_json(args.base), read_json(args.test), args.base, args.test)
    return 0


if __name__ == "__main__":
    sys.exit(main())

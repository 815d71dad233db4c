"""Console output of the suites: the header (configuration and machine), notes, progress and result tables."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable
from tqdm import tqdm

from gear_jax.bench.common import GEAR, GEAR_HOST, PERCENTILES

TABLE_WIDTH = 200
FRACTION = "bandwidth_fraction_vs_"
ACHIEVED_RATIO = "achieved_samples_per_insert"  # actor_learner with a rate limiter
# The system shown (and plotted) as gear_jax in a suite that has none named `gear_jax`: the first of these
# that ran (the remote suite's gear_jax_remote).
HIGHLIGHT_FALLBACKS = ("gear_jax_remote",)

console = Console(highlight=False, width=None if sys.stdout.isatty() else TABLE_WIDTH)


def progress(total: int, desc: str) -> tqdm:
    """A progress bar on stderr counting timed iterations."""
    return tqdm(total=total, desc=desc, unit="it", leave=False, dynamic_ncols=True, disable=None)


def note(text: str) -> None:
    """Prints a note (a skipped baseline, a cap applied, ...) as it happens."""
    console.print(f"[yellow]note:[/yellow] {text}")


def print_header(suite: str, config: dict[str, Any], machine: dict[str, Any]) -> None:
    """Prints the suite, its configuration and the machine it runs on."""
    build = machine["gear_jax"]
    console.rule(f"gear_jax.bench {suite}")
    console.print(f"config: {json.dumps(config, sort_keys=True)}")
    console.print(
        f"machine: {machine['cpu']}, {machine['cpu_count']} cores, {machine['memory_gib']} GiB; "
        f"GPUs: {', '.join(machine['gpus']) or 'none'}; jax devices: {', '.join(machine['devices'])}"
    )
    console.print(
        f"gear_jax {build['version']} (cuda={build['cuda']}, ffi {','.join(build['ffi_platforms'])}), "
        f"jax {build['jax']}, jaxlib {build['jaxlib']}, python {machine['python']}"
    )


def format_seconds(seconds: float) -> str:
    """Seconds as a short string in us or ms."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    return f"{seconds * 1e3:.3f} ms"


def format_rate(value: float, unit: str) -> str:
    """A rate with an SI prefix, e.g. 1.2 G rows/s."""
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value:.1f} {unit}"


def highlighted_system(records: Sequence[dict[str, Any]]) -> str:
    """The system the table compares the others with (its "speedup" column) and the plot draws bold:
    `gear_jax`, or in a suite without it the first of HIGHLIGHT_FALLBACKS among the records."""
    systems = {r["system"] for r in records}
    if GEAR in systems:
        return GEAR
    return next((s for s in HIGHLIGHT_FALLBACKS if s in systems), GEAR)


def table_cells(records: Sequence[dict[str, Any]], item_unit: str) -> tuple[list[str], list[list[str]]]:
    """Header and one row of strings per record: the point, system, op, latency percentiles,
    throughput, and for a baseline the gear_jax speedup at the same point (its p50 / gear_jax's p50; the
    `highlighted_system`'s, named in the column's header, where a suite has no system named gear_jax).
    Where a reference system ran, two more columns give, in gear_jax's rows, its GB/s as a fraction of
    the reference's and its p50 over the reference's. Records of a rate-limited run add the achieved
    samples per insert."""
    keys = list(records[0]["point"]) if records else []
    gear = highlighted_system(records)
    refs = sorted({k.removeprefix(FRACTION) for r in records for k in r if k.startswith(FRACTION)})
    header = [
        *keys,
        "system",
        "op",
        *(f"p{p}" for p in PERCENTILES),
        f"{item_unit}/s",
        "GB/s",
        f"{gear} speedup",
    ]
    hosted = any(r["system"] == GEAR_HOST for r in records)
    if hosted:
        header.append(f"{GEAR_HOST} speedup")
    for ref in refs:
        header += [f"GB/s / {ref}", f"p50 / {ref}"]
    ratios = any(ACHIEVED_RATIO in r for r in records)
    if ratios:
        header.append("samples/insert")
    by_system = {
        g: {(json.dumps(r["point"], sort_keys=True), r["op"]): r for r in records if r["system"] == g}
        for g in (gear, GEAR_HOST)
    }

    def speedup_cell(g: str, r: dict[str, Any]) -> str:
        target = by_system[g].get((json.dumps(r["point"], sort_keys=True), r["op"]))
        speedup = target.get(f"speedup_vs_{r['system']}") if target is not None else None
        return f"{speedup:.2f}x" if speedup is not None else ""

    rows = []
    for r in records:
        rows.append(
            [
                *(str(r["point"][k]) for k in keys),
                r["system"],
                r["op"],
                *(format_seconds(r["latency_s"][f"p{p}"]) for p in PERCENTILES),
                format_rate(r["throughput"]["items_per_s"], ""),
                f"{r['throughput']['bytes_per_s'] / 1e9:.3f}",
                speedup_cell(gear, r),
                *([speedup_cell(GEAR_HOST, r)] if hosted else []),
                *(cell for ref in refs for cell in _reference_cells(r, ref)),
                *([f"{r[ACHIEVED_RATIO]:.3f}" if ACHIEVED_RATIO in r else ""] if ratios else []),
            ]
        )
    return header, rows


def _reference_cells(record: dict[str, Any], ref: str) -> tuple[str, str]:
    fraction, ratio = record.get(FRACTION + ref), record.get(f"time_ratio_vs_{ref}")
    return (f"{fraction:.2f}" if fraction is not None else "", f"{ratio:.2f}x" if ratio is not None else "")


def print_table(records: Sequence[dict[str, Any]], item_unit: str) -> None:
    """Prints `table_cells` as a rich table."""
    if not records:
        console.print("no measurements")
        return
    header, rows = table_cells(records, item_unit)
    table = RichTable()
    for i, name in enumerate(header):
        if name in ("system", "op"):  # never cut: the longest name sets the width
            table.add_column(name, justify="left", min_width=max(len(row[i]) for row in rows))
        else:
            table.add_column(name, justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)

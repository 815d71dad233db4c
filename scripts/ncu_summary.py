"""Medians of the kernel times in Nsight Compute's CSV (`ncu --csv --metrics gpu__time_duration.sum`), one
line per kernel and launch shape: how long each of gear_jax's kernels runs on the GPU, apart from the
dispatch around it (scripts/gpu_check.sh, stage ncu).

Usage: python scripts/ncu_summary.py NCU_LOG
"""

import csv
import re
import statistics
import sys


def kernel_times(lines):
    """{(kernel, block, grid): [microseconds]} from the CSV lines among `lines` (other output is skipped)."""
    rows = [line for line in lines if line.startswith('"')]
    times = {}
    for record in csv.DictReader(rows):
        if record.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = record.get("Metric Unit", "")
        value = float(record["Metric Value"].replace(",", ""))
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}.get(unit)
        if scale is None:
            continue
        name = record["Kernel Name"].replace("(anonymous namespace)::", "")
        name = re.sub(r"^(void )?(gear::)?", "", re.sub(r"\(.*", "", name))  # without the parameter list
        times.setdefault((name, record["Block Size"], record["Grid Size"]), []).append(value * scale)
    return times


def main():
    with open(sys.argv[1], errors="replace") as f:
        times = kernel_times(f.read().splitlines())
    if not times:
        raise SystemExit("no kernel times found")
    print(f"{'kernel':<44} {'block':>14} {'grid':>16} {'calls':>5} {'median us':>10}")
    for (name, block, grid), values in sorted(times.items()):
        print(f"{name[:44]:<44} {block:>14} {grid:>16} {len(values):>5} {statistics.median(values):>10.2f}")


if __name__ == "__main__":
    main()

"""`scripts/result_mapping_probe.py`: a jitted result's page faults against the host path's, run small."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "result_mapping_probe.py"


def test_the_probe_times_both_paths_at_each_batch_and_counts_their_page_faults() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rows=64", "--row_kib=4", "--batches=8,16", "--calls=3"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    line = re.compile(
        r"^batch (\d+) \((\d+) MiB\) (jit|host): p50 ([\d.]+) ms, ([\d.]+) us per row, (\d+) page faults"
    )
    found = [line.match(s).groups() for s in done.stdout.splitlines() if line.match(s)]
    assert [(b, path) for b, _, path, *_ in found] == [
        ("8", "jit"),
        ("8", "host"),
        ("16", "jit"),
        ("16", "host"),
    ]
    for batch, _, _, ms, per_row, _ in found:
        # the per-row time is the call's p50 over its rows (the call's is printed to 0.01 ms)
        assert float(per_row) > 0 and abs(float(per_row) * int(batch) / 1e3 - float(ms)) <= 0.006

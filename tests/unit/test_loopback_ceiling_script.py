"""`scripts/loopback_ceiling.py`: the TCP ceiling under the remote writers' figures, run small."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "loopback_ceiling.py"


def test_the_script_measures_streams_and_a_ping_pong_between_processes(tmp_path: Path) -> None:
    out = tmp_path / "ceiling.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--senders=1,2", "--seconds=0.3", "--message_kib=64", "--pings=200",
         f"--json={out}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    streams = report["stream_gb_per_s"]
    assert set(streams) == {"1", "2"} and all(0.01 < v < 1000 for v in streams.values()), streams
    ping = report["ping_pong"]
    assert ping["bytes"] == 1024 and 0 < ping["p50_us"] <= ping["p90_us"] < 1e6, ping

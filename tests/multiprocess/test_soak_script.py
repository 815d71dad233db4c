"""scripts/soak.py, shortly: writers killed at random while the learner samples and checkpoints the table;
the script checks every gathered step and every step of every checkpoint, and exits 1 on any fault."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "soak.py"


def test_a_short_soak_with_checkpoints_finds_no_fault(tmp_path):
    report = tmp_path / "soak.json"
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--duration_s=12",
            "--writers=2",
            "--mean_kill_interval_s=0.05",
            "--capacity=512",
            "--batch_size=64",
            "--report_every_s=3",
            "--checkpoint_every_s=2",
            f"--checkpoint_dir={tmp_path / 'checkpoints'}",
            f"--json={report}",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0 and "soak: passed" in done.stdout, done.stdout[-2000:] + done.stderr[-4000:]
    summary = json.loads(report.read_text())["summary"]
    assert summary["kills"] > 20 and summary["torn_steps"] == 0
    assert summary["checkpoints_saved"] >= 3 and summary["checkpoints_loaded"] == summary["checkpoints_saved"]
    assert summary["checkpoint_steps_checked"] > 0 and summary["checkpoint_torn_steps"] == 0

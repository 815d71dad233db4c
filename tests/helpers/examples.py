"""Running the scripts of examples/ as a user would, and reading their summary line."""

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository


def run_example(script: str, *args: str, timeout: float, env: dict[str, str] | None = None):
    """Runs examples/`script` with `args` from the repository root (`env` added to this environment),
    bounded by `timeout` seconds. Returns the fields of its one `summary: ` line (name -> text) and the
    finished process; fails with the example's output when it exits non-zero or prints no summary line,
    or several."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )
    assert done.returncode == 0, f"examples/{script} failed:\n{done.stdout}\n{done.stderr[-6000:]}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("summary: ")]
    assert len(lines) == 1, f"expected one summary line from examples/{script} in:\n{done.stdout}"
    return dict(re.findall(r"(\w+)=(\S+)", lines[0])), done


def numbers(fields: dict[str, str]) -> dict[str, float]:
    """A summary's fields as floats."""
    return {k: float(v) for k, v in fields.items()}

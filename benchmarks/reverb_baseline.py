"""The Reverb baseline: runs `reverb_worker.py` under another interpreter and reads its timings."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from typing import Any

import numpy as np

from gear_jax.bench.common import Unavailable
from gear_jax.bench.systems import System, Workload

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reverb_worker.py")
SETUP_INSERT_BATCH = 100


def run_worker(
    python: str | None, config: dict[str, Any], timeout_s: float, worker: str = WORKER
) -> dict[str, Any]:
    """Runs the worker script `worker` (reverb_worker.py by default) with `config` under `python`;
    returns its JSON result.

    Raises:
      Unavailable: no interpreter was given, it does not exist, or the worker failed.
    """
    if not python:
        raise Unavailable(
            "Reverb needs --reverb_python=PATH (an interpreter with dm-reverb; see docs/BENCHMARKS.md)"
        )
    if not os.path.exists(python):
        raise Unavailable(f"--reverb_python={python} does not exist")
    try:
        done = subprocess.run(
            [python, worker], input=json.dumps(config), capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        raise Unavailable(f"the Reverb worker ran longer than {timeout_s:.0f} s") from None
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise Unavailable(f"the Reverb worker failed (exit {done.returncode}): {tail}")
    return json.loads(done.stdout)


class ReverbSystem(System):
    """Reverb: a local server in another interpreter, sampled through `reverb.TrajectoryDataset`."""

    name = "reverb"
    interleavable = False  # timed inside its worker process

    def __init__(self, work: Workload, python: str | None, timeout_s: float):
        super().__init__(work)
        if work.method not in ("uniform", "prioritized"):
            raise Unavailable(
                f"Reverb's {work.method} selector returns one item repeatedly, not {work.method} batches"
            )
        if not python:
            raise Unavailable(
                "Reverb needs --reverb_python=PATH (an interpreter with dm-reverb; see docs/BENCHMARKS.md)"
            )
        self.python = python
        self.timeout_s = timeout_s
        self.versions: dict[str, Any] = {}

    def latencies(
        self, batch_sizes: list[int], warmup: int, iters: int, tick: Callable[[], None]
    ) -> dict[int, np.ndarray]:
        work = self.work
        data = work.data
        config = {
            "rows": data.rows,
            "steps": data.steps,
            "item_bytes": data.item_bytes,
            "seed": data.seed,
            "window": work.window,
            "method": work.method,
            "priority_exponent": work.priority_exponent,
            "batch_sizes": batch_sizes,
            "warmup": warmup,
            "iters": iters,
            "insert_batch": min(SETUP_INSERT_BATCH, data.rows),
        }
        result = run_worker(self.python, config, self.timeout_s)
        self.versions = result["versions"]
        for _ in range(len(batch_sizes) * iters):
            tick()
        return {int(b): np.asarray(v) for b, v in result["sample"].items()}

    def describe(self) -> str:
        return f"reverb versions: {self.versions}"

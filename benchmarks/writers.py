"""Writer processes: each attaches to a gear_jax table by name and inserts batches, timing every call.

Started with multiprocessing's spawn context. A writer inserts `warmup` untimed batches, waits at
the barrier with the other writers and the parent, then inserts `iters` timed batches, or, when
`iters` is None, until the parent sets `stop` (at least one). It puts (latencies, start, end) on
`results`; the times come from time.perf_counter, which on Linux is one clock for all processes.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import time
from typing import Any

import gear_jax as gj
from gear_jax.bench.data import Dataset

BARRIER_TIMEOUT_S = 300.0


@dataclasses.dataclass(frozen=True)
class WriterJob:
    """What one writer process does."""

    table: str
    item_bytes: int
    batch: int
    warmup: int
    iters: int | None
    seed: int


@dataclasses.dataclass(frozen=True)
class WriterResult:
    """Seconds per timed insert call, and when the timed part started and ended (perf_counter)."""

    latencies: list[float]
    start: float
    end: float


def writer_main(job: WriterJob, barrier: Any, stop: Any, results: Any) -> None:
    """The body of a writer process (see the module docstring)."""
    table = gj.Table.attach(job.table)
    rows = Dataset(job.batch, 1, job.item_bytes, job.seed).as_array()[:, 0]
    for _ in range(job.warmup):
        table.insert({"x": rows})
    barrier.wait(BARRIER_TIMEOUT_S)
    latencies: list[float] = []
    start = time.perf_counter()
    while True:  # at least one timed insert, even when the parent is already done
        t0 = time.perf_counter()
        table.insert({"x": rows})
        latencies.append(time.perf_counter() - t0)
        if len(latencies) == job.iters or (job.iters is None and stop.is_set()):
            break
    end = time.perf_counter()
    table.close()
    results.put(WriterResult(latencies, start, end))


class Writers:
    """`count` writer processes on one table; `start()` releases them, `finish()` collects results."""

    def __init__(self, count: int, job: WriterJob):
        ctx = mp.get_context("spawn")
        self.barrier = ctx.Barrier(count + 1)
        self.stop = ctx.Event()
        self.results = ctx.Queue()
        self.procs = [
            ctx.Process(
                target=writer_main,
                args=(dataclasses.replace(job, seed=job.seed + k), self.barrier, self.stop, self.results),
                daemon=True,
            )
            for k in range(count)
        ]
        for p in self.procs:
            p.start()

    def start(self) -> None:
        """Waits until every writer is ready, which releases them all."""
        self.barrier.wait(BARRIER_TIMEOUT_S)

    def finish(self) -> list[WriterResult]:
        """Stops open-ended writers and returns every writer's result.

        Raises:
          RuntimeError: a writer exited without a result.
        """
        self.stop.set()
        out = [self.results.get(timeout=BARRIER_TIMEOUT_S) for _ in self.procs]
        for p in self.procs:
            p.join(BARRIER_TIMEOUT_S)
            if p.exitcode != 0:
                raise RuntimeError(f"writer process {p.pid} exited with code {p.exitcode}")
        return out

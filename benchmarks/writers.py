"""Writer processes: each attaches to a gear_jax table by name and inserts batches, timing every call.

Started with multiprocessing's spawn context. A writer inserts `warmup` untimed batches, waits at
the barrier with the other writers and the parent, then inserts `iters` timed batches, or, when
`iters` is None, until the parent sets `stop` (at least one). It puts (latencies, start, end) on
`results`; the times come from time.perf_counter, which on Linux is one clock for all processes.

On a table with a rate limiter (`rate_limited`), an insert may wait for the learner: its latency
includes the wait, and a writer waiting when the parent sets `stop` leaves without that insert (it
looks at `stop` every `STOP_CHECK_S` of waiting), so it may end with no timed insert at all.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import time
from typing import Any

import gear_jax as gj
from gear_jax.bench.data import Dataset

BARRIER_TIMEOUT_S = 300.0
STOP_CHECK_S = 0.1


@dataclasses.dataclass(frozen=True)
class WriterJob:
    """What one writer process does."""

    table: str
    item_bytes: int
    batch: int
    warmup: int
    iters: int | None
    seed: int
    rate_limited: bool = False


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
    while True:  # at least one timed insert, even when the parent is already done (unless rate limited)
        t0 = time.perf_counter()
        if not insert_unless_stopped(table, rows, job.rate_limited, stop):
            break
        latencies.append(time.perf_counter() - t0)
        if len(latencies) == job.iters or (job.iters is None and stop.is_set()):
            break
    end = time.perf_counter()
    table.close()
    results.put(WriterResult(latencies, start, end))


def insert_unless_stopped(table: gj.Table, rows: Any, rate_limited: bool, stop: Any) -> bool:
    """Inserts `rows`; on a rate-limited table, waits for the limiter until admitted (True) or until
    `stop` is set (False, nothing inserted)."""
    if not rate_limited:
        table.insert({"x": rows})
        return True
    while True:
        try:
            table.insert({"x": rows}, timeout=STOP_CHECK_S)
            return True
        except gj.RateLimiterTimeout:
            if stop.is_set():
                return False


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

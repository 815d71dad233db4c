"""The measuring loop of the `remote` suite, one for every system: actor processes that time insert
calls, and the coordinator that releases them point by point and counts what the server received.

A system's actor processes start once and run every point (insert batch x item size) in turn. Per point:

  1. the coordinator reads the server's count of rows received, then every party meets at the barrier;
  2. each actor opens the point (`open_point(point)`: a context manager yielding the call, which inserts
     the point's `insert_batch` rows of `item_bytes` and returns once the server holds them, or a
     `Buffered` call, see below), makes `WARMUP_CALLS` untimed calls (a `Buffered` system then flushes,
     untimed), and meets the others at the barrier again: the release;
  3. each actor times calls back to back until `seconds` have passed since its release (at least one),
     (a `Buffered` system then flushes once, timed: its last call's return is the flush's), then puts an
     `ActorReport` on the results queue;
  4. the coordinator collects the reports and reads the server's count again.

A `Buffered` system's call keeps or streams its rows without waiting for the server's acknowledgement;
its `flush` returns once the server holds every row of the calls before it. Its latencies are those of
the calls alone (the acknowledgement is waited for once per point, in the flush, which counts in the
point's wall time and so in its throughput, not in any call's latency).

Times come from `time.perf_counter`, one clock for every process on Linux, so the point's wall time is
the last call's return (any actor) minus the first release. This file imports only the standard library
and numpy: Reverb's worker, under another interpreter, loads it by path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ContextManager

import numpy as np

WARMUP_CALLS = 2
BARRIER_TIMEOUT_S = 300.0  # the first wait includes the actors' start (imports) on a busy machine
POLL_S = 0.5  # the coordinator checks its actor processes this often while it waits
Point = dict[str, int]  # {"insert_batch": rows per call, "item_bytes": bytes per row}


@dataclasses.dataclass(frozen=True)
class ActorReport:
    """One actor's calls at one point: seconds per timed call, rows sent (warmup included), and when its
    timed calls began (its release) and ended (perf_counter)."""

    actor: int
    point: int
    latencies: np.ndarray
    rows_sent: int
    released: float
    finished: float


@dataclasses.dataclass(frozen=True)
class Buffered:
    """What `open_point` yields for a system whose call returns before the server acknowledges its rows:
    the call, and `flush`, which returns once the server holds the rows of every call before it."""

    call: Callable[[], Any]
    flush: Callable[[], Any]


def points(insert_batches: list[int], item_bytes: list[int]) -> list[Point]:
    """Every (item size, insert batch), item size outermost: the order every system runs them in."""
    return [{"insert_batch": b, "item_bytes": d} for d in item_bytes for b in insert_batches]


def run_actor(
    actor: int,
    open_point: Callable[[Point], ContextManager[Callable[[], Any] | Buffered]],
    sweep: list[Point],
    seconds: float,
    barrier: Any,
    results: Any,
) -> None:
    """The measuring part of an actor process: every point of `sweep` in turn (see the module docstring)."""
    for index, point in enumerate(sweep):
        barrier.wait(BARRIER_TIMEOUT_S)
        with open_point(point) as opened:
            call, flush = (opened.call, opened.flush) if isinstance(opened, Buffered) else (opened, None)
            for _ in range(WARMUP_CALLS):
                call()
            if flush is not None:
                flush()  # the warmup's rows reach the server before the release
            barrier.wait(BARRIER_TIMEOUT_S)
            latencies: list[float] = []
            released = now = time.perf_counter()
            deadline = released + seconds
            while not latencies or now < deadline:
                start = now
                call()
                now = time.perf_counter()
                latencies.append(now - start)
            if flush is not None:
                flush()  # inside the timed window: the point ends once the server holds every row
                now = time.perf_counter()
        rows_sent = point["insert_batch"] * (WARMUP_CALLS + len(latencies))
        results.put(ActorReport(actor, index, np.asarray(latencies), rows_sent, released, now))


def coordinate(
    actors: int,
    sweep: list[Point],
    barrier: Any,
    results: Any,
    rows_received: Callable[[Point], int],
    failure: Callable[[], str | None] | None = None,
) -> Iterator[dict[str, Any]]:
    """The coordinator's side: yields one summary per point of `sweep`, as the actors finish it.

    Args:
      actors: actor processes running `run_actor` on the same barrier (of actors + 1 parties) and queue.
      rows_received: the server's count of rows inserted into the point's table so far.
      failure: says why the run cannot go on (an actor process died), or None while it can; checked every
        `POLL_S`, it breaks the barrier so that nobody waits for the dead.

    A summary: {**point, "latencies_s": float64[calls of every actor], "wall_s", "rows_timed",
    "rows_sent" (warmup included), "rows_received", "calls_per_actor": [int]}.

    Raises:
      RuntimeError: `failure` said so, or the actors did not report within BARRIER_TIMEOUT_S.
    """
    with _watchdog(barrier, failure):
        for index, point in enumerate(sweep):
            before = rows_received(point)
            _wait(barrier, failure)
            _wait(barrier, failure)
            reports = sorted((_get(results, failure) for _ in range(actors)), key=lambda r: r.actor)
            if any(r.point != index for r in reports):
                raise RuntimeError(
                    f"remote: actor reports for points {[r.point for r in reports]}, not {index}"
                )
            yield {
                **point,
                "latencies_s": np.concatenate([r.latencies for r in reports]),
                "wall_s": max(r.finished for r in reports) - min(r.released for r in reports),
                "rows_timed": point["insert_batch"] * sum(len(r.latencies) for r in reports),
                "rows_sent": sum(r.rows_sent for r in reports),
                "rows_received": rows_received(point) - before,
                "calls_per_actor": [len(r.latencies) for r in reports],
            }


@contextlib.contextmanager
def _watchdog(barrier: Any, failure: Callable[[], str | None] | None) -> Iterator[None]:
    """Aborts `barrier` once `failure()` says something, until the block ends."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(POLL_S):
            if failure() is not None:
                barrier.abort()
                return

    thread = threading.Thread(target=watch, daemon=True) if failure is not None else None
    if thread is not None:
        thread.start()
    try:
        yield
    finally:
        done.set()
        if thread is not None:
            thread.join()


def _wait(barrier: Any, failure: Callable[[], str | None] | None) -> None:
    try:
        barrier.wait(BARRIER_TIMEOUT_S)
    except threading.BrokenBarrierError:
        why = failure() if failure is not None else None
        raise RuntimeError(
            f"remote: the actors did not all reach the barrier: {why or 'timed out'}"
        ) from None


def _get(results: Any, failure: Callable[[], str | None] | None) -> ActorReport:
    deadline = time.monotonic() + BARRIER_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            return results.get(timeout=POLL_S)
        except queue.Empty:
            why = failure() if failure is not None else None
            if why is not None:
                raise RuntimeError(f"remote: {why}") from None
    raise RuntimeError(f"remote: an actor did not report within {BARRIER_TIMEOUT_S:.0f} s")

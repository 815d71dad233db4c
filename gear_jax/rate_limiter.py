"""Flow control between actors and learners sharing a table: the settings of a table's rate limiter.

A table created with `Table.create(spec, rate_limiter=gj.RateLimiter(...))` keeps the limiter in its
shared header, so every process attached to it (actors inserting, a learner sampling) obeys the same
settings and raises the same counts (xla_ffi/rate_limiter.h has the native side).

The limiter follows the samples-per-insert ratio of Reverb's `SampleToInsertRatio`, in these terms:

- `diff = inserts * samples_per_insert - samples` says how many samples the learner is behind the ratio;
  `offset = samples_per_insert * min_size_to_sample`; `min_diff = offset - error_buffer` and
  `max_diff = offset + error_buffer` bound it.
- An insert of n rows may proceed when `diff + n * samples_per_insert <= max_diff`: actors wait while the
  learner is too far behind.
- n samples may proceed when the table holds at least `min_size_to_sample` rows and
  `diff - n >= min_diff`: the learner waits while the actors are too far behind.
- Without `samples_per_insert`, only the size condition applies: samples wait until the table holds
  `min_size_to_sample` rows, inserts never wait.

Where waits happen: on the host only, never inside an XLA computation. `Table.insert`, `Table.add` and
`EpisodeWriter.end_episode` wait (before claiming rows) until their rows are admitted; the learner calls
`table.await_samples(batch_size)` before each jitted sampling step, which waits until the samples are
admitted and counts them. Jitted `gj.sample` calls count nothing and never wait: the learner declares
its samples through `await_samples`. Rows inserted from inside jit (`gj.insert`) count as
inserts without waiting. Waits take a `timeout` in seconds (None: as long as it takes) and raise
`RateLimiterTimeout` when it runs out, or `TableClosedError` when the table is closed meanwhile (by this
process or by the creator).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

from gear_jax.errors import InvalidArgumentError


@dataclasses.dataclass(frozen=True)
class RateLimiter:
    """The settings of a table's rate limiter (see the module docstring for the rules).

    Args:
      min_size_to_sample: samples wait until the table holds this many rows (>= 1, at most the table's
        capacity).
      samples_per_insert: the target number of samples per inserted row (> 0), or None for no ratio
        (then only `min_size_to_sample` applies, and inserts never wait).
      error_buffer: how far (in samples) `diff` may stray from the ratio's target either way; required
        with `samples_per_insert`. It must be at least `(samples_per_insert + 1) / 2`, so that from any
        state one insert or one sample may proceed. With batches, a learner sampling `B` at a time and
        actors inserting `n` rows at a time both keep moving when
        `error_buffer >= (B + n * samples_per_insert) / 2`. A single insert of more rows than
        `2 * error_buffer / samples_per_insert` goes in only while the table fills, before sampling
        starts; later it is refused (InvalidArgumentError naming the largest batch that can wait).

    Raises:
      InvalidArgumentError: a setting out of range, or an `error_buffer` too small to let an insert
        or a sample proceed from every state.
    """

    min_size_to_sample: int = 1
    samples_per_insert: float | None = None
    error_buffer: float | None = None

    def __post_init__(self) -> None:
        size = self.min_size_to_sample
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
            raise InvalidArgumentError(
                f"RateLimiter: min_size_to_sample={size!r} must be an integer >= 1 (rows the table holds "
                "before samples may proceed)"
            )
        object.__setattr__(self, "min_size_to_sample", int(size))
        ratio, buffer = self.samples_per_insert, self.error_buffer
        if ratio is None:
            if buffer is not None:
                raise InvalidArgumentError(
                    f"RateLimiter: error_buffer={buffer!r} is a tolerance around samples_per_insert, which "
                    "is None; pass samples_per_insert too, or leave error_buffer out"
                )
            return
        ratio = _number(ratio, "samples_per_insert")
        if not ratio > 0:
            raise InvalidArgumentError(
                f"RateLimiter: samples_per_insert={ratio!r} must be > 0 (or None for no ratio)"
            )
        if buffer is None:
            raise InvalidArgumentError(
                f"RateLimiter: samples_per_insert={ratio!r} needs an error_buffer (the tolerance in "
                f"samples), at least (samples_per_insert + 1) / 2 = {(ratio + 1) / 2:g}; "
                "e.g. the learner's batch size plus an actor's insert batch times samples_per_insert"
            )
        buffer = _number(buffer, "error_buffer")
        if not 2 * buffer >= ratio + 1:
            raise InvalidArgumentError(
                f"RateLimiter: error_buffer={buffer!r} is too small for samples_per_insert={ratio!r}: "
                "inserts and samples could both be refused for good. Pass error_buffer >= "
                f"(samples_per_insert + 1) / 2 = {(ratio + 1) / 2:g}; with batches, >= (learner batch + "
                "insert batch * samples_per_insert) / 2"
            )
        object.__setattr__(self, "samples_per_insert", ratio)
        object.__setattr__(self, "error_buffer", buffer)

    @property
    def min_diff(self) -> float | None:
        """`samples_per_insert * min_size_to_sample - error_buffer` (None without a ratio)."""
        if self.samples_per_insert is None or self.error_buffer is None:
            return None
        return self.samples_per_insert * self.min_size_to_sample - self.error_buffer

    @property
    def max_diff(self) -> float | None:
        """`samples_per_insert * min_size_to_sample + error_buffer` (None without a ratio)."""
        if self.samples_per_insert is None or self.error_buffer is None:
            return None
        return self.samples_per_insert * self.min_size_to_sample + self.error_buffer

    def native_settings(self) -> tuple[int, float, float]:
        """(min_size_to_sample, samples_per_insert or 0, error_buffer or 0): what the table's shared
        header stores (the native create takes it)."""
        return (self.min_size_to_sample, self.samples_per_insert or 0.0, self.error_buffer or 0.0)


@dataclasses.dataclass(frozen=True)
class RateLimiterCounts:
    """A table's limiter counts, shared by every process (`Table.rate_limiter_counts()`).

    Attributes:
      inserts: rows admitted by the limiter since the table was made (host inserts count when admitted,
        before their rows are published; `gj.insert` inside jit counts rows as it publishes them). A
        process killed between its admission and its publication has what it never published taken
        back once it is found gone (docs/ARCHITECTURE.md, "Rate limiting").
      samples: samples admitted by `await_samples`.
      size: rows holding a committed trajectory now (`Table.size`).
      diff: `inserts * samples_per_insert - samples`; None without a ratio.
    """

    inserts: int
    samples: int
    size: int
    diff: float | None


def check_timeout(timeout: Any, op: str) -> float | None:
    """`timeout` as seconds for the native waits (None, or inf: no limit); InvalidArgumentError naming
    `op` for anything but a number >= 0."""
    if timeout is None:
        return None
    seconds = _number(timeout, "timeout", op)
    if math.isnan(seconds) or seconds < 0:
        raise InvalidArgumentError(
            f"{op}: timeout={timeout!r} must be seconds >= 0, or None to wait for good"
        )
    return None if math.isinf(seconds) else seconds


def check_count(n: Any, op: str) -> int:
    """`n` (a number of samples) as an int >= 1; InvalidArgumentError naming `op` otherwise."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise InvalidArgumentError(f"{op}: n={n!r} must be an integer >= 1 (the samples of the next step)")
    if n > _MAX_COUNT:
        raise InvalidArgumentError(f"{op}: n={n!r} is beyond any count a table holds (at most {_MAX_COUNT})")
    return int(n)


_MAX_COUNT = 2**63 - 1  # the limiter's counts are int64


def _number(value: Any, name: str, op: str = "RateLimiter") -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgumentError(f"{op}: {name}={value!r} must be a number")
    v = float(value)
    if name != "timeout" and not math.isfinite(v):
        raise InvalidArgumentError(f"{op}: {name}={value!r} must be finite")
    return v

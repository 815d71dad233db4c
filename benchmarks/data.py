"""The rows every system of a suite holds: the same bytes, made chunk by chunk (no extra full copy)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

POOL_ROWS = 256
CHUNK_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class Dataset:
    """`rows` rows of `steps` steps of `item_bytes` uint8 each, with per-row priorities.

    Row r is random pool row r % 256 with its first 4 bytes (when there are 4) set to r, little
    endian, so that every row differs and a gathered row can be checked.
    """

    rows: int
    steps: int
    item_bytes: int
    seed: int = 0

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (all its steps)."""
        return self.steps * self.item_bytes

    @property
    def chunk_rows(self) -> int:
        """Rows per chunk: about 64 MiB, at least 1."""
        return max(1, min(self.rows, CHUNK_BYTES // self.row_bytes))

    def _pool(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        pool_rows = min(POOL_ROWS, self.rows)
        return rng.integers(0, 256, (pool_rows, self.steps, self.item_bytes), dtype=np.uint8)

    def _stamp(self, first_steps: np.ndarray, ids: np.ndarray) -> None:
        """Writes each row's id into the first 4 bytes of its first step (uint8[n, item_bytes])."""
        if self.item_bytes >= 4:
            first_steps[:, :4] = ids.astype("<u4").view(np.uint8).reshape(-1, 4)

    def chunks(self) -> Iterator[tuple[int, np.ndarray]]:
        """Yields (first row, uint8[c, steps, item_bytes]) covering rows 0..rows-1 in order."""
        pool = self._pool()
        for start in range(0, self.rows, self.chunk_rows):
            ids = np.arange(start, min(self.rows, start + self.chunk_rows))
            chunk = pool[ids % len(pool)]
            self._stamp(chunk[:, 0], ids)
            yield start, chunk

    def step_column(self, step: int) -> np.ndarray:
        """Step `step` of every row, uint8[rows, item_bytes] (for buffers filled one time step at a time)."""
        pool = self._pool()
        ids = np.arange(self.rows)
        column = pool[ids % len(pool), step]
        if step == 0:
            self._stamp(column, ids)
        return column

    def priorities(self) -> np.ndarray:
        """float32[rows] in [0.1, 1), the same for every system."""
        return np.random.default_rng(self.seed + 1).uniform(0.1, 1.0, self.rows).astype(np.float32)

    def as_array(self) -> np.ndarray:
        """All rows in one new array, uint8[rows, steps, item_bytes]."""
        out = np.empty((self.rows, self.steps, self.item_bytes), np.uint8)
        for start, chunk in self.chunks():
            out[start : start + len(chunk)] = chunk
        return out


def cap_rows(requested: int, row_bytes: int, budget_gib: float, copies: int = 2) -> int:
    """The largest row count <= `requested` such that `copies` copies of the table fit in `budget_gib`.

    The suites hold one system's copy at a time; the second copy leaves room for what a system
    allocates while it is built and for memory freed late.
    """
    limit = int(budget_gib * 2**30) // (copies * row_bytes)
    return max(1, min(requested, limit))

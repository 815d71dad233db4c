"""Rows for the default fields of conftest's `make_table`, and what a table shows of its rows."""

import numpy as np


def transitions(n, start=0):
    """n rows for the default fields, with values that identify the row."""
    ids = np.arange(start, start + n)
    return {
        "obs": np.stack([ids, ids + 0.5, -ids], axis=1).astype(np.float32),
        "action": ids.astype(np.int32),
    }


def held_rows(table):
    """The rows being written now (odd generation: claimed by a writer or a batch, not yet published)."""
    return np.flatnonzero(table.row_status()["generation"] % 2 == 1)


def held_row(table):
    """The one row being written now; fails unless exactly one row is held."""
    rows = held_rows(table)
    assert len(rows) == 1, f"expected one row being written, found rows {rows.tolist()}"
    return int(rows[0])

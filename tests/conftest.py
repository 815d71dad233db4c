import numpy as np
import pytest

import gear_jax as gj


@pytest.fixture
def make_table():
    """Creates tables that are closed (and unlinked) when the test ends."""
    tables = []

    def make(fields=None, capacity=16, max_steps=1, **kwargs):
        fields = fields or {"obs": gj.Field((3,), "float32"), "action": gj.Field((), "int32")}
        table = gj.Table.create(gj.TableSpec(fields, capacity=capacity, max_steps=max_steps), **kwargs)
        tables.append(table)
        return table

    yield make
    for table in tables:
        table.close()


def transitions(n, start=0):
    """n rows for the default fields, with values that identify the row."""
    ids = np.arange(start, start + n)
    return {"obs": np.stack([ids, ids + 0.5, -ids], axis=1).astype(np.float32), "action": ids.astype(np.int32)}

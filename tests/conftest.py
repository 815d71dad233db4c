"""Fixtures for every test; shared helper code is in tests/helpers/."""

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

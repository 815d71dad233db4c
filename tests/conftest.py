"""Fixtures for every test; shared helper code is in tests/helpers/."""

import os

import pytest
from hypothesis import settings

import gear_jax as gj

# Property tests draw the same cases on every run by default, so that CI passes or fails on the code and
# not on the draw. HYPOTHESIS_PROFILE=explore draws new cases each run, to look for new failures.
settings.register_profile("reproducible", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "reproducible"))


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

import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from scipy import stats

import gear_jax as gj

P_THRESHOLD = 1e-3  # a correct sampler fails a single distribution test this rarely


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
    return {
        "obs": np.stack([ids, ids + 0.5, -ids], axis=1).astype(np.float32),
        "action": ids.astype(np.int32),
    }


def draw_counts(table, rows, method, draws=40_000, batch=2_000, window=None, device=None, **kwargs):
    """Row counts, starts and the last Sample of `draws` picks from `draws // batch` jitted calls with
    fixed keys, run on `device` (default: jax's default device)."""
    fn = jax.jit(lambda k: gj.sample(table, k, batch, method=method, window=window, **kwargs))
    counts = np.zeros(rows, np.int64)
    starts = []
    for i in range(draws // batch):
        key = jax.random.key(1000 + i)
        s = fn(key if device is None else jax.device_put(key, device))
        counts += np.bincount(np.asarray(s.indices), minlength=rows)
        starts.append(np.asarray(s.starts))
    return counts, np.concatenate(starts), s


def prioritized_table(make_table):
    """30 rows of random priorities in a 32-row table, row 7 at priority 0; returns (table, priorities)."""
    table = make_table(capacity=32)
    priorities = np.random.default_rng(0).uniform(0.1, 3.0, 30).astype(np.float32)
    priorities[7] = 0.0
    table.insert(transitions(30), priorities=priorities)
    return table, priorities


def assert_prioritized(counts, last_sample, priorities, exponent):
    """Counts follow p^a / sum p^a (chi-square), unselectable rows are never drawn, and the sample's
    probabilities are the exact ones."""
    weights = np.where(priorities > 0, priorities.astype(np.float64) ** exponent, 0.0)
    exact = weights / weights.sum()
    n = len(priorities)
    assert counts[n:].sum() == 0 and counts[:n][exact == 0].sum() == 0
    keep = exact > 0
    assert stats.chisquare(counts[:n][keep], exact[keep] * counts.sum()).pvalue > P_THRESHOLD
    np.testing.assert_allclose(
        np.asarray(last_sample.probabilities), exact[np.asarray(last_sample.indices)], rtol=1e-5
    )


def assert_mass_in_tail(counts, priorities, tail=10):
    """Counts of the last `tail` rows, and of all others together, follow the priorities (chi-square)."""
    exact = priorities.astype(np.float64) / priorities.sum()
    observed = np.append(counts[-tail:], counts[:-tail].sum())
    expected = np.append(exact[-tail:], exact[:-tail].sum()) * counts.sum()
    assert stats.chisquare(observed, expected).pvalue > P_THRESHOLD


def start_uniform_writers(table, width, seconds, bases=(0, 1_000_000)):
    """One process per base that attaches to `table` (a field "v" of `width` int32) and, for `seconds`,
    inserts one row at a time holding a single value in every element (base + 1, base + 2, ...), so
    that a row read while it was rewritten would mix two values. Returns the processes (stderr piped)."""
    code = f"""
        import numpy as np, gear_jax as gj, sys, time
        base, i = int(sys.argv[1]), 0
        with gj.Table.attach({table.name!r}) as t:
            end = time.monotonic() + {seconds}
            while time.monotonic() < end:
                i += 1
                t.insert({{"v": np.full((1, {width}), base + i, np.int32)}})
    """
    return [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), str(base)], stderr=subprocess.PIPE, text=True
        )
        for base in bases
    ]

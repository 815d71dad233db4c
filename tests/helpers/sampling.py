"""Distribution checks of sampled rows: chi-square tests with a fixed false-alarm rate."""

import jax
import numpy as np
from scipy import stats

import gear_jax as gj

from .tables import transitions

P_THRESHOLD = 1e-3  # a correct sampler fails a single distribution test this rarely


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

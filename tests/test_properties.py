"""Property tests: any spec, any batch, any window — what goes in comes back out."""

import jax
import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gear_jax as gj

DTYPES = ["bool", "int8", "uint16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


def random_values(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype == "bfloat16":
        return rng.normal(size=shape).astype(ml_dtypes.bfloat16)
    if np.dtype(dtype).kind == "f":
        return rng.normal(size=shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), shape).astype(dtype)


@st.composite
def table_cases(draw):
    num_fields = draw(st.integers(1, 3))
    fields = {
        f"f{i}": gj.Field(tuple(draw(st.lists(st.integers(1, 5), max_size=2))), draw(st.sampled_from(DTYPES)))
        for i in range(num_fields)
    }
    max_steps = draw(st.integers(1, 6))
    capacity = draw(st.integers(1, 12))
    rows = draw(st.integers(1, 20))
    steps = draw(st.integers(1, max_steps))
    window = draw(st.one_of(st.none(), st.integers(1, max_steps)))
    return fields, capacity, max_steps, rows, steps, window, draw(st.integers(0, 2**31))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=table_cases())
def test_insert_then_gather_round_trips(case):
    fields, capacity, max_steps, rows, steps, window, seed = case
    rng = np.random.default_rng(seed)
    spec = gj.TableSpec(fields, capacity=capacity, max_steps=max_steps)
    with gj.Table.create(spec) as table:
        lead = (rows, steps) if spec.is_trajectory else (rows,)
        data = {n: random_values(rng, (*lead, *f.shape), f.dtype.name) for n, f in fields.items()}
        lengths = rng.integers(1, steps + 1, rows)
        ids = table.insert(data, lengths=lengths if spec.is_trajectory else None)
        # The ring keeps the last `capacity` rows: row id -> the batch row that wrote it last.
        last = {int(r): b for b, r in enumerate(ids)}
        assert table.size == len(last)
        s = gj.sample(table, jax.random.key(seed), 16, window=window if spec.is_trajectory else None)
        batch = gj.gather(table, s)
        w = (window or max_steps) if spec.is_trajectory else 1
        for i, row in enumerate(np.asarray(s.indices)):
            b = last[int(row)]
            start = int(s.starts[i])
            n = min(w, lengths[b] - start) if spec.is_trajectory else 1
            assert n >= 1
            for name in fields:
                got = np.asarray(batch[name][i])
                if spec.is_trajectory:
                    np.testing.assert_array_equal(got[:n], data[name][b, start : start + n])
                    assert not got[n:].astype(bool).any()
                else:
                    np.testing.assert_array_equal(got, data[name][b])
            valid = np.asarray(batch["valid"][i])
            np.testing.assert_array_equal(valid, np.arange(w) < n if spec.is_trajectory else True)

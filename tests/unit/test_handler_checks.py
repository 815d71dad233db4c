"""The checks every FFI handler makes before it runs a kernel (xla_ffi/handler_checks.h).

The Python wrappers in gear_jax.ops refuse bad input at trace time, so these tests call the custom calls
directly, with arguments the wrappers would never pass. The CPU and CUDA handlers share one definition of
each check and of each error text: the same call must fail with the same words on both platforms.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gear_jax as gj
from gear_jax import _ffi
from tests.helpers.tables import transitions


def platforms():
    yield "cpu"
    yield pytest.param("gpu", marks=pytest.mark.gpu)


@pytest.fixture(params=list(platforms()))
def device(request):
    try:
        return jax.devices(request.param)[0]
    except RuntimeError:
        pytest.skip(f"jax sees no {request.param} device")


def attrs(table):
    return {"handle": np.int64(table.handle), "spec_hash": np.int64(table.spec.spec_hash)}


def raw_sample(table, device, seed_words=2, method=0, exponent=1.0, window=0, batch=4):
    def call(seed):
        types = [jax.ShapeDtypeStruct((batch,), d) for d in (jnp.int32, jnp.uint32, jnp.float32, jnp.int32)]
        types.append(jax.ShapeDtypeStruct((), jnp.int32))  # selectable
        types.append(jax.ShapeDtypeStruct((batch,), jnp.int32))  # lengths
        return jax.ffi.ffi_call(_ffi.SAMPLE, types)(
            seed,
            jnp.zeros((), jnp.int32),
            method=np.int32(method),
            priority_exponent=np.float32(exponent),
            window=np.int32(window),
            **attrs(table),
        )

    seed = jax.device_put(np.arange(seed_words, dtype=np.uint32), device)
    return jax.block_until_ready(jax.jit(call)(seed))


def raw_total_weight(table, device, exponent=1.0, count_shape=(), window=0, window_law=0):
    def call(after):
        types = [jax.ShapeDtypeStruct((), jnp.float32), jax.ShapeDtypeStruct(count_shape, jnp.int32)]
        return jax.ffi.ffi_call(_ffi.TOTAL_WEIGHT, types)(
            after,
            priority_exponent=np.float32(exponent),
            window=np.int32(window),
            window_law=np.int32(window_law),
            **attrs(table),
        )

    return jax.block_until_ready(jax.jit(call)(jax.device_put(np.zeros((), np.int32), device)))


def raw_sample_at(table, device, seed_words=2, exponent=1.0, window=0, batch=4, result_batch=None):
    def call(seed, targets):
        n = batch if result_batch is None else result_batch
        types = [jax.ShapeDtypeStruct((n,), d) for d in (jnp.int32, jnp.uint32, jnp.float32, jnp.int32)]
        return jax.ffi.ffi_call(_ffi.SAMPLE_AT, types)(
            seed,
            targets,
            jnp.zeros((), jnp.int32),
            priority_exponent=np.float32(exponent),
            window=np.int32(window),
            **attrs(table),
        )

    seed = jax.device_put(np.arange(seed_words, dtype=np.uint32), device)
    targets = jax.device_put(np.arange(batch, dtype=np.float32) - 1.0, device)
    return jax.block_until_ready(jax.jit(call)(seed, targets))


def raw_ordered_candidates(table, device, seed_words=2, method=2, window=0, batch=4, key_words=None):
    def call(seed):
        types = [jax.ShapeDtypeStruct((batch,), d) for d in (jnp.int32, jnp.uint32, jnp.float32, jnp.int32)]
        types.append(jax.ShapeDtypeStruct((2 * batch if key_words is None else key_words,), jnp.uint32))
        return jax.ffi.ffi_call(_ffi.ORDERED_CANDIDATES, types)(
            seed, jnp.zeros((), jnp.int32), method=np.int32(method), window=np.int32(window), **attrs(table)
        )

    seed = jax.device_put(np.arange(seed_words, dtype=np.uint32), device)
    return jax.block_until_ready(jax.jit(call)(seed))


def raw_gather(table, device, batch=2, starts=None, field_bytes=None, fields=(0,)):
    def call(indices, generations, starts):
        shapes = [jax.ShapeDtypeStruct((batch,), jnp.bool_)]
        shapes += [jax.ShapeDtypeStruct((field_bytes or batch * 12,), jnp.uint8) for _ in fields]
        return jax.ffi.ffi_call(_ffi.GATHER, shapes)(
            indices,
            generations,
            starts,
            fields=np.array(fields, np.int64),
            window=np.int32(1),
            **attrs(table),
        )

    put = lambda x: jax.device_put(x, device)  # noqa: E731
    starts = np.zeros(batch if starts is None else starts, np.int32)
    return jax.block_until_ready(
        jax.jit(call)(put(np.zeros(batch, np.int32)), put(np.zeros(batch, np.uint32)), put(starts))
    )


def test_sample_checks(make_table, device):
    table = make_table()
    table.insert(transitions(4))
    indices = raw_sample(table, device)[0]  # the call as the wrapper makes it works
    assert np.all((np.asarray(indices) >= 0) & (np.asarray(indices) < 4))
    with pytest.raises(
        gj.EXECUTION_ERRORS, match="gear_jax.sample: the seed must hold 2 uint32 words, got 3"
    ):
        raw_sample(table, device, seed_words=3)
    with pytest.raises(gj.EXECUTION_ERRORS, match="gear_jax.sample: unknown sampling method 9"):
        raw_sample(table, device, method=9)
    with pytest.raises(
        gj.EXECUTION_ERRORS, match=r"gear_jax.sample: priority_exponent = -1\.0+ must be finite"
    ):
        raw_sample(table, device, exponent=-1.0)
    with pytest.raises(gj.EXECUTION_ERRORS, match="gear_jax.sample: window = -2 must be >= 0"):
        raw_sample(table, device, window=-2)


def test_gather_checks(make_table, device):
    table = make_table()  # fields obs float32[3] (12 bytes per row), action int32
    table.insert(transitions(4))
    valid, obs = raw_gather(table, device)  # the call as the wrapper makes it works
    # generation 0 matches no committed row: the picks come back invalid and zeroed
    assert np.asarray(valid).shape == (2,) and not np.asarray(valid).any()
    assert np.asarray(obs).shape == (24,) and not np.asarray(obs).any()
    with pytest.raises(
        gj.EXECUTION_ERRORS, match="gear_jax.gather: indices, generations and starts must have"
    ):
        raw_gather(table, device, starts=3)
    with pytest.raises(gj.EXECUTION_ERRORS, match="gear_jax.gather: field id 5 is outside"):
        raw_gather(table, device, fields=(5,))
    with pytest.raises(gj.EXECUTION_ERRORS, match="the result of field 0 holds 16 bytes, expected 24"):
        raw_gather(table, device, field_bytes=16)


def test_total_weight_checks(make_table, device):
    table = make_table()
    table.insert(transitions(4), priorities=np.array([1.0, 2.0, 0.0, 4.0], np.float32))
    total, count = raw_total_weight(table, device)  # the call as the wrapper makes it works
    assert (float(total), int(count)) == (7.0, 3)
    with pytest.raises(
        gj.EXECUTION_ERRORS, match=r"gear_jax.total_weight: priority_exponent = -1\.0+ must be finite"
    ):
        raw_total_weight(table, device, exponent=-1.0)
    with pytest.raises(
        gj.EXECUTION_ERRORS, match="gear_jax.total_weight: the total and the count must be scalars"
    ):
        raw_total_weight(table, device, count_shape=(2,))
    with pytest.raises(gj.EXECUTION_ERRORS, match="gear_jax.total_weight: window = -1 and window_law = 0"):
        raw_total_weight(table, device, window=-1)
    with pytest.raises(gj.EXECUTION_ERRORS, match="a combination of the skip_short and uniform_starts flags"):
        raw_total_weight(table, device, window=1, window_law=1)


def test_sample_at_checks(make_table, device):
    table = make_table()
    table.insert(transitions(4))
    indices, generations, _, _ = raw_sample_at(table, device)  # targets -1, 0, 1, 2
    np.testing.assert_array_equal(np.asarray(indices), [0, 0, 1, 2])
    assert np.asarray(generations)[0] == 1  # the failed-pick marker
    with pytest.raises(
        gj.EXECUTION_ERRORS, match="gear_jax.sample_at: the seed must hold 2 uint32 words, got 3"
    ):
        raw_sample_at(table, device, seed_words=3)
    with pytest.raises(
        gj.EXECUTION_ERRORS, match=r"gear_jax.sample_at: priority_exponent = nan must be finite"
    ):
        raw_sample_at(table, device, exponent=float("nan"))
    with pytest.raises(gj.EXECUTION_ERRORS, match="gear_jax.sample_at: window = -2 must be >= 0"):
        raw_sample_at(table, device, window=-2)
    with pytest.raises(
        gj.EXECUTION_ERRORS, match="gear_jax.sample_at: indices, generations, probabilities and starts must"
    ):
        raw_sample_at(table, device, result_batch=3)


def test_ordered_candidates_checks(make_table, device):
    table = make_table()
    table.insert(transitions(3))
    indices, generations, _, _, keys = raw_ordered_candidates(table, device)  # 3 rows, 4 picks: fifo
    np.testing.assert_array_equal(np.asarray(indices), [0, 1, 2, 0])
    assert np.asarray(generations)[3] == 1  # the failed-pick marker, not an error
    assert np.asarray(keys)[6:].tolist() == [0xFFFFFFFF, 0xFFFFFFFF]
    with pytest.raises(gj.EXECUTION_ERRORS, match="gear_jax.ordered_candidates: method 1 is not fifo, lifo"):
        raw_ordered_candidates(table, device, method=1)
    with pytest.raises(
        gj.EXECUTION_ERRORS, match="gear_jax.ordered_candidates: the seed must hold 2 uint32 words, got 1"
    ):
        raw_ordered_candidates(table, device, seed_words=1)
    with pytest.raises(gj.EXECUTION_ERRORS, match="gear_jax.ordered_candidates: window = -1 must be >= 0"):
        raw_ordered_candidates(table, device, window=-1)
    with pytest.raises(
        gj.EXECUTION_ERRORS, match=r"gear_jax.ordered_candidates: the order keys must hold 2 uint32 words per"
    ):
        raw_ordered_candidates(table, device, key_words=5)


def test_update_checks(make_table, device):
    table = make_table()
    table.insert(transitions(4))

    def call(indices, generations, priorities):
        return jax.ffi.ffi_call(
            _ffi.UPDATE_PRIORITIES, jax.ShapeDtypeStruct((), jnp.int32), has_side_effect=True
        )(indices, generations, priorities, jnp.zeros((), jnp.int32), **attrs(table))

    put = lambda x: jax.device_put(x, device)  # noqa: E731
    with pytest.raises(
        gj.EXECUTION_ERRORS, match="gear_jax.update_priorities: indices, generations and priorities"
    ):
        jax.block_until_ready(
            jax.jit(call)(
                put(np.zeros(3, np.int32)), put(np.zeros(2, np.uint32)), put(np.ones(3, np.float32))
            )
        )
    # On a GPU the failed call's runtime token stays JAX's last one for the device, raised again by
    # jax.effects_barrier() and at exit ("Exception ignored in atexit callback"), until a later call with
    # side effects on that device succeeds and replaces it (docs/BENCHMARKS.md). One does here.
    count = jax.jit(call)(
        put(np.zeros(0, np.int32)), put(np.zeros(0, np.uint32)), put(np.ones(0, np.float32))
    )
    assert int(count) == 0
    jax.effects_barrier()


def test_closed_table_is_refused_by_every_handler(make_table, device):
    table = make_table()
    table.insert(transitions(4))
    stale = gj.Table.attach(table.name)
    stale.close()  # its handle is closed, the table itself lives on
    with pytest.raises(gj.EXECUTION_ERRORS, match="is closed"):
        raw_sample(stale, device)
    with pytest.raises(gj.EXECUTION_ERRORS, match="is closed"):
        raw_gather(stale, device)
    with pytest.raises(gj.EXECUTION_ERRORS, match="is closed"):
        raw_total_weight(stale, device)
    with pytest.raises(gj.EXECUTION_ERRORS, match="is closed"):
        raw_sample_at(stale, device)


def test_method_numbers_come_from_the_native_module():
    from gear_jax import _native

    assert gj.METHODS == dict(_native.sample_methods())
    assert sorted(gj.METHODS) == ["fifo", "lifo", "prioritized", "topk", "uniform"]
    assert len(set(gj.METHODS.values())) == len(gj.METHODS)

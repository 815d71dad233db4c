import ml_dtypes
import numpy as np
import pytest

import gear_jax as gj


def test_field_normalizes_shape_and_dtype():
    assert gj.Field(4, "float32") == gj.Field((4,), np.float32)
    assert gj.Field((), "bfloat16").dtype == np.dtype(ml_dtypes.bfloat16)
    assert gj.Field((2, 3), "uint8").step_bytes == 6


@pytest.mark.parametrize("dtype", gj.SUPPORTED_DTYPES)
def test_every_supported_dtype_is_accepted(dtype):
    assert gj.Field((2,), dtype).dtype.name == dtype


@pytest.mark.parametrize("dtype", ["complex64", "object", "float8", "U8"])
def test_unsupported_dtype_is_refused(dtype):
    with pytest.raises(gj.SpecError, match="not supported"):
        gj.Field((), dtype)


@pytest.mark.parametrize("shape", [(0,), (-1, 2), (2.5,), "ab", None])
def test_bad_shape_is_refused(shape):
    with pytest.raises(gj.SpecError, match="shape"):
        gj.Field(shape, "float32")


def test_a_dtype_given_as_the_shape_is_refused_with_the_order_of_arguments():
    with pytest.raises(gj.SpecError, match=r"is a str: the first .* is the shape.*Field\(\(\), 'int32'"):
        gj.Field("int32")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(fields={}, capacity=4), "non-empty"),
        (dict(fields={"valid": gj.Field((), "bool")}, capacity=4), "reserved"),
        (dict(fields={"not a name": gj.Field((), "bool")}, capacity=4), "identifier"),
        (dict(fields={"x": (3,)}, capacity=4), "gear_jax.Field"),
        (dict(fields={"x": gj.Field((), "bool")}, capacity=0), "capacity"),
        (dict(fields={"x": gj.Field((), "bool")}, capacity=2**31), "capacity"),
        (dict(fields={"x": gj.Field((), "bool")}, capacity=4, max_steps=0), "max_steps"),
        (dict(fields={"x": gj.Field((), "bool")}, capacity=4.0), "capacity"),
    ],
)
def test_invalid_spec_raises(kwargs, message):
    with pytest.raises(gj.SpecError, match=message):
        gj.TableSpec(**kwargs)


def test_spec_round_trips_through_json_and_hashes_stably():
    spec = gj.TableSpec(
        {"a": gj.Field((2,), "bfloat16"), "b": gj.Field((), "int64")}, capacity=9, max_steps=3
    )
    again = gj.TableSpec.from_json(spec.to_json())
    assert again == spec and again.spec_hash == spec.spec_hash
    other = gj.TableSpec(
        {"a": gj.Field((2,), "bfloat16"), "b": gj.Field((), "int64")}, capacity=10, max_steps=3
    )
    assert other.spec_hash != spec.spec_hash
    assert 0 <= spec.spec_hash < 2**63


def test_spec_too_large_to_address_is_refused():
    with pytest.raises(gj.SpecError, match="larger than gear_jax addresses"):
        gj.TableSpec({"x": gj.Field((2**30,), "uint8")}, capacity=16, max_steps=2**30)

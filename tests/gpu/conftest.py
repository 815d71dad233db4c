"""Fixtures of the GPU tests (marked `gpu`; they skip where jax sees no GPU)."""

import jax
import pytest

import gear_jax as gj


@pytest.fixture
def gpu():
    """The first GPU jax sees; skips the test where there is none."""
    try:
        devices = jax.devices("gpu")
    except RuntimeError:
        pytest.skip("jax sees no GPU")
    if not gj.build_info()["cuda"]:
        pytest.fail("jax sees a GPU but gear_jax was built without its CUDA handlers (GEAR_JAX_CUDA=ON)")
    return devices[0]

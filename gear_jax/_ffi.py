"""Registers the native FFI targets with JAX, once, at import."""

from collections.abc import Callable
from typing import Any

import jax

from gear_jax import _native

SAMPLE = "gear_jax_sample"
GATHER = "gear_jax_gather"
UPDATE_PRIORITIES = "gear_jax_update_priorities"
TOTAL_WEIGHT = "gear_jax_total_weight"
SAMPLE_AT = "gear_jax_sample_at"
ORDERED_CANDIDATES = "gear_jax_ordered_candidates"
SAMPLE_GATHER = "gear_jax_sample_gather"
INSERT = "gear_jax_insert"
SHUFFLE = "gear_jax_shuffle"  # CPU only (gear_jax.epochs)
CONSUME = "gear_jax_consume"  # gear_jax.queues

REGISTERED_PLATFORMS: list[str] = []

for _platform, _targets in _native.registrations().items():
    for _name, _capsule in _targets.items():
        jax.ffi.register_ffi_target(_name, _capsule, platform=_platform)
    REGISTERED_PLATFORMS.append(_platform)


def call(target: str, result_types: Any, *, has_side_effect: bool = False) -> Callable[..., Any]:
    """The custom call `target` as a function of its operands (and attributes, as keywords), as every
    gear_jax call inside jit is made.

    Operands are data (keys, picks, priorities, rows), never parameters: they pass through
    `jax.lax.stop_gradient`, so a call inside a function that `jax.grad` differentiates runs in its
    forward pass (e.g. `update_priorities` of TD errors computed in the loss) instead of failing with
    "cannot be differentiated", and its results carry no gradient. Under `vmap` a call runs once per
    element ("sequential")."""
    custom_call = jax.ffi.ffi_call(
        target, result_types, has_side_effect=has_side_effect, vmap_method="sequential"
    )

    def bound(*operands: Any, **attributes: Any) -> Any:
        return custom_call(*(jax.lax.stop_gradient(x) for x in operands), **attributes)

    return bound

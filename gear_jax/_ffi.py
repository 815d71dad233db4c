"""Registers the native FFI targets with JAX, once, at import."""

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

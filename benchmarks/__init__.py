"""Benchmarks of gear_jax against its baselines: `python -m gear_jax.bench SUITE` (see docs/BENCHMARKS.md)."""

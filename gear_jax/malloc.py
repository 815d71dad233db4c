"""Keeps freed result buffers in the process, so that a jitted step's results do not page-fault.

On the CPU, XLA allocates every result of a jitted call with the C library's `malloc` and frees it when
the array dies. glibc maps a block of 128 KiB or more fresh from the kernel (raising that limit as
blocks are freed) and gives memory above the top of its heaps back once 128 KiB or more lie free
there, so a step that returns a 1 MiB batch (1,024 rows of 1 KiB) often writes into pages the kernel
has just handed over: 256 page faults, each with its page's zeroing, and an unmap later. On this
project's 2-core virtual machine, writing 1 MiB into freshly mapped memory took 590 us, into mapped
memory 39 us; a jitted `sample_gather` of 1,024 x 1 KiB took 0 to 155 faults per call depending on the
run. How often depends on what else the process allocates, so the cost comes and goes between runs.

At import, gear_jax sets glibc's mmap threshold to 32 MiB (the most glibc allows) and its trim threshold
to 256 MiB: blocks below 32 MiB then come from the heaps and are reused, and up to 256 MiB of free heap
stay mapped. The price is memory: a process keeps up to that much freed memory instead of returning it.
Larger results (64 MiB batches of 64 KiB rows) are still mapped fresh; the CPU handlers ask for
transparent huge pages on them.

Nothing is changed when `GEAR_JAX_MALLOC_TUNING=0` is set, when `GLIBC_TUNABLES` already sets either
threshold (your own choice wins), or when the C library is not glibc. `malloc_tuning()` says which.
"""

from __future__ import annotations

import os
from typing import Any

from gear_jax import _native

MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 256 << 20
ENV = "GEAR_JAX_MALLOC_TUNING"
_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")

_state: dict[str, Any] = {"applied": False, "why": "not tried yet"}


def tune_malloc() -> dict[str, Any]:
    """Applies the thresholds (see the module docstring) unless told not to; returns `malloc_tuning()`."""
    global _state
    if os.environ.get(ENV, "1").strip() == "0":
        _state = {"applied": False, "why": f"{ENV}=0"}
    elif any(name in os.environ.get("GLIBC_TUNABLES", "") for name in _TUNABLES):
        _state = {"applied": False, "why": "GLIBC_TUNABLES sets the malloc thresholds"}
    elif _native.set_malloc_thresholds(MMAP_THRESHOLD, TRIM_THRESHOLD):
        _state = {
            "applied": True,
            "why": "set at import",
            "mmap_threshold": MMAP_THRESHOLD,
            "trim_threshold": TRIM_THRESHOLD,
        }
    else:
        _state = {"applied": False, "why": "the C library is not glibc or refused the thresholds"}
    return malloc_tuning()


def malloc_tuning() -> dict[str, Any]:
    """What gear_jax did to this process's `malloc`: {"applied": bool, "why": str} and, when applied,
    "mmap_threshold" and "trim_threshold" in bytes."""
    return dict(_state)

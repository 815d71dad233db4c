"""gear_jax: GPU-centric experience replay for JAX.

Replay data lives in (pinned) host memory as column tables; sampling and gathering are XLA custom calls
usable inside `jax.jit`.
"""

from typing import Any

import jax

from gear_jax import _ffi, _native
from gear_jax._version import __version__
from gear_jax.errors import (
    EXECUTION_ERRORS,
    AllRowsHeldError,
    CheckpointError,
    GearJaxError,
    InvalidArgumentError,
    NotEnoughRowsError,
    OutOfSpaceError,
    RateLimiterTimeout,
    RemoteAuthenticationError,
    RemoteError,
    RemoteUnavailableError,
    SlowPathWarning,
    SpecError,
    TableClosedError,
    TableMismatchError,
    TableNotFoundError,
)
from gear_jax.malloc import malloc_tuning, tune_malloc
from gear_jax.pool import clear_pool, configure_pool, pool_stats
from gear_jax.ops import (
    METHODS,
    Sample,
    gather,
    insert,
    ordered_candidates,
    sample,
    sample_at,
    sample_gather,
    total_weight,
    update_priorities,
)
from gear_jax.rate_limiter import RateLimiter, RateLimiterCounts
from gear_jax.spec import SUPPORTED_DTYPES, Field, TableSpec
from gear_jax.table import Table
from gear_jax.writers import EpisodeWriter
from gear_jax.epochs import epoch, retire
from gear_jax.queues import consume, dequeue
from gear_jax.sharded import ShardedSample, ShardedTable
from gear_jax import casting, host, sharded, transitions


def __getattr__(name: str) -> Any:
    # `gj.torch` imports the PyTorch bridge on first use: `import gear_jax` never needs torch; `gj.remote`
    # and `gj.serve` import the remote writers (Arrow Flight) on first use: nor does it need pyarrow.
    import importlib

    if name in ("torch", "remote"):
        return importlib.import_module(f"gear_jax.{name}")
    if name == "serve":
        return importlib.import_module("gear_jax.remote").serve
    raise AttributeError(f"module 'gear_jax' has no attribute {name!r}")


tune_malloc()  # result buffers reused instead of mapped fresh per call: gear_jax/malloc.py


def build_info() -> dict[str, Any]:
    """How this gear_jax was built: version, CUDA handlers, table format, jax version, platforms."""
    import jaxlib

    return {
        "version": __version__,
        "cuda": bool(_native.with_cuda),
        "format_version": int(_native.format_version),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "ffi_platforms": [p.lower() for p in _ffi.REGISTERED_PLATFORMS],
    }


__all__ = [
    "EXECUTION_ERRORS",
    "AllRowsHeldError",
    "CheckpointError",
    "EpisodeWriter",
    "Field",
    "GearJaxError",
    "InvalidArgumentError",
    "METHODS",
    "NotEnoughRowsError",
    "OutOfSpaceError",
    "RateLimiter",
    "RateLimiterCounts",
    "RateLimiterTimeout",
    "RemoteAuthenticationError",
    "RemoteError",
    "RemoteUnavailableError",
    "SUPPORTED_DTYPES",
    "Sample",
    "ShardedSample",
    "ShardedTable",
    "SlowPathWarning",
    "SpecError",
    "Table",
    "TableClosedError",
    "TableMismatchError",
    "TableNotFoundError",
    "TableSpec",
    "__version__",
    "build_info",
    "casting",
    "clear_pool",
    "configure_pool",
    "consume",
    "dequeue",
    "epoch",
    "gather",
    "host",
    "insert",
    "malloc_tuning",
    "ordered_candidates",
    "pool_stats",
    "retire",
    "sample",
    "sample_at",
    "sample_gather",
    "sharded",
    "total_weight",
    "transitions",
    "update_priorities",
]

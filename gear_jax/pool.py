"""The pool of closed tables: memory and handles kept for the next table that fits.

Creating a table reserves and maps its memory and, on a CUDA machine, registers it with CUDA (about a
second per few GiB); a function compiled for a table is traced and compiled for that table's handle.
When this process closes a table it created and no other process (or other `Table.attach` here) still
has it open, the memory goes to a pool instead of being freed. The next `Table.create` whose table
fits (memory at least as large, at most twice as large) takes it and skips the reservation and the
CUDA registration; when its spec is the closed table's, it also takes the closed table's handle, so
functions compiled for the closed table run on the new one without being traced or compiled again
(`Table` objects with the same handle and spec compare equal, also as static arguments of `jax.jit`).

Pooled memory stays in /dev/shm under a private name until it is reused, dropped (oldest first, past
`max_tables` or `max_bytes`), cleared, or the process exits. A create that finds /dev/shm full empties
the pool and tries again. `GEAR_JAX_POOL_BYTES=0` in the environment, or `configure_pool(max_tables=0)`,
turns the pool off; `Table.create(spec, reuse=False)` skips it for one table.
"""

from __future__ import annotations

import atexit

from gear_jax import _native
from gear_jax.errors import InvalidArgumentError


def pool_stats() -> dict[str, int]:
    """What the pool holds and has done in this process.

    Returns:
      tables, bytes: closed tables held now and their memory; max_tables, max_bytes: the limits;
      pooled: closes whose memory went to the pool; refused: creator closes it did not take (another
      open was alive, or the table exceeded max_bytes); reused: creates served from the pool;
      reused_handles: those that also took the closed table's handle (same spec).
    """
    return dict(_native.pool_stats())


def configure_pool(max_tables: int | None = None, max_bytes: int | None = None) -> None:
    """Sets the pool's limits (None keeps a limit); tables beyond them are dropped, oldest first.

    Args:
      max_tables: closed tables kept at most; 0 turns the pool off. Default 8.
      max_bytes: their memory at most. Default 16 GiB, or `GEAR_JAX_POOL_BYTES`.
    """
    current = _native.pool_stats()
    tables = current["max_tables"] if max_tables is None else max_tables
    nbytes = current["max_bytes"] if max_bytes is None else max_bytes
    for name, value in (("max_tables", tables), ("max_bytes", nbytes)):
        limit = 2**63 - 1 if name == "max_tables" else 2**64 - 1
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
            raise InvalidArgumentError(f"configure_pool: {name}={value!r} must be an int in [0, {limit}]")
    _native.pool_configure(tables, nbytes)


def clear_pool() -> None:
    """Drops every closed table the pool holds (their memory is freed once no call uses it)."""
    _native.pool_clear()


@atexit.register
def _close_pool_at_exit() -> None:
    # Runs after the finalizers of tables closed at exit (registered earlier, so called later), and
    # turns the pool off: a table whose finalizer runs even later removes its name instead of pooling.
    _native.pool_configure(0, 0)

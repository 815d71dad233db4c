"""Exceptions raised by gear_jax. Each names the argument at fault and the fix."""

import os
import sys
import warnings
from typing import Any

import jax
import numpy as np

# What a compiled function raises when a custom call fails while it runs (an empty table, a closed
# table, a NaN priority): JAX reports the handler's error as JaxRuntimeError, or as ValueError when the
# call went through its fast C++ dispatch path. The message starts with the status code and names the
# gear_jax operation.
EXECUTION_ERRORS = (jax.errors.JaxRuntimeError, ValueError)


class GearJaxError(Exception):
    """Base class of every gear_jax error."""


class SpecError(GearJaxError, ValueError):
    """A `Field` or `TableSpec` is invalid."""


class InvalidArgumentError(GearJaxError, ValueError):
    """An argument of an operation has the wrong type, shape, dtype or value."""


class TableClosedError(GearJaxError, RuntimeError):
    """The table was closed; open or attach it again."""


class TableNotFoundError(GearJaxError, FileNotFoundError):
    """No table of that name exists on this host."""


class TableMismatchError(GearJaxError, ValueError):
    """A mapping is not a gear_jax table, or has another spec than the one asked for."""


class CheckpointError(GearJaxError, ValueError):
    """A checkpoint directory can not be loaded (not a checkpoint, damaged, truncated, of a newer
    format) or saved to; the message names the path and the reason."""


class RateLimiterTimeout(GearJaxError, TimeoutError):
    """A wait for a table's rate limiter (an insert, `add`, `end_episode` or `await_samples`) ran out of
    time; the message says what waited, the counts and bounds, and what to start or raise."""


class OutOfSpaceError(GearJaxError, RuntimeError):
    """`/dev/shm` cannot hold a new table (it is reserved whole at creation); the message gives the
    bytes asked for. Free space there, lower the capacity, or raise the mount's size."""


class AllRowsHeldError(GearJaxError, RuntimeError):
    """Every row of the table is held by a writer (episodes being written, claimed rows): an insert finds
    no row to claim. Raise the capacity, end episodes sooner, or close writers that hold rows."""


class NotEnoughRowsError(GearJaxError, RuntimeError):
    """A selection on the host (`gear_jax.host`) found no selectable row, or fewer than the batch for
    fifo, lifo and topk; insert rows (or wait for the writers) and sample again."""


class RemoteError(GearJaxError, RuntimeError):
    """A served table's server refused or failed a remote writer's call for a reason of its own (a
    protocol mismatch, a malformed message); the message says what the server answered."""


class RemoteUnavailableError(GearJaxError, ConnectionError):
    """A remote writer could not reach its server after its retries: start the server (`gj.serve` or
    `python -m gear_jax.serve`), check the address, or raise `retries`."""


class RemoteAuthenticationError(GearJaxError, PermissionError):
    """A served table's server refused a remote writer's token; pass the server's `token=`."""


class SlowPathWarning(UserWarning):
    """An insert or one-row write took the general (Python) path: values of a type the native short path
    does not take (a list, a JAX array, a non-contiguous array, a dtype it does not convert). The same
    values are stored, at several times the cost; the message names the field and the fix. Issued once
    per table and field."""


def traced_value_error(value: Any, name: str, op: str) -> InvalidArgumentError:
    """The error for a traced value passed as the argument `name`, which must be a static Python value
    (it fixes a shape or the compiled call): a jit argument that was not marked static, typically."""
    return InvalidArgumentError(
        f"{op}: {name} is a traced value ({value}), but it must be a static Python value: it sets a "
        f"shape or the compiled call. Mark it static, e.g. jax.jit(step, static_argnames=({name!r},)), "
        f"or close over it (a constant, a global or functools.partial) instead of passing it as a "
        "jitted function's argument"
    )


def check_flag(value: Any, name: str, op: str) -> bool:
    """Refuses anything but True or False (numpy's bools included) for the flag `name` of `op`: an
    array's truth is ambiguous, a string or a number would be read as a flag by accident, and a traced
    value cannot choose the compiled call."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, jax.core.Tracer):
        raise traced_value_error(value, name, op)
    raise InvalidArgumentError(f"{op}: {name}={value!r} must be True or False")


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_at_caller(message: str, category: type[Warning]) -> None:
    """`warnings.warn` at the nearest frame outside gear_jax: the line of the user's code that called into
    the package, however many of the package's own frames lie between (a jitted function's frames, being
    outside gear_jax, count as the user's)."""
    frame, level = sys._getframe(0), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)

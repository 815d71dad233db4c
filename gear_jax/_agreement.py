"""Agreement among the processes of a `jax.distributed` job around the steps that can fail on one of them.

A collective (`process_allgather`, a `shard_map` program) waits for every process. A process that raises
before it reaches one leaves the others waiting until the coordination service gives up, with an error
that names neither gear_jax nor the cause. So the sharded layer runs every step that can fail locally
(checking arguments, creating or loading shards, writing a checkpoint's part) inside `agree`: every
process takes part in the same all-gather whatever happened to it, carrying whether its step failed and
why, and then every process raises when any failed. The process that failed raises its own error; the
others raise an error of the same gear_jax kind naming that process and its message.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gear_jax import errors
from gear_jax.errors import GearJaxError, InvalidArgumentError

MESSAGE_BYTES = 2048  # the part of a failing process's message that reaches the others


def _encode(error: BaseException | None, payload: np.ndarray) -> np.ndarray:
    """One process's report: [failed, message length (4 bytes), message, payload], as uint8."""
    message = b"" if error is None else f"{type(error).__name__}: {error}".encode()[:MESSAGE_BYTES]
    head = np.zeros(5 + MESSAGE_BYTES, np.uint8)
    head[0] = error is not None
    head[1:5] = np.frombuffer(np.uint32(len(message)).tobytes(), np.uint8)
    head[5 : 5 + len(message)] = np.frombuffer(message, np.uint8)
    return np.concatenate([head, np.ascontiguousarray(payload).view(np.uint8).reshape(-1)])


def agree(
    error: BaseException | None,
    op: str,
    payload: np.ndarray | None = None,
    kind: type[GearJaxError] | None = None,
    fallback: type[GearJaxError] = InvalidArgumentError,
) -> np.ndarray:
    """Every process's `payload` (stacked along a new first axis, in process order), once every process
    said whether its step failed (`error`: what it caught, or None). Call it on every process with a
    payload of the same shape and dtype everywhere.

    Raises, on every process, when any process's step failed: a process whose own step failed re-raises
    its `error`; the others raise `kind` (by default the class of the lowest-numbered failing process's
    error when it is a gear_jax error, `fallback` otherwise) saying which process failed in `op` and
    why.
    """
    from jax.experimental import multihost_utils

    payload = np.zeros(0, np.uint8) if payload is None else np.asarray(payload)
    reports = np.asarray(multihost_utils.process_allgather(_encode(error, payload)))
    reports = reports.reshape(reports.shape[0], -1)
    failed = [p for p in range(reports.shape[0]) if reports[p, 0]]
    if failed:
        if error is not None:
            raise error  # this process's own failure, with its own traceback
        first = failed[0]
        size = int(np.frombuffer(reports[first, 1:5].tobytes(), np.uint32)[0])
        message = reports[first, 5 : 5 + size].tobytes().decode(errors="replace")
        others = f" (and processes {failed[1:]})" if len(failed) > 1 else ""
        raise (kind or _kind_of(message, fallback))(
            f"{op}: process {first}{others} failed, so this process stops too: {message}"
        )
    data = reports[:, 5 + MESSAGE_BYTES :]
    return data.copy().view(payload.dtype).reshape((reports.shape[0], *payload.shape))


def _kind_of(message: str, fallback: type[GearJaxError]) -> type[GearJaxError]:
    """The gear_jax error class a report's message names ("CheckpointError: ..."), `fallback` for any
    other (an OSError, say)."""
    name = message.split(":", 1)[0]
    found = getattr(errors, name, None)
    if isinstance(found, type) and issubclass(found, GearJaxError):
        return found
    return fallback


def run_agreed(op: str, step: Any, kind: type[GearJaxError] | None = None) -> Any:
    """`step()` on this process, then `agree` on whether it failed: its result where every process's
    step succeeded, else the agreed error on every process."""
    try:
        result = step()
    except Exception as e:  # reported to every process; KeyboardInterrupt and the like end this one
        agree(e, op, kind=kind)
        raise AssertionError("unreachable: agree raises the error it was given") from e
    agree(None, op, kind=kind)
    return result

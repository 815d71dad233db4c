"""The `remote` suite's torch_rpc system: observers stream rows to one agent over `torch.distributed.rpc`.

After PyTorch's RL RPC benchmark (one agent, N observers): N + 1 spawned processes join one RPC group
through TensorPipe, MASTER_ADDR=127.0.0.1 and a free port. The agent (rank 0) holds, per item size, a
numpy ring of the table's capacity, touched before the run (as the gear_jax tables are filled), and runs
the suite's coordinator (`remote_sweep.coordinate`), whose summaries it puts on a queue for the suite's
process. Each observer (rank 1..N) runs `remote_sweep.run_actor` with calls of
`rpc.rpc_sync("agent", insert_rows, args=(uint8 tensor [B, item_bytes],))`, which return once the agent
copied the rows into its ring. TensorPipe is held to its TCP transport (`uv`) and its `basic` channel
over 127.0.0.1: left alone it moves tensors between processes of one host through shared memory (`shm`,
`cma`), which no other system of the suite may use, and the suite measures a network path. (A
1 KiB call from one observer on this 2-core VM: 470 us over TCP, 275 us through shared memory.)
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed.rpc as rpc

from gear_jax.bench.data import Dataset
from gear_jax.bench.remote_sweep import Point, coordinate, run_actor

AGENT = "agent"
HOST = "127.0.0.1"
RPC_TIMEOUT_S = 300.0
TRANSPORTS = ["uv"]  # TCP; see the module docstring
CHANNELS = ["basic"]


class Ring:
    """The agent's rows: uint8[capacity, item_bytes] per item size, written in turn like a table's ring.

    Calls run on TensorPipe's worker threads at once: a call claims its rows under the lock and copies
    outside it, as a gear_jax insert claims rows and then copies.
    """

    def __init__(self, capacity: int, item_sizes: list[int]):
        self.capacity = capacity
        self.rows = {d: np.ones((capacity, d), np.uint8) for d in item_sizes}  # ones: every page touched
        self.next = {d: 0 for d in item_sizes}
        self.received = {d: 0 for d in item_sizes}
        self.lock = threading.Lock()

    def insert(self, batch: np.ndarray) -> int:
        """Copies uint8[B, item_bytes] into the ring; returns the first row's slot."""
        item_bytes, n = batch.shape[1], batch.shape[0]
        with self.lock:
            first = self.next[item_bytes]
            self.next[item_bytes] = (first + n) % self.capacity
            self.received[item_bytes] += n
        rows = self.rows[item_bytes]
        head = min(n, self.capacity - first)
        rows[first : first + head] = batch[:head]
        rows[: n - head] = batch[head:]
        return first


_ring: Ring | None = None  # the agent process's ring


def insert_rows(batch: torch.Tensor) -> int:
    """The remote call: runs in the agent, inserts the observer's rows (uint8 [B, item_bytes])."""
    assert _ring is not None, "insert_rows runs in the agent process only"
    return _ring.insert(batch.numpy())


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def join_group(name: str, rank: int, world: int, port: int) -> None:
    """Joins the RPC group over 127.0.0.1:`port` with TensorPipe held to TCP."""
    os.environ.update(MASTER_ADDR=HOST, MASTER_PORT=str(port), TP_SOCKET_IFNAME="lo")
    # init_rpc and shutdown gather through a gloo group, which torch warns about on every call
    warnings.filterwarnings("ignore", message="You are using a Backend", category=UserWarning)
    options = rpc.TensorPipeRpcBackendOptions(
        rpc_timeout=RPC_TIMEOUT_S, _transports=TRANSPORTS, _channels=CHANNELS
    )
    rpc.init_rpc(name, rank=rank, world_size=world, rpc_backend_options=options)


def agent_main(
    world: int,
    port: int,
    sweep: list[Point],
    seconds: float,
    capacity: int,
    barrier: Any,
    results: Any,
    summaries: Any,
) -> None:
    """Rank 0: holds the rings, coordinates the observers point by point, puts each point's summary on
    `summaries`."""
    global _ring
    _ring = Ring(capacity, sorted({p["item_bytes"] for p in sweep}))
    join_group(AGENT, 0, world, port)
    ring = _ring
    for summary in coordinate(world - 1, sweep, barrier, results, lambda p: ring.received[p["item_bytes"]]):
        summaries.put(summary)
    rpc.shutdown()


def observer_main(
    rank: int, world: int, port: int, sweep: list[Point], seconds: float, barrier: Any, results: Any
) -> None:
    """Rank 1..world-1: times `rpc_sync` inserts of every point (remote_sweep.run_actor)."""
    join_group(f"observer{rank}", rank, world, port)
    actor = rank - 1

    def open_point(point: Point) -> Any:
        x = torch.from_numpy(Dataset(point["insert_batch"], 1, point["item_bytes"], actor).as_array()[:, 0])
        return contextlib.nullcontext(lambda: rpc.rpc_sync(AGENT, insert_rows, args=(x,)))

    run_actor(actor, open_point, sweep, seconds, barrier, results)
    rpc.shutdown()


def process_specs(
    world_size: int,
    sweep: list[Point],
    seconds: float,
    capacity: int,
    barrier: Any,
    results: Any,
    summaries: Any,
) -> list[tuple[Callable[..., None], tuple[Any, ...]]]:
    """(target, args) of the agent and the `world_size` observers."""
    world, port = world_size + 1, free_port()
    agent = (agent_main, (world, port, sweep, seconds, capacity, barrier, results, summaries))
    observers = [
        (observer_main, (rank, world, port, sweep, seconds, barrier, results)) for rank in range(1, world)
    ]
    return [agent, *observers]

"""Actors on other machines: a table served over the network, and writers that stream rows into it.

A process that holds a table (or its shards of a `ShardedTable`) serves it with `gj.serve(table)`; an
actor on any machine writes with `gj.remote.Writer(address)`, whose `insert`, `add` and `episode_writer`
read as a table's own. The transport is Arrow Flight (`pyarrow.flight`: Arrow record batches over gRPC,
TLS built in): each writer keeps one stream open, each insert is one record batch on it whose columns
are the rows' bytes (no copy on either side), and the server answers every batch with the row ids once
the rows are in the table. docs/BENCHMARKS.md ("Remote writers") has the figures that chose Flight over
plain gRPC.

What crosses the network, and what is checked where:
  * the client casts and checks a batch by the table's casting policy before sending (it fails fast, with
    the messages of a local insert); the server checks every message again (never trusting the client):
    the schema, each column's widths, bool bytes, the steps per row, priorities and lengths, and the size
    (`max_message_bytes`). A refused message writes nothing and leaves the stream usable;
  * an insert is one message and one local `Table.insert` on the server: all of it is written or none;
  * an episode is kept by the client until `end_episode`, then sent as one row: the server never holds a
    row for a client, so a client killed at any moment leaves no half-written or held row behind;
  * the table's rate limiter (or a queue's room) reaches remote writers: the server's insert waits, with
    the client's `timeout`, and reads the stream's next message only once the last is in the table, so a
    slow learner makes the writers wait instead of the server buffering (gRPC's flow control holds
    back what a writer sends ahead);
  * a server that goes away (restarted, say) is reconnected to: a writer retries a failed call up to
    `retries` times (waits doubling from `retry_wait_s`), then raises `RemoteUnavailableError`. A batch
    whose answer was lost with the connection is sent again: delivery is at least once (a batch the
    server wrote just before it died is written twice). A writer's stream names the spec it was made
    for, and a server restarted with a table of another spec refuses it (`RemoteError`). A server that
    stops answering without closing the connection (a stopped process, a network path that drops
    packets) holds the writer's call until it answers: neither side has a deadline on an open stream;
  * a wait for the rate limiter is a series of waits of at most a second (`WRITER_WAIT_SLICE_S`), the
    rows sent again for each: a writer closed by another thread stops waiting, and the server stops a
    wait whose writer is gone (a killed actor's rows are never written after it died), or when it is
    closing;
  * the server listens on 127.0.0.1 unless told otherwise, and beyond the loopback only with a
    shared-secret `token`, which every call must carry (`authorization: Bearer <token>`); a call without
    it gets nothing and writes nothing. With `tls=(cert_file, key_file)` the connection is TLS
    (`grpc+tls://`); writers pass the certificate that signed it as `tls_root_cert`.

A writer that stays idle for `idle_close_s` closes its stream (the next call opens another): a server's
`close()` waits for open streams, which an idle writer would otherwise hold.

Writers and servers left open when the interpreter exits are closed by an exit hook, which runs before
the finalizers of tables and of Arrow Flight's servers: each writer's stream ends (what `add` kept is not
sent; a warning says how many rows), then each server stops once its streams have ended, and the exit
waits for the threads of this module that call into Arrow Flight (up to `EXIT_END_S` for the stream of a
server that stopped answering). A thread still inside Arrow Flight when the interpreter finalizes is
ended by Python in mid-call, and that aborts the process ("terminate called without an active
exception").
"""

from __future__ import annotations

import atexit
import errno
import hmac
import ipaddress
import json
import logging
import math
import os
import socket
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gear_jax import _rows
from gear_jax.casting import StepConverter, check_casting, to_numpy
from gear_jax.errors import (
    AllRowsHeldError,
    InvalidArgumentError,
    RateLimiterTimeout,
    RemoteAuthenticationError,
    RemoteError,
    RemoteUnavailableError,
    TableClosedError,
)
from gear_jax.rate_limiter import check_timeout
from gear_jax.spec import TableSpec
from gear_jax.writers import DeferredFields, check_room_for_a_step

try:
    import pyarrow as pa
    import pyarrow.flight as flight
except ImportError as e:  # pragma: no cover - pyarrow is a dependency of the remote writers only
    raise ImportError(
        "gear_jax.remote needs pyarrow (Arrow Flight): pip install pyarrow, or gear_jax[remote]"
    ) from e

__all__ = ["RemoteEpisodeWriter", "Server", "Writer", "serve"]

PROTOCOL = 1
_OK_ANSWER = b'{"seq": %d, "ok": true, "rows": %d}'  # the head of a success's answer (JSON, as any head)
# A message's metadata (JSON, written without json.dumps: one per insert): seq, steps, timeout (a float
# or null), whether lengths and priorities were given, whether priorities are the table's max.
_META = b'{"seq": %d, "steps": %d, "timeout": %s, "lengths": %s, "priorities": %s, "max_priority": %s}'
_JSON_BOOL = {False: b"false", True: b"true"}
PRIORITY_COLUMN = "__priority"
LENGTH_COLUMN = "__length"
DEFAULT_MAX_MESSAGE_BYTES = 256 << 20
WAIT_SLICE_S = 0.25  # a server's waits for the rate limiter, between checks of whether it is closing
WRITER_WAIT_SLICE_S = 1.0  # a writer's: the longest wait one message asks the server for
AUTH_HEADER = "authorization"
_log = logging.getLogger("gear_jax.remote")
# The schemes of a gear_jax server's address (what Arrow Flight's gRPC client speaks).
_SCHEMES = ("grpc", "grpc+tls", "grpc+tcp", "grpc+unix")
# What the server raises by name, so that the writer raises the same class (anything else: RemoteError).
_ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (InvalidArgumentError, RateLimiterTimeout, TableClosedError, AllRowsHeldError)
}


# -- the server ----------------------------------------------------------------------------------------


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _tables_of(table: Any) -> dict[int | None, Any]:
    """{shard: Table} of what `serve` serves: a Table as shard None, a ShardedTable's local shards."""
    from gear_jax.sharded import ShardedTable
    from gear_jax.table import Table

    if isinstance(table, Table):
        return {None: table}
    if isinstance(table, ShardedTable):
        return dict(table.local_shards)
    if isinstance(table, Mapping) and table and all(isinstance(t, Table) for t in table.values()):
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in table):
            raise InvalidArgumentError("serve: a mapping of tables must be keyed by shard index (int)")
        return dict(table)
    raise InvalidArgumentError(
        f"serve: table must be a gear_jax.Table, a ShardedTable (its shards on this process) or a "
        f"{{shard: Table}} mapping; got {type(table).__name__}"
    )


class _TokenCheck(flight.ServerMiddlewareFactory):
    """Refuses every call that does not carry the server's token (before any handler runs)."""

    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()

    def start_call(self, info: Any, headers: dict[str, list[Any]]) -> None:
        given = headers.get(AUTH_HEADER) or headers.get(AUTH_HEADER.title()) or []
        for value in given:
            value = value.encode() if isinstance(value, str) else bytes(value)
            if hmac.compare_digest(value, self._expected):
                return None
        raise flight.FlightUnauthenticatedError("gear_jax server: missing or wrong token")


class _Layout:
    """The wire layout of one table: one large_binary column per field (each value one row's bytes),
    then the rows' priorities and lengths."""

    def __init__(self, spec: TableSpec):
        self.spec = spec
        self.names = list(spec.fields)
        self.step_bytes = [f.step_bytes for f in spec.fields.values()]
        # What record_batch builds again and again for the same number of rows and bytes per row (the
        # offsets of a column; priorities of 1 and lengths of `steps`): a writer of one or a few batch
        # sizes builds its messages from these (at most _KEPT sizes of each, see _keep).
        self._offsets: dict[tuple[int, int], Any] = {}
        self._defaults: dict[tuple[int, int], tuple[Any, Any]] = {}
        self.schema = pa.schema(
            [pa.field(n, pa.large_binary(), nullable=False) for n in self.names]
            + [
                pa.field(PRIORITY_COLUMN, pa.float32(), nullable=False),
                pa.field(LENGTH_COLUMN, pa.int32(), nullable=False),
            ]
        )

    def record_batch(
        self,
        arrays: list[np.ndarray],
        rows: int,
        priorities: np.ndarray | None,
        lengths: np.ndarray | None,
        steps: int = 1,
    ) -> Any:
        """The rows as a record batch whose field columns are views of `arrays` (no copy). Priorities
        None: 1 each; lengths None: `steps` each."""
        columns = []
        for array in arrays:
            width = array.nbytes // rows
            offsets = self._offsets.get((rows, width))
            if offsets is None:
                every = np.arange(0, (rows + 1) * width, width, dtype=np.int64)
                offsets = _keep(self._offsets, (rows, width), pa.py_buffer(every))
            data = pa.py_buffer(array.reshape(-1).view(np.uint8))
            columns.append(pa.Array.from_buffers(pa.large_binary(), rows, [None, offsets, data]))
        defaults = self._defaults.get((rows, steps))
        if defaults is None and (priorities is None or lengths is None):
            ones, full = np.ones((rows,), np.float32), np.full((rows,), steps, np.int32)
            defaults = _keep(self._defaults, (rows, steps), (pa.array(ones), pa.array(full)))
        if priorities is None:
            columns.append(defaults[0])
        else:
            columns.append(pa.Array.from_buffers(pa.float32(), rows, [None, pa.py_buffer(priorities)]))
        if lengths is None:
            columns.append(defaults[1])
        else:
            columns.append(pa.Array.from_buffers(pa.int32(), rows, [None, pa.py_buffer(lengths)]))
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def arrays(self, batch: Any, steps: int) -> dict[str, np.ndarray]:
        """The field arrays of a received batch (views of its buffers), after checking every column's
        widths and bytes; InvalidArgumentError naming the column otherwise."""
        rows = batch.num_rows
        lead = (rows, steps) if self.spec.is_trajectory else (rows,)
        out = {}
        for i, (name, field) in enumerate(self.spec.fields.items()):
            column = batch.column(i)
            if column.null_count:
                raise InvalidArgumentError(f"column {name!r} has null values")
            _, offsets, data = column.buffers()
            width = steps * self.step_bytes[i]
            at = np.frombuffer(offsets, np.int64, count=rows + 1, offset=column.offset * 8)
            first, last = int(at[0]), int(at[-1])
            regular = last - first == rows * width and (rows == 1 or bool((np.diff(at) == width).all()))
            if not regular or first < 0 or last > data.size:
                raise InvalidArgumentError(
                    f"column {name!r} does not hold {width} bytes per row ({steps} steps of "
                    f"{self.step_bytes[i]} bytes)"
                )
            raw = np.frombuffer(data, np.uint8, count=rows * width, offset=first)
            if field.dtype == np.bool_ and (raw > 1).any():
                raise InvalidArgumentError(f"column {name!r} holds bytes other than 0 and 1 for bools")
            out[name] = raw.view(field.dtype).reshape(*lead, *field.shape)
        return out


_KEPT = 8  # sizes of messages a writer's layout keeps the offsets and defaults of


def _keep(kept: dict[Any, Any], key: Any, value: Any) -> Any:
    """Keeps `value` under `key` in `kept`, which starts again empty once it holds _KEPT entries (one
    call each: safe for threads sharing a writer, as dict.clear and item assignment are); returns it."""
    if len(kept) >= _KEPT:
        kept.clear()
    kept[key] = value
    return value


def _wait_slices(timeout: float | None, slice_s: float) -> Any:
    """The waits, of at most `slice_s` each, that make up a wait of `timeout` seconds (None: for good):
    (seconds, whether it is the last), the time left measured as each begins."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        wait = slice_s if left is None else min(left, slice_s)
        yield wait, left is not None and left <= wait


class _Closing(Exception):
    """A server that is closing gave up a wait for the rate limiter."""


class _Service(flight.FlightServerBase):
    """The Flight service behind `Server`: `describe` (an action) and inserts (DoPut streams)."""

    def __init__(self, owner: Server, location: str, **kwargs: Any):
        super().__init__(location, **kwargs)
        self._owner = owner

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [("describe", "the served tables' specs, casting policies and limits (JSON)")]

    def do_action(self, context: Any, action: Any) -> Any:
        if action.type != "describe":
            raise flight.FlightServerError(f"gear_jax server: unknown action {action.type!r}; use describe")
        return [pa.py_buffer(json.dumps(self._owner.describe()).encode())]

    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        owner = self._owner
        try:
            command = json.loads(bytes(descriptor.command))
            shard, protocol, spec_hash = command.get("shard"), command.get("protocol"), command.get("spec")
        except (ValueError, TypeError, AttributeError):
            raise flight.FlightServerError(
                "gear_jax server: the stream's descriptor is not a gear_jax insert"
            )
        if protocol != PROTOCOL:
            raise flight.FlightServerError(
                f"gear_jax server: protocol {protocol!r} is not this server's ({PROTOCOL}); use the same "
                "gear_jax version on both sides"
            )
        if not (shard is None or type(shard) is int) or shard not in owner.tables:
            raise flight.FlightServerError(
                f"gear_jax server: shard {shard!r} is not served here; it serves {owner.shard_list()}"
            )
        if spec_hash != owner.tables[shard].spec.spec_hash:  # another table since the writer described it
            raise flight.FlightServerError(
                "gear_jax server: the served table's spec is not the one this writer was made for (the "
                "server was restarted with another table?); make a new gj.remote.Writer"
            )
        layout = owner.layouts[shard]
        if not reader.schema.equals(layout.schema):
            raise flight.FlightServerError(
                "gear_jax server: the stream's schema is not the table's; write with gj.remote.Writer"
            )
        with owner.stream_opened():
            while True:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    return
                if owner.closing:  # the writer sends the message again, to the next server
                    raise flight.FlightUnavailableError("gear_jax server: shutting down")
                try:
                    ack = owner.insert_message(shard, layout, chunk, context.is_cancelled)
                except _Closing:
                    raise flight.FlightUnavailableError("gear_jax server: shutting down") from None
                writer.write(pa.py_buffer(ack))


def _text(error: BaseException) -> str:
    """An Arrow error's message, printable (Arrow's URI errors can name a NUL character)."""
    return str(error).replace("\x00", "\\0")


def _tls_problem(cert_file: str, key_file: str) -> str | None:
    """Why (cert_file, key_file) cannot serve TLS, as far as this process's OpenSSL tells (gRPC's own
    reason goes only to its log); None when nothing was found."""
    import ssl

    try:
        with open(cert_file, "rb") as f:
            cert = f.read()
        with open(key_file, "rb") as f:
            key = f.read()
    except OSError as e:
        return f"cannot be read: {e}"
    if b"-----BEGIN CERTIFICATE-----" not in cert:
        return f"the certificate file {cert_file!r} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
    if b"PRIVATE KEY-----" not in key:
        return f"the key file {key_file!r} holds no PEM private key (-----BEGIN PRIVATE KEY-----)"
    if b"ENCRYPTED" in key:
        return f"the private key {key_file!r} is encrypted; gRPC takes only an unencrypted key"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert_file, key_file, password=lambda: b"")  # never a password prompt
    except (ssl.SSLError, OSError, ValueError) as e:
        return f"OpenSSL refuses the pair: {e}"
    return None


def _bind_problem(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on, found by binding a socket there now (as gRPC does, with
    SO_REUSEADDR) and closing it; None when it can."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError, ValueError) as e:
        return f"host={host!r} is not an address this machine can listen on ({e}); pass one of its addresses"
    for family, kind, proto, _, address in addresses:
        try:
            with socket.socket(family, kind, proto) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return f"port={port} is in use (another server listens there); pass another port, or 0"
            if e.errno == errno.EADDRNOTAVAIL:
                return f"host={host!r} is not an address of this machine; pass one of its addresses"
            if e.errno == errno.EACCES:
                return f"port={port} needs privileges this process lacks; pass a port >= 1024, or 0"
            return f"cannot listen on {host}:{port}: {e}"
    return None


def _start_failure(
    host: str, port: int, cert_file: str | None, key_file: str | None, error: BaseException
) -> InvalidArgumentError:
    """The error of a server that failed to start (`error`: Arrow Flight's, which seldom says why)."""
    if cert_file is not None and key_file is not None:
        problem = _tls_problem(cert_file, key_file)
        if problem is not None:
            return InvalidArgumentError(
                f"serve: tls=({cert_file!r}, {key_file!r}) cannot serve TLS: {problem}. Pass a PEM "
                "certificate and its unencrypted PEM private key (e.g. made by openssl req -x509 -newkey "
                "rsa:2048 -nodes)"
            )
    problem = _bind_problem(host, port)
    if problem is not None:
        return InvalidArgumentError(f"serve: {problem}")
    what = f"host={host!r}, port={port}" + (f", tls=({cert_file!r}, {key_file!r})" if cert_file else "")
    return InvalidArgumentError(
        f"serve: the server did not start with {what}: {_text(error)}. gRPC's log (stderr) says why; "
        "check the host, the port" + (" and the TLS certificate and key" if cert_file else "")
    )


class Server:
    """Serves a table, or this process's shards of a `ShardedTable`, to remote writers
    (`gj.remote.Writer`). Made by `gj.serve`; a context manager; `close()` stops it (the table stays)."""

    def __init__(
        self,
        table: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        tls: tuple[str, str] | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        close_timeout_s: float = 10.0,
    ):
        self.tables = _tables_of(table)
        if not isinstance(host, str) or not host:
            raise InvalidArgumentError(f"serve: host={host!r} must be a host name or address")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise InvalidArgumentError(
                f"serve: port={port!r} must be an int in [0, 65535] (0: any free port)"
            )
        if token is not None and (not isinstance(token, str) or len(token) < 16):
            raise InvalidArgumentError(
                "serve: token must be a string of at least 16 characters (e.g. secrets.token_hex(16))"
            )
        if token is None and not _is_loopback(host):
            raise InvalidArgumentError(
                f"serve: host={host!r} listens beyond the loopback; pass token=... (a shared secret every "
                "writer must present, e.g. secrets.token_hex(16)), and tls=(cert_file, key_file) on an "
                "untrusted network"
            )
        if (
            isinstance(max_message_bytes, bool)
            or not isinstance(max_message_bytes, int)
            or max_message_bytes < 1
        ):
            raise InvalidArgumentError(
                f"serve: max_message_bytes={max_message_bytes!r} must be a positive int"
            )
        kwargs: dict[str, Any] = {}
        scheme = "grpc"
        cert_file = key_file = None
        if tls is not None:
            try:
                cert_file, key_file = tls
                with open(cert_file, "rb") as f:
                    cert = f.read()
                with open(key_file, "rb") as f:
                    key = f.read()
            except (TypeError, ValueError, OSError) as e:
                raise InvalidArgumentError(
                    f"serve: tls={tls!r} must be (certificate file, private key file), PEM and readable: {e}"
                ) from None
            kwargs["tls_certificates"] = [(cert, key)]
            scheme = "grpc+tls"
        if token is not None:
            kwargs["middleware"] = {"token": _TokenCheck(token)}
        self.layouts = {s: _Layout(t.spec) for s, t in self.tables.items()}
        self.max_message_bytes = max_message_bytes
        self.closing = False
        self._close_timeout_s = close_timeout_s
        self._lock = threading.Lock()
        self._streams = 0
        self.stats = {"messages": 0, "rows": 0, "refused": 0, "streams": 0}
        self._host = host
        shown = f"[{host}]" if ":" in host else host  # an IPv6 address
        try:
            # A server that fails to start has nothing running (gRPC built no server) and holds no port.
            self._service = _Service(self, f"{scheme}://{shown}:{port}", **kwargs)
        except (pa.ArrowException, flight.FlightError, OSError) as e:  # Flight's errors say little: see why
            raise _start_failure(host, port, cert_file, key_file, e) from None
        self.port = int(self._service.port)
        self.address = f"{scheme}://{shown}:{self.port}"
        self._closed = False
        self._shutdown: threading.Thread | None = None  # close()'s, which may outlive close() (streams open)
        self._pid = os.getpid()
        _open_servers.add(self)
        _close_at_exit_first()

    def shard_list(self) -> list[int | None]:
        return list(self.tables)

    def describe(self) -> dict[str, Any]:
        """What a writer needs before its first insert: each served table's spec and policies."""
        return {
            "protocol": PROTOCOL,
            "max_message_bytes": self.max_message_bytes,
            "tables": [
                {
                    "shard": s,
                    "name": t.name,
                    "spec": t.spec.to_json(),
                    "casting": t.casting,
                    "queue": bool(t.queue),
                    "rate_limited": t.rate_limiter is not None,
                }
                for s, t in self.tables.items()
            ],
        }

    class _Open:
        def __init__(self, server: Server):
            self.server = server

        def __enter__(self) -> None:
            with self.server._lock:
                self.server._streams += 1
                self.server.stats["streams"] += 1

        def __exit__(self, *exc: object) -> None:
            with self.server._lock:
                self.server._streams -= 1

    def stream_opened(self) -> Server._Open:
        return Server._Open(self)

    @property
    def open_streams(self) -> int:
        """Insert streams open now (writers connected)."""
        return self._streams

    def insert_message(
        self, shard: int | None, layout: _Layout, chunk: Any, cancelled: Any = lambda: False
    ) -> bytes:
        """Checks one message and inserts its rows; the answer to send back (row ids, or the error).
        `cancelled()` tells whether the writer is gone (a wait for the rate limiter stops then)."""
        seq = None
        try:
            if chunk.app_metadata is None or chunk.data is None:
                raise InvalidArgumentError("a message must carry rows and their metadata")
            try:
                meta = json.loads(bytes(chunk.app_metadata))
                seq, steps, timeout = meta["seq"], meta["steps"], meta["timeout"]
                given_lengths, given_priorities = meta["lengths"], meta.get("priorities", True)
                max_priority = meta.get("max_priority", False)
            except (ValueError, TypeError, KeyError) as e:
                raise InvalidArgumentError(
                    f"the message's metadata is not a gear_jax insert's ({e})"
                ) from None
            batch = chunk.data
            table = self.tables[shard]
            spec = table.spec
            if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= spec.max_steps:
                raise InvalidArgumentError(f"steps={steps!r} per row; the table holds 1 to {spec.max_steps}")
            if not spec.is_trajectory and steps != 1:
                raise InvalidArgumentError(f"steps={steps} per row in a transition table (one step per row)")
            try:  # buffers as long as the columns say, before anything reads them (`arrays`: the offsets)
                batch.validate()
            except pa.ArrowException as e:
                raise InvalidArgumentError(f"the message's columns are malformed: {e}") from None
            if batch.num_rows < 1:
                raise InvalidArgumentError("a message must carry at least one row")
            size = batch.get_total_buffer_size()  # every buffer received, referenced or not
            if size > self.max_message_bytes:
                raise InvalidArgumentError(
                    f"the message holds {size} bytes, more than the server's max_message_bytes="
                    f"{self.max_message_bytes}; send fewer rows per insert"
                )
            if timeout is not None and not isinstance(timeout, (int, float)):
                raise InvalidArgumentError(f"timeout={timeout!r} must be seconds or None")
            timeout = check_timeout(timeout, "remote insert")
            arrays = layout.arrays(batch, steps)
            priorities = lengths = None  # None: 1 each, T each
            if max_priority:
                priorities = "max"  # the table's own rule
            elif given_priorities:
                priorities = batch.column(len(layout.names)).to_numpy(zero_copy_only=False)
            if given_lengths:
                lengths = batch.column(len(layout.names) + 1).to_numpy(zero_copy_only=False)
            rows = self._insert_waiting(table, arrays, priorities, lengths, timeout, cancelled)
        except _Closing:
            raise
        except Exception as e:  # noqa: BLE001 - whatever a message does, the server answers and goes on
            with self._lock:
                self.stats["refused"] += 1
            error = type(e).__name__ if type(e).__name__ in _ERRORS else "RemoteError"
            return json.dumps({"seq": seq, "ok": False, "error": error, "message": str(e)}).encode()
        with self._lock:
            self.stats["messages"] += 1
            self.stats["rows"] += len(rows)
        ids = np.asarray(rows, np.int32)
        if type(seq) is int:
            head = _OK_ANSWER % (seq, len(ids))
        else:
            head = json.dumps({"seq": seq, "ok": True, "rows": len(ids)}).encode()
        return head + b"\n" + ids.tobytes()

    def _insert_waiting(
        self,
        table: Any,
        arrays: dict[str, np.ndarray],
        priorities: Any,
        lengths: Any,
        timeout: float | None,
        cancelled: Any,
    ) -> np.ndarray:
        """`table.insert`, waiting for the rate limiter (or a queue's room) in slices of WAIT_SLICE_S: a
        server that is closing stops waiting (the writer sends the rows again to the next server)
        instead of holding its close until the learner makes room, and the rows of a writer that is gone
        (killed while it waited) are dropped. A refused wait writes nothing."""
        for wait, last in _wait_slices(timeout, WAIT_SLICE_S):
            try:
                return table.insert(arrays, priorities=priorities, lengths=lengths, timeout=wait)
            except RateLimiterTimeout:
                if last:
                    raise
                if self.closing or cancelled():
                    raise _Closing() from None
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Stops serving: refuses new messages (writers see the server as gone and retry), and waits up to
        `close_timeout_s` for open streams to end (an idle writer closes its stream within its
        `idle_close_s`). The tables stay open."""
        if self._closed:
            return
        self._closed = True
        self.closing = True
        done = threading.Thread(target=self._service.shutdown, name="gear_jax-serve-close", daemon=True)
        self._shutdown = done
        done.start()
        done.join(self._close_timeout_s)
        if done.is_alive():
            _log.warning(
                "gear_jax server %s: %d streams still open after %.0f s; they end when their writers "
                "disconnect",
                self.address,
                self._streams,
                self._close_timeout_s,
            )

    def _close_at_exit(self) -> None:
        """Closes the server at the interpreter's exit (the exit hook: this process's writers have ended
        their streams by then), and waits for its shutdown to finish, however long other processes'
        writers keep their streams open (as Arrow Flight's own finalizer would): a shutdown thread still
        inside Arrow Flight when the interpreter finalizes would abort the process."""
        if self._pid != os.getpid():  # a copy of the parent's server in a forked child
            return
        self.close()
        done = self._shutdown
        if done is not None and done.is_alive():
            _log.warning(
                "gear_jax server %s: the process exits once its %d open streams end (their writers close "
                "them after their idle_close_s)",
                self.address,
                self._streams,
            )
            done.join()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Server(address={self.address!r}, shards={self.shard_list()}, closed={self._closed})"


def serve(
    table: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    tls: tuple[str, str] | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> Server:
    """Serves `table` to remote writers (`gj.remote.Writer`) until the returned `Server` is closed.

    Args:
      table: a `Table`, a `ShardedTable` (this process's shards: writers name one with `shard=`), or a
        `{shard: Table}` mapping.
      host: the address to listen on; the loopback by default. Any other address needs `token`.
      port: the port; 0 picks a free one (`server.port`, `server.address`).
      token: a shared secret (at least 16 characters) every call must carry; None only on the loopback.
      tls: (certificate file, private key file), PEM: the connection is TLS (`grpc+tls://`).
      max_message_bytes: the largest message (one insert, every buffer it carries) the server takes;
        larger ones are refused, writing nothing. gRPC has received such a message by then: the limit
        does not bound the memory of one message.

    Returns:
      The running `Server` (a context manager): `server.address` is what writers connect to.

    Raises:
      InvalidArgumentError: a bad argument, a non-loopback host without a token, a port in use, a host
        that is not an address of this machine, a TLS certificate or key that cannot be read or used
        (the server did not start: nothing of it is left running).
    """
    return Server(table, host, port, token, tls, max_message_bytes)


# -- the writers ---------------------------------------------------------------------------------------


def _is_unavailable(error: BaseException) -> bool:
    """Whether a Flight error means the server is gone or going (retry), not that it refused the call."""
    if isinstance(error, (flight.FlightUnavailableError, flight.FlightTimedOutError, ConnectionError)):
        return True
    if isinstance(error, flight.FlightCancelledError):
        return True
    text = str(error).lower()
    return isinstance(error, (flight.FlightInternalError, OSError)) and any(
        s in text for s in ("unavailable", "connection", "socket", "shutting down", "broken pipe", "eof")
    )


def _end(stream: tuple[Any, Any]) -> None:
    """Ends a writer's stream (its server's answer to the end included), whatever the server's state."""
    try:
        stream[0].done_writing()
        stream[0].close()
    except (flight.FlightError, OSError, pa.ArrowException):
        pass


class _Ending:
    """A writer's stream ended in a thread of its own (gear_jax-remote-end): an idle writer's (whose server
    may have stopped answering), and at the interpreter's exit every open writer's. The exit waits for
    all of them (`wait_all`): one still inside Arrow Flight when the interpreter finalizes is ended by
    Python in mid-call, which aborts the process."""

    _lock = threading.Lock()
    _all: list[_Ending] = []

    def __init__(self, stream: tuple[Any, Any]):
        self.stream: tuple[Any, Any] | None = stream
        self.thread = threading.Thread(target=self._run, name="gear_jax-remote-end", daemon=True)

    def _run(self) -> None:
        stream = self.stream
        if stream is not None:
            _end(stream)
        self.stream = None
        del stream  # freed in this thread (Arrow Flight's destructors run while the exit waits for it)

    @classmethod
    def start(cls, stream: tuple[Any, Any]) -> _Ending:
        ending = cls(stream)
        with cls._lock:  # started under the lock: a thread not yet started is never dropped as ended
            cls._all = [e for e in cls._all if e.thread.is_alive()]
            cls._all.append(ending)
            ending.thread.start()
        return ending

    @classmethod
    def wait_all(cls, deadline: float) -> None:
        """Waits until `deadline` (time.monotonic()) for every stream being ended. One whose server stopped
        answering is left (pyarrow cannot cancel a DoPut stream): its thread stays blocked, and the
        process exits without it (its stream is never freed, which would block the exit for good)."""
        with cls._lock:
            endings = list(cls._all)
        for ending in endings:
            ending.thread.join(max(0.0, deadline - time.monotonic()))
        stuck = sum(e.thread.is_alive() for e in endings)
        if stuck:
            _log.warning(
                "gear_jax: %d writer streams did not end within %.0f s (their servers do not answer); "
                "exiting without them",
                stuck,
                EXIT_END_S,
            )


class _Idle:
    """Closes the streams of writers idle for longer than their `idle_close_s` (one daemon thread, which
    the exit hook stops)."""

    _lock = threading.Lock()
    _writers: weakref.WeakSet[Writer] = weakref.WeakSet()
    _thread: threading.Thread | None = None
    _stop = threading.Event()

    @classmethod
    def watch(cls, writer: Writer) -> None:
        with cls._lock:
            cls._writers.add(writer)
            if cls._stop.is_set():  # the interpreter is exiting: no thread starts any more
                return
            if cls._thread is None or not cls._thread.is_alive():
                cls._thread = threading.Thread(target=cls._run, name="gear_jax-remote-idle", daemon=True)
                cls._thread.start()

    @classmethod
    def _run(cls) -> None:
        while not cls._stop.wait(0.1):
            for writer in list(cls._writers):
                writer._close_if_idle()

    @classmethod
    def stop(cls) -> None:
        """Stops the thread (it starts no stream's end after this returns)."""
        with cls._lock:
            cls._stop.set()
            thread = cls._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()


# -- the interpreter's exit ----------------------------------------------------------------------------

EXIT_END_S = 5.0  # the longest the exit waits for writers' streams to end (servers that stopped answering)
_open_servers: weakref.WeakSet[Server] = weakref.WeakSet()


def _close_at_exit_first() -> None:
    """Makes `_close_at_exit` the next exit hook to run (atexit runs the last registered first): before
    the finalizers of tables and of Arrow Flight's servers (weakref.finalize's exit hook). A server's
    finalizer waits for its open streams, so an open writer's stream would hold the exit up for the
    writer's idle_close_s, and the thread that then ends it would race the interpreter's finalization."""
    atexit.unregister(_close_at_exit)
    atexit.register(_close_at_exit)


def _close_at_exit() -> None:
    """Closes the writers and servers of this process left open (see the module's docstring), in the
    order that lets each finish: no stream starts ending any more (the idle thread stops), the writers
    end their streams, then the servers stop."""
    _Idle.stop()
    pid = os.getpid()
    deadline = time.monotonic() + EXIT_END_S
    writers = [w for w in list(_Idle._writers) if w._pid == pid and not w.closed]
    closing = [(w, *w._close_at_exit(deadline)) for w in writers]
    _Ending.wait_all(deadline)
    for writer, held, ending in closing:
        if not held and (ending is None or not ending.thread.is_alive()):
            writer._close_client()
    for server in list(_open_servers):
        server._close_at_exit()


def _after_fork_in_child() -> None:
    """A forked child has copies of the parent's writers, servers and threads, none of them its own (the
    exit hook leaves them), and of locks that a thread of the parent may have held: new locks."""
    _Ending._lock = threading.Lock()
    _Idle._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Writer:
    """Writes rows into a table served by `gj.serve`, from any machine: `insert`, `add` and
    `episode_writer` as on a local table.

    Args:
      address: the server's address (`server.address`: "grpc://host:port" or "grpc+tls://host:port").
      shard: which served shard to write (a `ShardedTable`'s index); None when the server serves one table.
      token: the server's shared secret, if it has one.
      tls_root_cert: for a TLS server, the PEM file of the certificate (or CA) that signed its certificate.
      batch_rows: `add` sends its rows in messages of this many (and on `flush()` and `close()`).
      retries: tries of a call that finds the server gone before `RemoteUnavailableError`.
      retry_wait_s: the first wait between tries (doubling, at most 5 s).
      idle_close_s: the writer closes its stream after this long without a call.
      casting: the casting policy of inserts ("fit" or "strict"); None: the served table's.

    Close a writer (`close()`, or a `with` block): one left open when the interpreter exits is closed
    then, without sending the rows `add` kept (a warning says how many).

    Raises:
      RemoteUnavailableError: the server cannot be reached after `retries` tries.
      RemoteAuthenticationError: the server wants another token.
      InvalidArgumentError: bad arguments, or a shard the server does not serve.
    """

    def __init__(
        self,
        address: str,
        shard: int | None = None,
        token: str | None = None,
        tls_root_cert: str | None = None,
        batch_rows: int = 64,
        retries: int = 5,
        retry_wait_s: float = 0.2,
        idle_close_s: float = 1.0,
        casting: str | None = None,
    ):
        scheme, _, rest = address.partition("://") if isinstance(address, str) else ("", "", "")
        if not scheme or not rest or (scheme != "grpc+unix" and rest[0] in ":/?#"):  # no host
            raise InvalidArgumentError(
                f"Writer: address={address!r} must be a server's address such as 'grpc://127.0.0.1:5005' "
                "(server.address)"
            )
        if scheme not in _SCHEMES:  # Arrow Flight's schemes are lowercase
            raise InvalidArgumentError(
                f"Writer: address={address!r} has the scheme {scheme!r}, which a gear_jax server does not "
                "speak; use grpc://host:port, or grpc+tls://host:port for a TLS server (server.address)"
            )
        for name, value, low in (("batch_rows", batch_rows, 1), ("retries", retries, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidArgumentError(f"Writer: {name}={value!r} must be an int >= {low}")
        for name, value in (("retry_wait_s", retry_wait_s), ("idle_close_s", idle_close_s)):
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise InvalidArgumentError(f"Writer: {name}={value!r} must be seconds >= 0")
        self.address = address
        self._retries = retries
        self._retry_wait_s = float(retry_wait_s)
        self._idle_close_s = float(idle_close_s)
        self._batch_rows = batch_rows
        headers = [(AUTH_HEADER.encode(), f"Bearer {token}".encode())] if token is not None else []
        self._options = flight.FlightCallOptions(headers=headers)
        kwargs: dict[str, Any] = {}
        if tls_root_cert is not None:
            try:
                with open(tls_root_cert, "rb") as f:
                    kwargs["tls_root_certs"] = f.read()
            except (OSError, TypeError) as e:
                raise InvalidArgumentError(
                    f"Writer: tls_root_cert={tls_root_cert!r} cannot be read: {e}"
                ) from None
        self._lock = threading.RLock()
        self._stream: tuple[Any, Any] | None = None
        self._last_used = time.monotonic()
        self._seq = 0
        self._pending: list[tuple[list[np.ndarray], float]] = []
        self._closed = False
        self._pid = os.getpid()
        try:
            self._client = flight.FlightClient(address, **kwargs)
        except (pa.ArrowException, flight.FlightError, OSError, ValueError, TypeError) as e:
            raise InvalidArgumentError(
                f"Writer: address={address!r} is not a server's address ({_text(e)}); pass server.address, "
                "such as 'grpc://127.0.0.1:5005'"
            ) from None
        try:
            self._connect(address, shard, casting)
        except BaseException:  # a writer that failed to start keeps no connection
            self._closed = True
            self._client.close()
            raise
        _Idle.watch(self)
        _close_at_exit_first()

    def _connect(self, address: str, shard: int | None, casting: str | None) -> None:
        """Asks the server for its tables and takes the one of `shard` (Writer's arguments)."""
        described = self._retrying(self._describe, "describe")
        tables = {t["shard"]: t for t in described["tables"]}
        if shard is None and len(tables) == 1:
            shard = next(iter(tables))
        if shard not in tables:
            raise InvalidArgumentError(
                f"Writer: shard={shard!r} is not served at {address}; it serves shards "
                f"{sorted(tables, key=str)}" + (" (name one with shard=)" if shard is None else "")
            )
        info = tables[shard]
        self.shard = shard
        self.table_name: str = info["name"]
        self.spec = TableSpec.from_json(info["spec"])
        self.queue = bool(info["queue"])
        self.rate_limited = bool(info["rate_limited"])
        self.max_message_bytes = int(described["max_message_bytes"])
        self.casting = check_casting(casting if casting is not None else info["casting"])
        self._layout = _Layout(self.spec)
        self._batches = _rows.Batches(self.spec)
        self._convert = StepConverter(self.spec.fields)
        self._descriptor = flight.FlightDescriptor.for_command(
            json.dumps({"protocol": PROTOCOL, "shard": shard, "spec": self.spec.spec_hash}).encode()
        )

    # -- connection ------------------------------------------------------------------------------------

    def _describe(self) -> dict[str, Any]:
        results = list(self._client.do_action(flight.Action("describe", b""), self._options))
        described = json.loads(bytes(results[0].body))
        if described.get("protocol") != PROTOCOL:
            raise RemoteError(
                f"the server at {self.address} speaks protocol {described.get('protocol')!r}, this writer "
                f"{PROTOCOL}; use the same gear_jax version on both sides"
            )
        return described

    def _retrying(self, call: Any, what: str) -> Any:
        """`call()`, tried again while the server is unreachable, up to `retries` more times."""
        wait = self._retry_wait_s
        for attempt in range(self._retries + 1):
            if self._closed:
                raise InvalidArgumentError("this gj.remote.Writer was closed (while the call went on)")
            try:
                return call()
            except flight.FlightUnauthenticatedError:
                raise RemoteAuthenticationError(
                    f"the gear_jax server at {self.address} refused the token (pass the server's token=)"
                ) from None
            except (flight.FlightError, OSError) as e:
                if not _is_unavailable(e):
                    raise RemoteError(f"{what} at {self.address} failed: {e}") from None
                self._drop_stream()
                if attempt == self._retries:
                    raise RemoteUnavailableError(
                        f"the gear_jax server at {self.address} could not be reached ({what}, "
                        f"{self._retries + 1} tries): {e}. Is it running (gj.serve or python -m "
                        "gear_jax.serve)? Raise retries= to wait longer"
                    ) from None
                time.sleep(wait)
                wait = min(2 * wait, 5.0)
        raise AssertionError("unreachable")

    def _open_stream(self) -> tuple[Any, Any]:
        if self._stream is None:
            self._stream = self._client.do_put(self._descriptor, self._layout.schema, self._options)
        return self._stream

    def _drop_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream[0].close()
            except (flight.FlightError, OSError, pa.ArrowException):
                pass

    def _close_if_idle(self) -> None:
        if self._stream is None or not self._lock.acquire(blocking=False):
            return
        try:
            stream = None
            if self._stream is not None and time.monotonic() - self._last_used > self._idle_close_s:
                stream, self._stream = self._stream, None
        finally:
            self._lock.release()
        if stream is not None:  # ended in a thread of its own: a server that stopped answering stalls it
            _Ending.start(stream)

    def _end_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            _end(stream)

    def _close_at_exit(self, deadline: float) -> tuple[bool, _Ending | None]:
        """Closes a writer left open at the interpreter's exit (the exit hook): drops what `add` kept
        (sending it could wait for good: a full table, a gone server) and ends the stream in a thread,
        which the hook waits for until `deadline` (time.monotonic()). Returns whether another thread's call
        still holds the writer (its client is then left open) and the stream's ending."""
        if self._pending:
            _log.warning(
                "a gj.remote.Writer to %s was left open at exit: the %d rows add() kept were not sent "
                "(call flush() or close() before the end)",
                self.address,
                len(self._pending),
            )
        self._pending = []
        self._closed = True  # another thread's call stops within WRITER_WAIT_SLICE_S (or a retry's wait)
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            _log.warning(  # its server stopped answering: the call stays blocked, the process exits
                "a gj.remote.Writer to %s: another thread's call did not end by the exit", self.address
            )
            return True, None
        try:
            stream, self._stream = self._stream, None
        finally:
            self._lock.release()
        return False, None if stream is None else _Ending.start(stream)

    def _close_client(self) -> None:
        try:
            self._client.close()
        except (flight.FlightError, OSError, pa.ArrowException):
            pass

    def _send(self, batch: Any, meta: bytes) -> bytes:
        """Sends one message (`meta`: its metadata, JSON) and returns the server's answer, reconnecting
        (and resending) while the server is unreachable."""

        def once() -> bytes:
            writer, answers = self._open_stream()
            writer.write_with_metadata(batch, pa.py_buffer(meta))
            answer = answers.read()
            if answer is None:  # the server ended the stream: its status says why
                self._stream = None
                writer.close()  # raises the server's error
                raise flight.FlightUnavailableError("the server ended the stream")
            return answer.to_pybytes()

        with self._lock:
            self._live()
            try:
                return self._retrying(once, "insert")
            finally:
                self._last_used = time.monotonic()

    def _live(self) -> None:
        if self._closed:
            raise InvalidArgumentError("this gj.remote.Writer is closed; make a new one")

    # -- writing ---------------------------------------------------------------------------------------

    def insert(
        self,
        batch: Mapping[str, Any],
        priorities: Any = None,
        lengths: Any = None,
        timeout: float | None = None,
    ) -> np.ndarray:
        """Inserts a batch of rows into the served table; returns their row ids, int32[B], once they are
        in it. As `Table.insert`: the same arguments, casts and checks (done here first, and again by
        the server), all rows or none.

        Raises:
          InvalidArgumentError: as `Table.insert`, or a batch larger than the server's max_message_bytes.
          RateLimiterTimeout: the table's rate limiter (or a full queue) did not admit the rows in time.
          TableClosedError: the served table was closed.
          RemoteUnavailableError: the server could not be reached after `retries` tries.
        """
        if timeout is not None:
            timeout = check_timeout(timeout, "Writer.insert")
        max_priority = _rows.names_max_priority(priorities, "Writer.insert")
        checked = self._batches.ready(batch, self.casting)
        if checked is None or any(a.dtype != f.dtype for a, f in zip(checked[0], self.spec.fields.values())):
            checked = self._batches.host(batch, self.casting)
        arrays, rows, steps = checked
        if rows == 0:
            return np.zeros((0,), np.int32)
        # None: the layout's kept arrays of 1 and of `steps` (the server is told none were given).
        p = None if max_priority or priorities is None else _rows.priorities(priorities, rows)
        n = None if lengths is None else _rows.lengths(lengths, rows, steps)
        nbytes = sum(a.nbytes for a in arrays) + 8 * rows
        if nbytes > self.max_message_bytes:
            raise InvalidArgumentError(
                f"Writer.insert: the batch holds {nbytes} bytes, more than the server's max_message_bytes="
                f"{self.max_message_bytes}; insert fewer rows per call"
            )
        record = self._layout.record_batch(arrays, rows, p, n, steps)
        # A long wait for the rate limiter is a series of waits of at most WRITER_WAIT_SLICE_S, the rows
        # sent again for each: a writer closed meanwhile (by another thread) stops after the current one.
        for wait, last in _wait_slices(timeout, WRITER_WAIT_SLICE_S):
            self._seq += 1
            meta = _META % (
                self._seq,
                steps,
                repr(float(wait)).encode(),  # _wait_slices' waits are seconds, never None
                _JSON_BOOL[lengths is not None],
                _JSON_BOOL[priorities is not None],
                _JSON_BOOL[bool(max_priority)],
            )
            try:
                return self._answer(self._send(record, meta), rows)
            except RateLimiterTimeout as e:
                if self._closed:
                    raise InvalidArgumentError(
                        "this gj.remote.Writer was closed while the insert waited for the rate limiter; "
                        "nothing of it was written"
                    ) from None
                if last:
                    raise RateLimiterTimeout(f"(after {timeout:.3g} s in all) {e}") from None
        raise AssertionError("unreachable")

    def _answer(self, answer: bytes, rows: int) -> np.ndarray:
        head, _, body = answer.partition(b"\n")
        if head == _OK_ANSWER % (self._seq, rows) and len(body) == 4 * rows:  # the rows went in
            return np.frombuffer(body, np.int32).copy()
        reply = json.loads(head)
        if not reply.get("ok"):
            cls = _ERRORS.get(reply.get("error"), RemoteError)
            raise cls(f"gear_jax server {self.address}: {reply.get('message')}")
        ids = np.frombuffer(body, np.int32).copy()
        if ids.shape != (rows,):
            raise RemoteError(f"the server at {self.address} answered {ids.size} row ids for {rows} rows")
        return ids

    def add(self, row: Mapping[str, Any], priority: float = 1.0) -> None:
        """Adds one row (as `Table.add`: no batch axis; `[T, *shape]` for a trajectory table), checked and
        cast now and sent with others in messages of `batch_rows` rows (`flush()` sends what is kept)."""
        self._live()
        if not isinstance(row, Mapping):
            raise InvalidArgumentError(f"row must map field names to values, got {type(row).__name__}")
        p = _rows.priority(priority)
        if self.spec.is_trajectory:
            batch = {n: to_numpy(v, f"row[{n!r}]")[None] for n, v in row.items()}
            arrays, _, _ = self._batches.host(batch, self.casting)
            values = [a[0] for a in arrays]
        else:
            if set(row) != set(self.spec.fields):
                self._convert.refuse_keys(row, "row")
            values = self._convert(row, self.casting, "row")
        with self._lock:
            self._pending.append((values, p))
            if len(self._pending) >= self._batch_rows:
                self.flush()

    def flush(self, timeout: float | None = None) -> np.ndarray:
        """Sends the rows `add` kept; returns their row ids (int32, in the order added). A flush that
        raises keeps the rows (the next `add` or `flush` sends them again)."""
        with self._lock:
            pending = self._pending
            if not pending:
                return np.zeros((0,), np.int32)
            priorities = np.array([p for _, p in pending], np.float32)
            lengths = None
            if not self.spec.is_trajectory:
                batch = {n: np.stack([v[i] for v, _ in pending]) for i, n in enumerate(self.spec.fields)}
            else:
                lengths = np.array([v[0].shape[0] for v, _ in pending], np.int32)
                steps = int(lengths.max())
                batch = {}
                for i, (name, field) in enumerate(self.spec.fields.items()):
                    out = np.zeros((len(pending), steps, *field.shape), field.dtype)
                    for j, (values, _) in enumerate(pending):
                        out[j, : lengths[j]] = values[i]
                    batch[name] = out
            ids = self.insert(batch, priorities, lengths=lengths, timeout=timeout)
            self._pending = []
            return ids

    def episode_writer(self, deferred: Sequence[str] = ()) -> RemoteEpisodeWriter:
        """A step-by-step writer of episodes (as `Table.writer()`, `deferred` fields included), kept here
        until `end_episode`."""
        self._live()
        return RemoteEpisodeWriter(self, deferred)

    def close(self) -> None:
        """Sends what `add` kept, then closes the stream. Idempotent. A call of another thread that is
        waiting for the rate limiter stops within WRITER_WAIT_SLICE_S and raises."""
        if self._closed:
            return
        try:
            if self._pending and self._lock.acquire(timeout=0):  # not while another thread sends
                try:
                    self.flush()
                finally:
                    self._lock.release()
        finally:
            self._closed = True
            self._lock.acquire()  # another thread's wait ends within WRITER_WAIT_SLICE_S
            try:
                self._end_stream()
                self._client.close()
            finally:
                self._lock.release()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self._pending = []  # an error: what add kept is dropped, not sent on the way out
        self.close()

    def __repr__(self) -> str:
        return f"Writer(address={self.address!r}, table={self.table_name!r}, shard={self.shard!r})"


class RemoteEpisodeWriter:
    """Writes episodes step by step into a served table (`Writer.episode_writer()`), as `EpisodeWriter`:
    `append` checks and casts each step at once; `end_episode` sends the episode as one row and returns
    its row id. Nothing reaches the server before `end_episode`, so an abandoned episode (`close()`, the
    `with` block's end, a killed process) leaves nothing behind. Deferred fields as `EpisodeWriter`'s:
    given for every step at `end_episode(deferred=...)`."""

    def __init__(self, writer: Writer, deferred: Sequence[str] = ()):
        self._writer = writer
        self._steps: list[list[np.ndarray]] = []
        self._deferred = DeferredFields(deferred, writer.spec)

    @property
    def steps(self) -> int:
        """Steps appended to the current episode."""
        return len(self._steps)

    def append(self, step: Mapping[str, Any]) -> None:
        """Appends one step (a value of each field's shape), cast by the table's casting policy.

        Raises:
          InvalidArgumentError: missing or unknown fields, wrong shapes or dtypes, or an episode that
            would exceed `max_steps` (end it first).
        """
        writer = self._writer
        writer._live()
        spec = writer.spec
        step = self._deferred.step(step)
        if not isinstance(step, Mapping) or set(step) != set(spec.fields):
            writer._convert.refuse_keys(step, "step")
        check_room_for_a_step(len(self._steps), spec)
        self._steps.append(writer._convert(step, writer.casting))

    def end_episode(
        self,
        priority: float | str = 1.0,
        timeout: float | None = None,
        deferred: Mapping[str, Any] | None = None,
    ) -> int:
        """Sends the episode (one row of its steps); returns its row id. Raises as `Writer.insert`; the
        episode is kept when the insert fails (call end_episode again, or close() to drop it).

        Args:
          priority: finite and >= 0 (as `EpisodeWriter.end_episode` takes it); or "max": the largest
            priority any row of the served table was given so far (its `max_priority`, 1 while no row had
            one), read by the server when it inserts the row, as `Writer.insert(..., priorities="max")`.
          timeout: seconds to wait at most for the table's rate limiter; None waits as long as it takes.
          deferred: for a writer made with `episode_writer(deferred=[...])`: every deferred field's values
            for the episode's steps, `[steps, *shape]` (as `EpisodeWriter.end_episode` takes them).
        """
        op = "RemoteEpisodeWriter.end_episode"
        # Checked in EpisodeWriter.end_episode's order: priority, steps, timeout.
        priorities: str | list[float]
        if _rows.names_max_priority(priority, op, rows=None, name="priority"):
            priorities = "max"  # the server inserts the row with the table's own rule
        else:
            priorities = [_rows.priority(priority)]
        if not self._steps:
            raise InvalidArgumentError("end_episode() needs at least one append() first")
        if timeout is not None:
            timeout = check_timeout(timeout, op)
        spec = self._writer.spec
        values = self._deferred.values(deferred, len(self._steps), self._writer.casting)
        if spec.is_trajectory:  # one row of T steps: [1, T, *shape]
            batch = {n: np.stack([s[i] for s in self._steps])[None] for i, n in enumerate(spec.fields)}
            batch.update({n: v[None] for n, v in values.items()})
        else:  # a transition table's row is its one step: [1, *shape] (append allows no second step)
            batch = {n: self._steps[0][i][None] for i, n in enumerate(spec.fields)}
            batch.update(values)  # [1, *shape]
        row = int(self._writer.insert(batch, priorities, timeout=timeout)[0])
        self._steps = []
        return row

    def close(self) -> None:
        """Drops an unfinished episode (nothing of it was sent)."""
        self._steps = []

    def __enter__(self) -> RemoteEpisodeWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

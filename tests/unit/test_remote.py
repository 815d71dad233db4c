"""Remote writers (gear_jax/remote.py): a served table written through `gj.remote.Writer` over 127.0.0.1,
what the client and the server refuse (malformed, oversized, wrongly typed, unauthenticated messages write
nothing), the rate limiter reaching remote writers, TLS, and reconnecting to a restarted server. Writers
in other processes (killed mid-stream among them) are in tests/multiprocess/test_remote_processes.py."""

import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gear_jax as gj

pa = pytest.importorskip("pyarrow")
flight = pytest.importorskip("pyarrow.flight")
remote = gj.remote

FIELDS = {"obs": gj.Field((3,), "float32"), "action": gj.Field((), "int32"), "done": gj.Field((), "bool")}
TOKEN = "0123456789abcdef0123"


def FIELDS_SPEC_HASH():  # noqa: N802 - a constant, computed when asked
    return gj.TableSpec(FIELDS, capacity=64).spec_hash


def rows(n, start=0):
    ids = np.arange(start, start + n)
    return {
        "obs": np.stack([ids, ids + 0.5, -ids], axis=1).astype(np.float32),
        "action": ids.astype(np.int32),
        "done": ids % 2 == 1,
    }


def snapshot(table):
    """Everything a write could change: status and every column's bytes."""
    return (table.row_status(), {n: c.copy() for n, c in table.columns.items()})


def same(a, b):
    status_a, cols_a = a
    status_b, cols_b = b
    return all(np.array_equal(status_a[k], status_b[k]) for k in status_a) and all(
        np.array_equal(cols_a[n], cols_b[n]) for n in cols_a
    )


@pytest.fixture
def served(make_table):
    """A transition table, its server and a writer; everything closed at the end."""
    table = make_table(fields=FIELDS, capacity=64)
    server = gj.serve(table)
    writer = remote.Writer(server.address, retries=1, retry_wait_s=0.01)
    yield table, server, writer
    writer.close()
    server.close()


def test_insert_add_and_flush_store_what_a_local_insert_stores(served):
    table, server, writer = served
    ids = writer.insert(rows(5), priorities=np.arange(1, 6))
    assert ids.dtype == np.int32 and ids.tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(table.columns["obs"][ids, 0], rows(5)["obs"])
    np.testing.assert_array_equal(table.columns["action"][ids, 0], np.arange(5))
    np.testing.assert_array_equal(table.columns["done"][ids, 0], rows(5)["done"])
    np.testing.assert_array_equal(table.row_status()["priority"][ids], np.arange(1, 6))
    # Values the casting policy converts (float64, Python ints and bools) are cast on the client.
    more = writer.insert({"obs": np.ones((2, 3)), "action": [7, 8], "done": [True, False]}, priorities=0.5)
    assert table.columns["action"][more, 0].tolist() == [7, 8]
    for i in range(3):
        writer.add({"obs": [i, i, i], "action": 100 + i, "done": True}, priority=2.0)
    assert table.size == 7  # kept by the writer until batch_rows or flush
    flushed = writer.flush()
    assert table.columns["action"][flushed, 0].tolist() == [100, 101, 102]
    assert table.size == 10 and server.stats["rows"] == 10
    writer.insert(rows(2), priorities="max")
    assert table.row_status()["priority"][10:12].tolist() == [5.0, 5.0]


def test_add_sends_full_batches_and_close_sends_the_rest(make_table):
    table = make_table(fields=FIELDS, capacity=64)
    with gj.serve(table) as server:
        with remote.Writer(server.address, batch_rows=4) as writer:
            for i in range(10):
                writer.add({"obs": np.zeros(3), "action": i, "done": False})
            assert table.size == 8 and server.stats["messages"] == 2
        assert table.size == 10
        assert sorted(table.columns["action"][:10, 0].tolist()) == list(range(10))


def test_episodes_of_a_trajectory_table_and_a_step_ring(make_table):
    for kwargs in ({"max_steps": 6}, {}):
        if kwargs:
            table = make_table(fields=FIELDS, capacity=8, **kwargs)
        else:
            spec = gj.TableSpec(FIELDS, capacity=8, step_capacity=64, max_steps=6)
            table = gj.Table.create(spec)
        try:
            with gj.serve(table) as server, remote.Writer(server.address) as writer:
                with writer.episode_writer() as episode:
                    for t in range(4):
                        episode.append({"obs": [t, t, t], "action": t, "done": t == 3})
                    assert table.size == 0  # nothing reaches the server before end_episode
                    row = episode.end_episode(priority=3.0)
                    for t in range(6):
                        episode.append({"obs": np.zeros(3), "action": 10 + t, "done": False})
                    with pytest.raises(gj.InvalidArgumentError, match="max_steps=6"):
                        episode.append({"obs": np.zeros(3), "action": 0, "done": False})
                    episode.close()  # dropped: nothing was sent
                assert table.size == 1
                status = table.row_status()
                assert status["length"][row] == 4 and status["priority"][row] == 3.0
                got = gj.host.gather(table, gj.host.sample(table, np.random.default_rng(0), 1), window=4)
                assert got["action"][0].tolist() == [0, 1, 2, 3]
                # A batch of trajectories with lengths, and add() of rows of different lengths.
                batch = {"obs": np.ones((2, 5, 3)), "action": np.ones((2, 5), np.int32)}
                ids = writer.insert({**batch, "done": np.ones((2, 5), bool)}, lengths=[2, 5])
                assert table.row_status()["length"][ids].tolist() == [2, 5]
                writer.add({"obs": np.ones((3, 3)), "action": [1, 2, 3], "done": [False, False, True]})
                writer.add({"obs": np.ones((1, 3)), "action": [9], "done": [True]})
                added = writer.flush()
                assert table.row_status()["length"][added].tolist() == [3, 1]
        finally:
            table.close()


def test_the_client_refuses_bad_batches_before_sending(served):
    table, server, writer = served
    before = server.stats["messages"] + server.stats["refused"]
    with pytest.raises(gj.InvalidArgumentError, match="missing fields"):
        writer.insert({"obs": np.zeros((1, 3))})
    with pytest.raises(gj.InvalidArgumentError, match="shape"):
        writer.insert({**rows(2), "obs": np.zeros((2, 4), np.float32)})
    with pytest.raises(gj.InvalidArgumentError, match="priorities"):
        writer.insert(rows(2), priorities=[1.0, float("nan")])
    with pytest.raises(gj.InvalidArgumentError, match="timeout"):
        writer.insert(rows(2), timeout=-1)
    with pytest.raises(gj.InvalidArgumentError, match="every field"):
        writer.add({"obs": np.zeros(3), "action": 1, "done": False, "extra": 1})
    assert server.stats["messages"] + server.stats["refused"] == before and table.size == 0


def test_a_batch_beyond_the_servers_message_limit_is_refused_on_both_sides(make_table):
    table = make_table(fields={"x": gj.Field((1024,), "uint8")}, capacity=64)
    with gj.serve(table, max_message_bytes=10_000) as server:
        writer = remote.Writer(server.address)
        writer.insert({"x": np.zeros((4, 1024), np.uint8)})
        with pytest.raises(gj.InvalidArgumentError, match="max_message_bytes=10000"):
            writer.insert({"x": np.zeros((16, 1024), np.uint8)})
        # A client that does not check: the server refuses the message, writes nothing, and goes on.
        writer.max_message_bytes = 1 << 30
        before = snapshot(table)
        with pytest.raises(gj.InvalidArgumentError, match="max_message_bytes=10000"):
            writer.insert({"x": np.zeros((16, 1024), np.uint8)})
        assert same(before, snapshot(table))
        writer.insert({"x": np.ones((2, 1024), np.uint8)})
        assert table.size == 6
        writer.close()


def test_the_servers_checks_are_the_tables_own(served):
    """What only the table can check (a queue's rules, a closed table) comes back as the table's error."""
    table, server, writer = served
    writer.insert(rows(1))
    table.close()
    with pytest.raises(gj.TableClosedError):
        writer.insert(rows(1))


# -- messages a client crafts by hand ------------------------------------------------------------------


RAW_CLIENTS = []


@pytest.fixture(autouse=True)
def close_raw_clients():
    """Closes the hand-made clients of a test, also when it fails (an open stream delays a server's close)."""
    yield
    while RAW_CLIENTS:
        RAW_CLIENTS.pop().close()


class RefusedStream:
    """A stream the server ended as it opened: gRPC reports that refusal at `do_put` itself or at the
    first message, depending on which comes first on the wire (a loaded machine showed both)."""

    def __init__(self, error: Exception):
        self.error = error


def raw_stream(server, shard=None, schema=None, token=None, command=None):
    """A Flight stream to `server` made by hand: (client, writer, answers), or (client, RefusedStream,
    None) when the server refused it at once."""
    client = flight.FlightClient(server.address)
    RAW_CLIENTS.append(client)
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    options = flight.FlightCallOptions(headers=headers)
    layout = server.layouts[shard]
    if command is None:
        command = json.dumps({"protocol": 1, "shard": shard, "spec": layout.spec.spec_hash}).encode()
    try:
        writer, answers = client.do_put(
            flight.FlightDescriptor.for_command(command), schema or layout.schema, options
        )
    except flight.FlightError as e:
        return client, RefusedStream(e), None
    return client, writer, answers


def good_batch(server, n=2):
    layout = server.layouts[None]
    arrays = [np.ascontiguousarray(v) for v in rows(n).values()]
    return layout.record_batch(arrays, n, np.ones(n, np.float32), np.ones(n, np.int32))


def send(writer, answers, batch, meta):
    """One message; the server's answer (a dict), or the error that ended the stream."""
    if isinstance(writer, RefusedStream):
        return {"ended": True, "error": str(writer.error)}
    raw = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    try:
        writer.write_with_metadata(batch, pa.py_buffer(raw))
        answer = answers.read()
        if answer is None:
            writer.close()
            return {"ended": True}
    except (flight.FlightError, OSError, pa.ArrowException) as e:
        return {"ended": True, "error": str(e)}
    head = answer.to_pybytes().partition(b"\n")[0]
    return json.loads(head)


META = {"seq": 1, "steps": 1, "timeout": None, "lengths": False}


def with_column(batch, i, column):
    columns = list(batch.columns)
    columns[i] = column
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)


def binary_column(values, width, n):
    return pa.Array.from_buffers(
        pa.large_binary(),
        n,
        [None, pa.py_buffer(np.arange(0, (n + 1) * width, width, dtype=np.int64)), pa.py_buffer(values)],
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s, b: (b, {**META, "steps": 2}), "steps=2"),
        (lambda s, b: (b, {**META, "steps": 0}), "steps=0"),
        (lambda s, b: (b, {"seq": 1}), "metadata"),
        (lambda s, b: (b, b"not json"), "metadata"),
        (lambda s, b: (b, {**META, "timeout": "soon"}), "timeout"),
        (lambda s, b: (b, {**META, "timeout": -5}), "timeout"),
        (lambda s, b: (b.slice(0, 0), META), "at least one row"),
        (lambda s, b: (with_column(b, 0, binary_column(np.zeros(22, np.uint8), 11, 2)), META), "12 bytes"),
        (lambda s, b: (with_column(b, 2, binary_column(np.array([0, 7], np.uint8), 1, 2)), META), "bools"),
        (lambda s, b: (with_column(b, 3, pa.array([1.0, float("nan")], pa.float32())), META), "priorit"),
        (lambda s, b: (with_column(b, 3, pa.array([1.0, None], pa.float32())), META), "priorit"),
        (lambda s, b: (b, {**META, "lengths": True, "steps": 1}), None),  # lengths of 1: accepted
    ],
)
def test_the_server_refuses_malformed_messages_and_writes_nothing(served, change, message):
    table, server, writer = served
    client, stream, answers = raw_stream(server)
    before = snapshot(table)
    batch, meta = change(server, good_batch(server))
    answer = send(stream, answers, batch, meta)
    if message is None:
        assert answer["ok"] and table.size == 2
        return
    assert answer.get("ok") is False and message in answer["message"], answer
    assert same(before, snapshot(table))
    # The stream goes on: the next good message is written.
    assert send(stream, answers, good_batch(server), META)["ok"]
    assert table.size == 2
    client.close()


def test_the_server_ends_streams_of_another_schema_or_shard_or_protocol(served):
    table, server, writer = served
    wrong = pa.schema([pa.field("obs", pa.float64())])
    for kwargs in (
        {"schema": wrong},
        {"command": b"{}"},
        {"command": b"\xff garbage"},
        {"command": json.dumps({"protocol": 99, "shard": None}).encode()},
        {"command": json.dumps({"protocol": 1, "shard": 3}).encode()},
        {"command": json.dumps({"protocol": 1, "shard": [], "spec": FIELDS_SPEC_HASH()}).encode()},
        {"command": json.dumps({"protocol": 1, "shard": None, "spec": 12345}).encode()},
        {"command": json.dumps({"protocol": 1, "shard": None}).encode()},
    ):
        before = snapshot(table)
        client, stream, answers = raw_stream(server, **kwargs)
        batch = pa.record_batch([pa.array([1.0])], schema=wrong) if "schema" in kwargs else good_batch(server)
        answer = send(stream, answers, batch, META)
        assert answer.get("ended"), answer
        assert same(before, snapshot(table))
        client.close()
    writer.insert(rows(1))  # the server still serves
    assert table.size == 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_metadata_writes_whole_messages_or_nothing(served, data):
    """Random metadata on a good message: the server answers (or ends the stream), writes all of the
    message or nothing, and keeps serving."""
    table, server, writer = served
    n = data.draw(st.integers(1, 4))
    meta = dict(META)
    if data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(META) + ["max_priority"]))
        meta[key] = data.draw(
            st.one_of(st.none(), st.integers(-3, 1 << 40), st.floats(), st.text(max_size=4), st.booleans())
        )
        raw = json.dumps(meta).encode()
    else:
        raw = data.draw(st.binary(max_size=40))
    size = table.size
    client, stream, answers = raw_stream(server)
    answer = send(stream, answers, good_batch(server, n), raw)
    client.close()
    assert table.size == (min(size + n, table.capacity) if answer.get("ok") else size)
    assert not (table.row_status()["generation"] % 2).any(), "a row was left held"
    assert writer.insert(rows(1)).shape == (1,)  # the server still serves


# Flight's wire format by hand (gRPC frames of FlightData protobufs), for messages no Arrow library would
# build: truncated, with damaged headers, bodies or offsets.


def varint(n):
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def proto_bytes(field, value):
    return varint(field << 3 | 2) + varint(len(value)) + value


def flight_data(header, body=b"", app_metadata=None, command=None):
    out = b""
    if command is not None:
        out += proto_bytes(1, varint(1 << 3 | 0) + varint(2) + proto_bytes(2, command))
    out += proto_bytes(2, header)
    if app_metadata is not None:
        out += proto_bytes(3, app_metadata)
    return out + (proto_bytes(1000, body) if body else b"")


def ipc_parts(serialized):
    message = pa.ipc.read_message(serialized)
    return message.metadata.to_pybytes(), message.body.to_pybytes() if message.body else b""


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_frames_write_whole_messages_or_nothing(served, data):
    """Good messages damaged on the wire (bytes flipped, cut short, offsets moved), sent as raw gRPC
    frames: the server answers or ends the stream, writes all of a message or nothing, never leaves a
    row held, and keeps serving."""
    grpc = pytest.importorskip("grpc")
    table, server, writer = served
    n = data.draw(st.integers(1, 4))
    schema_header, _ = ipc_parts(server.layouts[None].schema.serialize())
    header, body = ipc_parts(good_batch(server, n).serialize())
    part = data.draw(st.sampled_from(["header", "body", "both"]))
    damaged = []
    for name, value in (("header", header), ("body", body)):
        if part in (name, "both"):
            value = bytearray(value)
            for _ in range(data.draw(st.integers(1, 4))):
                if value and data.draw(st.booleans()):
                    value[data.draw(st.integers(0, len(value) - 1))] = data.draw(st.integers(0, 255))
                else:
                    value = value[: data.draw(st.integers(0, len(value)))]
            value = bytes(value)
        damaged.append(value)
    command = json.dumps({"protocol": 1, "shard": None, "spec": table.spec.spec_hash}).encode()
    frames = [
        flight_data(schema_header, command=command),
        flight_data(damaged[0], damaged[1], json.dumps(META).encode()),
    ]
    size = table.size
    channel = grpc.insecure_channel(server.address.removeprefix("grpc://"))
    put = channel.stream_stream("/arrow.flight.protocol.FlightService/DoPut")
    try:
        answers = [bytes(a) for a in put(iter(frames), timeout=10)]
    except grpc.RpcError as e:
        assert e.code() != grpc.StatusCode.DEADLINE_EXCEEDED, "the server hung on a damaged message"
        answers = []
    finally:
        channel.close()
    ok = any(b'"ok": true' in a for a in answers)
    assert table.size == (min(size + n, table.capacity) if ok else size)
    assert not (table.row_status()["generation"] % 2).any(), "a row was left held"
    assert writer.insert(rows(1)).shape == (1,)  # the server still serves


# -- the rate limiter and queues -------------------------------------------------------------------


def test_the_rate_limiter_makes_remote_writers_wait(make_table):
    limiter = gj.RateLimiter(min_size_to_sample=1, samples_per_insert=1.0, error_buffer=4)
    table = make_table(fields=FIELDS, capacity=64, rate_limiter=limiter)
    with gj.serve(table) as server, remote.Writer(server.address) as writer:
        inserted = 0
        with pytest.raises(gj.RateLimiterTimeout):
            for _ in range(20):
                writer.insert(rows(1), timeout=0.05)
                inserted += 1
        assert 1 <= inserted < 20 and table.size == inserted  # the refused insert wrote nothing
        table.await_samples(4)  # the learner declares samples: room for more inserts
        writer.insert(rows(1), timeout=5)
        assert table.size == inserted + 1


def insert_without_timeout(writer):
    """Starts a thread whose insert of one row waits (the limiter has no room), and lets it start
    waiting; (the thread, the list that gets what its insert raised)."""
    outcome = []

    def wait_forever():
        try:
            writer.insert(rows(1))
        except Exception as e:  # noqa: BLE001 - what the writer raised is the outcome
            outcome.append(e)

    waiting = threading.Thread(target=wait_forever)
    waiting.start()
    time.sleep(0.3)
    return waiting, outcome


def test_closing_a_server_ends_a_wait_for_the_rate_limiter(make_table):
    """A writer waiting without a timeout does not hold the server's close: the wait ends, nothing of it
    is written, and the writer finds the server gone."""
    limiter = gj.RateLimiter(min_size_to_sample=1, samples_per_insert=1.0, error_buffer=4)
    table = make_table(fields=FIELDS, capacity=64, rate_limiter=limiter)
    server = gj.serve(table)
    writer = remote.Writer(server.address, retries=2, retry_wait_s=0.01)
    writer.insert(rows(5))  # the limiter's room is used up: the next insert waits for samples
    waiting, outcome = insert_without_timeout(writer)
    started = time.monotonic()
    server.close()
    waiting.join(30)  # ~0.25 s measured; 30 s for a loaded machine (a wait that never ends fails)
    assert not waiting.is_alive(), f"the wait went on {time.monotonic() - started:.1f} s after the close"
    assert len(outcome) == 1 and isinstance(outcome[0], gj.RemoteUnavailableError), outcome
    assert table.size == 5
    writer.close()


def test_a_full_queue_makes_remote_writers_wait(make_table):
    queue = make_table(fields=FIELDS, capacity=8, queue=True)
    with gj.serve(queue) as server, remote.Writer(server.address) as writer:
        writer.insert(rows(7))
        with pytest.raises(gj.RateLimiterTimeout, match="queue"):
            writer.insert(rows(2), timeout=0.05)
        assert queue.unconsumed == 7
        gj.host.dequeue(queue, 4)
        writer.insert(rows(2), timeout=5)
        assert queue.unconsumed == 5


# -- security ------------------------------------------------------------------------------------------


def test_a_token_is_required_for_every_call(make_table):
    table = make_table(fields=FIELDS, capacity=16)
    with gj.serve(table, token=TOKEN) as server:
        for token in (None, "wrong-token-of-some-length"):
            with pytest.raises(gj.RemoteAuthenticationError, match="token"):
                remote.Writer(server.address, token=token)
        client, stream, answers = raw_stream(server, token="x" * 20)  # a stream with a wrong token
        assert send(stream, answers, good_batch(server), META).get("ended")
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(flight.FlightClient(server.address).do_action(flight.Action("describe", b"")))
        assert table.size == 0 and server.stats["messages"] == 0
        with remote.Writer(server.address, token=TOKEN) as writer:
            writer.insert(rows(3))
        assert table.size == 3


def test_listening_beyond_the_loopback_needs_a_token(make_table):
    table = make_table(fields=FIELDS, capacity=16)
    with pytest.raises(gj.InvalidArgumentError, match="token"):
        gj.serve(table, host="0.0.0.0")
    with pytest.raises(gj.InvalidArgumentError, match="16 characters"):
        gj.serve(table, token="short")
    with gj.serve(table, host="0.0.0.0", token=TOKEN) as server:
        with remote.Writer(f"grpc://127.0.0.1:{server.port}", token=TOKEN) as writer:
            writer.insert(rows(1))
    assert table.size == 1


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for a certificate")
def test_tls(make_table, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    table = make_table(fields=FIELDS, capacity=16)
    with gj.serve(table, tls=(str(cert), str(key)), token=TOKEN) as server:
        assert server.address.startswith("grpc+tls://")
        with remote.Writer(server.address, token=TOKEN, tls_root_cert=str(cert)) as writer:
            writer.insert(rows(2))
        with pytest.raises((gj.RemoteUnavailableError, gj.RemoteError)):  # no certificate to check it with
            remote.Writer(server.address, token=TOKEN, retries=0)
        with pytest.raises(gj.RemoteUnavailableError):  # plain gRPC to a TLS port
            remote.Writer(server.address.replace("grpc+tls", "grpc"), token=TOKEN, retries=0)
    assert table.size == 2


# -- servers that go away ----------------------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_writer_reconnects_to_a_restarted_server_and_gives_up_on_a_gone_one(make_table):
    table = make_table(fields=FIELDS, capacity=64)
    port = free_port()
    server = gj.serve(table, port=port)
    writer = remote.Writer(server.address, retries=8, retry_wait_s=0.02, idle_close_s=0.2)
    writer.insert(rows(2))
    server.close()
    with pytest.raises(gj.RemoteUnavailableError, match="could not be reached"):
        writer.insert(rows(1))  # 9 tries over about 1 s, then a clear error
    assert table.size == 2
    server = gj.serve(table, port=port)
    writer.insert(rows(3))  # the same writer, a new connection
    assert table.size == 5
    writer.close()
    server.close()
    with pytest.raises(gj.RemoteUnavailableError):
        remote.Writer(f"grpc://127.0.0.1:{port}", retries=1, retry_wait_s=0.01)


def test_serving_shards(make_table):
    shards = {0: make_table(fields=FIELDS, capacity=8), 1: make_table(fields=FIELDS, capacity=8)}
    with gj.serve(shards) as server:
        with pytest.raises(gj.InvalidArgumentError, match="shard=None is not served.*name one"):
            remote.Writer(server.address)
        with pytest.raises(gj.InvalidArgumentError, match="shard=5"):
            remote.Writer(server.address, shard=5)
        with remote.Writer(server.address, shard=1) as one:
            one.insert(rows(3))
        assert shards[0].size == 0 and shards[1].size == 3


def test_bad_arguments(make_table):
    table = make_table(fields=FIELDS, capacity=8)
    for kwargs, name in (({"port": -1}, "port"), ({"port": "80"}, "port"), ({"host": ""}, "host"),
                         ({"tls": ("/nonexistent", "/nonexistent")}, "tls"),
                         ({"max_message_bytes": 0}, "max_message_bytes")):  # fmt: skip
        with pytest.raises(gj.InvalidArgumentError, match=name):
            gj.serve(table, **kwargs)
    with pytest.raises(gj.InvalidArgumentError, match="table"):
        gj.serve(object())
    with gj.serve(table) as server:
        for kwargs, name in (({"batch_rows": 0}, "batch_rows"), ({"retries": -1}, "retries"),
                             ({"retry_wait_s": float("nan")}, "retry_wait_s"),
                             ({"tls_root_cert": "/nonexistent"}, "tls_root_cert")):  # fmt: skip
            with pytest.raises(gj.InvalidArgumentError, match=name):
                remote.Writer(server.address, **kwargs)
        with pytest.raises(gj.InvalidArgumentError, match="address"):
            remote.Writer("127.0.0.1:80")
        writer = remote.Writer(server.address)
        writer.close()
        with pytest.raises(gj.InvalidArgumentError, match="closed"):
            writer.insert(rows(1))


def test_gj_serve_stays_callable_when_the_command_module_is_imported(make_table):
    import gear_jax.serve  # noqa: F401 - makes gj.serve the module `python -m gear_jax.serve` runs

    table = make_table(fields=FIELDS, capacity=8)
    with gj.serve(table) as server, remote.Writer(server.address) as writer:
        writer.insert(rows(2))
    assert table.size == 2


def send_frames(server, frames):
    """Raw gRPC DoPut frames; the answers (bytes), or [] when the server ended the stream."""
    grpc = pytest.importorskip("grpc")
    channel = grpc.insecure_channel(server.address.removeprefix("grpc://"))
    put = channel.stream_stream("/arrow.flight.protocol.FlightService/DoPut")
    try:
        return [bytes(a) for a in put(iter(frames), timeout=10)]
    except grpc.RpcError as e:
        assert e.code() != grpc.StatusCode.DEADLINE_EXCEEDED, "the server hung on a damaged message"
        return []
    finally:
        channel.close()


@pytest.mark.parametrize("claimed_rows", [3, 1_000_000])
def test_a_message_claiming_more_rows_than_its_buffers_hold_is_refused(served, claimed_rows):
    """The IPC header says more rows than the buffers of 2 hold (every length of 2 in it changed): the
    server validates the buffers before it reads any offset (it used to crash reading past them)."""
    table, server, writer = served
    schema_header, _ = ipc_parts(server.layouts[None].schema.serialize())
    header, body = ipc_parts(good_batch(server, 2).serialize())
    header = bytearray(header)
    for at in range(0, len(header) - 7, 8):
        if int.from_bytes(header[at : at + 8], "little") == 2:
            header[at : at + 8] = claimed_rows.to_bytes(8, "little")
    command = json.dumps({"protocol": 1, "shard": None, "spec": table.spec.spec_hash}).encode()
    meta = json.dumps({**META, "lengths": True}).encode()
    answers = send_frames(
        server, [flight_data(schema_header, command=command), flight_data(bytes(header), body, meta)]
    )
    assert not any(b'"ok": true' in a for a in answers)
    assert table.size == 0
    assert writer.insert(rows(1)).shape == (1,)


def test_padding_the_message_does_not_pass_the_size_limit(make_table):
    """The last buffer of a message declared 1 MiB longer than its column uses: the limit counts every
    byte received, not only those the columns reference."""
    table = make_table(fields=FIELDS, capacity=16)
    with gj.serve(table, max_message_bytes=10_000) as server:
        schema_header, _ = ipc_parts(server.layouts[None].schema.serialize())
        header, body = ipc_parts(good_batch(server, 2).serialize())
        header, pad = bytearray(header), 1 << 20
        last = (len(body) - 8).to_bytes(8, "little") + (8).to_bytes(8, "little")  # the lengths' 2 int32
        at = bytes(header).rfind(last)
        assert at >= 0
        header[at + 8 : at + 16] = (8 + pad).to_bytes(8, "little")
        command = json.dumps({"protocol": 1, "shard": None, "spec": table.spec.spec_hash}).encode()
        frames = [
            flight_data(schema_header, command=command),
            flight_data(bytes(header), body + bytes(pad), json.dumps(META).encode()),
        ]
        answers = send_frames(server, frames)
        assert answers and b"max_message_bytes" in answers[0]
        assert table.size == 0


def test_a_writer_refuses_a_restarted_server_of_another_spec(make_table):
    first = make_table(fields={"obs": gj.Field((3,), "float32")}, capacity=8)
    second = make_table(fields={"obs": gj.Field((3,), "int32")}, capacity=8)  # as many bytes per row
    port = free_port()
    server = gj.serve(first, port=port)
    writer = remote.Writer(server.address, retries=3, retry_wait_s=0.02, idle_close_s=0.1)
    writer.insert({"obs": np.ones((1, 3), np.float32)})
    server.close()
    with gj.serve(second, port=port):
        with pytest.raises(gj.RemoteError, match="make a new gj.remote.Writer"):
            writer.insert({"obs": np.full((1, 3), 1.5, np.float32)})
    assert second.size == 0
    writer.close()


def test_a_failed_flush_keeps_the_rows_added(make_table):
    limiter = gj.RateLimiter(min_size_to_sample=1, samples_per_insert=1.0, error_buffer=4)
    table = make_table(fields=FIELDS, capacity=64, rate_limiter=limiter)
    with gj.serve(table) as server, remote.Writer(server.address) as writer:
        writer.insert(rows(5))  # the limiter's room is used up
        for i in range(3):
            writer.add({"obs": np.zeros(3), "action": 100 + i, "done": False})
        with pytest.raises(gj.RateLimiterTimeout):
            writer.flush(timeout=0.05)
        table.await_samples(8)
        ids = writer.flush(timeout=5)
        assert table.columns["action"][ids, 0].tolist() == [100, 101, 102] and table.size == 8


def test_closing_a_writer_cancels_another_threads_wait(make_table):
    limiter = gj.RateLimiter(min_size_to_sample=1, samples_per_insert=1.0, error_buffer=4)
    table = make_table(fields=FIELDS, capacity=64, rate_limiter=limiter)
    with gj.serve(table) as server:
        writer = remote.Writer(server.address, retries=1, retry_wait_s=0.01)
        writer.insert(rows(5))
        waiting, outcome = insert_without_timeout(writer)
        started = time.monotonic()
        writer.close()
        waiting.join(30)  # 0.7-1.3 s measured; 30 s for a loaded machine (a wait that never ends fails)
        assert not waiting.is_alive(), f"the wait went on {time.monotonic() - started:.1f} s after the close"
        assert len(outcome) == 1, outcome
        deadline = time.monotonic() + 30  # polled, as the join: a pass takes no longer than the drop
        while server.open_streams and time.monotonic() < deadline:  # the server drops the wait too
            time.sleep(0.05)
        assert server.open_streams == 0
        table.await_samples(8)
        time.sleep(0.3)
        assert table.size == 5  # the cancelled insert was not written later


def test_a_writers_messages_reuse_kept_columns_and_keep_few_sizes(served):
    """The layout keeps the offsets and default columns of recent batch sizes (at most _KEPT of each) and
    builds from them what a fresh build gives; the rows written are the rows given."""
    table, _, writer = served
    layout = writer._layout
    for n in range(1, remote._KEPT + 4):  # more sizes than it keeps
        arrays = [np.ascontiguousarray(v) for v in rows(n).values()]
        kept = layout.record_batch(arrays, n, None, None, steps=1)
        assert kept.equals(layout.record_batch(arrays, n, np.ones(n, np.float32), np.ones(n, np.int32)))
        assert len(layout._offsets) <= remote._KEPT and len(layout._defaults) <= remote._KEPT
    given = np.array([0.5, 2.0, 3.0], np.float32)
    ids = writer.insert(rows(3, 10), priorities=given)
    np.testing.assert_array_equal(table.columns["action"][ids, 0], [10, 11, 12])
    np.testing.assert_array_equal(table.row_status()["priority"][ids], given)
    ids = writer.insert(rows(3, 20))  # the kept column of ones
    np.testing.assert_array_equal(table.columns["action"][ids, 0], [20, 21, 22])
    np.testing.assert_array_equal(table.row_status()["priority"][ids], [1.0, 1.0, 1.0])


def test_a_writers_metadata_template_is_the_json_the_server_reads():
    cases = [(1, 1, 1.0, False, False, False), (7, 40, 0.25, True, True, True)]
    for seq, steps, timeout, lengths, priorities, top in cases:
        flags = [remote._JSON_BOOL[v] for v in (lengths, priorities, top)]
        meta = remote._META % (seq, steps, repr(float(timeout)).encode(), *flags)
        assert json.loads(meta) == {
            "seq": seq,
            "steps": steps,
            "timeout": timeout,
            "lengths": lengths,
            "priorities": priorities,
            "max_priority": top,
        }
    assert json.loads(remote._OK_ANSWER % (3, 5)) == {"seq": 3, "ok": True, "rows": 5}


def test_an_answer_whose_ids_do_not_match_its_head_is_refused(served):
    _, _, writer = served
    writer._seq = 4
    head = remote._OK_ANSWER % (4, 3)
    np.testing.assert_array_equal(
        writer._answer(head + b"\n" + np.arange(3, dtype=np.int32).tobytes(), 3), [0, 1, 2]
    )
    with pytest.raises(gj.RemoteError, match="answered 2 row ids for 3 rows"):
        writer._answer(head + b"\n" + np.arange(2, dtype=np.int32).tobytes(), 3)


def test_threads_sharing_a_writer_insert_batches_of_many_sizes(served):
    """Threads sharing one writer, with more batch sizes than its layout keeps: every insert answers its
    own rows' ids, and the server took every row."""
    table, server, writer = served
    errors, counts = [], []

    def insert(thread):
        try:
            for i in range(40):
                n = 1 + (thread * 7 + i) % (remote._KEPT + 5)
                ids = writer.insert(rows(n, 1000 * thread + i))
                assert ids.shape == (n,) and len(set(ids.tolist())) == n
                counts.append(n)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=insert, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert len(counts) == 160 and server.stats["rows"] == sum(counts) and table.size == 64


# -- episodes of a transition table; servers that do not start; addresses a writer refuses --------------


def end_one_episode(table, remote_writer=None, steps=1, priority=2.5):
    """Appends `steps` steps with a local EpisodeWriter (`remote_writer` None) or a RemoteEpisodeWriter
    and ends the episode; what it leaves: (end_episode's result, the row's length, priority and columns,
    the table's size)."""
    episode = table.writer() if remote_writer is None else remote_writer.episode_writer()
    with episode:
        for t in range(steps):
            obs = np.array([t, t + 0.5, -t], np.float32)
            episode.append({"obs": obs, "action": np.int32(10 + t), "done": np.bool_(t == steps - 1)})
        row = episode.end_episode(priority=priority)
    status = table.row_status()
    length = int(status["length"][row])  # the steps beyond it are not the row's (a reused table's bytes)
    columns = (
        None if table.spec.step_ring else {n: c[row, :length].tolist() for n, c in table.columns.items()}
    )
    return (type(row), row, length, float(status["priority"][row]), columns, table.size)


def episode_table(make_table, kind):
    """A table of FIELDS of 8 rows for episodes: a transition table, a trajectory table of 6 steps, or a
    step ring (made here: the caller closes it; make_table closes the others)."""
    if kind == "step ring":
        return gj.Table.create(gj.TableSpec(FIELDS, capacity=8, step_capacity=64, max_steps=6))
    return make_table(fields=FIELDS, capacity=8, max_steps=1 if kind == "transition" else 6)


@pytest.mark.parametrize(
    "kind, steps",
    [("transition", 1), ("trajectory", 4), ("trajectory", 6), ("step ring", 3)],
)
def test_a_remote_episode_ends_as_a_local_one(make_table, kind, steps):
    """RemoteEpisodeWriter.end_episode writes the row a local EpisodeWriter writes (its values, length and
    priority) and returns the same: on a transition table (one step a row: sent as [1, *shape], not
    [1, 1, *shape]) as on trajectory tables."""
    results = []
    for remote_side in (False, True):
        table = episode_table(make_table, kind)
        try:
            first = rows(1) if kind == "transition" else {n: v[:, None] for n, v in rows(1).items()}
            table.insert(first)  # the episode's row is not row 0
            if remote_side:
                with gj.serve(table) as server, remote.Writer(server.address) as writer:
                    results.append(end_one_episode(table, writer, steps))
                    episode = writer.episode_writer()
                    episode.append({"obs": np.zeros(3, np.float32), "action": 0, "done": False})
                    with pytest.raises(gj.InvalidArgumentError, match="RemoteEpisodeWriter.end_episode"):
                        episode.end_episode(timeout=-1)
            else:
                results.append(end_one_episode(table, None, steps))
        finally:
            if kind == "step ring":
                table.close()
    local, served = results
    assert local == served
    assert local[:4] == (int, 1, steps, 2.5) and local[5] == 2
    if kind == "transition":
        assert local[4] == {"obs": [[0.0, 0.5, 0.0]], "action": [10], "done": [True]}


@pytest.mark.parametrize("kind", ["transition", "trajectory", "step ring"])
def test_a_remote_episode_of_priority_max_ends_as_a_local_one(make_table, kind):
    """end_episode(priority="max") gives the row the largest priority any row of the table was given so
    far, remote as local (1 while no row had one); another string is refused by name, nothing sent."""
    results = []
    for remote_side in (False, True):
        table = episode_table(make_table, kind)
        try:
            with gj.serve(table) as server, remote.Writer(server.address) as writer:
                episode_of = writer if remote_side else None
                results.append(end_one_episode(table, episode_of, priority="max")[3])  # no row had one
                first = rows(2) if kind == "transition" else {n: v[:, None] for n, v in rows(2).items()}
                table.insert(first, priorities=[6.0, 2.0])
                results.append(end_one_episode(table, episode_of, priority="max")[3])
                episode = table.writer() if episode_of is None else writer.episode_writer()
                episode.append({"obs": np.zeros(3, np.float32), "action": 0, "done": False})
                name = "RemoteEpisodeWriter" if remote_side else "EpisodeWriter"
                with pytest.raises(gj.InvalidArgumentError, match=rf"{name}.end_episode: priority='mx'"):
                    episode.end_episode(priority="mx")
                assert table.size == 4
                episode.close()
        finally:
            if kind == "step ring":
                table.close()
    assert results == [1.0, 6.0, 1.0, 6.0]


@pytest.mark.parametrize("kind, steps", [("transition", 1), ("trajectory", 4), ("step ring", 3)])
def test_a_remote_episode_with_deferred_fields_ends_as_a_local_one(make_table, kind, steps):
    """writer.episode_writer(deferred=...) takes the deferred fields at end_episode, as Table.writer does:
    the same row, and the same refusal of a missing field (nothing sent)."""
    results = []
    for remote_side in (False, True):
        table = episode_table(make_table, kind)
        try:
            with gj.serve(table) as server, remote.Writer(server.address) as writer:
                make = writer.episode_writer if remote_side else table.writer
                with make(deferred=["action", "done"]) as episode:
                    for t in range(steps):
                        episode.append({"obs": np.array([t, t + 0.5, -t], np.float32)})
                    with pytest.raises(gj.InvalidArgumentError, match=r"deferred field \['action', 'done'\]"):
                        episode.end_episode(deferred={"action": np.arange(steps)})
                    assert table.size == 0
                    deferred = {"action": 10 + np.arange(steps), "done": np.arange(steps) == steps - 1}
                    row = episode.end_episode(priority=2.5, deferred=deferred)
                status = table.row_status()
                length = int(status["length"][row])
                if kind == "step ring":  # a ring's columns are its steps
                    first = int(status["first_step"][row])
                    episode_steps = {n: c[first : first + length] for n, c in table.columns.items()}
                else:
                    episode_steps = {n: c[row, :length] for n, c in table.columns.items()}
                results.append((row, length, float(status["priority"][row]), episode_steps))
        finally:
            if kind == "step ring":
                table.close()
    (row, length, priority, values), (row2, length2, priority2, values2) = results
    assert (row, length, priority) == (row2, length2, priority2) == (row, steps, 2.5)
    for name in FIELDS:
        np.testing.assert_array_equal(values[name], values2[name])
    assert values["action"].tolist() == list(range(10, 10 + steps))
    assert values["done"].tolist() == [False] * (steps - 1) + [True]
    assert values["obs"][:, 0].tolist() == list(range(steps))


def free_tcp_port_held():
    """A socket listening on a free port of 127.0.0.1 (the caller closes it)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def port_is_free(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_serving_on_a_port_in_use_names_the_port(make_table):
    table = make_table(fields=FIELDS, capacity=16)
    with gj.serve(table) as server:
        threads = set(threading.enumerate())
        in_use = f"port={server.port} is in use.*another port, or 0"
        with pytest.raises(gj.InvalidArgumentError, match=in_use):
            gj.serve(table, port=server.port)
        assert set(threading.enumerate()) == threads  # nothing of the failed server runs
        with remote.Writer(server.address) as writer:  # the server that holds the port still serves
            writer.insert(rows(2))
    held = free_tcp_port_held()  # a port another program listens on
    try:
        port = held.getsockname()[1]
        with pytest.raises(gj.InvalidArgumentError, match=f"port={port} is in use"):
            gj.serve(table, port=port)
    finally:
        held.close()
    with gj.serve(table, port=port) as server:  # the failed tries left the port free
        assert server.port == port
    assert table.size == 2


@pytest.mark.parametrize(
    "host, message",
    [("not a host!", "host='not a host!' is not an address"), ("192.0.2.1", "host='192.0.2.1' is not an")],
)
def test_serving_on_a_host_that_is_not_this_machines_names_the_host(make_table, host, message):
    table = make_table(fields=FIELDS, capacity=16)
    with pytest.raises(gj.InvalidArgumentError, match=message):
        gj.serve(table, host=host, token=TOKEN)


def self_signed(tmp_path, name):
    """A self-signed certificate of 127.0.0.1 and its unencrypted key (EC: quick to make): two paths."""
    cert, key = tmp_path / f"{name}-cert.pem", tmp_path / f"{name}-key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return str(cert), str(key)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for a certificate")
def test_serving_with_a_certificate_or_key_that_cannot_be_used_names_tls(make_table, tmp_path):
    cert, key = self_signed(tmp_path, "good")
    _, other_key = self_signed(tmp_path, "other")
    encrypted = str(tmp_path / "encrypted-key.pem")
    subprocess.run(
        ["openssl", "pkey", "-in", key, "-aes256", "-passout", "pass:secret", "-out", encrypted],
        check=True, capture_output=True,
    )  # fmt: skip
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    table = make_table(fields=FIELDS, capacity=16)
    port = free_port()
    threads = set(threading.enumerate())
    for tls, reason in [
        ((str(garbage), str(garbage)), "holds no PEM certificate"),
        ((key, cert), "holds no PEM certificate"),  # the files swapped
        ((cert, cert), "holds no PEM private key"),
        ((cert, other_key), "OpenSSL refuses the pair.*mismatch"),  # another certificate's key
        ((cert, encrypted), "is encrypted"),
    ]:
        with pytest.raises(gj.InvalidArgumentError, match=f"serve: tls=.*cannot serve TLS: .*{reason}"):
            gj.serve(table, port=port, tls=tls)
        assert set(threading.enumerate()) == threads and port_is_free(port)  # nothing left running
    with gj.serve(table, port=port, tls=(cert, key), token=TOKEN) as server:
        with remote.Writer(server.address, token=TOKEN, tls_root_cert=cert) as writer:
            writer.insert(rows(1))
    assert table.size == 1


@pytest.mark.parametrize(
    "address, message",
    [
        ("http://127.0.0.1:5005", "scheme 'http', which a gear_jax server does not speak; use grpc://"),
        ("GRPC://127.0.0.1:5005", "scheme 'GRPC', which"),
        ("foo://bar", "scheme 'foo', which"),
        ("garbage", "must be a server's address such as 'grpc://"),
        ("127.0.0.1:5005", "must be a server's address"),  # a bare host:port
        ("grpc://", "must be a server's address"),
        ("grpc://:5005", "must be a server's address"),  # no host
        ("://127.0.0.1:5005", "must be a server's address"),
        ("grpc://127.0.0.1:notaport", r"is not a server's address \(Cannot parse URI.*pass server.address"),
        ("grpc://127.0.0.1:99999", r"is not a server's address \(Invalid port"),
        ("grpc:// 127.0.0.1:5005", "is not a server's address"),
        (None, "must be a server's address"),
    ],
)
def test_a_writer_refuses_an_address_it_cannot_use(address, message):
    named = f"Writer: address={re.escape(repr(address))} .*{message}"
    with pytest.raises(gj.InvalidArgumentError, match=named):
        remote.Writer(address, retries=0)


def test_a_writer_takes_every_grpc_scheme_and_keeps_no_connection_when_it_fails(make_table, monkeypatch):
    table = make_table(fields=FIELDS, capacity=16)
    clients = []

    class Client(flight.FlightClient):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.closed = False
            clients.append(self)

        def close(self):
            self.closed = True
            super().close()

    monkeypatch.setattr(remote.flight, "FlightClient", Client)
    with gj.serve(table) as server:
        for scheme in ("grpc", "grpc+tcp"):
            with remote.Writer(f"{scheme}://127.0.0.1:{server.port}") as writer:
                writer.insert(rows(1))
        with pytest.raises(gj.RemoteUnavailableError):  # TLS to a plain server: no handshake
            remote.Writer(f"grpc+tls://127.0.0.1:{server.port}", retries=0)
        with pytest.raises(gj.InvalidArgumentError, match="shard=3"):  # the server answered, then refused
            remote.Writer(server.address, shard=3)
    with pytest.raises(gj.RemoteUnavailableError):  # nothing listens there
        remote.Writer(f"grpc://127.0.0.1:{free_port()}", retries=0)
    assert len(clients) == 5 and all(c.closed for c in clients)
    assert table.size == 2


# A process that ends with a writer (or a server) still open: the exit hook closes them before the
# interpreter finalizes. Before it, Arrow Flight's server finalizer waited at exit for the writer's idle
# close (idle_close_s), and the thread that ended the stream could still be inside Arrow Flight when the
# interpreter finalized, which aborted the process ("terminate called without an active exception",
# SIGABRT) in about 1 run of 15 of the abort-prone variants (raise, end, episode: 22 aborts in 340 runs,
# two at a time, on 2 cores), so their 30 runs catch it with a probability of about 0.87; `slow_idle`
# fails every time without the hook (its exit waited for the writer's idle_close_s, 30 s).
LEFT_OPEN = """
import sys
import numpy as np
import gear_jax as gj

variant, idle_close_s = sys.argv[1], float(sys.argv[2])
spec = gj.TableSpec({"x": gj.Field((), "float32")}, capacity=100, max_steps=4 if variant == "episode" else 1)
table = gj.Table.create(spec)
server = gj.serve(table)
w = gj.remote.Writer(server.address, idle_close_s=idle_close_s)
if variant == "episode":
    w.insert({"x": np.ones((3, 4), np.float32)}, timeout=30)
    with w.episode_writer() as episode:
        episode.append({"x": np.float32(1)})
        raise RuntimeError("user error mid-episode")
w.insert({"x": np.ones(3, np.float32)}, timeout=30)
w.add({"x": np.float32(1)})
w.flush()
if variant == "server_closed":
    server.close()
elif variant == "writer_closed":
    w.close()
elif variant == "pending":
    w.add({"x": np.float32(2)})
elif variant == "raise":
    raise RuntimeError("user error while a server and a writer are open")
"""


@pytest.mark.parametrize(
    "variant, runs, idle_close_s, status",
    [
        ("raise", 10, 1.0, 1),  # the review's reproducer
        ("end", 10, 1.0, 0),  # the same without the error
        ("episode", 10, 1.0, 1),  # an error in an episode writer's block, mid-episode
        ("server_closed", 2, 0.2, 0),  # the writer left open
        ("writer_closed", 2, 1.0, 0),  # the server left open
        ("pending", 1, 1.0, 0),  # rows kept by add: not sent, and said so
        ("slow_idle", 1, 30.0, 0),  # a writer that keeps its stream long does not hold the exit up
    ],
)
def test_a_process_ending_with_a_writer_or_server_open_exits_cleanly(variant, runs, idle_close_s, status):
    def run(_):
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-c", LEFT_OPEN, variant, str(idle_close_s)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return done.returncode, done.stderr, time.monotonic() - began

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, range(runs)))
    bad = [(rc, err[-600:]) for rc, err, _ in results if rc != status or "terminate called" in err]
    assert not bad, f"{len(bad)} of {runs} runs did not exit with {status}: {bad}"
    for _, err, seconds in results:
        assert "Fatal Python error" not in err and seconds < 15, (seconds, err[-600:])
        if status == 1:
            assert "RuntimeError: user error" in err
        assert ("the 1 rows add() kept were not sent" in err) == (variant == "pending"), err[-600:]

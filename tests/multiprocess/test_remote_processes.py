"""Remote writers in processes of their own (tests/helpers/remote_worker.py) streaming into a served table
over 127.0.0.1: several at once, writers SIGKILLed mid-stream, a server process (`python -m
gear_jax.serve`) SIGKILLed and restarted under a writer."""

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import gear_jax as gj

pytest.importorskip("pyarrow")
pytestmark = pytest.mark.multiprocess
WORKER = pathlib.Path(__file__).resolve().parents[1] / "helpers" / "remote_worker.py"
REPO = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 120


def start_writer(address, first, count, batch, retries=5):
    return subprocess.Popen(
        [sys.executable, str(WORKER), address, str(first), str(count), str(batch), str(retries)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip


def finish(process, timeout=TIMEOUT):
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return out


def table_of(make_table, item_bytes, capacity):
    return make_table(
        fields={"id": gj.Field((), "int64"), "payload": gj.Field((item_bytes,), "uint8")}, capacity=capacity
    )


def check_whole(table, may_hold=0):
    """Every selectable row holds one writer's row entire (its payload matches its id); at most
    `may_hold` rows are held (a server process killed mid-insert leaves its rows to the next claims that
    reach them: the dead-writer recovery of docs/ARCHITECTURE.md)."""
    status = table.row_status()
    assert (status["generation"] % 2).sum() <= may_hold, "a row was left held"
    live = np.flatnonzero(status["priority"] > 0)
    ids = table.columns["id"][live, 0]
    payload = table.columns["payload"][live, 0]
    assert (payload == (ids % 251).astype(np.uint8)[:, None]).all(), "a row holds parts of two writes"
    return ids


def test_writer_processes_deliver_every_row_once(make_table):
    table = table_of(make_table, 1024, capacity=4096)
    with gj.serve(table) as server:
        writers = [start_writer(server.address, w * 100_000, 600, 16) for w in range(3)]
        try:
            for w in writers:
                finish(w)
        finally:
            for w in writers:
                w.kill()
    ids = check_whole(table)
    expected = [w * 100_000 + i for w in range(3) for i in range(600)]
    assert sorted(ids.tolist()) == expected


def test_writers_killed_mid_stream_leave_nothing_half_written_or_held(make_table):
    """Writers of 64 KiB rows, 32 per message, SIGKILLed at random moments (mid-message among them): the
    server writes whole messages or nothing, holds no row, and serves the next writer."""
    table = table_of(make_table, 65536, capacity=1024)
    rng = np.random.default_rng(0)
    with gj.serve(table) as server:
        acknowledged = []
        for round_ in range(6):
            writer = start_writer(server.address, round_ * 1_000_000, -1, 32)
            try:
                assert writer.stdout.readline() == "ready\n", writer.stderr.read()
                line = writer.stdout.readline()  # a message acknowledged before the kill, however slow
                assert line.strip().isdigit(), writer.stderr.read()
                acknowledged.append(int(line))
                time.sleep(float(rng.uniform(0.05, 0.4)))
            finally:
                writer.send_signal(signal.SIGKILL)
                out = writer.stdout.read()  # the rest, with what readline buffered (communicate skips it)
                writer.communicate(timeout=TIMEOUT)
            acknowledged += [int(v) for v in out.split()]
        ids = set(check_whole(table).tolist())
        assert acknowledged, "no writer got a message through before it was killed"
        # What the server acknowledged is in the table (the ring holds the last 1024 rows).
        newest = sorted(acknowledged)[-4:]
        assert all(first in ids for first in newest)
        deadline = time.monotonic() + 30  # polled: a loaded machine may take seconds, a pass takes less
        while server.open_streams and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.open_streams == 0, "a killed writer's stream stayed open"
        finish(start_writer(server.address, 9_000_000, 64, 32))  # the server still serves
    assert 9_000_063 in set(check_whole(table).tolist())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(table, port, address_file):
    if os.path.exists(address_file):
        os.unlink(address_file)
    server = subprocess.Popen(
        [sys.executable, "-m", "gear_jax.serve", f"--table={table.name}", f"--port={port}",
         f"--address_file={address_file}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not os.path.exists(address_file):
        assert server.poll() is None, server.stderr.read()
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    return server


def test_a_writer_goes_on_through_a_killed_and_restarted_server_process(make_table, tmp_path):
    table = table_of(make_table, 256, capacity=8192)
    port, address_file = free_port(), str(tmp_path / "address")
    server = start_server(table, port, address_file)
    writer = None
    try:
        writer = start_writer(f"grpc://127.0.0.1:{port}", 0, 3000, 8, retries=40)
        assert writer.stdout.readline() == "ready\n", writer.stderr.read()
        while table.size < 300:
            assert writer.poll() is None, writer.stderr.read()
            time.sleep(0.01)
        server.send_signal(signal.SIGKILL)
        server.wait(TIMEOUT)
        time.sleep(0.3)  # the writer retries meanwhile
        server = start_server(table, port, address_file)
        finish(writer)
    finally:
        for p in (server, writer):
            if p is not None:
                p.kill()
    ids = check_whole(table, may_hold=8)
    assert set(ids.tolist()) == set(range(3000)), "a row was lost across the restart"
    assert len(ids) - 3000 <= 8, "more than the batch in flight was written twice"


def test_a_writer_killed_while_it_waits_for_the_rate_limiter_writes_nothing_later(make_table):
    limiter = gj.RateLimiter(min_size_to_sample=1, samples_per_insert=1.0, error_buffer=4)
    table = make_table(
        fields={"id": gj.Field((), "int64"), "payload": gj.Field((16,), "uint8")},
        capacity=64, rate_limiter=limiter,
    )  # fmt: skip
    with gj.serve(table) as server:
        writer = start_writer(server.address, 0, 100, 1)  # waits after the limiter's room of 5 rows
        try:
            assert writer.stdout.readline() == "ready\n", writer.stderr.read()
            deadline = time.monotonic() + 60
            while table.size < 5 or not server.open_streams:
                assert time.monotonic() < deadline and writer.poll() is None, writer.stderr.read()
                time.sleep(0.01)
            time.sleep(0.3)  # the sixth insert waits in the server
        finally:
            writer.send_signal(signal.SIGKILL)
            writer.communicate(timeout=TIMEOUT)
        deadline = time.monotonic() + 10
        while server.open_streams and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.open_streams == 0, "the server still waits for a dead writer"
        table.await_samples(8)  # room again: a wait still going on would write now
        time.sleep(0.5)
        assert table.size == 5


def test_the_serve_command_exits_on_sigterm_while_a_stream_is_held_open(make_table, tmp_path):
    pa = pytest.importorskip("pyarrow")
    flight = pytest.importorskip("pyarrow.flight")
    table = table_of(make_table, 16, capacity=8)
    server = start_server(table, free_port(), str(tmp_path / "address"))
    address = open(tmp_path / "address").read().strip()
    client = flight.FlightClient(address)
    try:
        # A stream opened and never written to: pyarrow's server would wait for it forever.
        descriptor = flight.FlightDescriptor.for_command(b'{"protocol": 1, "shard": null}')
        client.do_put(descriptor, pa.schema([pa.field("x", pa.int8())]))
        time.sleep(0.5)
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
    finally:
        server.kill()
        client.close()

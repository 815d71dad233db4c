"""What TCP over 127.0.0.1 carries on this machine, with no RPC engine: the ceiling under every remote
writer's figures (the `remote` suite's gear_jax, Reverb and torch.distributed.rpc alike).

Two measurements, each between real processes:

    stream     N sender processes each send `--message_kib` KiB messages as fast as `sendall` goes, for
               `--seconds`, to one receiver process that reads them into one buffer with `recv_into`
               (one thread per connection) and does nothing else with them: GB/s of all senders
    ping_pong  one client sends `--ping_bytes` bytes and waits for the server's 8-byte answer, again and
               again (a synchronous call with no work on either side): p50 and p90 of a round trip, us

    python scripts/loopback_ceiling.py --senders=1,2 --json=docs/bench/loopback_ceiling.json

A remote insert does more than either: it serializes, checks and copies the rows into a table, and its
engine (gRPC) adds its own framing and threads; so these are bounds, not targets.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_list("senders", ["1", "2"], "Sender processes of the stream measurement, a sweep.")
flags.DEFINE_integer("message_kib", 256, "KiB per sendall of the stream measurement.")
flags.DEFINE_float("seconds", 3.0, "Seconds each stream measurement sends for.")
flags.DEFINE_integer("ping_bytes", 1024, "Bytes each ping-pong call sends.")
flags.DEFINE_integer("pings", 5000, "Timed ping-pong round trips (after 500 untimed).")
flags.DEFINE_float("timeout_s", 120.0, "Each child process's time limit.")
flags.DEFINE_string("json", None, "Where to write the figures, as JSON.")
flags.DEFINE_string("role", "", "Set by the launcher: sender or pinger (a child process).")
flags.DEFINE_integer("port", 0, "Set by the launcher: the port a child connects to.")

PING_WARMUP = 500


def send_for(port: int) -> None:
    """A sender: `--message_kib` KiB messages to `port` for `--seconds`."""
    data = b"\x01" * (FLAGS.message_kib * 1024)
    with socket.create_connection(("127.0.0.1", port)) as s:
        deadline = time.monotonic() + FLAGS.seconds
        while time.monotonic() < deadline:
            s.sendall(data)


def ping(port: int) -> None:
    """A pinger: `--ping_bytes` bytes, then wait for 8; prints the round trips' p50 and p90 (us)."""
    data = b"\x01" * FLAGS.ping_bytes
    answer = bytearray(8)
    times = np.empty(FLAGS.pings)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(PING_WARMUP + FLAGS.pings):
            start = time.perf_counter()
            s.sendall(data)
            got = 0
            while got < 8:
                got += s.recv_into(memoryview(answer)[got:])
            if i >= PING_WARMUP:
                times[i - PING_WARMUP] = time.perf_counter() - start
    print(
        json.dumps({"p50_us": float(np.median(times) * 1e6), "p90_us": float(np.percentile(times, 90) * 1e6)})
    )


def child(role: str, port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), f"--role={role}", f"--port={port}", *sys.argv[1:]],
        stdout=subprocess.PIPE,
        text=True,
    )


def listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


def stream(senders: int) -> float:
    """GB/s that `senders` sender processes push to this process over loopback."""
    sock = listener()
    received: list[int] = []

    def drain(conn: socket.socket) -> None:
        buffer = memoryview(bytearray(FLAGS.message_kib * 1024))
        total = 0
        with conn:
            while n := conn.recv_into(buffer):
                total += n
        received.append(total)

    procs = [child("sender", sock.getsockname()[1]) for _ in range(senders)]
    threads = []
    for _ in range(senders):
        conn, _ = sock.accept()
        threads.append(threading.Thread(target=drain, args=(conn,)))
        threads[-1].start()
    start = time.perf_counter()
    for p in procs:
        p.wait(timeout=FLAGS.timeout_s)
    for t in threads:
        t.join(timeout=FLAGS.timeout_s)
    elapsed = time.perf_counter() - start
    sock.close()
    return sum(received) / elapsed / 1e9


def ping_pong() -> dict[str, float]:
    """Round trips of a synchronous call with no work: this process answers, a child calls."""
    sock = listener()
    proc = child("pinger", sock.getsockname()[1])
    conn, _ = sock.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    request = memoryview(bytearray(FLAGS.ping_bytes))
    with conn:
        for _ in range(PING_WARMUP + FLAGS.pings):
            got = 0
            while got < FLAGS.ping_bytes:
                n = conn.recv_into(request[got:])
                if n == 0:
                    raise RuntimeError("the pinger left early")
                got += n
            conn.sendall(b"\x00" * 8)
    out, _ = proc.communicate(timeout=FLAGS.timeout_s)
    sock.close()
    return json.loads(out)


def main(argv: list[str]) -> None:
    del argv
    if FLAGS.role == "sender":
        return send_for(FLAGS.port)
    if FLAGS.role == "pinger":
        return ping(FLAGS.port)
    results: dict[str, object] = {"cpu_count": os.cpu_count(), "message_kib": FLAGS.message_kib}
    streams = {}
    for senders in [int(s) for s in FLAGS.senders]:
        streams[senders] = stream(senders)
        logging.info(
            "stream, %d sender(s) of %d KiB messages: %.2f GB/s", senders, FLAGS.message_kib, streams[senders]
        )
    results["stream_gb_per_s"] = streams
    results["ping_pong"] = {"bytes": FLAGS.ping_bytes, **ping_pong()}
    logging.info(
        "ping-pong of %d bytes: p50 %.1f us, p90 %.1f us",
        FLAGS.ping_bytes,
        results["ping_pong"]["p50_us"],
        results["ping_pong"]["p90_us"],
    )
    if FLAGS.json:
        with open(FLAGS.json, "w") as f:
            json.dump(results, f, indent=1)
        logging.info("wrote %s", FLAGS.json)


if __name__ == "__main__":
    app.run(main)

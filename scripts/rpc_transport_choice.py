"""Loopback cost of two RPC engines for streaming rows from actor processes to a table server.

Each point streams batches of B rows of S bytes (uint8) over one long-lived stream per client and
waits for the server's acknowledgement of every batch before the next (a synchronous insert). The
server copies each batch into a preallocated numpy ring (it stands in for the table) before it
acknowledges. Engines:

  flight  Arrow Flight (pyarrow.flight) DoPut: the client writes record batches with
          `write_with_metadata`; each field is a `large_binary` column built zero-copy from the numpy
          batch (`pa.Array.from_buffers`, one value per row); the server reads `read_chunk()`, views
          each column's data buffer as numpy without copying, copies it into the ring and answers on
          the metadata writer; the client reads that ack (`metadata_reader.read()`).
  grpc    plain grpcio, no generated code: a generic bidirectional stream-stream method with identity
          (bytes) serializers; each request is a 16-byte header plus the batch's bytes, each response
          a 16-byte ack.

The server runs in its own process and every client in its own (multiprocessing, spawn), all on
127.0.0.1. Per point: a warmup, then calls for about --seconds; it reports per-call latency p50/p95
(µs, pooled over clients) and aggregate rows/s and GB/s (rows x S bytes over the wall time from the
common start to the last client's end).

    python scripts/rpc_transport_choice.py --json docs/bench/transport_choice.json
    python scripts/rpc_transport_choice.py --engines grpc --steps 1024 --batches 32 --clients 1,4
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import struct
import threading
import time
from concurrent import futures

import numpy as np

# 16-byte gRPC request header: rows, row bytes, fields, spare.
_HDR = struct.Struct("<IIII")
# 16-byte acknowledgement: rows stored, last byte of the last row as stored in the ring.
_ACK = struct.Struct("<qq")
_METHOD = "/gear_jax.bench.Rows/Put"


class Ring:
    """A preallocated numpy ring per (row bytes, field); a lock hands out slots, copies run outside it."""

    def __init__(self, steps: list[int], fields: int, ring_bytes: int, max_batch: int):
        self._lock = threading.Lock()
        self._rows: dict[int, np.ndarray] = {}
        self._pos: dict[int, int] = {}
        for s in steps:
            cap = max(max_batch, ring_bytes // s)
            arrs = np.empty((fields, cap, s), np.uint8)
            arrs.fill(0)  # Touch the pages now, not during the measurement.
            self._rows[s] = arrs
            self._pos[s] = 0

    def insert(self, step: int, columns: list[np.ndarray]) -> int:
        """Copies B rows per field (each column shaped (B, step)) into the ring; returns the last byte."""
        b = columns[0].shape[0]
        ring = self._rows[step]
        cap = ring.shape[1]
        with self._lock:
            start = self._pos[step]
            self._pos[step] = (start + b) % cap
        first = min(b, cap - start)
        for f, col in enumerate(columns):
            ring[f, start:start + first] = col[:first]
            if first < b:
                ring[f, :b - first] = col[first:]
        return int(ring[len(columns) - 1, (start + b - 1) % cap, step - 1])


# ----------------------------------------------------------------------------------------------- server


def _flight_server(ring: Ring):
    import pyarrow as pa
    import pyarrow.flight as fl

    class Server(fl.FlightServerBase):
        def do_put(self, context, descriptor, reader, writer):
            while True:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    return
                batch = chunk.data
                if batch is None:
                    return
                cols = []
                step = 0
                for col in batch.columns:
                    # large_binary buffers: [validity, int64 offsets, data]; all rows are one size here.
                    _, offs, data = col.buffers()
                    o = np.frombuffer(offs, np.int64, count=len(col) + 1, offset=col.offset * 8)
                    step = int(o[1] - o[0])
                    view = np.frombuffer(data, np.uint8, count=int(o[-1] - o[0]), offset=int(o[0]))
                    cols.append(view.reshape(len(col), step))
                last = ring.insert(step, cols)
                writer.write(pa.py_buffer(_ACK.pack(batch.num_rows, last)))

    return Server("grpc://127.0.0.1:0")


def _grpc_server(ring: Ring, options):
    import grpc

    def put(requests, context):
        for req in requests:
            b, step, fields, _ = _HDR.unpack_from(req)
            flat = np.frombuffer(req, np.uint8, count=b * step * fields, offset=_HDR.size)
            cols = list(flat.reshape(fields, b, step))
            last = ring.insert(step, cols)
            yield _ACK.pack(b, last)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=options)
    handler = grpc.method_handlers_generic_handler(
        "gear_jax.bench.Rows",
        {"Put": grpc.stream_stream_rpc_method_handler(put, request_deserializer=None,
                                                      response_serializer=None)},
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def server_main(engine: str, steps, fields, ring_bytes, max_batch, msg_bytes, port_q, stop_ev):
    ring = Ring(steps, fields, ring_bytes, max_batch)
    options = [("grpc.max_send_message_length", msg_bytes), ("grpc.max_receive_message_length", msg_bytes)]
    if engine == "flight":
        # pyarrow's FlightServerBase takes no gRPC options; Arrow's server lifts gRPC's receive cap itself.
        server = _flight_server(ring)
        port_q.put(server.port)
        stop_ev.wait()
        server.shutdown()
    else:
        server, port = _grpc_server(ring, options)
        port_q.put(port)
        stop_ev.wait()
        server.stop(None)


# ----------------------------------------------------------------------------------------------- client


class _FlightCaller:
    def __init__(self, port: int, fields: int, options):
        import pyarrow as pa
        import pyarrow.flight as fl

        self.pa = pa
        self.client = fl.FlightClient(f"grpc://127.0.0.1:{port}", generic_options=options)
        schema = pa.schema([(f"f{i}", pa.large_binary()) for i in range(fields)])
        self.writer, self.reader = self.client.do_put(fl.FlightDescriptor.for_path("rows"), schema)
        self.schema = schema
        self.meta = pa.py_buffer(b"insert")
        self._offsets: dict[tuple[int, int], object] = {}

    def __call__(self, data: np.ndarray) -> tuple[int, int]:
        pa = self.pa
        fields, b, step = data.shape
        key = (b, step)
        offs = self._offsets.get(key)
        if offs is None:
            offs = self._offsets[key] = pa.py_buffer(np.arange(b + 1, dtype=np.int64) * step)
        cols = [pa.Array.from_buffers(pa.large_binary(), b, [None, offs, pa.py_buffer(data[f])])
                for f in range(fields)]
        batch = pa.RecordBatch.from_arrays(cols, schema=self.schema)
        self.writer.write_with_metadata(batch, self.meta)
        ack = self.reader.read()
        return _ACK.unpack(ack.to_pybytes())

    def close(self):
        self.writer.done_writing()
        self.writer.close()
        self.client.close()


class _GrpcCaller:
    def __init__(self, port: int, fields: int, options):
        import queue

        import grpc

        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=options)
        call = self.channel.stream_stream(_METHOD, request_serializer=None, response_deserializer=None)
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.responses = call(iter(self.q.get, None))

    def __call__(self, data: np.ndarray) -> tuple[int, int]:
        fields, b, step = data.shape
        # grpcio sends `bytes`: header + payload costs one copy of the batch here.
        self.q.put(b"".join((_HDR.pack(b, step, fields, 0), memoryview(data).cast("B"))))
        return _ACK.unpack(next(self.responses))

    def close(self):
        self.q.put(None)
        for _ in self.responses:
            pass
        self.channel.close()


def client_main(engine, port, fields, step, batch, warmup_s, seconds, msg_bytes, seed, barrier, out_q):
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(fields, batch, step), dtype=np.uint8)
    expect_last = int(data[-1, -1, -1])
    options = [("grpc.max_send_message_length", msg_bytes), ("grpc.max_receive_message_length", msg_bytes)]
    caller_cls = _FlightCaller if engine == "flight" else _GrpcCaller
    caller = caller_cls(port, fields, options)
    t_end = time.perf_counter() + warmup_s
    while time.perf_counter() < t_end:
        rows, last = caller(data)
        assert rows == batch and last == expect_last, (rows, last, expect_last)
    barrier.wait()
    lat = []
    t0 = time.perf_counter()
    t_end = t0 + seconds
    now = t0
    while now < t_end:
        a = time.perf_counter_ns()
        rows, last = caller(data)
        lat.append(time.perf_counter_ns() - a)
        now = time.perf_counter()
        if rows != batch or last != expect_last:
            raise RuntimeError(f"bad ack {rows, last}, expected {batch, expect_last}")
    caller.close()
    out_q.put((t0, now, np.asarray(lat, np.int64)))


# ----------------------------------------------------------------------------------------------- driver


def run_point(ctx, engine, port, fields, step, batch, clients, warmup_s, seconds, msg_bytes):
    barrier = ctx.Barrier(clients)
    out_q = ctx.Queue()
    procs = [ctx.Process(target=client_main,
                         args=(engine, port, fields, step, batch, warmup_s, seconds, msg_bytes, 1000 + i,
                               barrier, out_q))
             for i in range(clients)]
    for p in procs:
        p.start()
    results = [out_q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"client exited with {p.exitcode}")
    t0 = min(r[0] for r in results)
    t1 = max(r[1] for r in results)
    lat = np.concatenate([r[2] for r in results])
    calls = int(lat.size)
    rows = calls * batch
    wall = t1 - t0
    return {
        "engine": engine, "step_bytes": step, "fields": fields, "batch": batch, "clients": clients,
        "calls": calls, "seconds": wall,
        "p50_us": float(np.percentile(lat, 50) / 1e3), "p95_us": float(np.percentile(lat, 95) / 1e3),
        "rows_per_s": rows / wall, "gb_per_s": rows * step * fields / wall / 1e9,
    }


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="flight,grpc", help="Comma list: flight, grpc.")
    ap.add_argument("--steps", type=_ints, default=[1024, 65536], help="Row sizes in bytes (uint8 rows).")
    ap.add_argument("--batches", type=_ints, default=[1, 32, 256], help="Rows per call.")
    ap.add_argument("--clients", type=_ints, default=[1], help="Client process counts for every point.")
    ap.add_argument("--multi", default="1024x32x4,65536x32x4",
                    help="Extra points STEPxBATCHxCLIENTS, comma separated ('' for none).")
    ap.add_argument("--fields", type=int, default=1, help="Columns (fields) per row, each STEP bytes.")
    ap.add_argument("--warmup", type=float, default=0.3, help="Warmup seconds per point and client.")
    ap.add_argument("--seconds", type=float, default=1.2, help="Measured seconds per point.")
    ap.add_argument("--ring_mib", type=int, default=64, help="Server ring size per row size and field.")
    ap.add_argument("--json", default=None, help="Write the results here.")
    args = ap.parse_args()

    points = [(s, b, c) for s in args.steps for b in args.batches for c in args.clients]
    for spec in filter(None, args.multi.split(",")):
        s, b, c = (int(x) for x in spec.split("x"))
        if (s, b, c) not in points:
            points.append((s, b, c))
    steps = sorted({p[0] for p in points})
    max_batch = max(p[1] for p in points)
    max_msg = max(s * b for s, b, _ in points) * args.fields
    msg_bytes = max_msg + (1 << 20)

    import grpc
    import pyarrow

    versions = {"pyarrow": pyarrow.__version__, "grpcio": grpc.__version__, "numpy": np.__version__,
                "python": platform.python_version()}
    print(f"# {versions}; max message {msg_bytes} bytes", flush=True)
    ctx = mp.get_context("spawn")
    results = []
    print("| engine | step | batch | clients | calls | p50 µs | p95 µs | rows/s | GB/s |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    for engine in args.engines.split(","):
        port_q, stop_ev = ctx.Queue(), ctx.Event()
        server = ctx.Process(target=server_main, args=(engine, steps, args.fields, args.ring_mib << 20,
                                                       max_batch, msg_bytes, port_q, stop_ev))
        server.start()
        port = port_q.get(timeout=60)
        try:
            for step, batch, clients in points:
                r = run_point(ctx, engine, port, args.fields, step, batch, clients, args.warmup,
                              args.seconds, msg_bytes)
                results.append(r)
                print(f"| {engine} | {step} | {batch} | {clients} | {r['calls']} | {r['p50_us']:.0f} | "
                      f"{r['p95_us']:.0f} | {r['rows_per_s']:.0f} | {r['gb_per_s']:.3f} |", flush=True)
        finally:
            stop_ev.set()
            server.join(30)
            if server.exitcode is None:
                server.terminate()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"what": __doc__.splitlines()[0], "host": "127.0.0.1 loopback",
                       "cpus": mp.cpu_count(), "versions": versions, "warmup_s": args.warmup,
                       "seconds": args.seconds, "results": results}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()

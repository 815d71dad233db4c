"""The `insert` suite: rows/s and GB/s of inserting batches, from one and several writer processes, and
the cost of one-row inserts against a numpy row write (`one_row`).

gear_jax writers are separate processes that attach to the table by name. The baselines run with
one writer, in this process (Reverb: a client in its worker process), at the `writers=1` points:
gear_jax_jit (`gj.insert` inside a jitted function, of a batch already on the device: an effectful call
leaves JAX's fast dispatch path, which dominates small batches), gear_jax_jit_scan8 (8 such inserts in
one `lax.scan`, where that cost is paid once: latency per insert, the call's divided by 8), numpy
(slice copy into a preallocated ring), jnp_update (jitted, donated dynamic_update_slice), flashbax
(jitted, donated item-buffer `add`), torchrl (`extend`), Reverb (trajectory writer + flush).

Every table is filled once before timing, so the timed inserts overwrite rows whose memory is already
mapped: the steady state of a ring that has wrapped, not the first touch of fresh pages. (Reverb
allocates memory per inserted chunk; it has no table to fill.)
"""

from __future__ import annotations

import argparse
import gc
import itertools
import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import gear_jax as gj
from gear_jax.bench.common import GEAR, Unavailable, make_record, parse_ints, time_calls
from gear_jax.bench.data import Dataset, cap_rows
from gear_jax.bench import one_row
from gear_jax.bench.display import progress
from gear_jax.bench.reverb_baseline import run_worker
from gear_jax.bench.systems import import_torchrl
from gear_jax.bench.writers import WriterJob, Writers

DEFAULTS = {"table_rows": "100000", "item_bytes": "1024,65536", "batch_size": "1,32,256"}
PLOT = {"x": "batch_size", "y": "bytes_per_s", "label": "GB/s inserted"}
Insert = Callable[[int], Any]


def gear_point(point: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """gear_jax: `writers` processes insert `args.iters` batches each into one table of `table_rows`."""
    rows, writers, item_bytes, batch = (
        point[k] for k in ("table_rows", "writers", "item_bytes", "batch_size")
    )
    spec = gj.TableSpec(fields={"x": gj.Field((item_bytes,), "uint8")}, capacity=rows)
    with gj.Table.create(spec) as table:
        for _, chunk in Dataset(rows, 1, item_bytes).chunks():
            table.insert({"x": chunk[:, 0]})
        job = WriterJob(table.name, item_bytes, batch, args.warmup, args.iters, seed=0)
        procs = Writers(writers, job)
        procs.start()
        results = procs.finish()
    latencies = np.concatenate([r.latencies for r in results])
    wall = max(r.end for r in results) - min(r.start for r in results)
    return make_record(point, GEAR, "insert", latencies, batch, batch * item_bytes, wall_s=wall)


SCAN_INSERTS = 8  # inserts per call of gear_jax_jit_scan8


def gear_jit_insert(rows: int, chunk: np.ndarray, scan: int = 0) -> Insert:
    """gear_jax `gj.insert` inside a jitted function, of the chunk as a device array (the in-jit path of
    programs that act and learn in one `jax.jit`), into a filled table of `rows` rows; with `scan`, that
    many inserts of the chunk in one `lax.scan` per call."""
    spec = gj.TableSpec(fields={"x": gj.Field((chunk.shape[1],), "uint8")}, capacity=rows)
    table = gj.Table.create(spec)
    for _, rows_chunk in Dataset(rows, 1, chunk.shape[1]).chunks():
        table.insert({"x": rows_chunk[:, 0]})
    if scan:
        insert = jax.jit(
            lambda x: jax.lax.scan(lambda c, _: (c, gj.insert(table, {"x": x})), None, length=scan)[1]
        )
    else:
        insert = jax.jit(lambda x: gj.insert(table, {"x": x}))
    device_chunk = jnp.asarray(chunk)

    def step(i: int) -> None:
        jax.block_until_ready(insert(device_chunk))

    weakref.finalize(step, table.close)  # the table goes with the timed function
    return step


def numpy_insert(rows: int, chunk: np.ndarray) -> Insert:
    """Copies the chunk into a preallocated ring of `rows` rows at the next position."""
    ring = np.full((rows, chunk.shape[1]), 0, np.uint8)
    batch = len(chunk)

    def step(i: int) -> None:
        at = (i * batch) % rows
        head = min(batch, rows - at)
        ring[at : at + head] = chunk[:head]
        ring[: batch - head] = chunk[head:]

    return step


def jnp_insert(rows: int, chunk: np.ndarray) -> Insert:
    """Writes the host chunk into a device ring with a jitted, donated dynamic_update_slice."""
    state = {"ring": jnp.zeros((rows, chunk.shape[1]), jnp.uint8)}
    batch = len(chunk)
    write = jax.jit(
        lambda ring, x, at: ring.at[(at + jnp.arange(batch)) % rows].set(x, unique_indices=True),
        donate_argnums=0,
    )

    def step(i: int) -> None:
        state["ring"] = jax.block_until_ready(write(state["ring"], chunk, (i * batch) % rows))

    return step


def flashbax_insert(rows: int, chunk: np.ndarray) -> Insert:
    """flashbax item buffer `add` of the host chunk, jitted with the state donated."""
    try:
        import flashbax as fbx
    except ImportError as e:
        raise Unavailable(f"flashbax is not installed ({e})") from None
    buffer = fbx.make_item_buffer(max_length=rows, min_length=1, sample_batch_size=1, add_sequences=True)
    state = {"s": buffer.init(jnp.zeros((chunk.shape[1],), jnp.uint8))}
    add = jax.jit(buffer.add, donate_argnums=0)

    def step(i: int) -> None:
        state["s"] = jax.block_until_ready(add(state["s"], chunk))

    return step


def torchrl_insert(rows: int, chunk: np.ndarray) -> Insert:
    """torchrl ReplayBuffer(LazyTensorStorage).extend of the chunk as a torch tensor."""
    torch, rl = import_torchrl()
    buffer = rl.ReplayBuffer(storage=rl.LazyTensorStorage(rows))
    for _, rows_chunk in Dataset(rows, 1, chunk.shape[1]).chunks():
        buffer.extend(torch.from_numpy(rows_chunk[:, 0]))
    tensor = torch.from_numpy(chunk)
    return lambda i: buffer.extend(tensor)


IN_PROCESS: dict[str, Callable[[int, np.ndarray], Insert]] = {
    "gear_jax_jit": gear_jit_insert,
    "gear_jax_jit_scan8": lambda rows, chunk: gear_jit_insert(rows, chunk, scan=SCAN_INSERTS),
    "numpy": numpy_insert,
    "jnp_update": jnp_insert,
    "flashbax": flashbax_insert,
    "torchrl": torchrl_insert,
}
SYSTEMS = (GEAR, *IN_PROCESS, "reverb", "sb3")
ONE_ROW_ONLY = ("sb3",)  # systems of the one-row points only (`one_row`)


def reverb_latencies(item_bytes: int, batch: int, args: argparse.Namespace) -> np.ndarray:
    """Seconds per batch of Reverb trajectory-writer inserts (each ending with a flush); Reverb's table
    holds every row inserted, so it never wraps."""
    calls = args.warmup + args.iters
    config = {
        "rows": calls * batch,
        "steps": 1,
        "item_bytes": item_bytes,
        "seed": 0,
        "window": 0,
        "method": "uniform",
        "priority_exponent": 1.0,
        "batch_sizes": [],
        "warmup": 0,
        "iters": 0,
        "insert_batch": batch,
    }
    result = run_worker(args.reverb_python, config, args.reverb_timeout)
    return np.asarray(result["insert"]["latencies_s"][args.warmup :])


def baseline_latencies(name: str, rows: int, chunk: np.ndarray, args: argparse.Namespace) -> np.ndarray:
    """Seconds per insert call of one in-process baseline (or Reverb)."""
    if name == "reverb":
        return reverb_latencies(chunk.shape[1], len(chunk), args)
    try:
        with progress(args.iters, f"{name} insert") as bar:
            latencies = time_calls(IN_PROCESS[name](rows, chunk), args.warmup, args.iters, bar.update)
        return latencies / SCAN_INSERTS if name == "gear_jax_jit_scan8" else latencies
    finally:
        gc.collect()  # frees this baseline's ring (torchrl's buffer sits in reference cycles) before the next


def run(args: argparse.Namespace, note: Callable[[str], None]) -> list[dict[str, Any]]:
    """Records for every writer count x item size x batch size x system; with batch size 1 and one
    writer, also the one-row inserts of `one_row` (a CartPole transition per call) per table size."""
    records = []
    if 1 in parse_ints(args.batch_size) and 1 in parse_ints(args.writers):
        for rows in parse_ints(args.table_rows):
            records += one_row.run(args, rows, note)
    for requested, item_bytes in itertools.product(parse_ints(args.table_rows), parse_ints(args.item_bytes)):
        rows = cap_rows(requested, item_bytes, args.mem_budget_gib)
        if rows < requested:
            note(f"item_bytes={item_bytes}: table_rows capped from {requested} to {rows}")
        for batch, writers in itertools.product(parse_ints(args.batch_size), parse_ints(args.writers)):
            point = {"table_rows": rows, "writers": writers, "item_bytes": item_bytes, "batch_size": batch}
            if GEAR in args.systems:
                records.append(gear_point(point, args))
            if writers != 1:
                continue
            chunk = Dataset(batch, 1, item_bytes).as_array()[:, 0]
            for name in [s for s in args.systems if s != GEAR and s not in ONE_ROW_ONLY]:
                try:
                    latencies = baseline_latencies(name, rows, chunk, args)
                except Exception as e:  # noqa: BLE001 - a baseline failing is reported, not fatal
                    note(f"skipped {name} at {point} insert: {type(e).__name__}: {e}")
                    continue
                records.append(make_record(point, name, "insert", latencies, batch, batch * item_bytes))
    return records

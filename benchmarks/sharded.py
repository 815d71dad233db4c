"""The `sharded` suite: a jitted sample + gather of a `ShardedTable` over real `jax.distributed`
processes, for each layout (processes x CPU devices per process) and each mode and method.

For each layout of `--layouts` (default 1x1,1x2,2x1,2x2,4x1,4x2) the suite starts that many
processes of benchmarks/sharded_worker.py on this machine (`jax.distributed` on 127.0.0.1, a free
port, `JAX_NUM_CPU_DEVICES` devices each, `cluster_detection_method="deactivate"`), every one bounded
by `--layout_timeout` and all killed when one fails. They build a 1-D mesh of S = processes x devices
shards of `--table_rows` rows each (capacity per shard; every row filled, random priorities) of one
uint8 field of `--item_bytes`, and time `ShardedTable.sampler(B)`'s jitted step for each system
`<mode>_<method>`: modes `global` and `local`, methods uniform and prioritized (`--priority_exponent`),
and fifo, lifo and topk when `gear_jax.sharded.SHARDED_METHODS` has them at run time (otherwise they
are skipped with a note). One untimed first call (trace + compile, recorded as `first_call_s`),
`--warmup` untimed calls, then `--iters` timed calls per process, each ending in
`jax.block_until_ready`. A step's latency is the slowest process's latency at that iteration (the
step is done when every device has its batch); rows/s counts the B picks, GB/s their B x item_bytes
gathered bytes.

Bytes moved per step, from the shapes alone (not measured): the sizes of the collectives' results,
summed over the S devices (a device's own share included). With S shards of C rows, B picks in all
(B / S per device) and R bytes per row:

- counts (every mode): `psum` of the S int32 selectable counts, S values reaching each device:
  4 S^2.
- gear_jax `global` uniform / prioritized: the `all_gather` of the S float32 shard totals (4 S^2)
  plus the counts: selection = 8 S^2. Rows: each device's `all_to_all` takes in S blocks of C slots,
  each with the row, its `valid` byte and 16 bytes of index, generation, probability and window start:
  rows = S^2 C (R + 17), C the block capacity of the step's branch (`gear_jax.sharded
  .exchange_capacities`; the worker replays 20 of the timed keys to see which each took, and the
  record keeps them as `exchange_capacities`). `globalfull` is the same with full-size blocks, C = B /
  S: rows = S B (R + 17), what every global step sent before the compact exchange. `picked_row_bytes`
  = B (R + 17) is what the picks themselves hold; `sent_over_picked` is rows over it (S for
  `globalfull`).
- gear_jax `global` fifo / lifo / topk (decentralized exact answer): every device proposes its best B
  candidates and the S B (score, id) pairs (8 bytes: a 4-byte score and an int32 id) are all-gathered:
  selection = 8 S^2 B + 4 S^2; rows as for global.
- gear_jax `local` (every method): selection = 4 S^2 (the counts); rows = 0 (no row leaves its shard).
- naive (the design that ships every weight to one rank): the S C float32 weights (or 4-byte scores)
  gathered to rank 0, then the B int32 picks broadcast to every device: selection = 4 S C + 4 S B;
  rows: the same row exchange as gear_jax's in `global` mode, 0 in `local`.

Each record holds these under `bytes_moved` (gear_jax's and the naive design's selection, rows and
total, and naive / gear_jax ratios of selection and of total), and the suite prints them as a table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gear_jax.bench.common import make_record, parse_ints, parse_names
from gear_jax.bench.display import console, progress

DEFAULTS = {
    "layouts": "1x1,1x2,2x1,2x2,4x1,4x2",
    "table_rows": "4096",
    "item_bytes": "1024",
    "batch_size": "256",
}
PLOT = {"x": "shards", "y": "items_per_s", "label": "rows/s (sample + gather)"}
# "globalfull": global mode with full-size exchange blocks (`capacity_factor=None`), the exchange every
# global step used before the compact one; measured beside it as its baseline.
MODES = ("global", "globalfull", "local")
METHODS = ("uniform", "prioritized", "fifo", "lifo", "topk")
DECENTRALIZED = ("fifo", "lifo", "topk")
SYSTEMS = tuple(f"{mode}_{method}" for mode in MODES for method in METHODS)
OP = "sample_gather"
WORKER = "gear_jax.bench.sharded_worker"

F32 = I32 = 4
META_BYTES = 16  # per routed pick: int32 index, uint32 generation, float32 probability, int32 start
VALID_BYTES = 1  # the bool `valid` of each routed pick
PAIR_BYTES = 8  # one (score, id) candidate of the decentralized methods: a 4-byte score, an int32 id
POLL_S = 0.1


def bytes_moved(
    mode: str,
    method: str,
    shards: int,
    table_rows: int,
    batch_size: int,
    row_bytes: int,
    block_capacity: float | None = None,
) -> dict[str, Any]:
    """Bytes one step moves through collectives, from the shapes (see the module docstring).

    Args:
      mode, method: the system (`global`, `globalfull` / `local`; uniform, prioritized, fifo, lifo or
        topk).
      shards: S; table_rows: C rows per shard; batch_size: B picks in all; row_bytes: R gathered bytes
        per row; block_capacity: global modes: the slots of each (source, consumer) block of the
        exchange, averaged over the steps (B / S for full-size blocks, the default).

    Returns:
      {"gear_jax": {"select", "rows", "total"}, "naive": {"select", "rows", "total"},
       "picked_row_bytes", "select_ratio", "total_ratio", "sent_over_picked"}: ratios are naive /
       gear_jax; sent_over_picked is the exchanged bytes over the picked rows' bytes.
    """
    s, c, b, r = shards, table_rows, batch_size, row_bytes
    counts = I32 * s * s
    slot_bytes = r + VALID_BYTES + META_BYTES
    capacity = b / s if block_capacity is None else block_capacity
    exchanged = s * s * capacity * slot_bytes if mode.startswith("global") else 0
    if mode == "local":
        select = counts
    elif method in DECENTRALIZED:
        select = PAIR_BYTES * s * s * b + counts
    else:
        select = F32 * s * s + counts
    naive_select = F32 * s * c + I32 * s * b
    gear = {"select": select, "rows": exchanged, "total": select + exchanged}
    naive = {"select": naive_select, "rows": exchanged, "total": naive_select + exchanged}
    picked = b * slot_bytes if mode.startswith("global") else 0
    return {
        "gear_jax": gear,
        "naive": naive,
        "picked_row_bytes": picked,
        "select_ratio": naive["select"] / gear["select"],
        "total_ratio": naive["total"] / gear["total"],
        "sent_over_picked": exchanged / picked if picked else None,
    }


def parse_layouts(text: str) -> list[tuple[int, int]]:
    """`"1x2,4x1"` -> [(1, 2), (4, 1)]: (processes, CPU devices per process)."""
    layouts = []
    for item in parse_names(text):
        try:
            processes, devices = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise ValueError(f"--layouts entry {item!r} must be PROCESSESxDEVICES, e.g. 2x1") from None
        if processes < 1 or devices < 1:
            raise ValueError(f"--layouts entry {item!r} needs at least one process and one device")
        layouts.append((processes, devices))
    if not layouts:
        raise ValueError(f"--layouts {text!r} names no layout")
    return layouts


def available_systems(requested: Sequence[str], methods: Sequence[str], note: Callable[[str], None]) -> list:
    """The requested systems this gear_jax can run, read from `gear_jax.sharded` now; a note for others."""
    from gear_jax import sharded

    have = tuple(getattr(sharded, "SHARDED_METHODS", ()))
    modes = tuple(getattr(sharded, "MODES", MODES))
    systems = []
    for system in requested:
        mode, method = system.split("_", 1)
        if method not in methods:
            note(f"skipped {system}: {method} is not in --methods")
        elif (
            method not in have
            or (mode.removesuffix("full") not in modes)
            or (mode == "globalfull" and not hasattr(sharded, "exchange_capacities"))
        ):
            note(f"skipped {system}: gear_jax.sharded has methods {have} and modes {modes}")
        else:
            systems.append(system)
    return systems


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_layout(
    processes: int, devices: int, points: list[dict[str, int]], systems: list[str], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Starts the layout's worker processes and returns each one's result, in process order.

    Raises:
      RuntimeError: a process failed, printed no result or ran past `--layout_timeout` (all are
        killed then).
    """
    config = {
        "processes": processes,
        "devices_per_process": devices,
        "port": free_port(),
        "points": points,
        "systems": systems,
        "warmup": args.warmup,
        "iters": args.iters,
        "priority_exponent": args.priority_exponent,
    }
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices))
    total = len(points) * len(systems) * args.iters
    desc = f"sharded {processes}x{devices}"
    with tempfile.TemporaryDirectory(prefix="gear_jax_sharded_") as folder:
        outs = [os.path.join(folder, f"{i}.out") for i in range(processes)]
        errs = [os.path.join(folder, f"{i}.err") for i in range(processes)]
        procs: list[subprocess.Popen] = []
        try:
            for i in range(processes):
                cmd = [sys.executable, "-m", WORKER, str(i), json.dumps(config)]
                # The children write through their own handles; the suite reads the files by path.
                with open(outs[i], "wb") as out, open(errs[i], "wb") as err:
                    procs.append(subprocess.Popen(cmd, stdout=out, stderr=err, env=env))
            _wait(procs, outs[0], errs, total, desc, args.layout_timeout)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        results = []
        for i in range(processes):
            with open(outs[i]) as f:
                lines = [line for line in f.read().splitlines() if line.startswith("RESULT ")]
            if not lines:
                raise RuntimeError(f"process {i} printed no result: {_tail(errs[i])}")
            results.append(json.loads(lines[-1][len("RESULT ") :]))
    return results


def _wait(
    procs: list[subprocess.Popen], out0: str, errs: list[str], total: int, desc: str, limit: float
) -> None:
    """Waits for every process, advancing the progress bar from process 0's TICK lines.

    Raises:
      RuntimeError: a process exited with an error, or they ran past `limit` seconds.
    """
    deadline = time.monotonic() + limit
    seen = 0
    with progress(total, desc) as bar:
        while True:
            failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed:
                i = failed[0]
                raise RuntimeError(f"process {i} exited with code {procs[i].returncode}: {_tail(errs[i])}")
            with open(out0, "rb") as f:
                f.seek(seen)
                text = f.read()
            done = text[: text.rfind(b"\n") + 1]
            seen += len(done)
            for line in done.decode(errors="replace").splitlines():
                if line.startswith("TICK "):
                    bar.update(int(line.split()[1]))
            if all(p.poll() == 0 for p in procs):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the processes ran past --layout_timeout={limit:g} s and were killed")
            time.sleep(POLL_S)


def _tail(path: str, chars: int = 3000) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-chars:]


def run(args: argparse.Namespace, note: Callable[[str], None]) -> list[dict[str, Any]]:
    """Records for every layout x table size x item size x batch size x system."""
    layouts = parse_layouts(args.layouts)
    systems = available_systems(args.systems, parse_names(args.methods), note)
    sizes = list(
        itertools.product(
            parse_ints(args.table_rows), parse_ints(args.item_bytes), parse_ints(args.batch_size)
        )
    )
    cores = os.cpu_count() or 1
    note(
        f"every layout's processes run on this one machine and share its {cores} CPU cores (up to "
        f"{max(p * d for p, d in layouts)} CPU devices in {max(p for p, _ in layouts)} processes); "
        "collectives between processes go through gloo over 127.0.0.1: step times include that "
        "contention and loopback TCP, not a network or GPU interconnect"
    )
    records: list[dict[str, Any]] = []
    for processes, devices in layouts:
        shards = processes * devices
        points = []
        for rows, item_bytes, batch in sizes:
            if batch % shards:
                note(
                    f"skipped batch_size={batch} at {processes}x{devices}: not a multiple of {shards} shards"
                )
                continue
            points.append({"table_rows": rows, "item_bytes": item_bytes, "batch_size": batch})
        if not points or not systems:
            continue
        layout = f"{processes}x{devices}"
        try:
            results = run_layout(processes, devices, points, systems, args)
        except RuntimeError as e:
            note(f"skipped layout {layout}: {e}")
            continue
        records += layout_records(results, layout, processes, devices, note)
    print_bytes(records)
    return records


def layout_records(
    results: list[dict[str, Any]], layout: str, processes: int, devices: int, note: Callable[[str], None]
) -> list[dict[str, Any]]:
    """One record per point and system from the processes' results."""
    shards = processes * devices
    records = []
    for p, entry in enumerate(results[0]["points"]):
        size = entry["point"]
        point = {"shards": shards, "devices_per_process": devices, **size}
        for system in entry["systems"]:
            per_process = [r["points"][p]["systems"][system] for r in results]
            error = next((m["error"] for m in per_process if "error" in m), None)
            if error is not None:
                note(f"skipped {system} at {layout} {size}: {error}")
                continue
            latencies = np.asarray([m["latencies_s"] for m in per_process], np.float64)
            step = latencies.max(axis=0)  # done when every process has its part of the batch
            b, r = size["batch_size"], size["item_bytes"]
            record = make_record(point, system, OP, step, b, b * r)
            mode, method = system.split("_", 1)
            taken = per_process[0].get("exchange_capacities")  # the same on every process
            capacity = float(np.mean(taken)) if taken else None
            record.update(
                layout=layout,
                processes=processes,
                mode=mode,
                method=method,
                first_call_s=max(m["first_call_s"] for m in per_process),
                per_process_p50_s=[float(np.percentile(x, 50)) for x in latencies],
                exchange_capacities=taken,
                bytes_moved=bytes_moved(mode, method, shards, size["table_rows"], b, r, capacity),
            )
            records.append(record)
    return records


def format_bytes(n: float) -> str:
    """Bytes in B, KiB, MiB or GiB."""
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def bytes_rows(records: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the bytes-moved table, one row per record."""
    header = [
        "layout",
        "shards",
        "table_rows",
        "batch_size",
        "system",
        "gear_jax select",
        "gear_jax rows",
        "naive select",
        "naive rows",
        "select naive/gear_jax",
        "total naive/gear_jax",
        "rows sent / picked",
    ]
    rows = []
    for r in records:
        moved = r["bytes_moved"]
        gear, naive = moved["gear_jax"], moved["naive"]
        rows.append(
            [
                r["layout"],
                str(r["point"]["shards"]),
                str(r["point"]["table_rows"]),
                str(r["point"]["batch_size"]),
                r["system"],
                format_bytes(gear["select"]),
                format_bytes(gear["rows"]),
                format_bytes(naive["select"]),
                format_bytes(naive["rows"]),
                f"{moved['select_ratio']:.1f}x",
                f"{moved['total_ratio']:.2f}x",
                "-" if moved.get("sent_over_picked") is None else f"{moved['sent_over_picked']:.2f}x",
            ]
        )
    return header, rows


def print_bytes(records: list[dict[str, Any]]) -> None:
    """Prints the bytes each step moves (computed from the shapes), gear_jax against the naive design."""
    if not records:
        return
    from rich.table import Table as RichTable

    header, rows = bytes_rows(records)
    table = RichTable(title="bytes moved per step through collectives (from the shapes; summed over devices)")
    for name in header:
        table.add_column(name, justify="left" if name in ("layout", "system") else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)

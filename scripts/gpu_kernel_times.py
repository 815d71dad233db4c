"""The GPU's own time for a gear_jax sample + gather against XLA's copy of the same bytes, read from a
profiler trace (CUPTI) of the jitted calls.

What it is for: the GPU issue's copy targets. There, a jitted call's result time is compared with a
copy timed by CUDA events alone, and the jitted call's dispatch (60-200 us on the device machines) sits
on one side only. Here both sides are jitted calls and both are read the same way: the device work of
each call, without the dispatch around it.

The programs, at every point (--points):
- gear_jax: `gj.sample_gather` of B uniform picks (rows, or windows of W steps) from a pinned table;
- pinned_copy_jit: the same number of bytes, B consecutive rows (or B x W steps) of a JAX array in
  pinned_host memory, moved to the GPU by XLA (one DMA), as in the gather suite;
- jnp_take: B rows of an array in GPU memory (XLA's gather; no host memory: the floor of a gather).

Each program makes --iters calls inside a profiler session, every call marked on the host with a
`TraceAnnotation`. A call's device events (kernels, memcpys, memsets on the device planes' stream lines)
are those that start inside its mark. Per call: `busy`, the union of its device events; `span`, its
first device start to its last device end; `wall`, the mark's own length. Medians over the calls;
GB/s on busy time; a line per point with gear_jax's busy GB/s over the copy's. The profiler puts the
host marks and the device events on one clock (nanoseconds since the session started); where a call
gets no event all the same, the events are split into calls at their largest gaps instead, and the
report says so. While a profiler session is active, XLA runs the programs it would capture as CUDA
graphs op by op (`--xla_enable_command_buffers_during_profiling`, off by default): `span` can then hold
launch gaps that an untraced call does not have; `busy` counts the device's work only.

Point syntax: ROW_BYTESxB (rows), STEP_BYTESxBwW (B windows of W steps in trajectories of 4 W steps).

Run on a GPU machine: python scripts/gpu_kernel_times.py [--points=...] [--json=PATH] [--xspace_dir=DIR]
(--xspace_dir keeps each program's raw trace, to read again with jax.profiler.ProfileData.from_file).
Without a GPU it says so and exits with status 2.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_string(
    "points",
    "512x32,4096x1024,65536x256,65536x1024,4096x512w16",
    "comma-separated points: ROW_BYTESxB, or STEP_BYTESxBwW for windows of W steps",
)
flags.DEFINE_integer("iters", 30, "traced calls per program and point")
flags.DEFINE_integer("warmup", 5, "untraced calls per program and point, after compiling")
flags.DEFINE_integer("table_mib", 1024, "the most host memory a point's table takes, MiB")
flags.DEFINE_string("systems", "gear_jax,pinned_copy_jit,jnp_take", "which programs to time")
flags.DEFINE_string("json", None, "write the results here")
flags.DEFINE_string("xspace_dir", None, "keep each program's raw trace (XSpace) in this folder")
flags.DEFINE_enum(
    "platform",
    "gpu",
    ["gpu", "cpu"],
    "cpu: run the programs and the trace without a GPU (a check of this "
    "script: a CPU trace has no device planes, so every record says so)",
)

CALL_MARK = "gpu_kernel_times_call"
SYSTEMS = ("gear_jax", "pinned_copy_jit", "jnp_take")
# The GPU tracer (XLA's CUPTI collector) puts every kernel, memcpy and memset of a CUDA stream on that
# stream's line of the device plane, named "Stream #<id>(<kinds>)"; memcpys are named "MemcpyH2D" and
# the like, kernels by their demangled names. The device plane can also hold a "CUPTI overhead" line
# and counter lines, whose events are no work of the calls. (The "XLA Ops" and "Steps" lines seen in
# TensorBoard are derived later, when a trace is converted: a session's own XSpace has none.)
STREAM_LINE_PREFIX = "Stream #"


@dataclasses.dataclass(frozen=True)
class Point:
    item_bytes: int  # bytes per row, or per step with a window
    batch: int
    window: int = 0  # 0: rows

    @property
    def steps_out(self) -> int:
        return self.window or 1

    @property
    def max_steps(self) -> int:
        return 4 * self.window if self.window else 1

    @property
    def bytes_out(self) -> int:
        return self.batch * self.steps_out * self.item_bytes

    def label(self) -> str:
        return f"{self.item_bytes}x{self.batch}" + (f"w{self.window}" if self.window else "")


def parse_points(text: str) -> list[Point]:
    """Points from "4096x1024,4096x512w16"; raises ValueError naming the bad one."""
    points = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            size, rest = part.split("x")
            batch, _, window = rest.partition("w")
            point = Point(int(size), int(batch), int(window) if window else 0)
        except ValueError:
            raise ValueError(f"--points: {part!r} is not ROW_BYTESxB or STEP_BYTESxBwW (e.g. 4096x512w16)")
        if point.item_bytes <= 0 or point.batch <= 0 or point.window < 0:
            raise ValueError(f"--points: {part!r} needs positive sizes")
        points.append(point)
    if not points:
        raise ValueError("--points: no point given")
    return points


@dataclasses.dataclass(frozen=True)
class Event:
    name: str
    start_ns: float
    end_ns: float


def call_marks(profile: Any) -> list[tuple[float, float]]:
    """The host marks of the traced calls, (start_ns, end_ns), in time order."""
    marks = []
    for plane in profile.planes:
        if plane.name.startswith("/host:"):
            for line in plane.lines:
                marks.extend((e.start_ns, e.end_ns) for e in line.events if e.name == CALL_MARK)
    return sorted(marks)


def device_events(profile: Any) -> tuple[list[Event], list[str]]:
    """(the events of every GPU plane's stream lines in start order, the names of the device planes'
    lines, for a report that finds none)."""
    events, lines = [], []
    for plane in profile.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            lines.append(f"{plane.name}: {line.name}")
            if line.name.startswith(STREAM_LINE_PREFIX):
                events.extend(Event(e.name, e.start_ns, e.end_ns) for e in line.events)
    return sorted(events, key=lambda e: e.start_ns), lines


def busy_ns(events: Iterable[Event]) -> float:
    """The length of the union of the events' intervals (overlapping streams counted once)."""
    total, end = 0.0, -np.inf
    for e in sorted(events, key=lambda e: e.start_ns):
        if e.start_ns >= end:
            total += e.end_ns - e.start_ns
            end = e.end_ns
        elif e.end_ns > end:
            total += e.end_ns - end
            end = e.end_ns
    return total


def split_by_marks(
    events: Sequence[Event], marks: Sequence[tuple[float, float]]
) -> tuple[list[list[Event]], int] | None:
    """(each mark's events: those that start inside it, the number of events outside every mark, which
    no call made: the runtime's own work); None when a mark gets no event (the host and device clocks
    disagree: use split_by_gaps)."""
    calls: list[list[Event]] = [[] for _ in marks]
    outside = 0
    for e in events:
        for i, (start, end) in enumerate(marks):
            if start <= e.start_ns <= end:
                calls[i].append(e)
                break
        else:
            outside += 1
    return (calls, outside) if all(calls) else None


def split_by_gaps(events: Sequence[Event], calls: int) -> list[list[Event]]:
    """`events` (in start order) cut into `calls` groups at the calls - 1 largest gaps between one event's
    end and the next one's start: the calls ran one after another, with the host's dispatch between."""
    if len(events) < calls:
        raise ValueError(f"{len(events)} device events cannot make {calls} calls")
    ends = np.maximum.accumulate([e.end_ns for e in events])
    gaps = np.array([events[i + 1].start_ns - ends[i] for i in range(len(events) - 1)])
    cuts = sorted(np.argsort(-gaps, kind="stable")[: calls - 1] + 1) if calls > 1 else []
    bounds = [0, *cuts, len(events)]
    return [list(events[a:b]) for a, b in zip(bounds, bounds[1:])]


def summarize_calls(calls: Sequence[Sequence[Event]], marks: Sequence[tuple[float, float]]) -> dict[str, Any]:
    """Medians (us) of busy, span and wall time per call, and each event name's mean time per call."""
    busy = [busy_ns(c) / 1e3 for c in calls]
    span = [(max(e.end_ns for e in c) - min(e.start_ns for e in c)) / 1e3 for c in calls]
    names: dict[str, float] = {}
    for call in calls:
        for e in call:
            names[e.name] = names.get(e.name, 0.0) + (e.end_ns - e.start_ns) / 1e3 / len(calls)
    return {
        "calls": len(calls),
        "busy_us": statistics.median(busy),
        "busy_us_min": min(busy),
        "span_us": statistics.median(span),
        "wall_us": statistics.median([(b - a) / 1e3 for a, b in marks]) if marks else None,
        "events_per_call": statistics.median([len(c) for c in calls]),
        "by_name_us": dict(sorted(names.items(), key=lambda kv: -kv[1])),
    }


def analyze(profile: Any, iters: int) -> dict[str, Any]:
    """One program's trace: its calls' device time (see the module docstring)."""
    events, lines = device_events(profile)
    marks = call_marks(profile)
    if not events:
        return {"error": "no device events in the trace", "device_lines": lines, "marks": len(marks)}
    by_marks = split_by_marks(events, marks) if len(marks) == iters else None
    if by_marks is not None:
        calls, outside = by_marks
        return {"split": "marks", "events_outside_marks": outside, **summarize_calls(calls, marks)}
    try:
        calls = split_by_gaps(events, iters)
    except ValueError as e:
        return {"error": str(e), "device_lines": lines, "marks": len(marks)}
    return {"split": "gaps", **summarize_calls(calls, [])}


def gb_per_s(nbytes: int, microseconds: float) -> float:
    """Bytes moved in that many microseconds, in GB/s (1e9 bytes per second)."""
    return nbytes / microseconds / 1e3


def traced_calls(
    call: Callable[[Any], Any], args: Sequence[Any], iters: int, warmup: int, keep: str | None
) -> Any:
    """`call(*args[i])` for the first `warmup` arguments, then for the next `iters` in a profiler session;
    the trace as ProfileData. The arguments are on the GPU already, so that no call's trace holds the
    copy of its own argument."""
    import jax
    from jax._src.lib import _profiler

    for i in range(warmup):
        jax.block_until_ready(call(*args[i]))
    options = _profiler.ProfileOptions()
    options.python_tracer_level = 0  # no Python function events: less host work inside the marks
    session = _profiler.ProfilerSession(options)
    try:
        for i in range(iters):
            with jax.profiler.TraceAnnotation(CALL_MARK):
                jax.block_until_ready(call(*args[warmup + i]))
    finally:
        xspace = session.stop()
    if keep:
        with open(keep, "wb") as f:
            f.write(xspace)
    return jax.profiler.ProfileData.from_serialized_xspace(xspace)


def programs(
    point: Point, systems: Sequence[str], table_bytes: int, calls: int, platform: str
) -> tuple[dict[str, tuple[Callable, list]], Callable]:
    """The jitted programs of one point, each with the arguments of `calls` calls (on the GPU); and a
    function freeing them."""
    import jax
    import jax.numpy as jnp

    import gear_jax as gj

    gpu = jax.devices(platform)[0]
    row_bytes = point.item_bytes * point.max_steps
    rows = max(point.batch, min(1 << 20, table_bytes // row_bytes))
    made: dict[str, tuple[Callable, list]] = {}

    def on_gpu(values: Iterable[Any], *after: Any) -> list[tuple]:
        """One argument tuple per call: the value on the GPU, then `after` (arrays held already)."""
        return [(jax.block_until_ready(jax.device_put(v, gpu)), *after) for v in values]

    closers: list[Callable[[], None]] = []
    if "gear_jax" in systems:
        spec = gj.TableSpec(
            {"x": gj.Field((point.item_bytes,), "uint8")}, capacity=rows, max_steps=point.max_steps
        )
        table = gj.Table.create(spec)
        closers.append(table.close)
        chunk = max(1, (64 << 20) // row_bytes)
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            shape = (n, point.max_steps, point.item_bytes) if point.window else (n, point.item_bytes)
            table.insert({"x": np.full(shape, start % 251, np.uint8)})
        window = point.window or None
        run = jax.jit(lambda k: gj.sample_gather(table, k, point.batch, window=window)[1]["x"])
        made["gear_jax"] = (run, on_gpu(jax.random.key(i) for i in range(calls)))
    if "pinned_copy_jit" in systems:
        # As many bytes as the table holds, each call's span at a new place in them (as gear_jax's picks
        # land anywhere in its table): no call reads bytes a call before it has just read.
        steps = point.batch * point.steps_out
        spans = max(1, rows * point.max_steps // steps)
        host = jax.sharding.SingleDeviceSharding(gpu, memory_kind="pinned_host")
        device = jax.sharding.SingleDeviceSharding(gpu, memory_kind="device")
        flat = jax.device_put(np.full((spans * steps, point.item_bytes), 3, np.uint8), host)
        closers.append(flat.delete)
        copy = jax.jit(lambda first, a: jax.device_put(jax.lax.dynamic_slice_in_dim(a, first, steps), device))
        firsts = (np.int32(i * 7919 % spans * steps) for i in range(calls))
        made["pinned_copy_jit"] = (copy, on_gpu(firsts, flat))
    if "jnp_take" in systems:
        hbm_rows = max(point.batch, min(rows, (256 << 20) // (point.item_bytes * point.steps_out)))
        hbm = jax.device_put(jnp.zeros((hbm_rows, point.steps_out * point.item_bytes), jnp.uint8), gpu)
        closers.append(hbm.delete)
        take = jax.jit(lambda i, a: jnp.take(a, (jnp.arange(point.batch) * 7919 + i) % hbm_rows, axis=0))
        made["jnp_take"] = (take, on_gpu((np.int32(i) for i in range(calls)), hbm))

    def close() -> None:
        for c in closers:
            c()

    return made, close


def main(argv: Sequence[str]) -> int:
    del argv
    import jax

    points = parse_points(FLAGS.points)
    systems = [s for s in FLAGS.systems.split(",") if s]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        raise app.UsageError(f"--systems: unknown {unknown}; choose among {list(SYSTEMS)}")
    try:
        gpu = jax.devices(FLAGS.platform)[0]
    except RuntimeError:
        logging.error(
            "gpu_kernel_times needs a GPU (jax sees %s); --platform=cpu checks the script", jax.devices()
        )
        return 2
    logging.info("device %s, jax %s", gpu.device_kind, jax.__version__)
    if FLAGS.xspace_dir:
        os.makedirs(FLAGS.xspace_dir, exist_ok=True)
    results = []
    for point in points:
        made, close = programs(
            point, systems, FLAGS.table_mib << 20, FLAGS.warmup + FLAGS.iters, FLAGS.platform
        )
        try:
            record: dict[str, Any] = {
                "point": point.label(),
                "bytes": point.bytes_out,
                **dataclasses.asdict(point),
            }
            for name, (call, args) in made.items():
                keep = (
                    os.path.join(FLAGS.xspace_dir, f"{point.label()}_{name}.xplane.pb")
                    if FLAGS.xspace_dir
                    else None
                )
                t0 = time.perf_counter()
                profile = traced_calls(call, args, FLAGS.iters, FLAGS.warmup, keep)
                found = analyze(profile, FLAGS.iters)
                if "busy_us" in found:
                    found["busy_gbps"] = gb_per_s(point.bytes_out, found["busy_us"])
                found["seconds"] = round(time.perf_counter() - t0, 2)
                record[name] = found
            results.append(record)
        finally:
            close()
        print(report_line(record), flush=True)
    if FLAGS.json:
        with open(FLAGS.json, "w") as f:
            json.dump({"device": gpu.device_kind, "jax": jax.__version__, "points": results}, f, indent=1)
    return 0


def report_line(record: dict[str, Any]) -> str:
    """One point: each program's median busy / span / wall time, and gear_jax's GB/s over the copy's."""
    parts = [f"point {record['point']} ({record['bytes'] / 2**20:.2f} MiB)"]
    for name in SYSTEMS:
        found = record.get(name)
        if found is None:
            continue
        if "error" in found:
            parts.append(f"{name}: {found['error']}; device lines {found.get('device_lines')}")
            continue
        wall = f" wall {found['wall_us']:.1f}" if found.get("wall_us") else ""
        parts.append(
            f"{name}: busy {found['busy_us']:.1f} span {found['span_us']:.1f}{wall} us "
            f"({found['busy_gbps']:.1f} GB/s, {found['events_per_call']:g} events/call, by {found['split']})"
        )
    gear, copy = record.get("gear_jax", {}), record.get("pinned_copy_jit", {})
    if "busy_gbps" in gear and "busy_gbps" in copy:
        parts.append(f"gear_jax / copy GB/s on the device: {gear['busy_gbps'] / copy['busy_gbps']:.2f}")
    return "; ".join(parts)


if __name__ == "__main__":
    app.run(main)

"""`python -m gear_jax.bench SUITE [flags]`: runs one benchmark suite and prints, saves and plots it.

Sweeps are comma-separated lists (`--batch_size=32,64,128`). See docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from types import ModuleType

from gear_jax.bench import (
    actor_learner,
    episode_inserts,
    episodes,
    gather,
    insert,
    pool,
    ppo,
    priorities,
    queue_throughput,
    remote_inserts,
    sample,
    selection,
    sharded,
    torch_handoff,
)
from gear_jax.bench.common import GEAR, machine_info, make_report, parse_floats, parse_names, write_json
from gear_jax.bench.display import note, print_header, print_table
from gear_jax.bench.plot import plot_report

SUITES: dict[str, ModuleType] = {
    "gather": gather,
    "sample": sample,
    "priorities": priorities,
    "insert": insert,
    "actor_learner": actor_learner,
    "torch": torch_handoff,
    "pool": pool,
    "sharded": sharded,
    "episodes": episodes,
    "episode_inserts": episode_inserts,
    "ppo": ppo,
    "queue": queue_throughput,
    "remote": remote_inserts,
}
SYSTEMS: dict[str, tuple[str, ...]] = {
    "gather": selection.SYSTEMS,
    "sample": selection.SELECT_SYSTEMS,
    "priorities": priorities.SYSTEMS,
    "insert": insert.SYSTEMS,
    "actor_learner": (GEAR,),
    "torch": torch_handoff.SYSTEMS,
    "pool": pool.SYSTEMS,
    "sharded": sharded.SYSTEMS,
    "episodes": episodes.SYSTEMS,
    "episode_inserts": episode_inserts.SYSTEMS,
    "ppo": ppo.SYSTEMS,
    "queue": queue_throughput.SYSTEMS,
    "remote": remote_inserts.SYSTEMS,
}
INTERLEAVED_SUITES = (
    "gather",
    "sample",
    "priorities",
    "episodes",
)  # the suites that time through selection.measure
BUSY_LOAD = 0.5
# Flags shared by suites with different defaults: a suite's DEFAULTS come first, then these.
FALLBACKS = {"world_size": "1,2,4", "insert_batch": 32}
ITEM_UNITS = {
    "gather": "rows",
    "sample": "samples",
    "priorities": "samples",
    "insert": "rows",
    "actor_learner": "rows",
    "torch": "rows",
    "pool": "tables",
    "sharded": "rows",
    "episodes": "windows",
    "episode_inserts": "episodes / steps",
    "ppo": "rollout rows (x epochs)",
    "queue": "rows",
    "remote": "rows",
}


def parser() -> argparse.ArgumentParser:
    """The command line; list flags left unset take the suite's defaults."""
    p = argparse.ArgumentParser(prog="python -m gear_jax.bench", description=__doc__.splitlines()[0])
    p.add_argument("suite", choices=sorted(SUITES))
    p.add_argument(
        "--batch_size", help="picks per step (insert, remote: rows per insert call), e.g. 32,64,1024"
    )
    p.add_argument("--item_bytes", help="bytes per row (per step with --window), e.g. 1024,65536")
    p.add_argument("--table_rows", help="rows in the table, e.g. 10000,100000")
    p.add_argument(
        "--window",
        type=int,
        default=0,
        help="gather, episodes: steps per sampled window (0: whole rows; episodes: 32)",
    )
    p.add_argument(
        "--max_steps",
        type=int,
        default=0,
        help="gather with --window: steps per row (default 4 x window); episodes: the longest episode, "
        "cartpole's time limit (default 500) or the lognormal's clip (default 1000, mean a tenth of it)",
    )
    p.add_argument("--lengths", help="episodes: episode length distributions, e.g. cartpole,lognormal")
    p.add_argument(
        "--steps", help="episodes: steps held by every system (a budget of whole episodes), e.g. 1000000"
    )
    p.add_argument("--step_bytes", help="episodes: bytes per step, e.g. 1024")
    p.add_argument(
        "--methods", default="uniform,prioritized,fifo,lifo,topk", help="sample, sharded: selection methods"
    )
    p.add_argument("--priority_exponent", type=float, default=0.6, help="exponent of prioritized sampling")
    p.add_argument(
        "--workloads",
        default="static",
        help="priorities: static (sample only, op prioritized) and/or update (a learner step: set the B "
        "priorities sampled by the previous step, then sample; op prioritized+update), e.g. static,update",
    )
    p.add_argument("--writers", default="1,2", help="insert: writer processes")
    p.add_argument(
        "--world_size",
        help="actor_learner: actor processes (1,2,4); queue: actor processes (1,2); remote: (1,2,4,8)",
    )
    p.add_argument(
        "--insert_batch", type=int, help="actor_learner: rows per actor insert (32); queue: the same (8)"
    )
    p.add_argument("--rows_per_actor", type=int, help="queue: rows each actor inserts (50000)")
    p.add_argument("--queue_size", type=int, help="queue: rows the queue holds (1024)")
    p.add_argument("--seconds", type=float, help="remote: seconds each actor times calls per point (1.0)")
    p.add_argument(
        "--samples_per_insert",
        help="actor_learner: give the table a rate limiter with these target ratios (a sweep, e.g. 1,4); "
        "default none",
    )
    p.add_argument(
        "--error_buffer",
        type=float,
        help="actor_learner with --samples_per_insert: the limiter's tolerance in samples (default: batch "
        "size + insert_batch x samples_per_insert)",
    )
    p.add_argument("--layouts", help="sharded: PROCESSESxDEVICES per process, e.g. 1x1,1x2,2x1,2x2,4x1,4x2")
    p.add_argument(
        "--layout_timeout", type=float, default=1800.0, help="sharded: seconds allowed per layout's processes"
    )
    p.add_argument("--iters", type=int, default=100, help="timed iterations per point and system")
    p.add_argument("--warmup", type=int, default=10, help="untimed iterations first (after compiling)")
    p.add_argument(
        "--interleave",
        type=int,
        default=0,
        help="gather, sample, priorities, episodes: hold every system at once and time them in turns of "
        "this many steps, so that a machine whose speed drifts slows all alike (0: one system after another)",
    )
    p.add_argument("--systems", help="comma-separated systems to run (default: all of the suite's)")
    p.add_argument("--reverb_python", help="interpreter with dm-reverb installed, for the Reverb baseline")
    p.add_argument(
        "--reverb_timeout", type=float, default=1800.0, help="seconds allowed per Reverb worker run"
    )
    p.add_argument(
        "--mem_budget_gib", type=float, default=8.0, help="memory for two copies of a table; caps table_rows"
    )
    p.add_argument("--json", help="write the report (every measurement, config, machine) to this path")
    p.add_argument("--plot", help="write a PNG of throughput against the swept variable to this path")
    return p


def resolve(args: argparse.Namespace, p: argparse.ArgumentParser) -> argparse.Namespace:
    """Fills the suite's defaults and checks `--systems`."""
    suite = SUITES[args.suite]
    for key, value in suite.DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key, value in FALLBACKS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    known = SYSTEMS[args.suite]
    args.systems = parse_names(args.systems) if args.systems else list(known)
    unknown = [s for s in args.systems if s not in known]
    if unknown:
        p.error(f"--systems {unknown} are not systems of the {args.suite} suite; choose from {list(known)}")
    if args.suite == "priorities":
        try:
            priorities.parse_workloads(args.workloads)
        except ValueError as e:
            p.error(str(e))
    if args.suite in ("episodes", "episode_inserts"):
        try:
            episodes.check_lengths(args.lengths)
        except ValueError as e:
            p.error(str(e))
    if args.samples_per_insert:
        try:
            parse_floats(args.samples_per_insert)
        except ValueError as e:
            p.error(f"--samples_per_insert: {e}")
    elif args.error_buffer is not None:
        p.error("--error_buffer needs --samples_per_insert")
    for key in ("insert_batch", "rows_per_actor", "queue_size"):
        if getattr(args, key) is not None and getattr(args, key) < 1:
            p.error(f"--{key} must be >= 1, got {getattr(args, key)}")
    if args.seconds is not None and not args.seconds > 0:
        p.error(f"--seconds must be > 0, got {args.seconds}")
    if args.iters < 1 or args.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    if args.interleave < 0:
        p.error(
            f"--interleave must be >= 0 (steps per turn; 0: one system after another), got {args.interleave}"
        )
    if args.interleave and args.suite not in INTERLEAVED_SUITES:
        p.error(f"--interleave applies to the {', '.join(INTERLEAVED_SUITES)} suites, not {args.suite}")
    return args


def stop(signum: int, frame: object) -> None:
    """On SIGTERM (`timeout`, say): unwind like an exception, so every table closes and its shared
    memory is removed instead of staying behind in /dev/shm."""
    raise SystemExit(f"gear_jax.bench: stopped by signal {signum}; nothing was written")


def main(argv: list[str] | None = None) -> int:
    """Runs the suite; returns the exit status."""
    signal.signal(signal.SIGTERM, stop)
    p = parser()
    args = resolve(p.parse_args(argv), p)
    suite = SUITES[args.suite]
    config = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
    machine = machine_info()
    print_header(args.suite, config, machine)
    notes: list[str] = []

    def add_note(text: str) -> None:
        if text not in notes:
            note(text)
            notes.append(text)

    busy = os.getloadavg()[0]
    if busy > BUSY_LOAD:
        add_note(
            f"the 1-minute load average is {busy:.2f} before the run: other processes may disturb the timings"
        )
    records = suite.run(args, add_note)
    machine["load_avg_end"] = list(os.getloadavg())
    report = make_report(
        args.suite, config, machine, records, notes, suite.PLOT, getattr(suite, "AVAILABLE", True)
    )
    print_table(report["records"], ITEM_UNITS[args.suite])
    if args.json:
        write_json(report, args.json)
        print(f"wrote {args.json}")
    if args.plot:
        if getattr(suite, "plot_report", plot_report)(report, args.plot):  # a suite may draw its own
            print(f"wrote {args.plot}")
        else:
            note(f"no plot written to {args.plot}: the report has no measurements")
    return 0


if __name__ == "__main__":
    sys.exit(main())

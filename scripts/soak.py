"""Soak test: writer processes killed and restarted at random while a learner samples, for a given time.

One table in shared memory; a nursery process (attached, no JAX backend) forks `--writers` writers and
SIGKILLs one of them every `--mean_kill_interval_s` on average (exponential gaps), forking a
replacement at once. Writers mix three ways of writing: episodes step by step (EpisodeWriter), batches
of episodes (`insert`), and one-step episodes one row per call. Every step's values name its episode
and step, so the learner can check every valid step it gathers.

The learner runs one jitted step (uniform sample of windows, gather, priority update) in a loop and,
every `--report_every_s`, logs and records: learner steps/s and gathered steps/s, the share of invalid
picks, torn steps (valid steps whose values disagree: must stay 0), rows held (odd generation), the
table's size against a scan of the rows, kills so far, gear_jax entries in /dev/shm, and the private
resident memory of the learner and of the writers. At the end, with every writer gone: an insert of
`capacity` rows must succeed, no row may stay held, and `size` must equal the committed rows.

With `--checkpoint_every_s`, the learner also saves the table (`Table.save`) that often while the writers
are killed, into one directory (each save replaces the last), then loads it back (`Table.load`) and checks
every step of every episode it holds, as it checks the steps it gathers: every checkpoint must load, with
no torn step.

Not part of CI. Run (10 minutes, 4 writers; a checkpoint every 20 s):

    python scripts/soak.py --duration_s=600 --writers=4 --checkpoint_every_s=20 --plot=soak.png \
        --json=soak.json
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_float("duration_s", 600.0, "How long the learner runs.")
flags.DEFINE_integer("writers", 4, "Writer processes alive at a time.")
flags.DEFINE_float("mean_kill_interval_s", 0.05, "Mean time between two SIGKILLs of a random writer.")
flags.DEFINE_integer("capacity", 4096, "Rows of the table.")
flags.DEFINE_integer("max_steps", 16, "Steps per row.")
flags.DEFINE_integer("width", 64, "int64 values per step (the step's bytes are 8 x width + 8).")
flags.DEFINE_integer("batch_size", 256, "Windows the learner samples per step.")
flags.DEFINE_integer("window", 8, "Steps per sampled window.")
flags.DEFINE_float("report_every_s", 10.0, "Seconds between two reports.")
flags.DEFINE_integer("seed", 0, "Seed of the kills and of the learner's keys.")
flags.DEFINE_float("checkpoint_every_s", 0.0, "Seconds between two checkpoints of the table (0: none).")
flags.DEFINE_string("checkpoint_dir", None, "Where the checkpoints go (default: a temporary directory).")
flags.DEFINE_string("plot", None, "Where to write a PNG of the series (optional).")
flags.DEFINE_string("json", None, "Where to write the series and the summary as JSON (optional).")
# Internal: the nursery re-executes this script with --role=nursery --table=NAME.
flags.DEFINE_enum("role", "learner", ["learner", "nursery"], "Internal: which process this is.")
flags.DEFINE_string("table", None, "Internal: the table's name (nursery).")


def step_values(episode: int, t: int, width: int) -> list[int]:
    """The values of step t of an episode: each element names both, so a torn step shows."""
    return [episode * 1024 + t] * width


# -- the nursery: forks writers, kills them at random, forks replacements ---------------------------


def write_forever(table, kind: int, seed: int) -> None:
    """A writer's loop; never returns (killed by the nursery)."""
    import numpy as np

    import gear_jax as gj

    rng = random.Random(seed)
    episode = seed * 10_000_000
    width, max_steps = FLAGS.width, table.max_steps
    writer = table.writer()
    while True:
        episode += 1
        steps = rng.randint(1, max_steps)
        try:
            if kind == 0:  # an episode step by step
                for t in range(steps):
                    writer.append({"x": step_values(episode, t, width), "episode": episode})
                writer.end_episode(priority=rng.uniform(0.1, 2.0))
            elif kind == 1:  # a batch of 8 episodes
                x = np.zeros((8, max_steps, width), np.int64)
                ep = np.zeros((8, max_steps), np.int64)
                for b in range(8):
                    x[b] = (episode + b) * 1024 + np.arange(max_steps)[:, None]
                    ep[b] = episode + b
                episode += 8
                table.insert({"x": x, "episode": ep}, lengths=np.full(8, steps, np.int32))
            else:  # one-step episodes, one row per call
                writer.append({"x": step_values(episode, 0, width), "episode": episode})
                writer.end_episode()
        except gj.GearJaxError:
            pass  # every row held by live writers for the moment


def nursery() -> None:
    import gear_jax as gj

    table = gj.Table.attach(FLAGS.table)
    rng = random.Random(FLAGS.seed)
    children: list[int] = []
    kills = 0
    stop = False

    def on_term(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)

    def spawn(k: int) -> int:
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:
                write_forever(table, k % 3, FLAGS.seed * 1000 + k)
            finally:
                os._exit(0)
        return pid

    children = [spawn(k) for k in range(FLAGS.writers)]
    next_report = time.monotonic() + 1.0
    k = FLAGS.writers
    while not stop:
        time.sleep(rng.expovariate(1.0 / FLAGS.mean_kill_interval_s))
        j = rng.randrange(len(children))
        os.kill(children[j], signal.SIGKILL)
        os.waitpid(children[j], 0)
        kills += 1
        children[j] = spawn(k)
        k += 1
        if time.monotonic() > next_report:
            # Measured here, where the writers' pids are current (they change many times a second).
            private = private_mib(os.getpid()) + sum(private_mib(p) for p in children)
            print(f"kills {kills} private_mib {private:.1f}", flush=True)
            next_report += 1.0
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    print(f"kills {kills} private_mib 0", flush=True)
    print("stopped", flush=True)


# -- the learner --------------------------------------------------------------------------------------


def private_mib(pid: int) -> float:
    """Resident private memory of a process (RssAnon: not the shared table, which every writer maps)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def shm_entries(prefixes: tuple[str, ...]) -> tuple[int, float]:
    """Names in /dev/shm that start with one of `prefixes` (this run's table, its processes' pool
    entries), and their MiB."""
    count, size = 0, 0
    for name in os.listdir("/dev/shm"):
        if name.startswith(prefixes):
            count += 1
            try:
                size += os.stat(f"/dev/shm/{name}").st_size
            except OSError:
                pass
    return count, size / 2**20


def scan(table) -> tuple[int, int]:
    """(committed rows, held rows) from a snapshot of the rows."""
    status = table.row_status()
    even = status["generation"] % 2 == 0
    return int((even & (status["length"] > 0)).sum()), int((~even).sum())


def check_checkpoint(path: str) -> dict:
    """Loads the checkpoint at `path` and checks each step of every episode it holds: (episodes, steps
    checked, torn steps, seconds to load)."""
    import numpy as np

    import gear_jax as gj

    start = time.monotonic()
    with gj.Table.load(path) as loaded:
        seconds = time.monotonic() - start
        lengths = loaded.row_status()["length"]
        rows = np.flatnonzero(lengths > 0)
        x = loaded.columns["x"][rows]  # [rows, max_steps, width]
        episode = loaded.columns["episode"][rows]
        t = np.arange(loaded.max_steps)
        used = t[None, :] < lengths[rows][:, None]
        expected = episode * 1024 + t[None, :]
        torn = used & ((x != expected[..., None]).any(-1) | (episode != episode[:, :1]))
        return {
            "episodes": int(rows.size),
            "steps": int(used.sum()),
            "torn_steps": int(torn.sum()),
            "load_s": round(seconds, 3),
        }


def learner() -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from tqdm import tqdm

    import gear_jax as gj

    jax.config.update("jax_enable_x64", True)  # int64 values stay int64 in the learner's checks
    spec = gj.TableSpec(
        {"x": gj.Field((FLAGS.width,), "int64"), "episode": gj.Field((), "int64")},
        capacity=FLAGS.capacity,
        max_steps=FLAGS.max_steps,
    )
    table = gj.Table.create(spec, name=f"soak_{os.getpid()}")
    window = min(FLAGS.window, FLAGS.max_steps)

    @jax.jit
    def step(key):
        smp = gj.sample(table, key, FLAGS.batch_size, window=window)
        batch = gj.gather(table, smp)
        x, valid, episode = batch["x"], batch["valid"], batch["episode"]
        t = smp.starts[:, None] + jnp.arange(window)[None, :]
        expected = episode * 1024 + t
        torn = valid & ((x != expected[..., None]).any(-1) | (episode != episode[:, :1]))
        updated = gj.update_priorities(table, smp, jnp.abs(jnp.sin(x[:, 0, 0].astype(jnp.float32))) + 0.1)
        return valid[:, 0], valid.sum(), torn.sum(), updated

    nursery_proc = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--role=nursery",
            f"--table={table.name}",
            f"--writers={FLAGS.writers}",
            f"--mean_kill_interval_s={FLAGS.mean_kill_interval_s}",
            f"--width={FLAGS.width}",
            f"--seed={FLAGS.seed}",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    os.set_blocking(nursery_proc.stdout.fileno(), False)
    kills, writers_private = 0, 0.0

    def read_nursery() -> None:
        nonlocal kills, writers_private
        while line := nursery_proc.stdout.readline():
            if line.startswith("kills "):
                parts = line.split()
                kills = int(parts[1])
                writers_private = float(parts[3]) or writers_private

    while table.size < FLAGS.batch_size:  # wait for a first few rows
        time.sleep(0.1)
        if nursery_proc.poll() is not None:
            raise RuntimeError("the nursery died before the writers wrote anything")
    key = jax.random.key(FLAGS.seed)
    jax.block_until_ready(step(key))  # compile

    series: list[dict] = []
    totals = {"steps": 0, "picks": 0, "invalid_picks": 0, "valid_steps": 0, "torn_steps": 0}
    checkpoints = {"saved": 0, "loaded": 0, "refused": 0, "steps_checked": 0, "torn_steps": 0, "save_s": []}
    checkpoint_dir = FLAGS.checkpoint_dir or tempfile.mkdtemp(prefix="soak_checkpoints_")
    os.makedirs(checkpoint_dir, exist_ok=True)
    start = time.monotonic()
    next_report = start + FLAGS.report_every_s
    next_checkpoint = start + FLAGS.checkpoint_every_s if FLAGS.checkpoint_every_s > 0 else float("inf")
    window_totals = dict(totals)
    window_start = start
    progress = tqdm(total=int(FLAGS.duration_s), desc="soak", unit="s", mininterval=1.0)
    try:
        while (now := time.monotonic()) - start < FLAGS.duration_s:
            key, sub = jax.random.split(key)
            first_valid, valid_steps, torn, _ = step(sub)
            first_valid = np.asarray(first_valid)
            totals["steps"] += 1
            totals["picks"] += first_valid.size
            totals["invalid_picks"] += int((~first_valid).sum())
            totals["valid_steps"] += int(valid_steps)
            totals["torn_steps"] += int(torn)
            progress.n = int(now - start)
            progress.refresh() if totals["steps"] % 50 == 0 else None
            if now >= next_checkpoint:  # a save while the writers are killed, then a load of it
                path = os.path.join(checkpoint_dir, "table")
                saved_at = time.monotonic()
                table.save(path)
                checkpoints["save_s"].append(round(time.monotonic() - saved_at, 3))
                checkpoints["saved"] += 1
                try:
                    checked = check_checkpoint(path)
                except gj.GearJaxError as e:
                    checkpoints["refused"] += 1
                    logging.error("checkpoint %d does not load: %s", checkpoints["saved"], e)
                else:
                    checkpoints["loaded"] += 1
                    checkpoints["steps_checked"] += checked["steps"]
                    checkpoints["torn_steps"] += checked["torn_steps"]
                    logging.info("checkpoint %d: %s", checkpoints["saved"], checked)
                next_checkpoint = time.monotonic() + FLAGS.checkpoint_every_s
            if now >= next_report:
                read_nursery()
                committed, held = scan(table)
                entries, shm_mib = shm_entries(
                    (
                        table.name,
                        *(f"gear_jax_pool_{p}_" for p in (os.getpid(), nursery_proc.pid)),
                    )
                )
                seconds = now - window_start
                delta = {k: totals[k] - window_totals[k] for k in totals}
                point = {
                    "t_s": round(now - start, 1),
                    "learner_steps_per_s": round(delta["steps"] / seconds, 1),
                    "gathered_steps_per_s": round(delta["valid_steps"] / seconds),
                    "invalid_pick_share": round(delta["invalid_picks"] / max(delta["picks"], 1), 5),
                    "torn_steps": totals["torn_steps"],
                    "kills": kills,
                    "held_rows": held,
                    "size": int(table.size),
                    "committed_rows": committed,
                    "shm_entries": entries,
                    "shm_mib": round(shm_mib, 1),
                    "learner_private_mib": round(private_mib(os.getpid()), 1),
                    "writers_private_mib": round(writers_private, 1),  # the nursery's and its writers' sum
                }
                series.append(point)
                logging.info("%s", " ".join(f"{k}={v}" for k, v in point.items()))
                window_totals, window_start = dict(totals), now
                next_report += FLAGS.report_every_s
    finally:
        progress.close()
        nursery_proc.send_signal(signal.SIGTERM)
        nursery_proc.wait(timeout=60)
        os.set_blocking(nursery_proc.stdout.fileno(), True)
        read_nursery()

    # Every writer is gone: the rows must all be claimable, and the counters exact.
    committed_before, held_before = scan(table)
    size_before = int(table.size)
    rows = table.insert(
        {
            "x": np.zeros((FLAGS.capacity, FLAGS.max_steps, FLAGS.width), np.int64),
            "episode": np.zeros((FLAGS.capacity, FLAGS.max_steps), np.int64),
        }
    )
    committed_after, held_after = scan(table)
    summary = {
        "duration_s": round(time.monotonic() - start, 1),
        "writers": FLAGS.writers,
        "kills": kills,
        "learner_steps": totals["steps"],
        "picks": totals["picks"],
        "invalid_pick_share": round(totals["invalid_picks"] / max(totals["picks"], 1), 5),
        "valid_steps_checked": totals["valid_steps"],
        "torn_steps": totals["torn_steps"],
        "held_rows_after_writers_gone": held_before,
        "size_equals_committed_after_writers_gone": size_before == committed_before,
        "insert_of_every_row_succeeded": sorted(rows.tolist()) == list(range(FLAGS.capacity)),
        "held_rows_after_that_insert": held_after,
        "size_equals_committed_after_that_insert": int(table.size) == committed_after == FLAGS.capacity,
        "checkpoints_saved": checkpoints["saved"],
        "checkpoints_loaded": checkpoints["loaded"],
        "checkpoint_steps_checked": checkpoints["steps_checked"],
        "checkpoint_torn_steps": checkpoints["torn_steps"],
        "checkpoint_save_s_max": max(checkpoints["save_s"], default=0.0),
    }
    if not FLAGS.checkpoint_dir:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    table.close()
    return {"summary": summary, "series": series}


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = result["series"]
    t = [p["t_s"] for p in series]
    panels = [
        ("learner steps/s", ["learner_steps_per_s"]),
        ("invalid pick share", ["invalid_pick_share"]),
        ("rows", ["held_rows", "size"]),
        ("kills (cumulative)", ["kills"]),
        ("private resident MiB", ["learner_private_mib", "writers_private_mib"]),
        ("/dev/shm MiB", ["shm_mib"]),
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.0 * len(panels)), sharex=True)
    for ax, (title, keys) in zip(axes, panels):
        for k in keys:
            ax.plot(t, [p[k] for p in series], label=k)
        ax.set_ylabel(title, fontsize=8)
        if len(keys) > 1:
            ax.legend(fontsize=7)
    axes[-1].set_xlabel("seconds")
    s = result["summary"]
    title = f"soak: {s['writers']} writers, {s['kills']} kills in {s['duration_s']} s"
    fig.suptitle(f"{title}, torn steps {s['torn_steps']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str]) -> None:
    del argv
    if FLAGS.role == "nursery":
        nursery()
        return
    result = learner()
    summary = result["summary"]
    logging.info("summary: %s", " ".join(f"{k}={v}" for k, v in summary.items()))
    if FLAGS.json:
        with open(FLAGS.json, "w") as f:
            json.dump(result, f, indent=1)
    if FLAGS.plot:
        plot(result, FLAGS.plot)
    ok = (
        summary["torn_steps"] == 0
        and summary["insert_of_every_row_succeeded"]
        and summary["held_rows_after_that_insert"] == 0
        and summary["size_equals_committed_after_writers_gone"]
        and summary["size_equals_committed_after_that_insert"]
        and summary["checkpoints_loaded"] == summary["checkpoints_saved"]
        and summary["checkpoint_torn_steps"] == 0
    )
    print("soak: " + ("passed" if ok else "FAILED"), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    app.run(main)

"""Processes of tests/helpers/queue_worker.py for the queue and max_times_sampled tests, and the race of
learner processes for the last samples of a limited table's rows."""

import collections
import os
import pathlib
import subprocess
import sys

WORKER = pathlib.Path(__file__).resolve().parent / "queue_worker.py"
REPO = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 120


def start(role, table, *args, stdout=subprocess.PIPE, env=None):
    """Starts a worker; `stdout` a pipe (read it, or a process that prints much blocks) or a file; `env`
    entries added to this process's environment."""
    return subprocess.Popen(
        [sys.executable, str(WORKER), role, table.name, *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=None if env is None else {**os.environ, **env},
    )


def finish(process, timeout=TIMEOUT, with_stderr=False):
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return (out, err) if with_stderr else out


def race_learners(table, done_file, platforms, env=None):
    """Learner processes (one per entry of `platforms`: "" for jax's default device, "cpu" or "gpu")
    sample `table` (a field "id", 256 rows, max_times_sampled set) while a writer process overwrites its
    rows with ids 1,000 to 1,999; returns how many times each id was delivered, over every learner.
    Every learner must have delivered some: one whose calls all failed (a GPU program on a table its
    process did not pin, say) would leave the race to the others and prove nothing of its platform."""
    learners = [start("learner", table, done_file, platform, env=env) for platform in platforms]
    writer = None
    try:
        for p in learners:
            assert p.stdout.readline() == "ready\n", p.stderr.read()
        for p in learners:
            p.stdin.write("go\n")
            p.stdin.flush()
        writer = start("writer", table, 1_000, 1_000, 8, 0.005, env=env)
        finish(writer)
        pathlib.Path(done_file).touch()
        outputs = [finish(p, with_stderr=True) for p in learners]
    finally:
        for p in [*learners, writer]:
            if p is not None:
                p.kill()
    for platform, (out, err) in zip(platforms, outputs):
        assert out.split(), f"the learner on {platform or 'the default device'!r} delivered nothing: {err}"
    return collections.Counter(int(v) for out, _ in outputs for v in out.split())


def check_race(table, counts, k):
    """No contents delivered more than k times, the last contents of every row exactly k, and the race
    was run: some contents were overwritten after a learner had sampled them."""
    assert table.unconsumed == 0
    assert max(counts.values()) == k
    final = {int(v) for v in table.columns["id"][:, 0]}
    assert all(counts[v] == k for v in final)
    overwritten = set(counts) - final
    assert overwritten, "the writer overwrote no row the learners had sampled: the race was not run"
    assert all(1 <= counts[v] <= k for v in overwritten)

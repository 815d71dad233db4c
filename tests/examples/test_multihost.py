"""examples/multihost.py: a jax.distributed job of 2 processes on this machine, each owning one shard of a
sharded table that its own actor process fills (attached to the shard, or through the process's server of
it with --actors=remote), and a data-parallel DQN learner over both.

The runs go through the example's launcher (`--num_processes=2`), which bounds every process by
`--timeout` and kills them all when one fails. They share a JAX compilation cache (a fresh directory
per test session), so later runs skip most of the first one's compilation.
"""

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

import gear_jax.cleanup
from tests.helpers import examples


@pytest.fixture(scope="module")
def compilation_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("multihost_jax_cache")


def run_example(cache: pathlib.Path, *args: str, timeout: int) -> dict:
    """Runs the example with `args`; returns its summary line's fields (numbers as floats, the per-shard
    lists as lists of ints)."""
    return run_job(cache, *args, timeout=timeout)[0]


def run_job(cache: pathlib.Path, *args: str, timeout: int) -> tuple[dict, str]:
    """`run_example`, and the job's log (its stderr)."""
    env = {"JAX_COMPILATION_CACHE_DIR": str(cache), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    fields, done = examples.run_example(
        "multihost.py", "--num_processes=2", f"--timeout={timeout - 20}", *args, timeout=timeout, env=env
    )
    summary = {k: [int(x) for x in v.split(",")] if k.startswith("shard_") else float(v)
               for k, v in fields.items()}
    # Every process prefixes its log lines with its index.
    for i in range(2):
        assert f"[process {i}/2]" in done.stderr
    # The processes closed their shards: nothing of the table is left in shared memory.
    name = re.search(r"\[launcher\] starting 2 processes, .*, table (\S+)", done.stderr).group(1)
    if os.path.isdir("/dev/shm"):
        assert not [f for f in os.listdir("/dev/shm") if f.startswith(name + ".shard")]
    return summary, done.stderr


def check_smoke_summary(s: dict) -> None:
    """What a --smoke run of 2 processes must end with."""
    assert s["processes"] == 2 and s["shards"] == 2 and s["actors"] == 2
    assert s["steps"] == 50 and s["global_batch"] == 128  # steps: the updates Adam applied
    assert len(s["shard_sizes"]) == len(s["shard_inserts"]) == len(s["shard_priority_updates"]) == 2
    # The rate limiter: each host's actor wrote its learning_starts (64) and 4 transitions per update,
    # give or take its chunks of 8 steps x 4 environments (the learner's last update waits for 64 + 4 * 49
    # less a chunk; the actor writes at most two chunks past 64 + 4 * 50).
    for inserted, size in zip(s["shard_inserts"], s["shard_sizes"]):
        assert 64 + 4 * 49 - 32 <= inserted <= 64 + 4 * 50 + 64
        assert size == min(inserted, s["capacity"])
    assert s["transitions"] == sum(s["shard_inserts"])
    # Priority updates reached both shards: most of the 50 x 128 picks (none was overwritten meanwhile).
    assert all(n > 0 for n in s["shard_priority_updates"])
    assert 50 * 128 / 2 <= sum(s["shard_priority_updates"]) <= 50 * 128
    assert s["eval_episodes"] == 4 and s["eval_return"] >= 1 and s["initial_eval_return"] >= 1
    assert s["final_loss"] >= 0 and s["steps_per_s"] > 0 and 0 < s["wall_s"] <= s["process_s"]


def test_smoke_every_shard_receives_transitions_and_the_learner_takes_its_steps(compilation_cache):
    check_smoke_summary(run_example(compilation_cache, "--smoke", timeout=240))


def test_smoke_remote_actors_write_through_their_process_server(compilation_cache):
    s, log = run_job(compilation_cache, "--smoke", "--actors=remote", timeout=240)
    check_smoke_summary(s)
    # Each process served its shard on the loopback, its actor wrote through that address (it attached
    # nothing), and the server, closed after the actor stopped, wrote every transition the actor counted.
    for i in range(2):
        served = re.search(rf"\[process {i}/2\] serving shards \[{i}\] of \S+ at (grpc://127\.0\.0\.1:\d+)\n",
                           log)
        assert served, log[-6000:]
        address = re.escape(served.group(1))
        assert re.search(rf"\[process {i}/2\] actor 0: writing into shards \[{i}\] of \S+ through the server "
                         rf"at {address}\n", log)
        closed = re.search(rf"\[process {i}/2\] server {address} closed: it wrote (\d+) rows", log)
        assert closed and int(closed.group(1)) == s["shard_inserts"][i]
    assert "attached to" not in log


@pytest.mark.multiprocess
def test_the_data_parallel_learner_learns_cartpole(compilation_cache):
    # 1500 updates of a 128-row global batch; 4 transitions per update per process. Measured on this
    # project's 2-core machine, about 45 s a run with a warm compilation cache: seed 0 ended at
    # eval_return 255.1, 273.8, 305.3 and 397.1 in four runs (runs differ: actors and learner interleave
    # differently), seeds 1-3 at 120.8, 289.2, 166.5. The untrained policy of seed 0 scores 9.7; the
    # maximum is 500.
    s = run_example(compilation_cache, "--steps=1500", "--eval_every=1500", "--eval_episodes=10", "--seed=0",
                    timeout=200)
    assert s["steps"] == 1500
    assert s["initial_eval_return"] < 30
    assert s["eval_return"] >= 100
    assert min(s["shard_inserts"]) >= 500 + 4 * 1499 - 32


@pytest.mark.multiprocess
def test_a_job_killed_mid_run_resumes_from_its_last_checkpoint(compilation_cache, tmp_path):
    # A 300-update job checkpointing every 50 updates is SIGKILLed (launcher, both processes and their
    # actors at once) after its checkpoint of update 100; the same command then resumes from the newest
    # checkpoint: the replay's rows, the learner's state (Adam's count goes on to 300), the updates after.
    args = ["--steps=300", "--learning_starts=64", "--eval_every=300", "--eval_episodes=4",
            f"--checkpoint_dir={tmp_path / 'checkpoints'}", "--checkpoint_every=50"]
    cache = {"JAX_COMPILATION_CACHE_DIR": str(compilation_cache),
             "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    script = str(examples.ROOT / "examples" / "multihost.py")
    job = subprocess.Popen(
        [sys.executable, script, "--num_processes=2", "--timeout=200", "--stop_grace=45", *args],
        cwd=examples.ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **cache},
        start_new_session=True,
    )
    saved, lines, deadline = {}, [], time.monotonic() + 200
    try:  # until both processes logged their checkpoint of update 100
        while sum("checkpoint of update 100 saved" in line for line in lines) < 2:
            lines.append(job.stdout.readline())
            assert lines[-1] and time.monotonic() < deadline, "no checkpoint of update 100 before the end"
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        lines += job.communicate()[0].splitlines()
    launched = (re.search(r"starting 2 processes, .*, table (\S+)", line) for line in lines)
    name = next(m.group(1) for m in launched if m)
    gear_jax.cleanup.remove_dead_tables(match=f"{name}*")  # what the killed processes left in /dev/shm
    for line in lines:  # each process logs its own shard's rows after each checkpoint
        if found := re.search(r"checkpoint of update (\d+) saved .* shards hold \{(\d+): (\d+)\}", line):
            saved.setdefault(int(found.group(1)), {})[int(found.group(2))] = int(found.group(3))
    s = run_example(compilation_cache, *args, timeout=240)
    resumed = int(s["resumed_from"])  # a later checkpoint than 100 may have committed before the kill
    assert resumed >= 100 and resumed % 50 == 0
    assert s["steps"] == 300  # Adam's count: the restored state's updates and the new ones
    # The replay came back: each shard holds its checkpoint's rows (at least those logged after an
    # earlier checkpoint returned, at most those logged after its own returned: actors write meanwhile),
    # and the rows written since the resume.
    earlier = max(step for step in saved if step < resumed)  # 50 at least: logged before 100
    for shard, (size, inserted) in enumerate(zip(s["shard_sizes"], s["shard_inserts"])):
        restored = size - inserted
        assert restored >= saved[earlier][shard] > 0
        if shard in saved.get(resumed, {}):
            assert restored <= saved[resumed][shard]
    assert all(n > 0 for n in s["shard_priority_updates"]) and s["final_loss"] >= 0


@pytest.mark.multiprocess
def test_sigterm_to_the_launcher_ends_every_process_promptly_and_leaves_no_shards(compilation_cache):
    # A scheduler's SIGTERM to the launcher of a running job: the launcher tells its processes to stop,
    # each closes its actors and shards and leaves without jax.distributed's shutdown barrier (not
    # killed), and nothing of the table stays in shared memory.
    cache = {"JAX_COMPILATION_CACHE_DIR": str(compilation_cache),
             "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    script = str(examples.ROOT / "examples" / "multihost.py")
    args = ["--steps=100000", "--learning_starts=64", "--eval_every=100000", "--eval_episodes=2"]
    job = subprocess.Popen(
        [sys.executable, script, "--num_processes=2", "--timeout=200", *args], cwd=examples.ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **cache},
        start_new_session=True,
    )
    lines, deadline = [], time.monotonic() + 150
    try:
        while sum("training starts" in line for line in lines) < 2:  # both processes are training
            lines.append(job.stdout.readline())
            assert lines[-1] and time.monotonic() < deadline, "the job did not start training"
        job.send_signal(signal.SIGTERM)  # the launcher alone
        start = time.monotonic()
        lines += job.communicate(timeout=90)[0].splitlines()
        took = time.monotonic() - start
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert job.returncode != 0
    # Both ended by themselves within the launcher's grace, none killed (-9): on SIGTERM (143), or aborted
    # (-6), which one process was once in a loaded CI run (not reproduced; likely a collective whose
    # peer had already left). Measured here: 1-3 s from the signal to the launcher's exit. The grace
    # is generous so that a loaded machine's slow exit is not taken for a hang; a hang is still killed.
    assert took < 45 + 5, f"the job took {took:.1f} s to end"
    codes = next(line for line in lines if "exit codes:" in line)
    assert re.search(r"exit codes: \[(143|-6), (143|-6)\]$", codes), codes
    launched = (re.search(r"starting 2 processes, .*, table (\S+)", line) for line in lines)
    name = next(m.group(1) for m in launched if m)
    if os.path.isdir("/dev/shm"):
        assert not [f for f in os.listdir("/dev/shm") if f.startswith(name + ".shard")]

"""examples/multihost.py: a jax.distributed job of 2 processes on this machine, each owning one shard of a
sharded table that its own actor process fills, and a data-parallel DQN learner over both.

Both runs go through the example's launcher (`--num_processes=2`), which bounds every process by
`--timeout` and kills them all when one fails. They share a JAX compilation cache (a fresh directory
per test session), so the second run skips most of the first one's compilation.
"""

import os
import pathlib
import re

import pytest

from tests.helpers import examples


@pytest.fixture(scope="module")
def compilation_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("multihost_jax_cache")


def run_example(cache: pathlib.Path, *args: str, timeout: int) -> dict:
    """Runs the example with `args`; returns its summary line's fields (numbers as floats, the per-shard
    lists as lists of ints)."""
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
    return summary


def test_smoke_every_shard_receives_transitions_and_the_learner_takes_its_steps(compilation_cache):
    s = run_example(compilation_cache, "--smoke", timeout=240)
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

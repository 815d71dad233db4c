"""examples/impala.py: actor processes -> a gear_jax queue -> a jitted V-trace learner.

One `--smoke` run (2 actor processes, 150 learner steps of 16 unrolls of 20 steps, about 8 s on this
project's 2-core CPU machine) checks that every unroll the actors inserted was delivered exactly once
(to the learner, or still queued at the end: none lost, none twice), that the learner learned
CartPole from them, and that no actor insert took the slow path (SlowPathWarning).
"""

from tests.helpers import examples


def test_smoke_run_delivers_every_unroll_once_and_learns():
    # Seed 0, --smoke, ten runs (three of them with two busy loops on the 2-core machine): initial
    # returns 25.9-26.3, final 79.3-105.8 (actors' timing varies from run to run, so the numbers do too;
    # the bound of 60 is about four spreads below their mean of 96).
    fields, done = examples.run_example("impala.py", "--smoke", timeout=400)
    summary = examples.numbers(fields)
    assert summary["steps"] == 150
    assert summary["unrolls"] == 150 * 16  # every learner step got a full batch
    assert summary["duplicates"] == 0 and summary["lost"] == 0
    assert summary["initial_return"] < 40  # a random policy keeps CartPole up for about 22 steps
    assert summary["final_return"] >= 60, summary
    assert summary["env_steps_per_s"] > 0
    assert "0 delivered twice, 0 lost" in done.stdout
    # The actors' rows are C-contiguous: every insert takes the native short path, none warns.
    assert "SlowPathWarning" not in done.stderr, done.stderr[-3000:]

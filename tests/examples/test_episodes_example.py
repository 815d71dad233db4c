"""examples/episodes.py: actor processes write variable-length episodes into a step-ring table while a GRU
world model trains on windows of them.

One run of the example checks that the actors, separate processes attached by name, wrote episodes step
by step while the learner trained, as many as the table's rate limiter lets through for its updates;
that the ring wrapped and held more episodes than a padded table of the same memory could; and that the
GRU predicts the next observation of held-out episodes far better than the persistence forecast and than
the same network without memory. Another, with actors slowed down, checks that the rate limiter then
holds the learner back.
"""

from tests.helpers import examples


def run_example(*args: str) -> dict[str, str]:
    """Runs the example with `args`; returns the fields of its summary line."""
    return examples.run_example("episodes.py", *args, timeout=150)[0]


def test_actors_write_episodes_and_the_world_model_needs_its_memory():
    # 400 updates, 2 actors as fast as the rate limiter lets them, a ring of 10,000 steps. Measured with
    # these flags, seeds 0-2, twice each: eval_mse 0.0083-0.0146, memoryless 0.0560-0.0807, persistence
    # 0.0753-0.0988, untrained 0.134-0.277, 424 episodes written (400-406 while the learner trained,
    # 96,100-101,200 steps), 38-42 episodes in the ring; 2 s of training, 7 s in all on the 2-core machine.
    fields = run_example("--steps=400", "--eval_every=400", "--step_capacity=10000", "--seed=1")
    assert fields["table"] == "ring"
    summary = {k: float(v) for k, v in fields.items() if k != "table"}
    # The rate limiter (64 windows sampled per episode written, a tolerance of 8 updates, sampling from 16
    # episodes on) bounds what the actors wrote by the learner's 400 updates, whichever side is faster:
    # 400 + 16 - 8 <= episodes <= 400 + 16 + 8. So the actors wrote while the learner trained.
    assert summary["actors"] == 2
    assert 408 <= summary["episodes"] <= 424
    assert summary["episodes_during_training"] >= 408 - 24  # at most 24 were in before the first update
    assert summary["steps_written"] > 5 * 10_000  # the ring wrapped several times
    # Episodes take only their steps: more than 20 (= 10,000 // 500 rows of a padded table) in the ring.
    assert summary["table_episodes"] > 20
    # The untrained model is no better than predicting no change; the memoryless one barely better.
    assert summary["initial_eval_mse"] > 0.5 * summary["persistence_mse"]
    assert summary["memoryless_eval_mse"] > 0.5 * summary["persistence_mse"]
    # The GRU infers the velocities from the window's history.
    assert summary["eval_mse"] < 0.3 * summary["persistence_mse"]
    assert summary["eval_mse"] < 0.4 * summary["memoryless_eval_mse"]


def test_slow_actors_hold_the_learner_back():
    # Actors capped at 2,000 steps per second each write about 16 episodes a second, far fewer than the
    # learner's updates a second: the rate limiter makes the learner wait for them, and still takes one
    # episode per update. Measured, three runs: episodes=108, held_updates 49, 55, 59 of 100 (the first
    # 16 or so ride on the episodes written before training; each later one needs a new episode).
    # Fewer than 20 would need a learner slower than the actors, about 60 ms an update (3-5 ms here).
    fields = run_example("--steps=100", "--eval_every=100", "--actor_rate=2000", "--seed=0")
    summary = {k: float(v) for k, v in fields.items() if k != "table"}
    assert 100 + 16 - 8 <= summary["episodes"] <= 100 + 16 + 8
    assert summary["held_updates"] >= 20

"""examples/episodes.py: actor processes write variable-length episodes into a step-ring table while a GRU
world model trains on windows of them.

One run of the example checks that the actors, separate processes attached by name, wrote episodes step
by step while the learner trained, that the ring wrapped and held more episodes than a padded table of
the same memory could, and that the GRU predicts the next observation of held-out episodes far better
than the persistence forecast and than the same network without memory.
"""

from tests.helpers import examples


def run_example(*args: str) -> dict[str, str]:
    """Runs the example with `args`; returns the fields of its summary line."""
    return examples.run_example("episodes.py", *args, timeout=150)[0]


def test_actors_write_episodes_and_the_world_model_needs_its_memory():
    # 400 updates, 2 actors, a ring of 10,000 steps. Measured with these flags, seeds 0-2: eval_mse
    # 0.0109-0.0158, memoryless 0.0602-0.0793, persistence 0.0792-0.0985 (eval_mse 0.14-0.16 of it),
    # untrained 0.133-0.283, 35-44 episodes in the ring, 240-320 written during training; 45-57 s each on
    # the 2-core machine under other jobs' load.
    fields = run_example("--steps=400", "--eval_every=400", "--step_capacity=10000", "--seed=1")
    assert fields["table"] == "ring"
    summary = {k: float(v) for k, v in fields.items() if k != "table"}
    # The actors really wrote, while the learner trained, and the ring wrapped.
    assert summary["actors"] == 2
    assert summary["episodes_during_training"] >= 20
    assert summary["steps_written"] > 10_000
    # Episodes take only their steps: more than 20 (= 10,000 // 500 rows of a padded table) in the ring.
    assert summary["table_episodes"] > 20
    # The untrained model is no better than predicting no change; the memoryless one barely better.
    assert summary["initial_eval_mse"] > 0.5 * summary["persistence_mse"]
    assert summary["memoryless_eval_mse"] > 0.5 * summary["persistence_mse"]
    # The GRU infers the velocities from the window's history.
    assert summary["eval_mse"] < 0.3 * summary["persistence_mse"]
    assert summary["eval_mse"] < 0.4 * summary["memoryless_eval_mse"]

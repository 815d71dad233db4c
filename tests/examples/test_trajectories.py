"""examples/trajectories.py: actor processes write episodes while a recurrent learner trains on windows.

One run of the example (about 12 s on this project's 2-core CPU machine) checks that the actors,
separate processes attached by name, wrote episodes while the learner trained, as many as the table's
rate limiter lets through for its updates, that the table's ring
wrapped (the learner sampled while actors overwrote rows), and that the GRU trained on 16-step windows
balances CartPole from partial observations (cart position and pole angle only), where the same model
trained on 1-step windows (no memory) cannot.
"""

from tests.helpers import examples


def run_example(*args: str) -> dict[str, float]:
    """Runs the example with `args`; returns the numbers of its summary line."""
    return examples.numbers(examples.run_example("trajectories.py", *args, timeout=240)[0])


def test_actors_write_episodes_and_the_recurrent_learner_needs_its_memory():
    # 300 updates, 2 actors of 4 environments as fast as the rate limiter lets them, a 32-episode ring.
    # Measured with these flags, seeds 0, 1, 2, 5, 6: eval_return 482.0-500 (500 is the maximum),
    # memoryless 42.0-44.9, untrained 9.0-14.5, 91 episodes written (75-83 while the learner trained),
    # table_size 25-26; 3-6 s of training, about 12 s in all.
    summary = run_example(
        "--steps=300", "--eval_every=300", "--eval_episodes=8", "--capacity=32", "--seed=1"
    )
    # The rate limiter (256 windows sampled per episode written, sampling from 8 episodes on, a tolerance
    # of 8.25 episodes) bounds what the actors wrote by the learner's 300 updates, whichever side is
    # faster: 300 * 64 / 256 + 8 - 8.25 <= episodes <= 75 + 8 + 8.25. So they wrote while it trained, and
    # the ring wrapped.
    assert summary["actors"] == 2
    assert 75 <= summary["episodes"] <= 91
    assert summary["episodes_during_training"] >= 75 - 8 - 8  # at most 16 were in before the first update
    assert summary["episodes"] > summary["capacity"] == 32
    # Rows being rewritten (at most one per writer: 8) are not counted.
    assert 32 - 8 <= summary["table_size"] <= 32
    assert summary["steps_written"] >= 250 * summary["episodes"]  # the controller's episodes are long
    # Learning, and memory is what makes it possible.
    assert summary["initial_eval_return"] < 50
    assert summary["memoryless_eval_return"] < 100
    assert summary["eval_return"] >= 250

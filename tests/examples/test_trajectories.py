"""examples/trajectories.py: actor processes write episodes while a recurrent learner trains on windows.

One run of the example (about 35 s on this project's 2-core CPU machine) checks that the actors,
separate processes attached by name, wrote episodes while the learner trained, that the table's ring
wrapped (the learner sampled while actors overwrote rows), and that the GRU trained on 16-step windows
balances CartPole from partial observations (cart position and pole angle only), where the same model
trained on 1-step windows (no memory) cannot.
"""

from tests.helpers import examples


def run_example(*args: str) -> dict[str, float]:
    """Runs the example with `args`; returns the numbers of its summary line."""
    return examples.numbers(examples.run_example("trajectories.py", *args, timeout=240)[0])


def test_actors_write_episodes_and_the_recurrent_learner_needs_its_memory():
    # 300 updates, 2 actors, a 32-episode ring. Measured with these flags, seeds 0, 1, 2, 5, 6: eval_return
    # 473.4-500 (500 is the maximum), memoryless 41.2-43.4, untrained 9.0-14.5, 144-169 episodes written
    # during training, table_size 24-26; about 35 s each.
    summary = run_example(
        "--steps=300", "--eval_every=300", "--eval_episodes=8", "--capacity=32", "--seed=1"
    )
    # The actors really wrote: episodes kept arriving while the learner trained, and the ring wrapped.
    assert summary["actors"] == 2
    assert summary["episodes_during_training"] >= 20
    assert summary["episodes"] > summary["capacity"] == 32
    assert 16 <= summary["table_size"] <= 32  # rows being rewritten (at most one per writer) are not counted
    assert summary["steps_written"] >= 250 * summary["episodes"]  # the controller's episodes are long
    # Learning, and memory is what makes it possible.
    assert summary["initial_eval_return"] < 50
    assert summary["memoryless_eval_return"] < 100
    assert summary["eval_return"] >= 250

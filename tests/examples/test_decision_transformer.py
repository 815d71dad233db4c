"""examples/decision_transformer.py: a decision transformer trained on windows of offline CartPole
episodes of mixed quality, held in a step ring, and evaluated conditioned on target returns.

One run checks that the learner's loss falls and that the trained model follows the return it is
conditioned on in the real environment. Another, on short episodes and long windows, checks the padded
windows: each gathered window agrees with its Sample (valid steps, timesteps, returns-to-go), and the
number of padded windows is what the uniform law over window starts predicts.
"""

import math

from tests.helpers import examples

KEYS = (
    "data_return_min data_return_median data_return_mean data_return_max episodes table_steps initial_loss "
    "final_loss final_accuracy masked_windows expected_masked_windows inconsistent_windows updates window "
    "eval_episodes updates_per_s wall_s"
).split()


def run_example(*args: str) -> dict[str, float]:
    """Runs the example with `args`; returns the numbers of its summary line."""
    return examples.numbers(examples.run_example("decision_transformer.py", *args, timeout=120)[0])


def test_the_transformer_follows_the_target_return():
    # The smoke model (one block, 32 wide) on 200 episodes, 1000 updates. Measured with these flags,
    # seeds 0-3: eval_return_500 343.2-465.9, eval_return_100 97.1-152.0, initial_loss 0.84-1.12,
    # final_loss about 0.46; about 13 s in all on the 2-core machine.
    summary = run_example(
        "--smoke", "--steps=1000", "--episodes=200", "--eval_episodes=8", "--targets=500,100", "--seed=0"
    )
    assert set(KEYS) | {"eval_return_500", "eval_return_100"} == set(summary)
    assert summary["updates"] == 1000 and summary["episodes"] == 200
    # Mixed quality: episodes from near the shortest CartPole allows to the 500-step limit.
    assert 1 <= summary["data_return_min"] < 30 and summary["data_return_max"] == 500
    assert summary["inconsistent_windows"] == 0
    # The data's actions are noisy (a random action with probability 0.2 to 1): the loss cannot reach 0,
    # but it falls well below chance (ln 2) from the untrained model's.
    assert summary["final_loss"] < summary["initial_loss"] - 0.2
    assert summary["final_loss"] < 0.6 < math.log(2)
    assert summary["final_accuracy"] > 0.7
    # The returns are legal, and follow the target: near 500 asked for 500, near 100 asked for 100.
    for target in (500, 100):
        assert 1 <= summary[f"eval_return_{target}"] <= 500
    assert summary["eval_return_500"] > 250
    assert 50 < summary["eval_return_100"] < 200
    assert summary["eval_return_500"] > 2 * summary["eval_return_100"]


def test_short_episodes_give_padded_windows_at_the_uniform_law():
    # Nearly random actions (epsilon >= 0.9): episodes of about 10 to 90 steps, most shorter than the
    # 40-step window. Measured: 747 padded windows of 3840 (60 updates of 64), 752.0 expected; 9 s.
    summary = run_example("--smoke", "--min_epsilon=0.9", "--window=40", "--targets=100", "--seed=0")
    assert summary["window"] == 40 and summary["updates"] == 60
    assert summary["data_return_max"] < 200
    # Every window agrees with its Sample: valid exactly on the first min(length, 40) steps, timestep
    # start + i, return-to-go length - timestep.
    assert summary["inconsistent_windows"] == 0
    # Each episode shorter than the window is one padded window among all window starts: the count of
    # padded windows is binomial around the expectation (5 standard deviations).
    draws = summary["updates"] * 64
    expected = summary["expected_masked_windows"]
    assert expected > 300
    sd = math.sqrt(expected * (1 - expected / draws))
    assert abs(summary["masked_windows"] - expected) < 5 * sd
    assert 1 <= summary["eval_return_100"] <= 500

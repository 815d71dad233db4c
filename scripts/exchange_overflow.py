"""How often global mode's exchange leaves its first block capacity, and the rows it then sends.

A step's owners are drawn as the sharded sample draws them: each of the B picks belongs to shard s with
probability share[s] (the shard's total over the whole). For each layout of shares this draws
`--steps` steps, asks `gear_jax.sharded.exchange_branch` which capacity each takes, and prints the
share of steps per branch and the rows sent per device over the rows picked (S x C over B / S).

    python scripts/exchange_overflow.py --shards=4 --batch_sizes=256,1024 --steps=20000
"""

from __future__ import annotations

import numpy as np
from absl import app, flags

from gear_jax import sharded

FLAGS = flags.FLAGS
flags.DEFINE_integer("shards", 4, "S, shards on the mesh axis.")
flags.DEFINE_list("batch_sizes", ["256", "1024"], "B, picks per step (multiples of S).")
flags.DEFINE_integer("steps", 20000, "Steps drawn per layout.")
flags.DEFINE_float("capacity_factor", sharded.CAPACITY_FACTOR, "The exchange's capacity factor.")
flags.DEFINE_integer("seed", 0, "Seed of the draws.")


def layouts(shards: int) -> dict[str, np.ndarray]:
    """Shares of the shards' weight: equal; one shard with half of it; one shard empty."""
    half = np.full(shards, 0.5 / (shards - 1))
    half[0] = 0.5
    empty = np.full(shards, 1.0 / (shards - 1))
    empty[1] = 0.0
    return {"balanced": np.full(shards, 1.0 / shards), "one shard half": half, "one shard empty": empty}


def main(argv: list[str]) -> None:
    del argv
    rng = np.random.default_rng(FLAGS.seed)
    s = FLAGS.shards
    print("| B | layout | capacities | steps per branch | rows sent / picked (mean) |")
    print("|---|---|---|---|---|")
    for b in (int(v) for v in FLAGS.batch_sizes):
        capacities = sharded.exchange_capacities(b, s, FLAGS.capacity_factor)
        for name, shares in layouts(s).items():
            owners = rng.choice(s, size=(FLAGS.steps, b), p=shares)
            branches = np.array([sharded.exchange_branch(o, s, capacities) for o in owners])
            counts = np.bincount(branches, minlength=len(capacities)) / FLAGS.steps
            sent = np.asarray(capacities)[branches] * s / (b / s)
            shown = ", ".join(f"{c}: {100 * f:.3g}%" for c, f in zip(capacities, counts))
            print(f"| {b} | {name} | {capacities} | {shown} | {sent.mean():.2f}x |")


if __name__ == "__main__":
    app.run(main)

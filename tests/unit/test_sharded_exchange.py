"""The capacities of global mode's exchange (gear_jax.sharded.exchange_capacities) and the branch a
step takes (exchange_branch): sized from the binomial law of a block's picks, always able to hold them."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from scipy import stats

import gear_jax as gj
from gear_jax import sharded


@pytest.mark.parametrize("batch_size, shards", [(1024, 4), (256, 4), (1024, 8), (64, 2), (8, 4), (4, 1)])
def test_capacities_grow_to_a_full_block(batch_size, shards):
    per_device = batch_size // shards
    for factor in (sharded.CAPACITY_FACTOR, 0.01, 3.0):
        capacities = sharded.exchange_capacities(batch_size, shards, factor)
        first = min(per_device, math.ceil(factor * batch_size / shards**2) + sharded.EXCHANGE_SLACK)
        assert capacities[0] == first and capacities[-1] == per_device
        assert list(capacities) == sorted(set(capacities)) and len(capacities) <= sharded.EXCHANGE_BRANCHES
    assert sharded.exchange_capacities(batch_size, shards, None) == (per_device,)


def test_balanced_shards_rarely_leave_the_first_branch_and_a_heavy_shard_always_does():
    batch_size, shards = 1024, 4
    per_device = batch_size // shards
    capacities = sharded.exchange_capacities(batch_size, shards, sharded.CAPACITY_FACTOR)
    # A block of a balanced layout holds Binomial(B / S, 1 / S) picks: the first capacity overflows in
    # a step with probability at most S^2 times its tail.
    tail = shards**2 * stats.binom.sf(capacities[0], per_device, 1 / shards)
    assert tail < 1e-5
    rng = np.random.default_rng(0)
    steps = 2000
    balanced = [
        sharded.exchange_branch(rng.integers(0, shards, batch_size), shards, capacities) for _ in range(steps)
    ]
    assert sum(b > 0 for b in balanced) == 0
    # One shard with half the weight: its blocks hold about B / (2 S) = 128 picks, past the first (100).
    heavy = np.where(rng.random((steps, batch_size)) < 0.5, 0, rng.integers(1, shards, (steps, batch_size)))
    branches = [int(sharded.exchange_branch(owners, shards, capacities)) for owners in heavy]
    assert min(branches) >= 1 and max(branches) < len(capacities) - 1
    # Every pick on one shard: only full-size blocks hold them. numpy and jax agree.
    one = np.zeros(batch_size, np.int64)
    assert sharded.exchange_branch(one, shards, capacities) == len(capacities) - 1
    for owners in heavy[:20]:
        assert int(sharded.exchange_branch(jnp.asarray(owners), shards, capacities)) == int(
            sharded.exchange_branch(owners, shards, capacities)
        )


@pytest.mark.parametrize("factor", [0, -1.0, float("nan"), "2", True])
def test_a_bad_capacity_factor_is_refused_by_name(factor):
    spec = gj.TableSpec({"x": gj.Field((), "float32")}, capacity=8)
    mesh = Mesh(np.array(jax.devices()[:1]), ("replay",))
    with gj.ShardedTable.create(spec, mesh) as table:
        table.shard(0).insert({"x": np.zeros(4, np.float32)})
        with pytest.raises(gj.InvalidArgumentError, match=r"capacity_factor=.* must be a number > 0"):
            table.sampler(4, capacity_factor=factor)(jax.random.key(0))


@pytest.mark.parametrize("batch_size", [2**31, 2**70, 0, -4, 2.0, True])
def test_a_batch_size_out_of_range_is_refused_by_name(batch_size):
    spec = gj.TableSpec({"x": gj.Field((), "float32")}, capacity=8)
    mesh = Mesh(np.array(jax.devices()[:1]), ("replay",))
    with gj.ShardedTable.create(spec, mesh) as table:
        table.shard(0).insert({"x": np.zeros(4, np.float32)})
        refused = r"batch_size=.* must be an int in \[1, 2\*\*31 - 1\]"
        with pytest.raises(gj.InvalidArgumentError, match=refused):
            table.sampler(batch_size)(jax.random.key(0))

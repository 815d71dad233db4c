"""Does compute-sanitizer survive a jitted shard_map with an all_to_all inside a lax.switch on a one-GPU
mesh, without gear_jax? The probe of a sanitizer crash in the sharded exchange's GPU tests
(docs/BENCHMARKS.md, the fourth GPU round):

    compute-sanitizer --tool memcheck python scripts/sanitizer_collectives_probe.py
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

mesh = Mesh(np.array(jax.devices("gpu")[:1]), ("replay",))


def body(key_data):
    x = jax.random.uniform(jax.random.wrap_key_data(key_data), (64, 8))

    def exchange(c, x):
        return lax.all_to_all(x[: 64 // c * c].reshape(1, -1, 8), "replay", 0, 0, tiled=True).sum()

    branch = (x[0, 0] > 0.5).astype(jnp.int32)
    return lax.switch(branch, [functools.partial(exchange, c) for c in (1, 2)], x)[None]


f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P("replay"), check_vma=False))
for i in range(20):
    print(i, float(f(jax.random.key_data(jax.random.key(i)))[0]))
print("probe done")

"""What JAX's dispatch costs a learner step whose priority update is an effect (docs/ARCHITECTURE.md,
"Why the update stays an effect").

Per learner step (prioritized sample of 32 rows of 10,000, gather, update_priorities): one step per jitted
call with the update as gear_jax declares it (effectful), one step per call with the same custom call
declared effect-free (what the fast path would give; unsafe: XLA may drop it), and 8 steps per call in a
`lax.scan` (effectful). Medians of 3 rounds. Run: `python scripts/update_dispatch.py`.
"""

import time
import jax
import jax.numpy as jnp
import numpy as np
import gear_jax as gj
from gear_jax import _ffi
from gear_jax.ops import _attrs

B, rows, K = 32, 10_000, 8
t = gj.Table.create(gj.TableSpec(fields={"x": gj.Field((64,), "float32")}, capacity=rows, max_steps=1))
t.insert({"x": np.ones((rows, 64), np.float32)}, priorities=np.ones(rows, np.float32))


def one(key, count, effect=True):
    key, k = jax.random.split(key)
    s = gj.sample(t, k, B, method="prioritized", after=count)
    x = gj.gather(t, s, fields=("x",))["x"]
    p = jnp.abs(x[:, 0]) + 0.1
    if effect:
        count = gj.update_priorities(t, s, p)
    else:
        count = jax.ffi.ffi_call(_ffi.UPDATE_PRIORITIES, jax.ShapeDtypeStruct((), jnp.int32))(
            s.indices, s.generations, p, jnp.zeros((), jnp.int32), **_attrs(t)
        )
    return key, count, x.sum()


def scanned(key, count):
    def body(carry, _):
        key, count, _x = one(carry[0], carry[1])
        return (key, count, _x), None

    (key, count, x), _ = jax.lax.scan(body, (key, count, jnp.zeros((), jnp.float32)), None, length=K)
    return key, count, x


steps = {
    "1 step/call, effectful update": (jax.jit(one), 1),
    "1 step/call, effect-free update": (jax.jit(lambda k, c: one(k, c, False)), 1),
    f"{K} steps/call in lax.scan, effectful": (jax.jit(scanned), K),
}
res = {n: [] for n in steps}
for r in range(3):
    for name, (f, per) in steps.items():
        key, c = jax.random.key(0), jnp.zeros((), jnp.int32)
        for _ in range(30):
            key, c, x = f(key, c)
        jax.block_until_ready(x)
        lat = []
        for _ in range(600 // per):
            a = time.perf_counter()
            key, c, x = f(key, c)
            jax.block_until_ready(x)
            lat.append((time.perf_counter() - a) / per)
        res[name].append(np.median(lat) * 1e6)
for n, v in res.items():
    print(f"{n}: {np.median(v):.0f} us per step (rounds: {', '.join(f'{x:.0f}' for x in v)})")
t.close()

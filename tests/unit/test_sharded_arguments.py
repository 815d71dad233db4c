"""The sharded layer's arguments (gear_jax.sharded): a bad one is refused by name with the fix, a valid one
is never refused, and a refused update changes no row on any shard.

Checks that need two shards run in a fresh interpreter with two CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count=2, as tests/unit/test_step_ring.py does); the others run
here, on one shard of this process's first device.
"""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import gear_jax as gj
from gear_jax import sharded

TWO_DEVICES = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}

# The start of every two-device script: a sharded table of 2 shards of 8 rows with a float field "x",
# `result(**values)` to report, and `error(call)` for what a call raises ("" when nothing).
PRELUDE = """
import json, sys
import numpy as np, jax, jax.numpy as jnp, gear_jax as gj
from jax.sharding import Mesh
from gear_jax import sharded as sh

assert len(jax.devices()) == 2
st = gj.ShardedTable.create(
    gj.TableSpec({"x": gj.Field((), "float32")}, capacity=8), Mesh(np.array(jax.devices()), ("replay",))
)

def result(**values):
    print("RESULT " + json.dumps(values), flush=True)

def error(call):
    try:
        jax.block_until_ready(call())
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return ""

def priorities():
    return [st.shard(s).row_status()["priority"].tolist() for s in range(2)]
"""


def run_on_two_shards(code: str) -> tuple[dict, subprocess.CompletedProcess]:
    """Runs PRELUDE + `code` on two CPU devices; (its RESULT, the finished process). A call that failed on
    one shard while the other waited in a collective would abort the process after XLA's 40 s rendezvous
    timeout: the timeout here lies above it."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PRELUDE) + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=150,
        env=TWO_DEVICES,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(lines[-1][len("RESULT ") :]), done


@pytest.fixture
def one_shard():
    """A sharded table of one shard of 8 rows on this process's first device, 4 rows inserted."""
    spec = gj.TableSpec({"x": gj.Field((), "float32")}, capacity=8)
    with gj.ShardedTable.create(spec, Mesh(np.array(jax.devices()[:1]), ("replay",))) as table:
        table.shard(0).insert({"x": np.arange(4, dtype=np.float32)})
        yield table


# -- S5: sharded update_priorities refuses what one table's update refuses ------------------------------


def test_update_refuses_bool_priorities_as_one_table_does_and_takes_ints(one_shard, make_table):
    smp, _ = one_shard.sampler(2)(0)
    update = one_shard.updater()
    with pytest.raises(
        gj.InvalidArgumentError, match=r"sharded.update_priorities: priorities has dtype bool"
    ):
        update(smp, jnp.array([True, True]))
    table = make_table(capacity=8)
    table.insert({"obs": np.zeros((4, 3), np.float32), "action": np.zeros(4, np.int32)})
    one = jax.jit(lambda k: gj.sample(table, k, 2))(jax.random.key(0))
    with pytest.raises(gj.InvalidArgumentError, match=r"update_priorities: priorities has dtype bool"):
        jax.jit(lambda s: gj.update_priorities(table, s, jnp.array([True, True])))(one)
    assert (one_shard.shard(0).row_status()["priority"][:4] == 1.0).all()  # nothing written
    # Integer priorities are numbers, as for one table.
    assert int(jax.jit(lambda s: gj.update_priorities(table, s, jnp.array([3, 3])))(one)) == 2
    assert int(np.asarray(update(smp, jnp.array([3, 3], jnp.int32)))[0]) == 2
    picked = np.unique(np.asarray(smp.indices))
    assert (one_shard.shard(0).row_status()["priority"][picked] == 3.0).all()


@pytest.mark.parametrize("bad", [-1, 8, 10**6])
def test_update_refuses_a_row_id_outside_the_one_shard(one_shard, bad):
    smp, _ = one_shard.sampler(2)(0)
    hand = sharded.ShardedSample(
        jnp.array([int(smp.indices[0]), bad], jnp.int32),
        smp.generations,
        smp.probabilities,
        smp.starts,
        smp.selectable,
    )
    with pytest.raises(gj.EXECUTION_ERRORS, match=rf"update_priorities: indices\[1\] = {bad} is outside"):
        jax.block_until_ready(one_shard.updater()(hand, jnp.array([5.0, 5.0])))
    assert (one_shard.shard(0).row_status()["priority"][:4] == 1.0).all()  # not even the valid pick


def test_update_refuses_global_row_ids_outside_every_shard_and_changes_no_shard():
    """Two shards of 8 rows: global ids -1 and 16 (past the last shard) and 10**6 are refused at run
    time on every shard (none is left waiting), with no row of either shard changed, and so is a NaN
    priority whose row lies on one shard only; a valid update after them applies."""
    out, _ = run_on_two_shards("""
        for s in range(2):
            st.shard(s).insert({"x": np.arange(4, dtype=np.float32)})
        smp, _ = st.sampler(4)(0)
        update = st.updater()
        generations = np.concatenate([st.shard(s).row_status()["generation"] for s in range(2)])

        def picks(ids):  # a ShardedSample of these global ids, with their rows' generations
            ids = np.asarray(ids, np.int32)
            gens = generations[np.clip(ids, 0, 15)].astype(np.uint32)
            return sh.ShardedSample(jnp.asarray(ids), jnp.asarray(gens), smp.probabilities, smp.starts,
                                    smp.selectable)

        errors = {}
        for bad in (-1, 16, 10**6):  # rows on both shards, then the bad id
            errors[str(bad)] = error(lambda: update(picks([1, 9, 2, bad]), jnp.full(4, 5.0)))
        unchanged = priorities()
        on_shard_1 = picks([1, 2, 9, 10])
        nan = error(lambda: update(on_shard_1, jnp.array([5.0, 5.0, 5.0, np.nan])))
        after_nan = priorities()
        counts = np.asarray(update(on_shard_1, jnp.array([5.0, 6.0, 7.0, 8.0]))).tolist()
        result(errors=errors, unchanged=unchanged, nan=nan, after_nan=after_nan, counts=counts,
               updated=priorities())
    """)
    for bad, message in out["errors"].items():
        assert f"update_priorities: indices[3] = {bad} is outside [0, 8)" in message, (bad, message)
    ones = [[1.0] * 4 + [0.0] * 4] * 2
    assert out["unchanged"] == ones
    assert "priorities[3] = nan" in out["nan"] and out["after_nan"] == ones
    assert out["counts"] == [2, 2]
    assert out["updated"] == [[1.0, 5.0, 6.0, 1.0] + [0.0] * 4, [1.0, 7.0, 8.0, 1.0] + [0.0] * 4]


# -- U2: global fifo, lifo and topk of more rows than one shard holds -----------------------------------


def test_global_ordered_picks_may_exceed_one_shards_capacity():
    """10 or 12 picks of the 16 (or 12) rows of two shards of 8: the one-table answers (fifo's and lifo's
    round-robin commit order, ties to the lower shard for fifo and the higher for lifo; topk by
    priority), with the rows gathered from both shards."""
    out, _ = run_on_two_shards("""
        def described(sampler):
            smp, batch = sampler(0)
            return {
                "x": np.asarray(batch["x"]).tolist(),
                "valid": np.asarray(batch["valid"]).all().item(),
                "indices": np.asarray(smp.indices).tolist(),
            }

        low, high = np.arange(1, 9, dtype=np.float32), np.arange(100, 108, dtype=np.float32)
        st.shard(0).insert({"x": np.arange(8, dtype=np.float32)}, priorities=low)
        st.shard(1).insert({"x": np.arange(10, 18, dtype=np.float32)}, priorities=high)
        picks = {}
        for method, b in (("fifo", 10), ("lifo", 12), ("topk", 10), ("topk", 16)):
            picks[f"{method}_{b}"] = described(st.sampler(b, method=method))
        uneven = sh.ShardedTable.create(st.spec, st.mesh)
        uneven.shard(0).insert({"x": np.arange(8, dtype=np.float32)})
        uneven.shard(1).insert({"x": np.arange(10, 14, dtype=np.float32)})
        picks["uneven_fifo_10"] = described(uneven.sampler(10, method="fifo"))
        result(**picks)
    """)
    expected = {
        "fifo_10": [0, 10, 1, 11, 2, 12, 3, 13, 4, 14],
        "lifo_12": [17, 7, 16, 6, 15, 5, 14, 4, 13, 3, 12, 2],
        "topk_10": [17, 16, 15, 14, 13, 12, 11, 10, 7, 6],
        "topk_16": [17, 16, 15, 14, 13, 12, 11, 10, 7, 6, 5, 4, 3, 2, 1, 0],
        "uneven_fifo_10": [0, 10, 1, 11, 2, 12, 3, 13, 4, 5],
    }
    for name, xs in expected.items():
        got = out[name]
        assert got["x"] == xs, name
        assert got["valid"], name
        # Global ids name the shard and the row that holds the value: shard 0 holds x, shard 1 x - 10 + 8.
        assert got["indices"] == [int(x) if x < 10 else int(x) - 2 for x in xs], name


def test_global_ordered_picks_of_more_rows_than_the_shards_hold():
    """More picks than one shard's capacity while the shards together hold too few rows (one shard
    full): every shard raises the single-table error at run time, at once (none waits in the exchange
    for the other); more picks than every shard's capacity, or local picks past one shard's, are
    refused at trace time by name."""
    out, _ = run_on_two_shards("""
        st.shard(0).insert({"x": np.arange(8, dtype=np.float32)})
        st.shard(1).insert({"x": np.arange(1, dtype=np.float32)})
        result(
            too_few={m: error(lambda: st.sampler(10, method=m)(0)) for m in ("fifo", "lifo", "topk")},
            global_18=error(lambda: st.sampler(18, method="topk")(0)),
            local_18=error(lambda: st.sampler(18, method="fifo", mode="local")(0)),
            still=np.asarray(st.sampler(8, method="fifo")(0)[1]["x"]).tolist(),
        )
    """)
    for method, message in out["too_few"].items():
        assert "fewer than batch_size 10" in message and "InvalidArgumentError" not in message, (
            method,
            message,
        )
    assert out["global_18"].startswith("InvalidArgumentError: sharded.sample: batch_size=18 in global mode")
    assert "2 shards' 16 rows" in out["global_18"]
    assert out["local_18"].startswith("InvalidArgumentError: sharded.sample: batch_size=18 in local mode")
    assert out["still"] == [0, 0, 1, 2, 3, 4, 5, 6]  # shard 1's one row is as old as shard 0's first


# -- U6: ShardedTable helpers refuse bad arguments by name ---------------------------------------------


@pytest.mark.parametrize("index", [1, -1, 99, "a", 1.0, True, None])
def test_shard_refuses_an_index_that_names_no_shard(one_shard, index):
    with pytest.raises(gj.InvalidArgumentError, match=r"ShardedTable.shard: s"):
        one_shard.shard(index)
    assert one_shard.shard(0) is one_shard.shard(np.int64(0))


@pytest.mark.parametrize(
    "key",
    [
        "k",
        1.5,
        True,
        2**70,
        None,
        np.zeros(3, np.uint32),
        np.zeros(2, np.float32),
        np.zeros((1, 2), np.uint32),
    ],
    ids=["str", "float", "bool", "huge-seed", "none", "three-words", "float-words", "batched-raw"],
)
def test_sampler_refuses_keys_of_the_wrong_kind(one_shard, key):
    with pytest.raises(gj.InvalidArgumentError, match=r"ShardedTable.sampler: key must be a JAX PRNG key"):
        one_shard.sampler(2)(key)


def test_sampler_takes_a_seed_a_key_or_its_data_alike(one_shard):
    sampler = one_shard.sampler(2)
    with pytest.raises(gj.InvalidArgumentError, match=r"got an array of \(2,\) keys: pass one"):
        sampler(jax.random.split(jax.random.key(0)))
    key = jax.random.key(3)
    picks = [
        np.asarray(sampler(k)[0].indices)
        for k in (3, np.int32(3), key, jax.random.key_data(key), np.asarray(jax.random.key_data(key)))
    ]
    for p in picks[1:]:
        np.testing.assert_array_equal(p, picks[0])


@pytest.mark.parametrize("sample", [1, None, "s"])
def test_updater_refuses_what_is_not_a_sharded_sample(one_shard, sample):
    with pytest.raises(
        gj.InvalidArgumentError, match=r"ShardedTable.updater: the sample must be a .*ShardedSample"
    ):
        one_shard.updater()(sample, jnp.ones(2))


def test_updater_refuses_priorities_of_another_shape_on_two_shards():
    out, _ = run_on_two_shards("""
        for s in range(2):
            st.shard(s).insert({"x": np.arange(4, dtype=np.float32)})
        smp, _ = st.sampler(4)(0)
        update = st.updater()
        three = sh.ShardedSample(jnp.arange(3, dtype=jnp.int32), jnp.zeros(3, jnp.uint32) + 2,
                                 jnp.ones(3), jnp.zeros(3, jnp.int32), smp.selectable)
        result(
            three_priorities=error(lambda: update(smp, jnp.ones(3))),
            matrix=error(lambda: update(smp, jnp.ones((4, 1)))),
            list_ok=np.asarray(update(smp, [2.0, 2.0, 2.0, 2.0])).tolist(),
            three_picks=error(lambda: update(three, jnp.ones(3))),
            unchanged_by_refusals=sum(p == 2.0 for shard in priorities() for p in shard),
        )
    """)
    expected = (
        "InvalidArgumentError: ShardedTable.updater: priorities has shape (3,), the sample has (4,) picks"
    )
    assert out["three_priorities"].startswith(expected)
    assert out["matrix"].startswith("InvalidArgumentError: ShardedTable.updater: priorities has shape (4, 1)")
    assert sum(out["list_ok"]) == 4
    assert out["three_picks"].startswith("InvalidArgumentError: ShardedTable.updater: the sample's indices")
    assert "a multiple of the 2 shards" in out["three_picks"]


@pytest.mark.parametrize("call", ["sample", "update_priorities", "importance_weights", "epoch", "retire"])
def test_sharded_calls_outside_shard_map_say_where_to_call_them(one_shard, call):
    smp, _ = one_shard.sampler(2)(0)
    calls = {
        "sample": lambda: sharded.sample(one_shard, jax.random.key(0), 2),
        "update_priorities": lambda: sharded.update_priorities(one_shard, smp, jnp.ones(2)),
        "importance_weights": lambda: sharded.importance_weights(one_shard, smp, 0.5),
        "epoch": lambda: sharded.epoch(one_shard, jax.random.key(0), 2),
        "retire": lambda: sharded.retire(one_shard, smp),
    }
    with pytest.raises(
        gj.InvalidArgumentError, match=rf"sharded.{call} .*inside jax.shard_map over the axis"
    ):
        calls[call]()


# -- U7: compiled sharded calls on closed shards raise at the call ------------------------------------


def test_compiled_sampler_and_updater_raise_at_the_call_after_close_and_exit_cleanly():
    out, done = run_on_two_shards("""
        for s in range(2):
            st.shard(s).insert({"x": np.arange(4, dtype=np.float32)})
        sampler, update = st.sampler(4), st.updater()
        smp, _ = sampler(0)
        jax.block_until_ready(update(smp, jnp.ones(4)))
        st.close()
        raised = {}
        for name, call in (("sampler", lambda: sampler(0)), ("updater", lambda: update(smp, jnp.ones(4)))):
            try:
                call()  # not read: an error that only a read would see does not count
                raised[name] = ""
            except Exception as e:
                raised[name] = f"{type(e).__name__}: {e}"
        result(**raised)
    """)
    for name in ("sampler", "updater"):
        assert out[name].startswith(f"TableClosedError: ShardedTable.{name}: shard 0 of the sharded table")
        assert "is closed" in out[name]
    assert "Exception ignored" not in done.stderr and "JaxRuntimeError" not in done.stderr, done.stderr[
        -3000:
    ]


def test_a_closed_one_shard_table_refuses_its_compiled_calls(one_shard):
    sampler, update = one_shard.sampler(2), one_shard.updater()
    smp, _ = sampler(0)
    one_shard.close()
    with pytest.raises(gj.TableClosedError, match="is closed"):
        sampler(0)
    with pytest.raises(gj.TableClosedError, match="is closed"):
        update(smp, jnp.ones(2))


# -- A5: the updater and the sampler take arrays of any placement, on meshes of Explicit and Auto axes -----

# A mesh built as the README builds it (jax.make_mesh: Explicit axes by default) or with Auto axes, its
# table's shards of 8 rows holding 4 each. Each update writes one value to the picks of a global or local
# fifo sample (shard 0's rows 0 and 1 and shard 1's rows 0 and 1, always), the value given as one kind of
# array; the shards' priorities are read back after each.
PLACEMENTS = """
from collections import Counter
import re
from jax.sharding import NamedSharding, PartitionSpec as P

st.close()
mesh = jax.make_mesh((2,), ("replay",), axis_types=(getattr(jax.sharding.AxisType, AXIS_TYPE),))
assert str(mesh.axis_types[0]).endswith(AXIS_TYPE)
st = gj.ShardedTable.create(gj.TableSpec({"x": gj.Field((), "float32")}, capacity=8), mesh)
for s in range(2):
    st.shard(s).insert({"x": np.arange(4, dtype=np.float32)})
row = NamedSharding(mesh, P("replay"))
update = st.updater()
kinds = {
    "numpy": lambda smp, batch, v: np.full(4, v, np.float32),
    "list": lambda smp, batch, v: [v] * 4,
    "jnp.full": lambda smp, batch, v: jnp.full(4, v),
    "committed to device 1": lambda smp, batch, v: jax.device_put(jnp.full(4, v), jax.devices()[1]),
    "replicated on the mesh": lambda smp, batch, v: jax.device_put(jnp.full(4, v), NamedSharding(mesh, P())),
    "from the sharded batch": lambda smp, batch, v: batch["x"] * 0 + v,
    "sharded by hand": lambda smp, batch, v: jax.device_put(np.full(4, v, np.float32), row),
}
cases, value = [], 2.0
for mode in ("global", "local"):
    smp, batch = st.sampler(4, method="fifo", mode=mode)(0)
    numpy_sample = jax.tree_util.tree_map(np.asarray, smp)  # a sample of host arrays
    calls = [(kind, smp, lambda s, p: update(s, p), make) for kind, make in kinds.items()]
    calls.append(("numpy sample", numpy_sample, lambda s, p: update(s, p), kinds["numpy"]))
    calls.append(("inside the caller's jit", smp, jax.jit(lambda s, p: update(s, jnp.zeros(4) + p)),
                  lambda smp, batch, v: np.float32(v)))
    for kind, s, call, make in calls:
        before = priorities()
        try:
            counts, problem = np.asarray(call(s, make(smp, batch, value))).tolist(), ""
        except Exception as e:
            counts, problem = None, f"{type(e).__name__}: {str(e)[:300]}"
        cases.append({"mode": mode, "kind": kind, "value": value, "indices": np.asarray(s.indices).tolist(),
                      "counts": counts, "problem": problem, "before": before, "after": priorities()})
        value += 1.0

# Placed already: no device_put of a concrete array outside the jit, and the compiled update is the
# plain shard_map's (no copy, no collective added).
smp, batch = st.sampler(4, method="fifo")(0)
placed = batch["x"] + 1.0
concrete_puts, real_put = [], jax.device_put
def counting_put(x, *args, **kwargs):
    if any(not isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(x)):
        concrete_puts.append(type(x).__name__)
    return real_put(x, *args, **kwargs)
jax.device_put = counting_put
jax.block_until_ready(update(smp, placed))
puts_when_placed = list(concrete_puts)
jax.block_until_ready(update(smp, real_put(np.asarray(placed), jax.devices()[1])))
puts_when_on_device_1 = concrete_puts[len(puts_when_placed):]
jax.device_put = real_put
plain = jax.jit(jax.shard_map(
    lambda s, p: sh.update_priorities(st, s, p)[None], mesh=mesh,
    in_specs=(sh.ShardedSample(P("replay"), P("replay"), P("replay"), P("replay"), P()), P("replay")),
    out_specs=P("replay"), check_vma=False,
))
def operations(f):
    text = f.lower(smp, placed).compile().as_text()
    found = re.findall(r"\\b(copy|copy-start|all-gather|all-to-all|all-reduce|collective-permute|"
                       r"dynamic-slice|slice|custom-call|send|recv)\\(", text)
    return dict(Counter(found))

# The sampler takes its key data as the caller's jit holds it, sharded along the axis too.
sampler = st.sampler(4)
data = np.asarray(jax.random.key_data(jax.random.key(3)))
keys = {}
for name, key in (("numpy", data), ("sharded", jax.device_put(data, row)),
                  ("on device 1", jax.device_put(data, jax.devices()[1]))):
    try:
        keys[name] = np.asarray(sampler(key)[0].indices).tolist()
    except Exception as e:
        keys[name] = f"{type(e).__name__}: {str(e)[:300]}"
for name, key in (("numpy in jit", data), ("sharded in jit", jax.device_put(data, row))):
    try:
        keys[name] = np.asarray(jax.jit(lambda k: sampler(k)[0].indices)(key)).tolist()
    except Exception as e:
        keys[name] = f"{type(e).__name__}: {str(e)[:300]}"
result(cases=cases, puts_when_placed=puts_when_placed, puts_when_on_device_1=puts_when_on_device_1,
       plain=operations(plain), updater=operations(jax.jit(lambda s, p: update(s, p))), keys=keys)
"""


@pytest.mark.parametrize("axis_type", ["Explicit", "Auto"])
def test_updater_and_sampler_take_arrays_of_any_placement(axis_type):
    """numpy, lists, unsharded and single-device jax arrays, replicated and sharded ones: the updater
    places them with the picks' sharding and applies them (read back from the shards) on both axis types
    and both sampling modes; placed ones go through without a copy; the sampler takes a key sharded
    along the axis inside the caller's jit."""
    out, _ = run_on_two_shards(f"AXIS_TYPE = {axis_type!r}\n" + textwrap.dedent(PLACEMENTS))
    assert len(out["cases"]) == 2 * 9
    for case in out["cases"]:
        name = (case["mode"], case["kind"])
        assert case["problem"] == "", (name, case["problem"])
        assert case["counts"] == [2, 2], name  # each shard updated its two picked rows
        ids = sorted(case["indices"])
        assert ids == [0, 1, 8, 9], name  # fifo, either mode: the two oldest rows of each shard
        expected = [list(shard) for shard in case["before"]]
        for g in ids:
            expected[g // 8][g % 8] = case["value"]
        assert case["after"] == expected, name
        assert case["after"] != case["before"], name  # every case writes a new value
    assert out["puts_when_placed"] == []
    assert out["puts_when_on_device_1"] == ["ArrayImpl"]  # the counter sees the one it must
    assert out["updater"] == out["plain"]
    keys = out["keys"]
    assert all(isinstance(v, list) for v in keys.values()), keys
    assert all(v == keys["numpy"] for v in keys.values()), keys

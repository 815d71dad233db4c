"""The PyTorch bridge (gear_jax.torch) with a real PyTorch: zero-copy hand-off, torch inserts, the sampler."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

import gear_jax as gj
import gear_jax.torch as gjt

TABLE_DTYPES = [
    "bool",
    "uint8",
    "int8",
    "uint16",
    "int16",
    "uint32",
    "int32",
    "float16",
    "bfloat16",
    "float32",
]


def values(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), shape).astype(dtype)
    return rng.normal(size=shape).astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)


def as_tensor(array):
    if array.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def test_import_gear_jax_does_not_import_torch():
    code = "import sys, gear_jax; assert 'torch' not in sys.modules; import gear_jax.torch; print('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize("dtype", TABLE_DTYPES)
def test_to_torch_shares_memory_and_round_trips(dtype):
    x = jnp.asarray(values(dtype, (64, 33)))
    t = gjt.to_torch({"x": x})["x"]
    assert t.data_ptr() == x.unsafe_buffer_pointer()
    assert t.dtype == gjt.torch_dtype(x.dtype) and tuple(t.shape) == x.shape
    back = gjt.from_torch(t, allow_copy=False)
    assert back.unsafe_buffer_pointer() == t.data_ptr()
    assert back.dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(back).view(np.uint8), np.asarray(x).view(np.uint8))


@pytest.mark.parametrize("dtype", TABLE_DTYPES)
def test_from_torch_shares_memory(dtype):
    t = as_tensor(values(dtype, (128, 5), seed=1)).clone()  # torch's allocator: 64-byte aligned
    x = gjt.from_torch([t], allow_copy=False)[0]
    assert x.unsafe_buffer_pointer() == t.data_ptr()
    np.testing.assert_array_equal(np.asarray(x).view(np.uint8), t.view(torch.uint8).numpy())


def test_from_torch_copies_are_observable():
    unaligned = torch.arange(65, dtype=torch.uint8)[1:]
    with pytest.warns(gjt.CopyWarning, match="aligned"):
        z = gjt.from_torch(unaligned)
    np.testing.assert_array_equal(np.asarray(z), np.arange(1, 65))
    wide = torch.arange(10, dtype=torch.int64)
    with pytest.warns(gjt.CopyWarning, match="int64"):
        x = gjt.from_torch(wide)
    np.testing.assert_array_equal(np.asarray(x), np.arange(10))
    with pytest.raises(gj.InvalidArgumentError, match="int64"):
        gjt.from_torch(wide, allow_copy=False)
    strided = torch.arange(20, dtype=torch.float32).reshape(10, 2)[:, 1]
    with pytest.warns(gjt.CopyWarning, match="not contiguous"):
        y = gjt.from_torch(strided)
    np.testing.assert_array_equal(np.asarray(y), np.arange(1, 20, 2))
    with pytest.raises(gj.InvalidArgumentError, match="contiguous"):
        gjt.from_torch(strided, allow_copy=False)


def spec_of_every_dtype(capacity=8, max_steps=1):
    fields = {d: gj.Field((3,), d) for d in TABLE_DTYPES}
    return gj.TableSpec(fields, capacity=capacity, max_steps=max_steps)


def test_insert_of_cpu_tensors_is_byte_exact(make_table):
    table = make_table(fields=spec_of_every_dtype().fields, capacity=8)
    batch = {d: values(d, (5, 3), seed=i) for i, d in enumerate(TABLE_DTYPES)}
    tensors = {d: as_tensor(a) for d, a in batch.items()}
    tensors["float32"] = torch.from_numpy(np.ascontiguousarray(np.stack([batch["float32"]] * 2, 2)))[..., 0]
    assert not tensors["float32"].is_contiguous()  # a strided view is handled, not refused
    rows = table.insert(tensors)
    for d, a in batch.items():
        np.testing.assert_array_equal(table.columns[d][rows, 0].view(np.uint8), a.view(np.uint8))


@pytest.mark.parametrize("trajectory", [False, True])
def test_insert_tensors_copies_into_rows_across_the_ring(make_table, trajectory):
    """The CUDA insert path (claim, copy into the rows, publish), run on CPU tensors."""
    steps = 4 if trajectory else 1
    table = make_table(fields=spec_of_every_dtype().fields, capacity=8, max_steps=steps)
    lead = (6, steps) if trajectory else (6,)
    for seed in range(2):  # the second batch wraps: rows 6, 7, 0, 1, 2, 3 (two runs)
        batch = {d: values(d, (*lead, 3), seed=10 * seed + i) for i, d in enumerate(TABLE_DTYPES)}
        lengths = np.array([4, 1, 2, 3, 4, 4]) if trajectory else None
        rows = gjt.insert_tensors(
            table, {d: as_tensor(a) for d, a in batch.items()}, priorities=2.0, lengths=lengths
        )
    np.testing.assert_array_equal(rows, [6, 7, 0, 1, 2, 3])
    status = table.row_status()
    assert (status["generation"] % 2 == 0).all() and table.size == 8
    for i, row in enumerate(rows):
        n = lengths[i] if trajectory else 1
        assert status["length"][row] == n and status["priority"][row] == 2.0
        for d, a in batch.items():
            got = table.columns[d][row, :n].view(np.uint8)
            want = (a[i, :n] if trajectory else a[i : i + 1]).view(np.uint8)
            np.testing.assert_array_equal(got, want)
    s = gj.sample(table, jax.random.key(0), 16)
    valid = np.asarray(gj.gather(table, s)["valid"]).reshape(16, -1)
    assert valid[:, 0].all()  # every picked row is published (steps past a row's length are masked)


def test_insert_tensors_refuses_bad_input_and_gives_rows_back(make_table, monkeypatch):
    table = make_table(fields={"x": gj.Field((2,), "float32"), "y": gj.Field((), "int32")}, capacity=4)
    good = {"x": torch.ones(3, 2), "y": torch.zeros(3, dtype=torch.int32)}
    before = table.row_status()["generation"]  # not all 0 where the table reuses pooled memory
    with pytest.raises(gj.InvalidArgumentError, match=r"batch\['y'\] has dtype torch.float64"):
        gjt.insert_tensors(table, {**good, "y": torch.zeros(3, dtype=torch.float64)})
    with pytest.raises(gj.InvalidArgumentError, match=r"batch\['x'\] has shape \(3, 3\)"):
        gjt.insert_tensors(table, {**good, "x": torch.ones(3, 3)})
    with pytest.raises(gj.InvalidArgumentError, match="expected cpu or cuda"):
        table.insert({**good, "x": torch.ones(3, 2, device="meta")})
    with pytest.raises(gj.InvalidArgumentError, match=r"batch is missing fields \['y'\]"):
        gjt.insert_tensors(table, {"x": good["x"]})
    assert table.size == 0 and (table.row_status()["generation"] == before).all()  # nothing was claimed

    calls = []

    def failing_column(column):
        calls.append(column)
        if len(calls) == 2:
            raise RuntimeError("copy failed")
        return torch.from_numpy(column)

    monkeypatch.setattr(gjt, "_column_tensor", failing_column)
    with pytest.raises(RuntimeError, match="copy failed"):
        gjt.insert_tensors(table, good)
    status = table.row_status()
    assert table.size == 0 and (status["generation"] % 2 == 0).all()  # claimed rows were given back
    assert (status["length"] == 0).all()


def test_episode_writer_takes_tensors(make_table):
    table = make_table(
        fields={"x": gj.Field((2,), "bfloat16"), "done": gj.Field((), "bool")}, capacity=4, max_steps=3
    )
    with table.writer() as w:
        for i in range(3):
            w.append({"x": torch.full((2,), i + 0.5, dtype=torch.bfloat16), "done": torch.tensor(i == 2)})
        row = w.end_episode(priority=1.0)
    np.testing.assert_array_equal(
        table.columns["x"][row].astype(np.float32), [[0.5] * 2, [1.5] * 2, [2.5] * 2]
    )
    np.testing.assert_array_equal(table.columns["done"][row], [False, False, True])


def filled_table(make_table, rows=32, capacity=32):
    table = make_table(
        fields={"obs": gj.Field((4,), "float32"), "id": gj.Field((), "int32")}, capacity=capacity
    )
    ids = np.arange(rows, dtype=np.int32)
    table.insert({"obs": np.repeat(ids[:, None], 4, 1).astype(np.float32), "id": ids})
    return table


@pytest.mark.parametrize("prefetch", [True, False])
def test_sampler_yields_the_sampled_rows(make_table, prefetch):
    table = filled_table(make_table)
    sampler = gjt.Sampler(table, 16, method="uniform", prefetch=prefetch, seed=3)
    seen = set()
    for _, batch in zip(range(5), sampler):
        assert isinstance(batch["obs"], torch.Tensor) and batch["obs"].shape == (16, 4)
        assert batch["valid"].all()
        assert torch.equal(batch["id"], batch["indices"])  # row i holds id i
        assert torch.equal(batch["obs"], batch["id"][:, None].float().expand(16, 4))
        assert torch.allclose(batch["probabilities"], torch.full((16,), 1 / 32))
        assert int(batch["selectable"]) == 32
        seen |= set(batch["indices"].tolist())
    assert len(seen) > 16  # batches differ from each other


def test_sampler_priority_updates_take_effect(make_table):
    table = filled_table(make_table)
    sampler = gjt.Sampler(table, 32, method="prioritized", prefetch=False)
    batch = next(sampler)
    keep = batch["indices"] % 2 == 0  # zero the priority of every odd row picked
    count = sampler.update_priorities(torch.where(keep, 1.0, 0.0))
    assert int(count) == 32
    picked_odd = set(batch["indices"][~keep].tolist())
    assert picked_odd and all(table.row_status()["priority"][r] == 0 for r in picked_odd)
    for _, later in zip(range(5), sampler):  # prefetch=False: the update is ordered before these samples
        assert not set(later["indices"].tolist()) & picked_odd


def test_sampler_rejects_bad_priorities(make_table):
    table = filled_table(make_table)
    sampler = gjt.Sampler(table, 8)
    with pytest.raises(gj.InvalidArgumentError, match="no batch was drawn"):
        sampler.update_priorities(torch.ones(8))
    next(sampler)
    with pytest.raises(gj.InvalidArgumentError, match=r"shape \(7,\), expected \(8,\)"):
        sampler.update_priorities(torch.ones(7))
    with pytest.raises(gj.InvalidArgumentError, match="priorities has dtype bool; expected floats"):
        sampler.update_priorities(torch.ones(8, dtype=torch.bool))
    with pytest.raises(gj.InvalidArgumentError, match="torch.Tensor"):
        sampler.update_priorities(np.ones(8))
    with pytest.raises(gj.InvalidArgumentError, match="lie on meta"):
        sampler.update_priorities(torch.ones(8, device="meta"))
    with pytest.raises(gj.EXECUTION_ERRORS, match="finite and >= 0"):
        int(sampler.update_priorities(torch.full((8,), float("nan"))))
    with pytest.raises(gj.InvalidArgumentError, match="window=9"):
        gjt.Sampler(table, 8, window=9)


def test_sampler_on_a_missing_gpu_is_refused(make_table):
    table = filled_table(make_table)
    try:
        jax.devices("gpu")
        pytest.skip("a GPU is present")
    except RuntimeError:
        pass
    with pytest.raises(gj.InvalidArgumentError, match="JAX sees no GPU"):
        gjt.Sampler(table, 8, device="cuda")


@pytest.mark.gpu
def test_gpu_handoff_waits_for_the_producer(make_table):
    """A batch whose producer kernel still runs at the hand-off: torch's stream must wait for it."""
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("jax sees no GPU")
    if not torch.cuda.is_available():
        pytest.skip("this torch has no CUDA")

    @jax.jit
    def slow(x):  # many dependent matmuls: still running when the call returns
        return jax.lax.fori_loop(0, 200, lambda i, y: jnp.tanh(y @ y) * 0 + y + 1, x)

    x = jax.device_put(jnp.zeros((2048, 2048), jnp.float32), gpu)
    y = slow(x)  # dispatched, not waited for
    t = gjt.to_torch(y)
    total = float((t * 1.0).sum())  # torch kernel on its current stream, ordered after JAX's
    assert total == 200.0 * 2048 * 2048
    table = filled_table(make_table)
    rows = table.insert(
        {
            "obs": torch.full((3, 4), 7.0, device="cuda"),
            "id": torch.arange(3, dtype=torch.int32, device="cuda"),
        }
    )
    np.testing.assert_array_equal(table.columns["obs"][rows, 0], 7.0)
    sampler = gjt.Sampler(table, 8, device="cuda")
    batch = next(sampler)
    assert batch["obs"].device.type == "cuda" and batch["valid"].all()


def test_insert_tensors_cast_by_the_tables_casting_policy(make_table):
    """Tensors take the one casting rule of every insert: under "fit" int64 values within int32's range
    are stored and values outside refused; under "strict" only safe casts are made."""
    table = make_table(fields={"y": gj.Field((), "int32"), "x": gj.Field((), "float32")}, capacity=8)
    rows = gjt.insert_tensors(
        table,
        {"y": torch.tensor([1, -7, 2**31 - 1]), "x": torch.tensor([0.5, 1.5, 2.5], dtype=torch.float64)},
    )
    np.testing.assert_array_equal(table.columns["y"][rows, 0], [1, -7, 2**31 - 1])
    np.testing.assert_array_equal(table.columns["x"][rows, 0], [0.5, 1.5, 2.5])
    with pytest.raises(gj.InvalidArgumentError, match=r"batch\['y'\] holds values in \[0, 2147483648\]"):
        gjt.insert_tensors(table, {"y": torch.tensor([0, 2**31]), "x": torch.zeros(2)})
    with pytest.raises(gj.InvalidArgumentError, match=r"batch\['x'\] holds 1e\+300, beyond float32"):
        huge = torch.tensor([1e300], dtype=torch.float64)
        gjt.insert_tensors(table, {"y": torch.zeros(1, dtype=torch.int32), "x": huge})
    table.casting = "strict"
    strict = r"batch\['y'\] has dtype torch.int64, expected int32: casting='strict'"
    with pytest.raises(gj.InvalidArgumentError, match=strict):
        gjt.insert_tensors(table, {"y": torch.tensor([1]), "x": torch.zeros(1)})
    assert table.size == 3

"""The PyTorch bridge (gear_jax.torch) with a real PyTorch: zero-copy hand-off, torch inserts, the sampler."""

import subprocess
import sys
import warnings

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
    with pytest.warns(gjt.CopyWarning, match="not contiguous") as caught:
        y = gjt.from_torch(strided)
    assert [w.filename for w in caught] == [__file__]  # the warning names the caller's line
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


def test_samplers_refuse_fields_their_own_keys_would_replace(make_table):
    """A field named as a key the sampler adds (`indices`, `probabilities`, `selectable`; `indices` for the
    EpochSampler) is refused at construction; the samplers never hand over their keys in its place."""
    table = make_table(
        fields={
            "obs": gj.Field((), "float32"),
            "probabilities": gj.Field((3,), "float32"),  # e.g. a policy's action probabilities
            "indices": gj.Field((), "int32"),
            "selectable": gj.Field((), "bool"),
        },
        capacity=16,
    )
    table.insert(
        {
            "obs": np.arange(10, dtype=np.float32),
            "probabilities": np.full((10, 3), 7.0, np.float32),
            "indices": np.full(10, 1000, np.int32),
            "selectable": np.ones(10, bool),
        }
    )
    with pytest.raises(
        gj.InvalidArgumentError,
        match=r"Sampler: the table's fields 'probabilities', 'indices', 'selectable' would be replaced .*"
        r"rename them in the TableSpec .*or leave them out with fields=\['obs'\]",
    ):
        gjt.Sampler(table, 4)
    with pytest.raises(gj.InvalidArgumentError, match=r"Sampler: the table's field 'probabilities' would"):
        gjt.Sampler(table, 4, fields=["obs", "probabilities"])
    with pytest.raises(
        gj.InvalidArgumentError,
        match=r"EpochSampler: the table's field 'indices' would be replaced .*rename it in the TableSpec",
    ):
        gjt.EpochSampler(table, 4)
    with pytest.raises(gj.InvalidArgumentError, match=r"EpochSampler: the table's field 'indices' would"):
        gjt.EpochSampler(table, 4, fields="indices")

    batch = next(gjt.Sampler(table, 4, fields=["obs"]))  # left out: the sampler's keys, as documented
    assert sorted(batch) == ["indices", "obs", "probabilities", "selectable", "valid"]
    assert batch["indices"].lt(10).all() and torch.equal(batch["obs"], batch["indices"].float())
    assert torch.allclose(batch["probabilities"], torch.full((4,), 0.1)) and int(batch["selectable"]) == 10
    # The EpochSampler adds only `indices`: the table's `probabilities` and `selectable` come through.
    seen = []
    for batch in gjt.EpochSampler(table, 5, num_rows=10, fields=["obs", "probabilities", "selectable"]):
        assert batch["valid"].all() and torch.equal(batch["probabilities"], torch.full((5, 3), 7.0))
        assert batch["selectable"].all() and torch.equal(batch["obs"], batch["indices"].float())
        seen += batch["indices"].tolist()
    assert sorted(seen) == list(range(10))


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


def held_by_writers(table, count):
    """`count` episode writers, each holding one row (an episode begun, not ended)."""
    writers = [table.writer() for _ in range(count)]
    for w in writers:
        w.append({name: np.zeros(f.shape, f.dtype) for name, f in table.spec.fields.items()})
    return writers


def stored(table):
    status = table.row_status()
    return table.size, table.columns["x"].copy(), status["length"].copy(), status["priority"].copy()


@pytest.mark.parametrize(
    "capacity, steps, held, batch",
    [
        (8, 1, 0, 9),  # one row more than the table (the review's first case)
        (64, 1, 0, 200),  # several laps of the ring, in chunks of 8
        (8, 2, 1, 8),  # capacity rows while a writer holds one (the review's second case)
        (8, 2, 1, 7),  # exactly the free room while a writer holds a row
        (64, 1, 56, 8),  # exactly the free room, a whole chunk, with most rows held
        (64, 1, 60, 8),  # a chunk finds fewer free rows than it asks for: publishes those, goes on
    ],
)
def test_insert_tensors_that_do_not_fit_store_what_the_host_insert_stores(
    make_table, capacity, steps, held, batch
):
    """A batch larger than the free room (the table, or the rows writers do not hold) is stored as the
    host insert stores it: the same ids, sizes, rows; no committed row is lost to a failed claim."""
    lead = (batch, steps) if steps > 1 else (batch,)
    values = (np.arange(np.prod(lead), dtype=np.float32) + 100).reshape(lead)
    priorities = np.arange(1, batch + 1, dtype=np.float32)
    results = []
    for via in ("torch", "host"):
        table = make_table(fields={"x": gj.Field((), "float32")}, capacity=capacity, max_steps=steps)
        table.insert({"x": np.arange(capacity * steps, dtype=np.float32).reshape(capacity, *lead[1:])})
        writers = held_by_writers(table, held)
        assert table.size == capacity - held
        if via == "torch":
            ids = gjt.insert_tensors(table, {"x": torch.from_numpy(values)}, priorities=priorities)
        else:
            ids = table.insert({"x": values}, priorities=priorities)
        results.append((ids, *stored(table)))
        for w in writers:
            w.close()
    (ids, size, x, length, priority), host = results[0], results[1]
    np.testing.assert_array_equal(ids, host[0])
    assert size == host[1] == capacity - held  # no committed row lost
    np.testing.assert_array_equal(x, host[2])
    np.testing.assert_array_equal(length, host[3])
    np.testing.assert_array_equal(priority, host[4])
    last = {int(row): i for i, row in enumerate(ids)}  # each row holds the last batch row written to it
    assert len(last) == min(batch, capacity - held)
    for row, i in last.items():
        np.testing.assert_array_equal(x[row, :steps], values[i].reshape(-1))
        assert priority[row] == priorities[i]


def test_insert_tensors_into_rows_all_held_changes_nothing(make_table):
    table = make_table(fields={"x": gj.Field((), "float32")}, capacity=8)
    table.insert({"x": np.arange(8, dtype=np.float32)})
    writers = held_by_writers(table, 8)
    before = stored(table)
    with pytest.raises(gj.AllRowsHeldError):
        gjt.insert_tensors(table, {"x": torch.ones(3)})
    after = stored(table)
    assert after[0] == before[0] == 0
    for a, b in zip(after[1:], before[1:]):
        np.testing.assert_array_equal(a, b)
    for w in writers:
        w.close()
    rows = gjt.insert_tensors(table, {"x": torch.ones(3)})  # the rows are free again
    assert table.size == 3 and (table.columns["x"][rows, 0] == 1).all()


def test_a_failing_copy_gives_back_only_its_chunk(make_table, monkeypatch):
    """A copy that fails (a CUDA error, say) after earlier chunks were published leaves those published
    and gives back the rows of its own chunk (capacity // 8 rows at most) empty, never the table."""
    table = make_table(fields={"x": gj.Field((), "float32")}, capacity=16)
    table.insert({"x": np.arange(16, dtype=np.float32)})
    calls = []

    def failing_column(column):
        calls.append(column)
        if len(calls) == 3:  # the third chunk (of 2 rows) of a one-field table
            raise RuntimeError("copy failed")
        return torch.from_numpy(column)

    monkeypatch.setattr(gjt, "_column_tensor", failing_column)
    with pytest.raises(RuntimeError, match="copy failed"):
        gjt.insert_tensors(table, {"x": torch.full((6,), -1.0)})
    status = table.row_status()
    assert table.size == 14 and (status["generation"] % 2 == 0).all()
    np.testing.assert_array_equal(table.columns["x"][:4, 0], [-1.0] * 4)  # the published chunks
    np.testing.assert_array_equal(status["length"][4:6], [0, 0])  # the failing chunk's rows, empty
    np.testing.assert_array_equal(table.columns["x"][6:, 0], np.arange(6, 16))  # untouched


@pytest.mark.parametrize(
    "tensor, values",
    [
        (torch.tensor([2**40 + 5, 2**31], dtype=torch.int64), r"\[2147483648, 1099511627781\]"),
        (torch.tensor([-(2**31) - 1, 0], dtype=torch.int64), r"\[-2147483649, 0\]"),
        (torch.tensor([2**63, 3], dtype=torch.uint64), r"\[3, 9223372036854775808\]"),
        (torch.tensor([2**32, 2**33], dtype=torch.uint64), r"\[4294967296, 8589934592\]"),
        (torch.tensor([[1, 2**35], [3, 4]], dtype=torch.int64).T, r"\[1, 34359738368\]"),  # not contiguous
    ],
)
def test_from_torch_refuses_64_bit_integers_that_would_wrap(tensor, values):
    """Without jax_enable_x64, JAX holds int64 / uint64 as 32 bits: a value outside is refused, never
    wrapped; values inside are copied (with the CopyWarning), and with x64 every value crosses."""
    with pytest.raises(gj.InvalidArgumentError, match=values + r", outside u?int32's range.*jax_enable_x64"):
        gjt.from_torch({"t": tensor})
    top = 2**31 - 1 if tensor.dtype == torch.int64 else 2**32 - 1  # the 32-bit type's largest value
    fits = torch.tensor([0, top, 5], dtype=tensor.dtype)
    with pytest.warns(gjt.CopyWarning, match="jax_enable_x64 is off"):
        x = gjt.from_torch(fits)
    assert x.dtype.itemsize == 4 and np.asarray(x).tolist() == [0, top, 5]
    with jax.enable_x64(True):
        wide = gjt.from_torch(tensor.contiguous(), allow_copy=False)
        assert wide.dtype.itemsize == 8
        np.testing.assert_array_equal(
            np.asarray(wide).view(np.uint64), tensor.contiguous().numpy().view(np.uint64)
        )


def test_bad_tensors_seeds_devices_and_leaves_are_refused_by_name(make_table):
    table = filled_table(make_table)
    before = table.columns["obs"].copy()
    sparse = torch.ones(3, 4).to_sparse()
    with warnings.catch_warnings():  # torch deprecates quantize_per_tensor
        warnings.simplefilter("ignore")
        quantized = torch.quantize_per_tensor(torch.ones(3, 4), 0.1, 0, torch.quint8)
    ids = torch.zeros(3, dtype=torch.int32)
    for insert in (table.insert, lambda b: gjt.insert_tensors(table, b)):
        with pytest.raises(
            gj.InvalidArgumentError, match=r"batch\['obs'\] is a torch tensor of layout .*to_dense"
        ):
            insert({"obs": sparse, "id": ids})
        with pytest.raises(
            gj.InvalidArgumentError, match=r"batch\['obs'\] is a quantized torch tensor.*dequantize"
        ):
            insert({"obs": quantized, "id": ids})
    with pytest.raises(gj.InvalidArgumentError, match=r"row\['obs'\] is a torch tensor of layout"):
        table.add({"obs": torch.ones(4).to_sparse(), "id": 0})
    with pytest.raises(
        gj.InvalidArgumentError, match=r"batch\['obs'\] is a torch.float8_e4m3fn torch tensor"
    ):
        table.insert({"obs": torch.ones(3, 4).to(torch.float8_e4m3fn), "id": ids})
    assert table.size == 32 and (table.columns["obs"] == before).all()

    for seed in (-1, 2**63, 1.5, True, "0"):
        with pytest.raises(
            gj.InvalidArgumentError, match=r"Sampler: seed=.* must be an int in \[0, 2\*\*63 - 1\]"
        ):
            gjt.Sampler(table, 8, seed=seed)
        with pytest.raises(gj.InvalidArgumentError, match=r"EpochSampler: seed=.* must be an int"):
            gjt.EpochSampler(table, 8, seed=seed)
    for device in ("garbage", "cuda:-1", True, 1.5):
        with pytest.raises(gj.InvalidArgumentError, match=r"Sampler: device=.* is not a torch device"):
            gjt.Sampler(table, 8, device=device)
        with pytest.raises(gj.InvalidArgumentError, match=r"EpochSampler: device=.* is not a torch device"):
            gjt.EpochSampler(table, 8, device=device)
    assert next(gjt.Sampler(table, 8, seed=np.int64(2**63 - 1), device=torch.device("cpu")))["valid"].all()

    with pytest.raises(
        gj.InvalidArgumentError, match=r"to_torch: the array is a JAX array of dtype key<fry>"
    ):
        gjt.to_torch(jax.random.key(0))
    with pytest.raises(gj.InvalidArgumentError, match=r"to_torch: tree\['state'\]\[1\] is .*key_data"):
        gjt.to_torch({"x": jnp.zeros(2), "state": (jnp.ones(2), jax.random.key(0))})
    assert torch.equal(
        gjt.to_torch(jax.random.key_data(jax.random.key(0))), torch.tensor([0, 0], dtype=torch.uint32)
    )

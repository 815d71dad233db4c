import ctypes
import mmap
import os
import stat

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

import gear_jax as gj
from tests.helpers.tables import held_row, transitions


def test_create_makes_private_shared_memory_with_unguessable_name(make_table):
    table = make_table()
    path = f"/dev/shm/{table.name}"
    assert table.name.startswith("gear_jax_") and len(table.name) == len("gear_jax_") + 32
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert table.size == 0 and table.capacity == 16 and table.max_steps == 1
    assert make_table().name != table.name


def test_columns_are_page_aligned(make_table):
    """Every column, status and fields alike, starts on a 4096-byte boundary (shared_table.h)."""
    table = make_table(fields={"a": gj.Field((3,), "uint8"), "b": gj.Field((5,), "float64")}, capacity=7)
    columns = [*table.columns.values(), *table.status_columns.values()]
    assert len(columns) == 6
    for column in columns:
        assert column.ctypes.data % 4096 == 0, column.ctypes.data % 4096


HUGE_PAGE = 2 << 20


def table_base(table):
    """The address this process maps the table at (its header)."""
    return table.status_columns["state"].ctypes.data - table.native.layout()["state"]


def pmd_mapped_kib(address):
    """ShmemPmdMapped of this process's mapping that holds `address` (/proc/self/smaps): the KiB of it
    mapped by 2 MiB pages."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            first = line.split()[0]
            if not first.endswith(":"):
                low, high = (int(x, 16) for x in first.split("-"))
                inside = low <= address < high
            elif inside and first == "ShmemPmdMapped:":
                return int(line.split()[1])
    raise AssertionError(f"no mapping holds {address:#x}")


def probe_dev_shm_pages(collapse):
    """Whether a 2 MiB block of a /dev/shm file of this probe's own ends up mapped by one 2 MiB page:
    with `collapse`, one 4 KiB page and madvise(MADV_COLLAPSE) (Linux 6.1), as shared_table.cc's
    BackWithHugePages does; without, the whole block reserved, which gets 2 MiB pages only where the
    mount or the system gives /dev/shm huge pages by themselves. False where the kernel's huge page is
    not 2 MiB."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size") as f:
            if int(f.read()) != HUGE_PAGE:
                return False
    except OSError:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    path = f"/dev/shm/gear_jax_probe_{os.getpid()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, HUGE_PAGE)
        os.posix_fallocate(fd, 0, 4096 if collapse else HUGE_PAGE)
        area = libc.mmap(None, 2 * HUGE_PAGE, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        aligned = (area + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
        fixed = 0x10  # MAP_FIXED
        libc.mmap(aligned, HUGE_PAGE, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | fixed, fd, 0)
        if collapse:
            libc.madvise(aligned, HUGE_PAGE, 25)  # MADV_COLLAPSE
        ctypes.c_uint8.from_address(aligned).value = 1  # map the block
        huge = pmd_mapped_kib(aligned) >= HUGE_PAGE // 1024
        libc.munmap(area, 2 * HUGE_PAGE)
        return huge
    finally:
        os.close(fd)
        os.unlink(path)


def test_tables_of_2_mib_and_more_are_mapped_on_2_mib_boundaries(make_table):
    """Creator and attacher map a table of 2 MiB or more at a 2 MiB boundary, so that its 2 MiB pages
    can be mapped whole; smaller tables need not be."""
    table = make_table(fields={"x": gj.Field((1024,), "uint8")}, capacity=3000)
    assert table_base(table) % HUGE_PAGE == 0
    with gj.Table.attach(table.name) as view:
        assert table_base(view) % HUGE_PAGE == 0


@pytest.mark.skipif(
    not probe_dev_shm_pages(collapse=True), reason="this kernel makes no 2 MiB pages of /dev/shm files"
)
@pytest.mark.parametrize("setting", [None, "1", "0"])
def test_large_tables_are_backed_by_2_mib_pages(make_table, monkeypatch, setting):
    """The whole 2 MiB blocks of a new table are 2 MiB pages, mapped as such in the creator and in an
    attaching process, unless GEAR_JAX_HUGE_PAGES=0 (where /dev/shm does not give huge pages by itself);
    the rows read back as written either way. Collapsing is best effort (a block whose 2 MiB page the
    kernel cannot find stays in 4 KiB pages), so at least half the blocks must be 2 MiB pages."""
    if setting is None:
        monkeypatch.delenv("GEAR_JAX_HUGE_PAGES", raising=False)
    else:
        monkeypatch.setenv("GEAR_JAX_HUGE_PAGES", setting)
    rows = 9000  # about 9 MiB: 4 whole blocks and a part
    table = make_table(fields={"x": gj.Field((1024,), "uint8")}, capacity=rows, reuse=False)  # new memory
    data = np.random.default_rng(0).integers(0, 256, (rows, 1024), dtype=np.uint8)
    table.insert({"x": data})
    whole_kib = os.stat(f"/dev/shm/{table.name}").st_size // HUGE_PAGE * HUGE_PAGE // 1024
    mapped_kib = pmd_mapped_kib(table_base(table))
    if setting == "0" and not probe_dev_shm_pages(collapse=False):
        assert mapped_kib == 0
    else:
        assert whole_kib // 2 <= mapped_kib <= whole_kib
    with gj.Table.attach(table.name) as view:
        np.testing.assert_array_equal(view.columns["x"][:, 0], data)  # reads every block
        assert pmd_mapped_kib(table_base(view)) == mapped_kib


def test_a_table_larger_than_dev_shm_is_refused_and_leaves_nothing(make_table):
    shm = os.statvfs("/dev/shm")
    capacity = shm.f_blocks * shm.f_frsize // 65536 + 1024  # rows of 64 KiB: more than the whole mount
    before = set(os.listdir("/dev/shm"))
    with pytest.raises(gj.OutOfSpaceError, match=r"Table.create: cannot reserve \d+ bytes .* lower capacity"):
        make_table(fields={"x": gj.Field((65536,), "uint8")}, capacity=capacity, reuse=False)
    assert set(os.listdir("/dev/shm")) - before == set()
    assert issubclass(gj.OutOfSpaceError, RuntimeError)  # what it was before it had a name


@pytest.mark.parametrize(
    "shape, steps, stride",
    [
        ((3,), 1, 16),  # 3 bytes: one 16-byte vector
        ((16,), 1, 16),  # already a multiple of 16
        ((17,), 1, 32),
        ((1000,), 1, 1008),  # under 1 KiB: 16-byte multiples
        ((1024,), 1, 1024),  # 1 KiB and up: whole 128-byte lines
        ((1030,), 1, 1152),
        ((100,), 12, 1280),  # a trajectory row of 12 steps of 100 bytes: 1200 -> 1280
        ((5,), 3, 16),
    ],
)
def test_row_stride_rule(make_table, shape, steps, stride):
    """Rows are padded to 16-byte multiples, and to 128-byte multiples from 1 KiB on (RowStride)."""
    table = make_table(fields={"x": gj.Field(shape, "uint8")}, capacity=3, max_steps=steps)
    column = table.columns["x"]
    assert column.strides[:2] == (stride, shape[0])
    step = np.arange(np.prod(shape), dtype=np.uint8).reshape(shape) % 251
    rows = {
        "x": np.broadcast_to(step, (3, steps, *shape)) if steps > 1 else np.broadcast_to(step, (3, *shape))
    }
    table.insert({"x": np.ascontiguousarray(rows["x"])})
    np.testing.assert_array_equal(column[2, steps - 1], step)  # the stride addresses the real rows


def test_close_unlinks_and_is_idempotent(make_table):
    table = make_table()
    path = f"/dev/shm/{table.name}"
    assert os.path.exists(path)
    table.close()
    table.close()
    assert not os.path.exists(path)
    assert table.closed
    with pytest.raises(gj.TableClosedError, match="closed"):
        table.insert(transitions(1))
    with pytest.raises(gj.TableClosedError):
        table.size


def test_context_manager_closes():
    spec = gj.TableSpec({"x": gj.Field((), "float32")}, capacity=4)
    with gj.Table.create(spec) as table:
        name = table.name
        assert os.path.exists(f"/dev/shm/{name}")
    assert table.closed and not os.path.exists(f"/dev/shm/{name}")


def test_explicit_name_and_duplicate_name(make_table):
    name = f"gear_jax_test_{os.getpid()}"
    table = make_table(name=name)
    assert table.name == name
    with pytest.raises(gj.InvalidArgumentError, match="already exists"):
        make_table(name=name)
    with pytest.raises(gj.InvalidArgumentError, match="name"):
        make_table(name="bad/name")


def test_insert_returns_row_ids_and_stores_data(make_table):
    table = make_table()
    empty = table.row_status()["generation"]  # 0 in new memory, higher in memory from the pool
    ids = table.insert(transitions(5), priorities=np.arange(1, 6))
    np.testing.assert_array_equal(ids, np.arange(5))
    status = table.row_status()
    np.testing.assert_array_equal(status["priority"][:5], np.arange(1, 6))
    np.testing.assert_array_equal(status["generation"][:5], empty[:5] + 2)
    np.testing.assert_array_equal(status["insert_seq"][:5], np.arange(1, 6))
    np.testing.assert_array_equal(table.columns["obs"][:5, 0], transitions(5)["obs"])
    assert table.size == 5


def test_fifo_overwrite_order_when_full(make_table):
    table = make_table(capacity=4)
    empty = table.row_status()["generation"]  # 0 in new memory, higher in memory from the pool
    table.insert(transitions(4))
    ids = table.insert(transitions(3, start=100))
    np.testing.assert_array_equal(ids, [0, 1, 2])  # the three oldest rows, in order
    np.testing.assert_array_equal(table.columns["action"][:, 0], [100, 101, 102, 3])
    status = table.row_status()
    np.testing.assert_array_equal(status["generation"] - empty, [4, 4, 4, 2])
    np.testing.assert_array_equal(status["insert_seq"], [5, 6, 7, 4])
    assert table.size == 4
    ids = table.insert(transitions(2, start=200))
    np.testing.assert_array_equal(ids, [3, 0])
    np.testing.assert_array_equal(table.columns["action"][:, 0], [201, 101, 102, 200])


def test_insert_accepts_numpy_jax_and_torch(make_table):
    table = make_table(fields={"x": gj.Field((2,), "bfloat16"), "y": gj.Field((), "int64")}, capacity=8)
    table.insert({"x": np.ones((1, 2), ml_dtypes.bfloat16), "y": np.array([1])})
    table.insert({"x": jnp.full((1, 2), 2, jnp.bfloat16), "y": jnp.array([2], jnp.int32)})
    table.insert({"x": torch.full((1, 2), 3, dtype=torch.bfloat16), "y": torch.tensor([3])})
    np.testing.assert_array_equal(table.columns["x"][:3, 0].astype(np.float32), [[1, 1], [2, 2], [3, 3]])
    np.testing.assert_array_equal(table.columns["y"][:3, 0], [1, 2, 3])


def test_trajectory_insert_with_lengths(make_table):
    table = make_table(fields={"x": gj.Field((), "int32")}, capacity=4, max_steps=5)
    data = np.arange(6, dtype=np.int32).reshape(2, 3)
    ids = table.insert({"x": data}, lengths=[2, 3])
    status = table.row_status()
    np.testing.assert_array_equal(status["length"][ids], [2, 3])
    np.testing.assert_array_equal(table.columns["x"][ids[1], :3], [3, 4, 5])


@pytest.mark.parametrize(
    "batch, kwargs, message",
    [
        ({"obs": np.zeros((2, 3), np.float32)}, {}, "missing fields"),
        ({**transitions(2), "extra": np.zeros(2)}, {}, "unknown fields"),
        ({"obs": np.zeros((2, 4), np.float32), "action": np.zeros(2, np.int32)}, {}, "shape"),
        ({"obs": np.zeros((2, 3), np.int64), "action": np.zeros(2, np.float32)}, {}, "2 fields can not"),
        ({"obs": np.zeros((2, 3), np.float32), "action": np.full(2, 2**40)}, {}, "outside int32's range"),
        ({"obs": np.zeros((2, 3), np.float32), "action": np.zeros(3, np.int32)}, {}, "rows"),
        (transitions(2), {"priorities": [1.0, np.nan]}, r"priorities\[1\]"),
        (transitions(2), {"priorities": [1.0, -1.0]}, r"priorities\[1\]"),
        (transitions(2), {"priorities": [1.0, np.inf]}, "finite"),
        (transitions(2), {"priorities": [1.0, 2.0, 3.0]}, "shape"),
        ([1, 2], {}, "mapping"),
    ],
)
def test_bad_insert_raises_and_writes_nothing(make_table, batch, kwargs, message):
    table = make_table()
    before = table.row_status()
    with pytest.raises(gj.InvalidArgumentError, match=message):
        table.insert(batch, **kwargs)
    assert table.size == 0
    after = table.row_status()
    for column in before:
        np.testing.assert_array_equal(after[column], before[column], err_msg=column)


def test_bad_trajectory_lengths_raise(make_table):
    table = make_table(fields={"x": gj.Field((), "int32")}, capacity=4, max_steps=3)
    with pytest.raises(gj.InvalidArgumentError, match="steps per row"):
        table.insert({"x": np.zeros((1, 4), np.int32)})
    with pytest.raises(gj.InvalidArgumentError, match=r"lengths\[0\]"):
        table.insert({"x": np.zeros((1, 2), np.int32)}, lengths=[3])
    assert table.size == 0


def test_safe_casts_are_made(make_table):
    table = make_table()
    table.insert({"obs": np.ones((1, 3), np.float16), "action": np.ones(1, np.int8)})
    table.insert({"obs": [[1, 2, 3]], "action": [7]})  # Python values that fit
    assert table.columns["obs"][1, 0].tolist() == [1.0, 2.0, 3.0]
    assert table.columns["action"][1, 0] == 7
    with pytest.raises(gj.InvalidArgumentError, match="dtype"):
        table.insert({"obs": [[1, 2, 3]], "action": [1.5]})
    with pytest.raises(gj.InvalidArgumentError, match="range"):
        table.insert({"obs": [[1, 2, 3]], "action": [2**40]})


def test_attach_reads_the_same_memory(make_table):
    table = make_table()
    other = gj.Table.attach(table.name)
    try:
        assert other.spec == table.spec and other.name == table.name
        other.insert(transitions(2))
        assert table.size == 2
        np.testing.assert_array_equal(table.columns["action"][:2, 0], [0, 1])
    finally:
        other.close()
    assert os.path.exists(f"/dev/shm/{table.name}")  # only the creator unlinks


def test_attach_errors(make_table):
    with pytest.raises(gj.TableNotFoundError, match="no gear_jax table named"):
        gj.Table.attach("gear_jax_does_not_exist_0123")
    table = make_table()
    other_spec = gj.TableSpec({"x": gj.Field((), "float32")}, capacity=16)
    with pytest.raises(gj.TableMismatchError, match="not the requested"):
        gj.Table.attach(table.name, spec=other_spec)
    assert gj.Table.attach(table.name, spec=table.spec).spec == table.spec


def test_attach_refuses_a_foreign_mapping():
    path = f"/dev/shm/gear_jax_foreign_{os.getpid()}"
    with open(path, "wb") as f:
        f.write(b"\x00" * 100000)
    try:
        with pytest.raises(gj.TableMismatchError, match="not a gear_jax table"):
            gj.Table.attach(os.path.basename(path))
    finally:
        os.unlink(path)


def test_writer_writes_episodes_in_place(make_table):
    table = make_table(
        fields={"x": gj.Field((2,), "float32"), "t": gj.Field((), "int32")}, capacity=4, max_steps=4
    )
    with table.writer() as writer:
        for t in range(3):
            writer.append({"x": np.full(2, t, np.float32), "t": t})
            row = held_row(table)
            assert table.row_status()["generation"][row] % 2 == 1  # held: odd
            np.testing.assert_array_equal(table.columns["x"][row, t], [t, t])  # written in place
        assert writer.end_episode(priority=2.5) == row
        status = table.row_status()
        assert status["length"][row] == 3 and status["priority"][row] == 2.5
        assert status["generation"][row] % 2 == 0
        writer.append({"x": np.zeros(2, np.float32), "t": 9})
        unfinished = held_row(table)
    # leaving the block abandons the unfinished episode: even generation, empty
    status = table.row_status()
    assert status["generation"][unfinished] % 2 == 0 and status["length"][unfinished] == 0
    assert table.size == 1


def test_writer_errors(make_table):
    table = make_table(fields={"x": gj.Field((), "float32")}, capacity=4, max_steps=2)
    with table.writer() as writer:
        with pytest.raises(gj.InvalidArgumentError, match="at least one append"):
            writer.end_episode()
        with pytest.raises(gj.InvalidArgumentError, match="every field"):
            writer.append({"y": 1.0})
        with pytest.raises(gj.InvalidArgumentError, match="shape"):
            writer.append({"x": np.zeros(2, np.float32)})
        writer.append({"x": 1.0})
        writer.append({"x": 2.0})
        with pytest.raises(gj.InvalidArgumentError, match="max_steps=2"):
            writer.append({"x": 3.0})
        with pytest.raises(gj.InvalidArgumentError, match="finite"):
            writer.end_episode(priority=float("nan"))
        writer.end_episode()
    assert table.size == 1


def test_all_rows_held_by_writers_raises_instead_of_hanging(make_table):
    table = make_table(fields={"x": gj.Field((), "float32")}, capacity=2, max_steps=2)
    writers = [table.writer(), table.writer()]
    for w in writers:
        w.append({"x": 0.0})
    with pytest.raises(RuntimeError, match="being written"):
        table.insert({"x": np.zeros((1, 1), np.float32)})
    for w in writers:
        w.close()
    table.insert({"x": np.zeros((1, 1), np.float32)})
    assert table.size == 1


def test_dropped_writer_gives_its_row_back(make_table):
    import gc

    table = make_table(fields={"x": gj.Field((), "float32")}, capacity=2, max_steps=2)
    writer = table.writer()
    writer.append({"x": 1.0})
    row = held_row(table)
    assert table.row_status()["generation"][row] % 2 == 1
    del writer
    gc.collect()
    status = table.row_status()
    assert status["generation"][row] % 2 == 0 and status["length"][row] == 0


def test_writer_closed_after_its_table_still_gives_the_row_back(make_table):
    table = make_table(fields={"x": gj.Field((), "float32")}, capacity=2, max_steps=2)
    other = gj.Table.attach(table.name)
    writer = other.writer()
    writer.append({"x": 1.0})
    row = held_row(other)
    other.close()
    writer.close()
    assert table.row_status()["generation"][row] % 2 == 0


def test_names_that_are_not_tables_are_refused_with_the_reason(make_table, tmp_path):
    directory, link = "gear_jax_test_a_directory", "gear_jax_test_a_link"
    os.mkdir(f"/dev/shm/{directory}")
    os.symlink(tmp_path / "elsewhere", f"/dev/shm/{link}")
    try:
        for name, reason in ((directory, "Invalid argument"), (link, "symbolic links")):
            with pytest.raises(gj.TableMismatchError, match=f"'/dev/shm/{name}' can not be opened.*{reason}"):
                gj.Table.attach(name)
    finally:
        os.rmdir(f"/dev/shm/{directory}")
        os.unlink(f"/dev/shm/{link}")
    for name in (".", ".."):
        for call in (lambda: gj.Table.attach(name), lambda: make_table(name=name)):
            with pytest.raises(gj.InvalidArgumentError, match="not '.' or '..'"):
                call()
    with pytest.raises(gj.InvalidArgumentError, match="names the pool's closed tables"):
        make_table(name="gear_jax_pool_123_4_mine")


def test_row_status_racing_a_close_on_another_thread_raises_table_closed():
    import threading
    import time

    failures = []
    for _ in range(20):
        table = gj.Table.create(gj.TableSpec({"x": gj.Field((64,), "float32")}, capacity=4096))
        started = threading.Event()

        def read(table=table, started=started):
            started.set()
            while True:
                try:
                    table.row_status()
                except gj.TableClosedError:
                    return
                except Exception as e:  # noqa: BLE001 - any other error is the failure looked for
                    failures.append(repr(e))
                    return

        thread = threading.Thread(target=read)
        thread.start()
        started.wait()
        time.sleep(0.02)
        table.close()
        thread.join(30)
        assert not thread.is_alive()
    assert failures == []

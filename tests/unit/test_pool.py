"""The pool of closed tables: memory and handles reused by the next table that fits, and only when no
other open of the closed table is alive."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

import gear_jax as gj
from tests.helpers.tables import transitions

SPEC = gj.TableSpec({"obs": gj.Field((3,), "float32"), "action": gj.Field((), "int32")}, capacity=64)
RUN_TIMEOUT_S = 120


COUNTS = ("pooled", "refused", "reused", "reused_handles")
_baseline = {}


@pytest.fixture(autouse=True)
def fresh_pool():
    """Each test starts with an empty pool and the default limits, and leaves it so."""
    gj.clear_pool()
    gj.configure_pool(max_tables=8, max_bytes=16 << 30)
    _baseline.update({k: gj.pool_stats()[k] for k in COUNTS})
    yield
    gj.clear_pool()
    gj.configure_pool(max_tables=8, max_bytes=16 << 30)


def pool():
    """pool_stats() with its counts (pooled, refused, reused, reused_handles) since the test began."""
    stats = gj.pool_stats()
    return {**stats, **{k: stats[k] - _baseline[k] for k in COUNTS}}


def pool_files():
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"gear_jax_pool_{os.getpid()}_"))


def python(code, *args, timeout=RUN_TIMEOUT_S):
    """Runs `code` in a new Python process; returns its stdout."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_same_spec_reuses_memory_and_handle_with_empty_rows():
    first = gj.Table.create(SPEC)
    first.insert(transitions(40))
    old_generations = first.row_status()["generation"]
    stale = jax.block_until_ready(gj.sample(first, jax.random.key(3), 16))
    handle, name = first.handle, first.name
    first.close()
    assert not os.path.exists(f"/dev/shm/{name}") and len(pool_files()) == 1
    assert pool()["tables"] == 1 and pool()["pooled"] == 1

    second = gj.Table.create(SPEC)
    try:
        stats = pool()
        assert (stats["tables"], stats["reused"], stats["reused_handles"]) == (0, 1, 1)
        assert second.handle == handle and second == first and hash(second) == hash(first)
        assert second.name != name and os.path.exists(f"/dev/shm/{second.name}") and pool_files() == []
        status = second.row_status()
        assert second.size == 0 and not status["length"].any() and not status["priority"].any()
        # Every row's generation rose to the next even one: a Sample of the closed table matches none.
        assert (status["generation"] % 2 == 0).all() and (status["generation"] > old_generations).all()
        second.insert(transitions(40))
        assert int(gj.update_priorities(second, stale, np.full(16, 5.0, np.float32))) == 0
        assert not np.asarray(gj.gather(second, stale)["valid"]).any()
        second.close()
        second = gj.Table.create(SPEC)
        with pytest.raises(gj.EXECUTION_ERRORS, match="no selectable rows"):
            jax.block_until_ready(gj.sample(second, jax.random.key(0), 4))
        rows = second.insert(transitions(5, start=100))
        got = gj.gather(second, gj.sample(second, jax.random.key(1), 32))
        assert np.asarray(got["valid"]).all()
        assert set(np.asarray(got["action"]).tolist()) <= set(range(100, 105))
        assert sorted(rows.tolist()) == [0, 1, 2, 3, 4]
    finally:
        second.close()


def test_function_compiled_for_the_closed_table_runs_on_the_new_one_without_tracing():
    traces = []

    def step(table, key):
        traces.append(table.name)
        s = gj.sample(table, key, 16, method="fifo")
        return gj.gather(table, s)["action"]

    step = jax.jit(step, static_argnums=0)
    first = gj.Table.create(SPEC)
    first.insert(transitions(16))
    np.testing.assert_array_equal(np.sort(np.asarray(step(first, jax.random.key(0)))), np.arange(16))
    first.close()

    second = gj.Table.create(SPEC)
    try:
        second.insert(transitions(16, start=500))
        got = np.asarray(step(second, jax.random.key(0)))
        assert len(traces) == 1, "the pooled table was traced again"
        np.testing.assert_array_equal(np.sort(got), np.arange(500, 516))
    finally:
        second.close()


def test_another_spec_that_fits_reuses_memory_under_a_new_handle():
    first = gj.Table.create(SPEC)
    old_fn = jax.jit(lambda k: gj.sample(first, k, 2))
    first.insert(transitions(8))
    jax.block_until_ready(old_fn(jax.random.key(0)))
    nbytes, handle = first.nbytes, first.handle
    first.close()
    other = gj.TableSpec({"obs": gj.Field((2,), "float32"), "action": gj.Field((), "int32")}, capacity=64)
    second = gj.Table.create(other)
    try:
        stats = pool()
        assert (stats["reused"], stats["reused_handles"]) == (1, 0)
        assert second.nbytes == nbytes and second.handle != handle and second != first
        with pytest.raises(gj.EXECUTION_ERRORS, match="closed"):
            jax.block_until_ready(old_fn(jax.random.key(0)))
        second.insert({"obs": np.ones((3, 2), np.float32), "action": np.arange(3, dtype=np.int32)})
        with gj.Table.attach(second.name) as attached:
            assert attached.spec == other and attached.size == 3
    finally:
        second.close()


def test_table_much_larger_than_needed_is_not_reused():
    big = gj.Table.create(gj.TableSpec({"x": gj.Field((4096,), "uint8")}, capacity=1024))
    big_bytes = big.nbytes
    big.close()
    small = gj.Table.create(SPEC)
    try:
        assert pool()["reused"] == 0 and pool()["tables"] == 1
        assert small.nbytes < big_bytes // 2
    finally:
        small.close()


def test_reuse_false_and_a_disabled_pool_skip_it():
    gj.Table.create(SPEC).close()
    fresh = gj.Table.create(SPEC, reuse=False)
    fresh.close()
    assert pool()["reused"] == 0 and pool()["tables"] == 2
    gj.configure_pool(max_tables=0)
    assert pool()["tables"] == 0 and pool_files() == []
    table = gj.Table.create(SPEC)
    name = table.name
    table.close()
    assert pool()["tables"] == 0 and not os.path.exists(f"/dev/shm/{name}") and pool_files() == []


def test_limits_drop_the_oldest_tables():
    gj.configure_pool(max_tables=2)
    tables = [gj.Table.create(SPEC, reuse=False) for _ in range(3)]
    nbytes = tables[0].nbytes
    for table in tables:
        table.close()
    stats = pool()
    assert stats["tables"] == 2 and len(pool_files()) == 2 and stats["bytes"] == 2 * nbytes
    gj.configure_pool(max_bytes=nbytes)
    assert pool()["tables"] == 1 and len(pool_files()) == 1
    big = gj.Table.create(gj.TableSpec({"x": gj.Field((4096,), "uint8")}, capacity=64))
    big.close()  # larger than max_bytes: refused, its name removed
    assert pool()["refused"] == 1 and len(pool_files()) == 1
    with pytest.raises(gj.InvalidArgumentError, match="max_tables"):
        gj.configure_pool(max_tables=-1)


def test_open_attach_in_this_process_keeps_the_memory_out_of_the_pool():
    creator = gj.Table.create(SPEC)
    attached = gj.Table.attach(creator.name)
    creator.close()
    assert pool()["refused"] == 1 and pool()["tables"] == 0
    with pytest.raises(gj.TableNotFoundError):
        gj.Table.attach(creator.name)
    # The attached table still works, and a new table does not take its memory.
    other = gj.Table.create(SPEC)
    try:
        attached.insert(transitions(3, start=7))
        assert attached.size == 3 and other.size == 0
    finally:
        other.close()
        attached.close()


def test_closed_attach_releases_its_slot():
    creator = gj.Table.create(SPEC)
    gj.Table.attach(creator.name).close()
    attached = gj.Table.attach(creator.name)
    del attached  # dropped without close(): the slot goes with the object
    creator.close()
    assert pool()["pooled"] == 1


def test_attach_to_a_pooled_table_by_its_pool_name_is_refused():
    gj.Table.create(SPEC).close()
    (name,) = pool_files()
    with pytest.raises(gj.TableNotFoundError, match="closed"):
        gj.Table.attach(name)


def test_live_attacher_in_another_process_keeps_the_memory_out_of_the_pool():
    creator = gj.Table.create(SPEC)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
            import sys, time
            import gear_jax as gj
            table = gj.Table.attach(sys.argv[1])
            print("attached", flush=True)
            sys.stdin.readline()
            table.insert({"obs": [[1.0, 2.0, 3.0]], "action": [9]})
            print(table.size, flush=True)
        """),
            creator.name,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "attached"
        creator.close()
        assert pool()["refused"] == 1 and pool_files() == []
        successor = gj.Table.create(SPEC)
        out, _ = child.communicate("go\n", timeout=RUN_TIMEOUT_S)
        assert out.strip() == "1" and child.returncode == 0
        assert successor.size == 0  # the child's insert went to the closed table's memory, not here
        successor.close()
    finally:
        child.kill()


def test_dead_attacher_does_not_keep_the_memory_out_of_the_pool():
    creator = gj.Table.create(SPEC)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time, gear_jax as gj; t = gj.Table.attach(sys.argv[1]); "
            "print('attached', flush=True); time.sleep(600)",
            creator.name,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "attached"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=RUN_TIMEOUT_S)
        creator.close()
        assert pool()["pooled"] == 1
    finally:
        child.kill()


def test_name_in_use_gives_the_pooled_table_back():
    gj.Table.create(SPEC).close()
    taken = gj.Table.create(SPEC, reuse=False)
    try:
        with pytest.raises(gj.InvalidArgumentError, match="already exists"):
            gj.Table.create(SPEC, name=taken.name)
        assert pool()["tables"] == 1 and pool()["reused"] == 0 and len(pool_files()) == 1
        again = gj.Table.create(SPEC)
        assert pool()["reused"] == 1
        again.close()
    finally:
        taken.close()


def test_pooled_names_do_not_outlive_the_process():
    out = python("""
        import os, gear_jax as gj
        spec = gj.TableSpec({"x": gj.Field((8,), "uint8")}, capacity=16)
        for _ in range(3):
            gj.Table.create(spec, reuse=False).close()
        kept = gj.Table.create(spec)  # closed at exit
        print(os.getpid(), gj.pool_stats()["tables"])
    """)
    pid, tables = map(int, out.split())
    assert tables == 2
    assert [n for n in os.listdir("/dev/shm") if n.startswith(f"gear_jax_pool_{pid}_")] == []


def test_names_left_by_a_killed_process_are_removed_by_the_next_one():
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, time, gear_jax as gj; "
            "gj.Table.create(gj.TableSpec({'x': gj.Field((8,), 'uint8')}, capacity=16)).close(); "
            "print(os.getpid(), flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pid = int(child.stdout.readline())
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=RUN_TIMEOUT_S)
        left = [n for n in os.listdir("/dev/shm") if n.startswith(f"gear_jax_pool_{pid}_")]
        assert len(left) == 1
        python(
            "import gear_jax as gj; "
            "gj.Table.create(gj.TableSpec({'x': gj.Field((8,), 'uint8')}, capacity=16)).close()"
        )
        assert not os.path.exists(f"/dev/shm/{left[0]}")
    finally:
        child.kill()


def mapped(name):
    """Whether this process maps the shared-memory object `name` (under its name, or deleted)."""
    with open("/proc/self/maps") as f:
        return any(f"/dev/shm/{name}" in line for line in f)


def test_close_unmaps_even_while_a_jit_cache_holds_the_table():
    gj.configure_pool(max_tables=0)
    table = gj.Table.create(SPEC)
    table.insert(transitions(4))
    fn = jax.jit(lambda t, k: gj.sample(t, k, 2), static_argnums=0)
    jax.block_until_ready(fn(table, jax.random.key(0)))
    name = table.name
    assert mapped(name)
    table.close()
    assert not mapped(name), "the closed table's memory is still mapped"
    with pytest.raises(gj.EXECUTION_ERRORS, match="closed"):
        jax.block_until_ready(fn(table, jax.random.key(1)))


def test_writer_holding_a_row_keeps_the_memory_until_it_gives_the_row_back():
    creator = gj.Table.create(SPEC)
    attached = gj.Table.attach(creator.name)
    writer = attached.writer()
    writer.append({"obs": np.zeros(3, np.float32), "action": 1})
    name = creator.name
    attached.close()
    assert mapped(name)
    creator.close()  # this process's attach still holds a row: not pooled
    assert pool()["refused"] == 1 and pool()["tables"] == 0
    writer.close()
    assert not mapped(name)


@pytest.mark.gpu
def test_pooled_memory_stays_pinned_and_gpu_calls_follow_the_new_layout():
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("jax sees no GPU")
    first = gj.Table.create(SPEC)
    assert first.pinned
    first.insert(transitions(20))
    on_gpu = jax.jit(lambda t, k: gj.gather(t, gj.sample(t, k, 8, method="lifo")), static_argnums=0)
    jax.block_until_ready(on_gpu(first, jax.device_put(jax.random.key(0), gpu)))
    first.close()
    # Another layout in the same memory: the GPU's view of the table must be the new one.
    other = gj.TableSpec({"action": gj.Field((), "int32"), "obs": gj.Field((2,), "float32")}, capacity=64)
    second = gj.Table.create(other)
    try:
        assert pool()["reused"] == 1 and second.pinned
        second.insert({"action": np.arange(10, 20, dtype=np.int32), "obs": np.ones((10, 2), np.float32)})
        got = on_gpu(second, jax.device_put(jax.random.key(0), gpu))
        assert list(got["action"].devices())[0] == gpu
        np.testing.assert_array_equal(np.asarray(got["action"]), np.arange(19, 11, -1))
        assert np.asarray(got["valid"]).all()
    finally:
        second.close()


def test_pooled_name_removed_by_hand_falls_back_to_new_memory():
    gj.Table.create(SPEC).close()
    (name,) = pool_files()
    os.unlink(f"/dev/shm/{name}")
    for _ in range(2):  # the lost entry is dropped, not retried
        table = gj.Table.create(SPEC)
        table.insert(transitions(3))
        assert table.size == 3
        table.close()
    assert pool()["reused"] == 1  # the second create reused the first's memory


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # the child runs no JAX code
def test_child_closing_an_inherited_table_leaves_the_parents_table_alone():
    table = gj.Table.create(SPEC)
    table.insert(transitions(5))
    pid = os.fork()
    if pid == 0:  # the child: close the inherited table, then leave without running any exit hooks
        code = 0
        try:
            table.insert(transitions(1, start=900))  # writing through the inherited mapping is allowed
            table.close()
        except BaseException:  # noqa: BLE001
            code = 1
        os._exit(code)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            pytest.fail("the forked child did not finish")
        time.sleep(0.01)
    status = done[1]
    try:
        assert os.waitstatus_to_exitcode(status) == 0
        assert table.size == 6 and os.path.exists(f"/dev/shm/{table.name}")
        with gj.Table.attach(table.name) as attached:
            assert attached.size == 6
        table.close()
        assert pool()["refused"] == 1  # the process forked since the table was made: never pooled
    finally:
        table.close()


def running(pid):
    """Whether process `pid` exists and has not exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_worker_forked_by_an_attacher_keeps_the_memory_out_of_the_pool():
    """An actor attaches, forks a worker and exits; the worker goes on inserting through the inherited
    mapping. The creator's close must not hand that memory to a new table."""
    creator = gj.Table.create(SPEC)
    actor = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
            import os, sys, time
            import gear_jax as gj
            table = gj.Table.attach(sys.argv[1])
            worker = os.fork()
            if worker == 0:  # the worker: waits for its go, then inserts through the inherited mapping
                sys.stdin.readline()
                for i in range(50):
                    table.insert({"obs": [[7.0, 7.0, 7.0]], "action": [7]})
                os._exit(0)
            print(worker, flush=True)
            os._exit(0)  # the actor leaves without closing: its attach slot now names a dead process
        """),
            creator.name,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    worker = int(actor.stdout.readline())
    try:
        actor.wait(timeout=RUN_TIMEOUT_S)
        creator.close()
        assert pool()["refused"] == 1 and pool()["pooled"] == 0
        successor = gj.Table.create(SPEC)
        assert pool()["reused"] == 0
        actor.stdin.write("go\n")
        actor.stdin.flush()
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while running(worker) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not running(worker)
        assert successor.size == 0  # the worker's rows went to the closed table's memory, not here
        successor.close()
    finally:
        try:
            os.kill(worker, signal.SIGKILL)
        except ProcessLookupError:
            pass
        actor.kill()

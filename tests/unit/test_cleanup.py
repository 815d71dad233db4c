"""gear_jax.cleanup: tables whose creator died, and processes in other PID namespaces.

Dead creators: a creator killed (SIGKILL, SIGTERM's default action) or gone by os._exit never closes
its table, so nothing else would ever remove its name from /dev/shm. A process that creates a table
removes every table whose creator and users (attached processes, processes with a writer slot) are all
gone, unless it was created with `outlive_creator=True`; `python -m gear_jax.cleanup` lists the tables
and removes dead ones.

Other PID namespaces: kill(pid, 0) only answers for pids of this process's PID namespace. A table
records its creator's namespace; where that is not this process's, or a process of another namespace
attached, a pid recorded in the table is judged by its liveness lock (a process that died holds none),
unless some process of the table held no lock in the table's liveness file: then every such pid counts
as alive. No table is swept on the word of kill(pid, 0) across namespaces, and the pool's orphan sweep
leaves other namespaces' names alone.

The processes here load the native module only (no JAX), so that each starts in a fraction of a second;
the cleanup command is run as `python -m gear_jax.cleanup`.
"""

import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import gear_jax as gj
import gear_jax.cleanup
from gear_jax import _native

pytestmark = pytest.mark.multiprocess
TIMEOUT = 30  # seconds for any one process
SPEC = gj.TableSpec({"x": gj.Field((), "int32")}, capacity=8)

# Loads the native module of this checkout; `create(name, persistent)` makes a small table (no pool).
PRELUDE = f"""
import importlib.util, os, signal, sys, time
import numpy as np
_spec = importlib.util.spec_from_file_location("_native", {_native.__file__!r})
native = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(native)

def create(name, persistent=False, reuse=False):
    extra = {{"outlive_creator": True}} if persistent else {{}}
    return native.NativeTable.create(name, 8, 1, [4], "{{}}", 1, False, reuse, **extra)

def insert_one(table):
    return table.insert([np.zeros(4, np.uint8)], 1, 1, np.ones(1, np.int32), np.ones(1, np.float32))

# Runs work() in a forked child whose pid names no process of the outer PID namespace (/proc is still
# the outer one in a new namespace, so kill(pid, 0) there says "dead" of it): forks until one is, and
# returns once that child ended.
def in_a_child_unknown_outside(work):
    while True:
        child = os.fork()
        if child == 0:
            if os.path.exists(f"/proc/{{os.getpid()}}"):
                os._exit(3)
            try:
                work()
            except BaseException:
                import traceback
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        _, status = os.waitpid(child, 0)
        if os.waitstatus_to_exitcode(status) != 3:
            return

def generation(table, row):
    memory = np.frombuffer(table.mapping(), np.uint8)
    start = int(memory[native.header_offsets()["state_offset"]:][:8].view(np.uint64)[0]) + 8 * row
    return int(memory[start : start + 8].view(np.uint64)[0] >> 32)
"""

# Creates table argv[1] (argv[2] == "1": outlive_creator), prints its pid, and exits by os._exit
# (argv[3] == "exit") or waits to be killed.
CREATOR = """
table = create(sys.argv[1], persistent=sys.argv[2] == "1")
print(os.getpid(), flush=True)
if sys.argv[3] == "exit":
    os._exit(0)
time.sleep(TIMEOUT)
"""

# Attaches table argv[1], says so, and waits to be killed.
ATTACHER = """
table = native.NativeTable.attach(sys.argv[1], False)
print(os.getpid(), flush=True)
time.sleep(TIMEOUT)
"""

# A process that creates a table: the moment dead tables are swept.
SWEEPER = """
create("gear_jax_test_sweeper_" + os.urandom(8).hex()).close()
"""


def script(code):
    return PRELUDE + f"TIMEOUT = {TIMEOUT}\n" + textwrap.dedent(code)


def start(code, *args, prefix=()):
    """Starts `code` (after PRELUDE) in a new Python process, with pipes for stdin and stdout."""
    return subprocess.Popen(
        [*prefix, sys.executable, "-c", script(code), *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run(code, *args, prefix=()):
    """Runs `code` (after PRELUDE) in a new Python process; returns its stdout."""
    result = subprocess.run(
        [*prefix, sys.executable, "-c", script(code), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def line(process):
    """The next line `process` prints (its stderr in the failure message if it ends instead)."""
    text = process.stdout.readline()
    if not text:
        process.wait(timeout=TIMEOUT)
        pytest.fail(f"the process ended (rc {process.returncode}): {process.stderr.read()}")
    return text.strip()


def end(process, sig=signal.SIGKILL):
    if process.poll() is None:
        process.send_signal(sig)
    process.wait(timeout=TIMEOUT)


def exists(name):
    return os.path.exists(f"/dev/shm/{name}")


def sweep():
    """A process creates a table: dead tables go."""
    run(SWEEPER)


@pytest.fixture
def names():
    """Fresh table names; whatever of them is left in /dev/shm is removed when the test ends."""
    made = []

    def new(kind="dead"):
        made.append(f"gear_jax_test_{kind}_{secrets.token_hex(8)}")
        return made[-1]

    yield new
    for name in made:
        if exists(name):
            os.unlink(f"/dev/shm/{name}")


def dead_table(name, death, persistent=False):
    """Table `name`, created by a process that then died by `death`; still in /dev/shm."""
    creator = start(CREATOR, name, int(persistent), "exit" if death == "os._exit" else "wait")
    try:
        line(creator)
        if death != "os._exit":
            creator.send_signal(signal.SIGKILL if death == "SIGKILL" else signal.SIGTERM)
        creator.wait(timeout=TIMEOUT)
    finally:
        end(creator)
    assert exists(name)


def header_field(mapping, field, dtype):
    """A writable view of one header field of a table's bytes (numpy uint8 array)."""
    offset = _native.header_offsets()[field]
    return mapping[offset : offset + np.dtype(dtype).itemsize].view(dtype)


@pytest.mark.parametrize("death", ["SIGKILL", "SIGTERM", "os._exit"])
def test_a_table_whose_creator_died_is_removed_by_the_next_create(names, death):
    name = names()
    dead_table(name, death)
    sweep()
    assert not exists(name)


def test_a_live_attacher_keeps_the_table(names):
    name = names()
    creator = start(CREATOR, name, 0, "wait")
    attacher = None
    try:
        line(creator)
        attacher = start(ATTACHER, name)
        line(attacher)
        end(creator)
        sweep()
        assert exists(name)  # the attacher still uses it
        end(attacher)
        sweep()
        assert not exists(name)
    finally:
        end(creator)
        if attacher is not None:
            end(attacher)


# Attaches table argv[1] argv[2] times (each open takes an attach slot), says so, and waits to be killed.
MANY_ATTACHES = """
tables = [native.NativeTable.attach(sys.argv[1], False) for _ in range(int(sys.argv[2]))]
print(os.getpid(), flush=True)
time.sleep(TIMEOUT)
"""


def test_a_process_past_the_attach_slots_keeps_the_table(names):
    # The 257th process to map a table finds no attach slot: nothing in the header names it. Once the
    # creator and the slotted processes were gone, a sweep removed a table that process still used
    # (issue 32's probe). A table marked so (more processes than slots) is now kept while /proc shows a
    # process mapping it.
    name = names()
    creator = start(CREATOR, name, 0, "wait")
    slots = unslotted = None
    try:
        line(creator)
        slots = start(MANY_ATTACHES, name, 256)  # every attach slot (the creator has none)
        line(slots)
        unslotted = start(ATTACHER, name)  # the 257th open: no slot left
        line(unslotted)
        end(creator)
        end(slots)
        sweep()
        assert exists(name)  # the unslotted process still maps it
        (record,) = gj.cleanup.find_tables(match=name)
        assert record.state == "live" and record.mapped_elsewhere and not record.removable
        assert record.attached_alive == 0 and not record.creator_alive
        end(unslotted)
        sweep()
        assert not exists(name)
    finally:
        for process in (creator, slots, unslotted):
            if process is not None:
                end(process)


# A subreaper (so that it can wait for its grandchild) forks the creator, which forks a writer and
# os._exit's once the writer wrote a row: the writer holds the table by fork, never attached by name.
# Prints the writer's pid; on a line of stdin kills the writer, reaps it and prints "gone".
FORKED_WRITER = """
import ctypes
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
started, pid_pipe = os.pipe(), os.pipe()
creator = os.fork()
if creator == 0:
    table = create(sys.argv[1])
    if os.fork() == 0:
        insert_one(table)
        os.write(pid_pipe[1], b"%d\\n" % os.getpid())
        os.write(started[1], b"x")
        time.sleep(TIMEOUT)
        os._exit(0)
    os.read(started[0], 1)
    os._exit(0)
os.waitpid(creator, 0)
writer = int(os.read(pid_pipe[0], 64).decode().strip())
print(writer, flush=True)
sys.stdin.readline()
os.kill(writer, signal.SIGKILL)
os.waitpid(writer, 0)
print("gone", flush=True)
sys.stdin.readline()
"""


def test_a_live_forked_writer_keeps_the_table(names):
    name = names()
    holder = start(FORKED_WRITER, name)
    try:
        line(holder)  # the creator is gone, its forked writer alive
        sweep()
        assert exists(name)
        holder.stdin.write("kill\n")
        holder.stdin.flush()
        assert line(holder) == "gone"
        sweep()
        assert not exists(name)
    finally:
        end(holder)


def cleanup(*flags):
    """Runs `python -m gear_jax.cleanup` on the test's tables; returns its stdout."""
    result = subprocess.run(
        [sys.executable, "-m", "gear_jax.cleanup", "--match=gear_jax_test_*", *flags],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        cwd=os.path.dirname(os.path.dirname(gj.__file__)),
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def row_of(listing, name):
    rows = [row.split() for row in listing.splitlines() if row.split()[:1] == [name]]
    assert len(rows) == 1, listing
    return rows[0]


def test_outlive_creator_tables_are_kept_and_the_cleanup_command_lists_and_removes(names):
    dead, persistent, live = names(), names(), names("live")
    # Each create sweeps: the dead table last.
    dead_table(persistent, "SIGKILL", persistent=True)
    table = gj.Table.create(SPEC, name=live, reuse=False)
    try:
        dead_table(dead, "SIGKILL")
        assert not table.outlive_creator
        listing = cleanup()
        assert "name" in listing.splitlines()[0] and "state" in listing.splitlines()[0]
        assert row_of(listing, dead)[-1] == "dead"
        assert row_of(listing, persistent)[-2:] == ["yes", "dead"]  # persistent, state
        assert row_of(listing, live)[-1] == "live" and str(os.getpid()) in row_of(listing, live)
        assert exists(dead) and exists(persistent)  # listing removes nothing

        sweep()  # the automatic sweep keeps a table created with outlive_creator=True
        assert not exists(dead) and exists(persistent)
        dead_table(dead, "os._exit")

        cleanup("--remove")
        assert not exists(dead) and exists(persistent) and exists(live)
        cleanup("--remove", "--include_persistent")
        assert not exists(persistent) and exists(live)
        assert table.size == 0  # the creator's table is untouched
    finally:
        table.close()


def test_the_python_api_finds_and_removes_dead_tables(names):
    from gear_jax import cleanup as api

    name = names()
    dead_table(name, "os._exit")
    found = {t.name: t for t in api.find_tables()}
    record = found[name]
    assert record.state == "dead" and not record.creator_alive
    assert record.format_version == gj.build_info()["format_version"]
    assert api.remove_dead_tables(dry_run=True, match=name) == [name] and exists(name)
    assert api.remove_dead_tables(match=name) == [name] and not exists(name)


def test_other_formats_and_other_files_are_left_alone(names):
    name, plain = names(), names("plain")
    dead_table(name, "os._exit")
    with open(f"/dev/shm/{plain}", "wb") as f:
        f.write(os.urandom(64 << 10))
    memory = np.memmap(f"/dev/shm/{name}", dtype=np.uint8, mode="r+")
    version = header_field(memory, "format_version", np.uint32)
    version[0] = 3
    memory.flush()
    sweep()
    assert exists(name) and exists(plain)
    version[0] = _native.format_version
    memory.flush()
    del version, memory
    sweep()
    assert not exists(name) and exists(plain)


def test_a_truncated_table_file_is_listed_as_truncated(names):
    # A table file cut after its creation kills a process that touches a mapped page past the end
    # (SIGBUS; issue 32's probe). The cleanup lists such files; attaches refuse them.
    name = names()
    dead_table(name, "os._exit")
    full = os.path.getsize(f"/dev/shm/{name}")
    (record,) = gj.cleanup.find_tables(match=name)
    assert not record.truncated
    os.truncate(f"/dev/shm/{name}", full - 4096)
    (record,) = gj.cleanup.find_tables(match=name)
    assert record.truncated and record.state == "dead"
    assert "dead (truncated)" in gj.cleanup.format_tables([record])
    with pytest.raises(gj.TableMismatchError):
        gj.Table.attach(name)
    assert gj.cleanup.remove_dead_tables(match=name) == [name] and not exists(name)


# Namespaces: forged where the test cannot make one, real where unshare works.


def _permitted(prefix):
    try:
        return subprocess.run([*prefix, "true"], capture_output=True, timeout=TIMEOUT).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# A new PID namespace (sharing /dev/shm); and a private /dev/shm, for the tests of pool names: processes
# of an older gear_jax, which other checkouts on the host may run meanwhile, remove every pool name whose
# pid is dead here, whatever its namespace (the defect these tests are about).
UNSHARE_PID = ["unshare", "--user", "--map-root-user", "--pid", "--fork"]
UNSHARE_PID = UNSHARE_PID if _permitted(UNSHARE_PID) else None
PRIVATE_SHM = ["unshare", "--user", "--map-root-user", "--mount", "--fork", "sh", "-c"]
PRIVATE_SHM = PRIVATE_SHM + ['mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$0" "$@"']
PRIVATE_SHM = PRIVATE_SHM if _permitted(PRIVATE_SHM) else None


@pytest.mark.parametrize("forge", ["creator_pid_namespace", "mixed_pid_namespaces"])
def test_a_dead_writer_of_another_namespace_is_told_by_its_liveness_lock(forge):
    table = gj.Table.create(SPEC, reuse=False)
    try:
        memory = np.frombuffer(table.native.mapping(), np.uint8)
        ours = _native.pid_namespace()
        assert ours != 0 and header_field(memory, "creator_pid_namespace", np.uint64)[0] == ours
        assert not table.native.liveness_unproven
        # A writer claims a row and dies holding it; so does a second one.
        claim = "print(native.NativeTable.attach(sys.argv[1], False).claim(), flush=True); os._exit(0)"
        row = int(run(claim, table.name))
        assert not header_field(memory, "mixed_pid_namespaces", np.uint32)[0]
        field = header_field(memory, forge, np.uint64 if forge == "creator_pid_namespace" else np.uint32)
        field[0] = ours + 1 if forge == "creator_pid_namespace" else 1  # kill(pid, 0) cannot judge now
        for _ in range(3):
            table.insert({"x": np.arange(8)})
        # Its liveness lock went with it: reclaimed, though kill(pid, 0) could not say.
        assert table.row_status()["generation"][row] % 2 == 0
        unproven = header_field(memory, "liveness_unproven", np.uint32)
        unproven[0] = 1  # as if some process of the table had held no lock: pids count as alive
        row = int(run(claim, table.name))
        for _ in range(3):
            table.insert({"x": np.arange(8)})
        assert table.row_status()["generation"][row] % 2 == 1  # its owner may live: never reclaimed
        field[0] = ours if forge == "creator_pid_namespace" else 0
        header_field(memory, "mixed_pid_namespaces", np.uint32)[0] = 0  # the claimer's attach set it
        table.insert({"x": np.arange(8)})
        assert table.row_status()["generation"][row] % 2 == 0  # kill(pid, 0) answers again: reclaimed
    finally:
        table.close()


def test_a_live_writer_of_another_namespace_keeps_its_row():
    # The same with a writer that lives on: its lock is held, so its row stays its own.
    table = gj.Table.create(SPEC, reuse=False)
    holder = start(
        "t = native.NativeTable.attach(sys.argv[1], False)\n"
        "print(t.claim(), flush=True)\n"
        "sys.stdin.readline()",
        table.name,
    )
    try:
        row = int(line(holder))
        memory = np.frombuffer(table.native.mapping(), np.uint8)
        header_field(memory, "mixed_pid_namespaces", np.uint32)[0] = 1
        for _ in range(3):
            table.insert({"x": np.arange(8)})
        assert table.row_status()["generation"][row] % 2 == 1
        assert not table.native.liveness_unproven
    finally:
        end(holder)
        table.close()


def test_a_process_without_a_lock_in_the_tables_liveness_file_marks_the_table():
    # The table names another liveness file than the one a new process locks in (as if the file had been
    # removed and made again since the table was created): that process's attach marks the table, and
    # its pids count as alive from then on.
    table = gj.Table.create(SPEC, reuse=False)
    try:
        memory = np.frombuffer(table.native.mapping(), np.uint8)
        assert not table.native.liveness_unproven
        inode = header_field(memory, "liveness_inode", np.uint64)
        assert inode[0] == os.stat("/dev/shm/gear_jax_liveness").st_ino
        inode[0] += 1
        run("native.NativeTable.attach(sys.argv[1], False); os._exit(0)", table.name)
        assert table.native.liveness_unproven
    finally:
        table.close()


# A process pools a table and dies, leaving a pool name with its pid; its header is made to say
# another namespace; a process that pools a table (and so sweeps the pool's orphans) must leave it, and
# remove it once the header says this namespace. Prints whether it was kept, then whether removed.
POOL_GUARD = """
def in_child(work):
    pid = os.fork()
    if pid == 0:
        try:
            work()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    return pid

def pool_a_table(clear):
    create("gear_jax_test_pooled_" + os.urandom(8).hex(), reuse=True).close()
    if clear:
        native.pool_clear()

dead = in_child(lambda: pool_a_table(clear=False))
[left] = [n for n in os.listdir("/dev/shm") if n.startswith(f"gear_jax_pool_{dead}_")]
offset = native.header_offsets()["creator_pid_namespace"]
ours = native.pid_namespace()
def forge(ns):
    with open("/dev/shm/" + left, "r+b") as f:
        f.seek(offset)
        f.write(ns.to_bytes(8, "little"))
try:
    forge(ours + 1)
    in_child(lambda: pool_a_table(clear=True))
    print(os.path.exists("/dev/shm/" + left))
    forge(ours)
    in_child(lambda: pool_a_table(clear=True))
    print(not os.path.exists("/dev/shm/" + left))
finally:
    if os.path.exists("/dev/shm/" + left):
        os.unlink("/dev/shm/" + left)
"""


def test_the_pool_sweep_leaves_names_of_another_namespace_alone():
    # Without a private /dev/shm, an older gear_jax running meanwhile may remove the name (and fail this).
    kept, removed = run(POOL_GUARD, prefix=PRIVATE_SHM or ()).split()
    assert kept == "True"  # its pid is dead here, but it is of another namespace
    assert removed == "True"


# In a new PID namespace (sharing /dev/shm), a child whose pid is unknown outside attaches table argv[1]
# and holds a row, creates table argv[2], prints "row pid", then on a line of stdin commits its row,
# prints "committed" or "lost", and closes its table.
IN_NAMESPACE = """
def work():
    shared = native.NativeTable.attach(sys.argv[1], False)
    row = shared.claim()
    own = create(sys.argv[2])
    print(row, os.getpid(), flush=True)
    sys.stdin.readline()
    try:
        shared.commit(row, 1, 1.0)
        print("committed", flush=True)
    except RuntimeError:
        print("lost", flush=True)
    own.close()
    native.pool_clear()  # close pooled it; no process of this namespace would ever sweep the name
in_a_child_unknown_outside(work)
"""


@pytest.mark.skipif(UNSHARE_PID is None, reason="unshare --user --pid is not permitted here")
def test_a_process_in_another_pid_namespace_keeps_its_rows_and_tables(names):
    own = names("foreign")
    table = gj.Table.create(SPEC, reuse=False)
    inner = start(IN_NAMESPACE, table.name, own, prefix=UNSHARE_PID)
    try:
        row, pid = map(int, line(inner).split())
        assert not os.path.exists(f"/proc/{pid}")  # dead, as far as kill(pid, 0) here can tell
        for _ in range(3):
            table.insert({"x": np.arange(8)})
        assert table.row_status()["generation"][row] % 2 == 1  # the live writer's row is still its own
        assert table.native.mixed_pid_namespaces
        # Its table stays, though its creator's pid looks dead from here; the cleanup lists it so.
        assert own not in _native.sweep_dead_tables() and exists(own)
        from gear_jax import cleanup as api

        [record] = api.find_tables(match=own)
        assert record.state == "other-namespace" and not record.removable
        inner.stdin.write("go\n")
        inner.stdin.flush()
        assert line(inner) == "committed"
        inner.wait(timeout=TIMEOUT)
        assert not exists(own)
    finally:
        end(inner)
        table.close()


# In a new PID namespace (sharing /dev/shm), a child whose pid is unknown outside attaches table argv[1],
# prints its pid and is killed.
KILLED_IN_NAMESPACE = """
def work():
    shared = native.NativeTable.attach(sys.argv[1], False)
    print(os.getpid(), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
in_a_child_unknown_outside(work)
"""


def column(memory, offset_field, dtype, row):
    """A writable view of one row's entry in the status column whose offset the header field holds."""
    start = int(header_field(memory, offset_field, np.uint64)[0]) + np.dtype(dtype).itemsize * row
    return memory[start : start + np.dtype(dtype).itemsize].view(dtype)


@pytest.mark.skipif(UNSHARE_PID is None, reason="unshare --user --pid is not permitted here")
def test_a_step_ring_goes_on_after_a_writer_of_another_pid_namespace_was_killed_copying():
    # A writer of another PID namespace died holding episode row 0 with steps from the ring's first one
    # (as if killed while copying them; its row is written here as the writer left it). Every later
    # retirement must pass that row: it used to wait 10 s for the "copying" writer, whom kill(pid, 0)
    # cannot judge across namespaces, and fail, for the table's lifetime.
    table = gj.Table.create(
        gj.TableSpec({"x": gj.Field((), "int32")}, capacity=4, max_steps=4, step_capacity=16), reuse=False
    )
    try:
        pid = int(run(KILLED_IN_NAMESPACE, table.name, prefix=UNSHARE_PID))
        assert not os.path.exists(f"/proc/{pid}") and table.native.mixed_pid_namespaces
        memory = np.frombuffer(table.native.mapping(), np.uint8)
        column(memory, "state_offset", np.uint64, 0)[0] = 1 << 32  # generation 1: held
        column(memory, "writer_pid_offset", np.int32, 0)[0] = pid
        column(memory, "first_step_offset", np.uint64, 0)[0] = 0
        t0 = time.monotonic()
        for k in range(12):  # 48 steps: the ring of 16 wraps three times
            table.insert({"x": np.full((1, 4), k, np.int32)}, lengths=np.array([4]))
        assert time.monotonic() - t0 < 5  # no 10 s wait for the dead writer
        assert not table.native.liveness_unproven
        assert table.row_status()["generation"][0] % 2 == 0  # its row was taken back
        assert table.size > 0
    finally:
        table.close()


# A creator unshares its PID namespace and forks: its children live in the new one, with pids unknown
# outside. One claims a row of the inherited table and lives on; the creator inserts past it. Prints
# "mixed held" when the fork marked the table and left the live writer's row alone.
UNSHARE_THEN_FORK = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
table = create("gear_jax_test_unshared_" + os.urandom(8).hex())
assert libc.unshare(0x20000000) == 0, ctypes.get_errno()  # CLONE_NEWPID: for the children to come
r, w = os.pipe(); r2, w2 = os.pipe()
init = os.fork()
if init == 0:  # pid 1 of the new namespace
    def work():
        os.write(w, f"{table.claim()}\\n".encode())
        os.read(r2, 1)  # alive, holding the row
    in_a_child_unknown_outside(work)
    os._exit(0)
row = int(os.read(r, 100).decode())
for _ in range(16):
    insert_one(table)
held = generation(table, row) % 2 == 1
print("mixed" if table.mixed_pid_namespaces else "unmarked", "held" if held else "reclaimed")
os.write(w2, b"x"); os.waitpid(init, 0)
table.close()
"""


@pytest.mark.skipif(UNSHARE_PID is None, reason="unshare --user --pid is not permitted here")
def test_a_fork_into_a_new_pid_namespace_marks_the_table_and_its_live_writer_keeps_its_row():
    assert run(UNSHARE_THEN_FORK, prefix=UNSHARE_PID[:3]).split() == ["mixed", "held"]


# A live writer holds a row of a table whose pids kill(pid, 0) cannot judge (the mark forged). This
# process's probe descriptor is closed by code that does not own it, and its number goes to another file.
# Prints the row's state after inserts, before and after: "held held" when the probe never answers for
# the other file.
PROBE_REUSED = """
import subprocess
name = "gear_jax_test_probe_" + os.urandom(8).hex()
table = create(name)
memory = np.frombuffer(table.mapping(), np.uint8)
offset = native.header_offsets()["mixed_pid_namespaces"]
memory[offset : offset + 4].view(np.uint32)[0] = 1
code = "import sys; from gear_jax import _native as n; t = n.NativeTable.attach(sys.argv[1], False); " \\
       "print(t.claim(), flush=True); sys.stdin.readline()"
holder = subprocess.Popen([sys.executable, "-c", code, name], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)
row = int(holder.stdout.readline())
def state():
    for _ in range(16):
        insert_one(table)
    return "held" if generation(table, row) % 2 else "reclaimed"
first = state()  # the probe is open now
fds = sorted(int(f) for f in os.listdir("/proc/self/fd")
             if os.path.realpath(f"/proc/self/fd/{f}") == "/dev/shm/gear_jax_liveness")
os.close(fds[-1])  # the probe, opened after this process's lock
other = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
assert other == fds[-1]
print(first, state(), flush=True)
holder.stdin.write("\\n"); holder.stdin.flush(); holder.wait()
table.close()
"""


def test_a_probe_descriptor_whose_number_went_to_another_file_never_says_dead(tmp_path):
    assert run(PROBE_REUSED, tmp_path / "other").split() == ["held", "held"]


# In a private /dev/shm: a process of a new PID namespace (argv[1]: its script) pools a table and waits
# (its pid is dead as far as this namespace can tell); this process pools a table (sweeping the pool's
# orphans), prints whether the other's pool name is still there, and lets it go.
POOL_ACROSS_NAMESPACES = """
import subprocess
inner = subprocess.Popen(["unshare", "--pid", "--fork", sys.executable, "-c", sys.argv[1]],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
pid = int(inner.stdout.readline())
create("gear_jax_test_pooled_" + os.urandom(8).hex(), reuse=True).close()
print(any(n.startswith(f"gear_jax_pool_{pid}_") for n in os.listdir("/dev/shm")), flush=True)
inner.stdin.write("go\\n")
inner.stdin.flush()
inner.wait(timeout=TIMEOUT)
"""
POOLS_AND_WAITS = """
def work():
    create("gear_jax_test_pooled_" + os.urandom(8).hex(), reuse=True).close()
    print(os.getpid(), flush=True)
    sys.stdin.readline()
    native.pool_clear()
in_a_child_unknown_outside(work)
"""


@pytest.mark.skipif(
    UNSHARE_PID is None or PRIVATE_SHM is None, reason="unshare --user --pid --mount is not permitted here"
)
def test_the_pool_sweep_leaves_a_live_process_of_another_namespace_alone():
    assert run(POOL_ACROSS_NAMESPACES, script(POOLS_AND_WAITS), prefix=PRIVATE_SHM).strip() == "True"

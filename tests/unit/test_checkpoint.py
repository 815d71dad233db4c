"""Checkpoints (gear_jax/checkpoint.py): `Table.save(path)` and `Table.load(path)`.

Round trips are exact (field bytes, every row's status, the allocator cursor, samples drawn with the
same key); saves killed by SIGKILL leave the previous checkpoint loadable; saves racing a writer in
another process hold only committed rows; every damaged or foreign checkpoint is refused by name.
"""

import errno
import json
import re
import os
import random
import select
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from pathlib import Path

import jax
import numpy as np
import pytest

import gear_jax as gj
from gear_jax import checkpoint
from tests.helpers.tables import held_row
from tests.helpers.waits import wait_until

STATUS = ("generation", "priority", "length", "insert_seq", "times_sampled")


@pytest.fixture
def tables():
    """Tables to close when the test ends: call with a table, get it back."""
    opened = []

    def keep(table):
        opened.append(table)
        return table

    yield keep
    for table in opened:
        table.close()


def filled_transitions(capacity=64, rows=150, seed=0):
    """A transition table that wrapped around (rows > capacity), priorities 0 included."""
    spec = gj.TableSpec(
        {"obs": gj.Field((5,), "float32"), "action": gj.Field((), "int32"), "done": gj.Field((), "bool")},
        capacity=capacity,
    )
    table = gj.Table.create(spec)
    rng = np.random.default_rng(seed)
    for start in range(0, rows, 16):
        n = min(16, rows - start)
        priorities = rng.uniform(0.0, 3.0, n).astype(np.float32)
        priorities[rng.random(n) < 0.2] = 0.0
        table.insert(
            {
                "obs": rng.standard_normal((n, 5), dtype=np.float32),
                "action": rng.integers(-9, 9, n, dtype=np.int32),
                "done": rng.random(n) < 0.5,
            },
            priorities=priorities,
        )
    return table


def assert_same_table(saved, loaded, held=()):
    """Field bytes and every status column equal, but for `held` rows (saved as empty)."""
    assert loaded.spec == saved.spec
    a, b = saved.row_status(), loaded.row_status()
    rows = np.setdiff1d(np.arange(saved.capacity), np.asarray(held, dtype=np.int64))
    for key in STATUS:
        np.testing.assert_array_equal(a[key][rows], b[key][rows], err_msg=key)
    for name in saved.spec.fields:
        x, y = saved.columns[name], loaded.columns[name]
        assert x[rows].tobytes() == y[rows].tobytes(), name
    assert saved.native.cursors() == loaded.native.cursors()
    for row in held:  # empty, unselectable, at the generation its writer will publish
        assert b["length"][row] == 0 and b["priority"][row] == 0
        assert b["generation"][row] == a["generation"][row] + 1 and b["generation"][row] % 2 == 0


def test_round_trip_is_exact(tmp_path, tables):
    saved = tables(filled_transitions())
    jax.jit(lambda k: gj.sample(saved, k, 8))(jax.random.key(3))  # some rows sampled: times_sampled > 0
    writer = saved.writer()
    writer.append({"obs": np.ones(5, np.float32), "action": 1, "done": True})  # a row held at save time
    held = [held_row(saved)]
    path = tmp_path / "ckpt"
    saved.save(path)
    loaded = tables(gj.Table.load(path))
    assert_same_table(saved, loaded, held)
    assert saved.row_status()["times_sampled"].sum() > 0
    assert loaded.size == saved.size == 64 - 1 and loaded.native.selectable == saved.native.selectable
    manifest = json.loads((path / "current" / "manifest.json").read_text())
    assert manifest["rows_saved_empty"] == 1 and manifest["size"] == loaded.size
    assert manifest["next_seq"] == saved.native.next_seq > saved.capacity
    writer.close()
    # The same key picks the same rows before and after, by every method; the cursors continue alike.
    for method in ("uniform", "prioritized", "fifo", "lifo", "topk"):
        draw = jax.jit(lambda t, k, m=method: gj.sample(t, k, 16, method=m), static_argnums=0)
        before, after = draw(saved, jax.random.key(7)), draw(loaded, jax.random.key(7))
        for leaf in ("indices", "generations", "probabilities", "starts"):
            np.testing.assert_array_equal(getattr(before, leaf), getattr(after, leaf), err_msg=method)
    fifo = jax.jit(lambda t: gj.sample(t, jax.random.key(0), 40, method="fifo"), static_argnums=0)
    order = np.asarray(fifo(loaded).indices)
    insert_seq = loaded.row_status()["insert_seq"]
    assert (np.diff(insert_seq[order].astype(np.int64)) > 0).all()  # oldest first
    more = {
        "obs": np.zeros((3, 5), np.float32),
        "action": np.arange(3, dtype=np.int32),
        "done": np.ones(3, bool),
    }
    np.testing.assert_array_equal(saved.insert(more), loaded.insert(more))  # the next rows overwritten
    assert saved.native.cursors() == loaded.native.cursors()


def test_trajectory_table_with_partial_lengths(tmp_path, tables):
    spec = gj.TableSpec(
        {"obs": gj.Field((2, 3), "float64"), "r": gj.Field((), "bfloat16")}, capacity=40, max_steps=6
    )
    saved = tables(gj.Table.create(spec))
    rng = np.random.default_rng(1)
    for _ in range(7):
        steps = int(rng.integers(1, 7))
        saved.insert(
            {
                "obs": rng.standard_normal((8, steps, 2, 3)),
                "r": rng.standard_normal((8, steps)).astype(np.float32),
            },
            priorities=rng.uniform(0.5, 2.0, 8),
            lengths=rng.integers(1, steps + 1, 8),
        )
    lengths = saved.row_status()["length"]
    assert len(set(lengths[lengths > 0].tolist())) > 2
    saved.save(tmp_path / "t")
    loaded = tables(gj.Table.load(tmp_path / "t", name=f"gear_jax_test_ckpt_{os.getpid()}"))
    assert loaded.name == f"gear_jax_test_ckpt_{os.getpid()}" and loaded.max_steps == 6
    assert_same_table(saved, loaded)
    gather = jax.jit(lambda t, k: t.sample_batch(k, 10, method="prioritized", window=2), static_argnums=0)
    (s1, b1), (s2, b2) = gather(saved, jax.random.key(1)), gather(loaded, jax.random.key(1))
    np.testing.assert_array_equal(s1.starts, s2.starts)
    for name in b1:
        np.testing.assert_array_equal(np.asarray(b1[name]), np.asarray(b2[name]))


def test_modes_and_replacement(tmp_path, tables):
    """Directories 0700, files 0600; a second save replaces the first and deletes its data; leftovers of
    killed saves are removed by the next save."""
    first = tables(filled_transitions(seed=1))
    second = tables(filled_transitions(seed=2))
    path = tmp_path / "ckpt"
    first.save(path)
    old_data = os.readlink(path / "current")
    leftover = "data-18eab0d1fa3f2b00-0123456789abcdef"  # what a save killed before its link flip leaves
    (path / leftover).mkdir()
    (path / leftover / "state.bin").write_bytes(b"x")
    os.symlink(leftover, path / ".current-0123456789abcdef")
    second.save(path)
    assert sorted(os.listdir(path)) == sorted(["current", "lock", os.readlink(path / "current")])
    assert os.readlink(path / "current") != old_data
    assert_same_table(second, tables(gj.Table.load(path)))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    data = path / os.readlink(path / "current")
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o700
    files = sorted(os.listdir(data))
    assert files == sorted(
        ["manifest.json", "state.bin", "length.bin", "insert_seq.bin", "times_sampled.bin"]
        + [f"field-{i:03d}.bin" for i in range(3)]
    )
    for name in [*files, "../lock"]:
        assert stat.S_IMODE(os.stat(data / name).st_mode) == 0o600, name
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["format"] == "gear_jax.checkpoint" and manifest["version"] == 1
    assert gj.TableSpec.from_json(manifest["spec"]) == second.spec
    for entry in manifest["columns"]:
        raw = (data / entry["file"]).read_bytes()
        assert len(raw) == entry["bytes"] and f"{zlib.crc32(raw):08x}" == entry["checksum"]


def test_saves_racing_to_one_path_take_turns(tmp_path, tables):
    one, two = tables(filled_transitions(seed=3)), tables(filled_transitions(seed=4))
    path = tmp_path / "ckpt"
    errors = []

    def save_many(table):
        try:
            for _ in range(5):
                table.save(path)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=save_many, args=(t,)) for t in (one, two)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    loaded = tables(gj.Table.load(path))
    # The last save to finish is the checkpoint, whole (the two tables' obs differ everywhere).
    assert_same_table(one if np.array_equal(loaded.columns["obs"], one.columns["obs"]) else two, loaded)
    assert len([e for e in os.listdir(path) if e.startswith("data-")]) == 1


@pytest.mark.parametrize("stage", ["manifest", "column"])
def test_a_load_that_a_save_overtakes_starts_again(tmp_path, tables, monkeypatch, stage):
    # A save that replaces the checkpoint deletes the previous data directory: a load that read the old
    # link, and had not yet opened the manifest or every column file, found them missing and raised
    # "'insert_seq.bin' is missing" on a complete checkpoint (5 of 1,390 loads racing saves in the probe).
    # Here the save runs at that very moment; the load then reads the new checkpoint whole.
    first, second = tables(filled_transitions(seed=5)), tables(filled_transitions(seed=6))
    path = tmp_path / "ckpt"
    first.save(path)
    opener = checkpoint._read_manifest if stage == "manifest" else checkpoint._open_column
    name = "_read_manifest" if stage == "manifest" else "_open_column"
    overtaken = []

    def open_after_a_save(*args, **kwargs):
        if not overtaken:
            overtaken.append(True)
            second.save(path)  # replaces the checkpoint and deletes the data directory being opened
        return opener(*args, **kwargs)

    monkeypatch.setattr(checkpoint, name, open_after_a_save)
    loaded = tables(gj.Table.load(path))
    assert overtaken
    assert_same_table(second, loaded)


def test_a_full_disk_is_a_checkpoint_error_naming_the_path(tmp_path, tables, monkeypatch):
    # ENOSPC raised a raw OSError without the path (issue 32's probe). The previous checkpoint stays
    # whole and the unfinished data directory goes.
    first, second = tables(filled_transitions(seed=7)), tables(filled_transitions(seed=8))
    path = tmp_path / "ckpt"
    first.save(path)

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "write_all", full)
    with pytest.raises(gj.CheckpointError, match=f"'{path}': writing the save failed: No space left"):
        second.save(path)
    monkeypatch.undo()
    assert len([e for e in os.listdir(path) if e.startswith("data-")]) == 1
    assert_same_table(first, tables(gj.Table.load(path)))


# -- SIGKILL during save -------------------------------------------------------------------------------

SAVER = """
    import sys
    import gear_jax as gj
    table = gj.Table.attach(sys.argv[1])
    print("ready", flush=True)
    while True:
        table.save(sys.argv[2])
"""


def big_table(seed):
    """64 MiB of rows whose bytes identify the table."""
    spec = gj.TableSpec({"x": gj.Field((1024,), "float32")}, capacity=16384)
    table = gj.Table.create(spec)
    block = np.random.default_rng(seed).standard_normal((4096, 1024), dtype=np.float32)
    for _ in range(4):
        table.insert({"x": block}, priorities=np.full(4096, seed + 1.0))
    return table


def test_sigkill_during_save_leaves_a_loadable_checkpoint(tmp_path, tables):
    previous, current = tables(big_table(1)), tables(big_table(2))
    path = tmp_path / "ckpt"
    previous.save(path)
    rng = random.Random(0)
    interrupted = 0
    for kill in range(4):
        saver = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(SAVER), current.name, str(path)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(Path(gj.__file__).parents[1])},  # this gear_jax
        )
        try:
            ready, _, _ = select.select([saver.stdout], [], [], 60)
            assert ready and saver.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.0, 0.8))
        finally:
            saver.send_signal(signal.SIGKILL)
            saver.wait()
        target = os.readlink(path / "current")
        interrupted += any(e.startswith("data-") and e != target for e in os.listdir(path))
        loaded = gj.Table.load(path)  # checks every checksum
        try:
            expected = previous if loaded.row_status()["priority"][0] == 2.0 else current
            assert_same_table(expected, loaded)
        finally:
            loaded.close()
    assert interrupted >= 1, "no kill landed inside a save"
    previous.save(path)  # a clean save afterwards removes what the killed ones left
    assert len([e for e in os.listdir(path) if e.startswith("data-")]) == 1


# -- saving while another process writes ---------------------------------------------------------------

# Inserts batches and writes episodes step by step (rows held for a while), through the native module
# only (no JAX: starts fast). Every step's payload is derived from its row's value v and the step.
WRITER = """
    import importlib.util, sys, time
    import numpy as np

    spec = importlib.util.spec_from_file_location("_native", sys.argv[1])
    native = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(native)
    table = native.NativeTable.attach(sys.argv[2], False)
    steps, width = int(sys.argv[3]), int(sys.argv[4])
    layout = table.layout()
    memory = np.frombuffer(table.mapping(), np.uint8)
    (v_at, v_stride, _), (p_at, p_stride, _) = layout["fields"]

    def payload(v):  # [steps, width] uint32
        k = np.arange(steps * width, dtype=np.uint64).reshape(steps, width)
        return ((v[..., None, None].astype(np.uint64) * 2654435761 + k * 40503) % 2**32).astype(np.uint32)

    v = 1
    print("ready", flush=True)
    while True:
        values = np.arange(v, v + 8, dtype=np.int64)
        v += 8
        vs = np.repeat(values[:, None], steps, axis=1)
        lengths = (values % steps + 1).astype(np.int32)
        table.insert([vs.reshape(-1).view(np.uint8), payload(values).reshape(-1).view(np.uint8)],
                     8, steps, lengths, np.ones(8, np.float32))
        row = table.claim()  # an episode written in place, one step at a time
        p = payload(np.array(v))
        for t in range(steps):
            memory[v_at + row * v_stride + t * 8:][:8].view(np.int64)[0] = v
            memory[p_at + row * p_stride + t * 4 * width:][:4 * width].view(np.uint32)[:] = p[t]
            time.sleep(0.0002)
        table.commit(row, steps, 2.0)
        v += 1
"""


def test_save_while_another_process_writes_holds_only_committed_rows(tmp_path, tables):
    steps, width = 3, 256
    spec = gj.TableSpec(
        {"v": gj.Field((), "int64"), "p": gj.Field((width,), "uint32")}, capacity=4096, max_steps=steps
    )
    table = tables(gj.Table.create(spec))
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(WRITER),
            gj._native.__file__,
            table.name,
            str(steps),
            str(width),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    checked = 0
    try:
        assert writer.stdout.readline().strip() == "ready"
        wait_until(lambda: table.size >= 1000, 120, "the writer's first 1000 rows")
        # Six saves, and more (for at most a minute) until the writer wrote during one of them: a save
        # takes 18-85 ms, during which a writer descheduled on a loaded machine may write nothing.
        round = saves_during_writes = 0
        more_until = time.monotonic() + 60
        while round < 6 or (not saves_during_writes and time.monotonic() < more_until):
            round += 1
            before = table.native.cursors()[1]
            table.save(tmp_path / "ckpt")
            saves_during_writes += table.native.cursors()[1] > before
            loaded = gj.Table.load(tmp_path / "ckpt")
            try:
                status = loaded.row_status()
                rows = np.flatnonzero(status["length"] > 0)
                assert loaded.size == rows.size and (status["generation"] % 2 == 0).all()
                empty = status["length"] == 0
                assert (status["priority"][empty] == 0).all()
                v = loaded.columns["v"][rows]
                k = np.arange(steps * width, dtype=np.uint64).reshape(steps, width)
                expected = ((v[:, :1, None].astype(np.uint64) * 2654435761 + k * 40503) % 2**32).astype(
                    np.uint32
                )
                lengths = status["length"][rows]
                used = np.arange(steps)[None, :] < lengths[:, None]
                assert (v == v[:, :1])[used].all(), "a row mixes steps of two episodes"
                assert (loaded.columns["p"][rows] == expected).all(axis=2)[used].all(), "a torn row was saved"
                assert (
                    lengths == np.where(status["priority"][rows] == 2.0, steps, v[:, 0] % steps + 1)
                ).all()
                checked += rows.size
            finally:
                loaded.close()
    finally:
        writer.kill()
        writer.wait()
    assert saves_during_writes, f"the writer wrote during none of the {round} saves"
    assert checked > 6 * 1000


# -- refusals ----------------------------------------------------------------------------------------


@pytest.fixture
def saved_checkpoint(tmp_path, tables):
    """(path, its data directory, the manifest) of a small saved checkpoint."""
    table = tables(filled_transitions())
    path = tmp_path / "ckpt"
    table.save(path)
    data = path / os.readlink(path / "current")
    return path, data, json.loads((data / "manifest.json").read_text())


def edit_manifest(data, change):
    """Changes the manifest and gives it a matching checksum (a forged manifest, not a damaged one)."""
    manifest = json.loads((data / "manifest.json").read_text())
    change(manifest)
    manifest["manifest_checksum"] = checkpoint.manifest_checksum(manifest)
    (data / "manifest.json").write_text(json.dumps(manifest))


def refused(path, match):
    with pytest.raises(gj.CheckpointError, match=match) as error:
        gj.Table.load(path)
    assert str(path) in str(error.value)
    return error.value


@pytest.mark.parametrize(
    "cursors,reason",
    [
        ({"next_seq": 2**64 - 1}, "next_seq=18446744073709551615"),  # the next insert would wrap it
        ({"commit_seq": 10**6}, "a table commits at most the rows it claimed"),
        ({"commit_seq": 3}, "past the 3 inserts"),  # rows inserted later than the counter says
        ({"next_seq": 5, "commit_seq": 5}, "past the 5 inserts"),  # 64 rows can not come of 5 claims
    ],
)
def test_refuses_cursors_the_rows_contradict(saved_checkpoint, cursors, reason):
    # A forged manifest (checksum recomputed) with next_seq = 2**64 - 1 loaded, and the next insert wrapped
    # the cursor, after which sampling looked at no row.
    path, data, manifest = saved_checkpoint
    assert manifest["next_seq"] > manifest["capacity"] and manifest["commit_seq"] >= 40
    edit_manifest(data, lambda m: m.update(cursors))
    refused(path, re.escape(reason))


def test_refuses_truncated_and_corrupted_files(saved_checkpoint):
    path, data, _ = saved_checkpoint
    field = data / "field-000.bin"
    raw = field.read_bytes()
    field.write_bytes(raw[:-7])
    refused(path, r"'field-000.bin' is truncated: 1273 bytes, the manifest says 1280")
    corrupted = bytearray(raw)
    corrupted[100] ^= 0x40
    field.write_bytes(bytes(corrupted))
    refused(path, r"'field-000.bin' is corrupted: its CRC-32 is [0-9a-f]{8}, the manifest says")
    field.write_bytes(raw + b"\0")
    refused(path, r"'field-000.bin' has 1281 bytes, the manifest says 1280")
    field.write_bytes(raw)
    state = data / "state.bin"
    raw = bytearray(state.read_bytes())
    raw[0] ^= 1
    state.write_bytes(bytes(raw))
    refused(path, r"'state.bin' is corrupted")


def test_refuses_a_damaged_manifest(saved_checkpoint):
    path, data, manifest = saved_checkpoint
    text = (data / "manifest.json").read_text()
    assert f'"next_seq": {manifest["next_seq"]},' in text
    (data / "manifest.json").write_text(
        text.replace(f'"next_seq": {manifest["next_seq"]},', '"next_seq": 1,')
    )
    refused(path, "manifest.json is corrupted: its checksum does not match its contents")


@pytest.mark.parametrize(
    "text,reason",
    [
        ("[" * 100_000 + "]" * 100_000, "RecursionError"),  # nesting deeper than the parser's stack
        ('{"next_seq": ' + "9" * 5000 + "}", "ValueError"),  # an int past Python's digit limit
    ],
)
def test_a_manifest_too_deep_or_with_a_huge_int_is_refused(saved_checkpoint, text, reason):
    # Both raised raw Python errors from the load (issue 32's probe).
    path, data, _ = saved_checkpoint
    (data / "manifest.json").write_text(text)
    refused(path, f"manifest.json is not valid JSON \\({reason}")


def test_a_refused_load_removes_the_table_it_created(saved_checkpoint):
    path, data, _ = saved_checkpoint
    (data / "length.bin").write_bytes(b"\0" * (data / "length.bin").stat().st_size)
    name = f"gear_jax_test_refused_{os.getpid()}"
    with pytest.raises(gj.CheckpointError, match="corrupted"):
        gj.Table.load(path, name=name)
    assert not os.path.exists(f"/dev/shm/{name}")


def test_refuses_foreign_directories(tmp_path, saved_checkpoint):
    path, data, _ = saved_checkpoint
    refused(tmp_path / "missing", "no such directory")
    (tmp_path / "empty").mkdir()
    refused(tmp_path / "empty", "no 'current' link: this is not a gear_jax checkpoint")
    (tmp_path / "file").write_text("x")
    refused(tmp_path / "file", "is not a directory")
    (data / "manifest.json").write_text("{not json")
    refused(path, "manifest.json is not valid JSON")
    (data / "manifest.json").write_text(json.dumps({"format": "something.else", "version": 1}))
    refused(path, "format 'something.else', not 'gear_jax.checkpoint'")
    (data / "manifest.json").unlink()
    refused(path, "no manifest.json: this is not a gear_jax checkpoint")
    os.unlink(path / "current")
    os.mkdir(path / "current")
    refused(path, "'current' is not a symbolic link")
    # Saving refuses to write into a directory that holds something else, and into a file.
    table = gj.Table.create(gj.TableSpec({"x": gj.Field((), "int32")}, capacity=4))
    try:
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "notes.txt").write_text("mine")
        with pytest.raises(
            gj.CheckpointError, match=r"'.*other': the directory is not empty and holds no gear_jax"
        ):
            table.save(tmp_path / "other")
        assert os.listdir(tmp_path / "other") == ["notes.txt"]
        with pytest.raises(gj.CheckpointError, match=r"'.*file': the path exists and is not a directory"):
            table.save(tmp_path / "file")
    finally:
        table.close()
    with pytest.raises(gj.CheckpointError, match="can not save a closed table"):
        table.save(tmp_path / "closed")


def test_a_first_save_killed_before_its_link_does_not_block_the_next(tmp_path, tables):
    path = tmp_path / "ckpt"
    path.mkdir(mode=0o700)
    (path / "lock").touch()
    (path / "data-18eab0d1fa3f2b00-0123456789abcdef").mkdir()
    refused(path, "no 'current' link")
    table = tables(filled_transitions())
    table.save(path)
    assert sorted(os.listdir(path)) == sorted(["current", "lock", os.readlink(path / "current")])
    assert_same_table(table, tables(gj.Table.load(path)))


def test_refuses_newer_and_invalid_versions(saved_checkpoint):
    path, data, _ = saved_checkpoint
    edit_manifest(data, lambda m: m.update(version=checkpoint.FORMAT_VERSION + 1))
    newer, reads = checkpoint.FORMAT_VERSION + 1, checkpoint.FORMAT_VERSION
    refused(path, rf"has checkpoint format version {newer}, newer than this gear_jax reads \({reads}\)")
    edit_manifest(data, lambda m: m.update(version="1"))
    refused(path, "invalid format version '1'")


@pytest.mark.parametrize("name", ["../escape.bin", "/etc/passwd", "sub/state.bin", "..", ""])
def test_refuses_file_names_that_escape(saved_checkpoint, name):
    path, data, _ = saved_checkpoint
    edit_manifest(data, lambda m: m["columns"][1].update(file=name))
    refused(path, f"names the file {name!r} for column 'length', which escapes the checkpoint directory")


def test_refuses_symbolic_links(tmp_path, saved_checkpoint):
    path, data, _ = saved_checkpoint
    outside = tmp_path / "outside.bin"
    shutil.copy(data / "length.bin", outside)
    (data / "length.bin").unlink()
    os.symlink(outside, data / "length.bin")
    refused(path, "'length.bin' is a symbolic link")
    (data / "length.bin").unlink()
    refused(path, "'length.bin' is missing")
    os.unlink(path / "current")
    os.symlink(data, path / "current")  # absolute
    refused(path, "'current' points at .*, outside the checkpoint directory")
    os.unlink(path / "current")
    os.symlink("../elsewhere", path / "current")
    refused(path, "'current' points at '../elsewhere', outside the checkpoint directory")


@pytest.mark.parametrize("name", ["manifest.json", "length.bin"])
def test_a_fifo_in_place_of_a_file_is_refused_without_blocking(saved_checkpoint, name):
    # Opening a FIFO for reading blocks until a writer opens it: the load must refuse it, not hang.
    path, data, _ = saved_checkpoint
    (data / name).unlink()
    os.mkfifo(data / name)
    outcome = {}

    def load():
        try:
            gj.Table.load(path)
        except BaseException as e:  # reported to the test thread
            outcome["error"] = e

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(20)
    if thread.is_alive():  # free the blocked open before failing
        os.close(os.open(data / name, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"Table.load blocked on a FIFO named {name}")
    assert isinstance(outcome.get("error"), gj.CheckpointError), outcome
    assert "is not a regular file" in str(outcome["error"]) and name in str(outcome["error"])


def test_refuses_spec_and_size_mismatches(saved_checkpoint):
    path, data, manifest = saved_checkpoint
    original = manifest

    def restore(m):
        m.clear()
        m.update(original)

    edit_manifest(data, lambda m: m.update(capacity=65))
    refused(path, "says capacity=65, max_steps=1, but its spec has capacity=64, max_steps=1")
    edit_manifest(data, restore)
    edit_manifest(data, lambda m: m["columns"][4].update(bytes=1))
    refused(
        path,
        r"entry for 'field-000.bin' is .*'bytes': 1.* but the spec implies .*'bytes': 1280.*do not match",
    )
    edit_manifest(data, restore)
    spec = json.loads(original["spec"])
    spec["fields"][0][1] = [6]  # obs of 6 floats: the files hold 5
    edit_manifest(data, lambda m: m.update(spec=json.dumps(spec)))
    refused(path, r"entry for 'field-000.bin' .*'shape': \[64, 1, 5\].* the spec implies .*\[64, 1, 6\]")
    edit_manifest(data, restore)
    edit_manifest(data, lambda m: m.update(spec="{}"))
    refused(path, "has no valid table spec")
    edit_manifest(data, restore)
    edit_manifest(data, lambda m: m["columns"].pop())
    refused(path, "lists 6 columns; its spec needs 7")
    edit_manifest(data, restore)
    edit_manifest(data, lambda m: m.update(next_seq=-1))
    refused(path, "invalid next_seq -1")
    edit_manifest(data, restore)
    gj.Table.load(path).close()  # the restored manifest loads


def test_load_into_a_name_in_use_is_refused(saved_checkpoint, tables):
    path, _, _ = saved_checkpoint
    taken = tables(gj.Table.create(gj.TableSpec({"x": gj.Field((), "int32")}, capacity=4)))
    with pytest.raises(gj.InvalidArgumentError, match="already exists; pick another name"):
        gj.Table.load(path, name=taken.name)
    assert taken.size == 0 and not taken.closed


def test_a_table_on_pooled_memory_saves_and_loads(tmp_path):
    # Memory from the pool keeps the generations of the table before it, so rows this table never
    # claimed have nonzero state words: its checkpoints were refused at load ("rows past the 1 the
    # manifest.json's next_seq claimed hold rows"), found by the property test of the whole API.
    spec = gj.TableSpec({"x": gj.Field((2,), "float32")}, capacity=4, max_steps=2)
    gj.clear_pool()  # so that the second table takes the first one's memory, whatever ran before
    limits = gj.pool_stats()
    gj.configure_pool(max_tables=8, max_bytes=16 << 30)
    try:
        save_and_load_on_pooled_memory(spec, tmp_path)
    finally:
        gj.clear_pool()
        gj.configure_pool(max_tables=limits["max_tables"], max_bytes=limits["max_bytes"])


def save_and_load_on_pooled_memory(spec, tmp_path):
    with gj.Table.create(spec) as first:
        first.insert({"x": np.ones((4, 2, 2), np.float32)})
    with gj.Table.create(spec) as table:
        status = table.row_status()
        assert (status["generation"] > 0).all() and table.size == 0, "the memory was not reused"
        table.insert({"x": np.full((1, 2, 2), 7.0, np.float32)})
        table.save(tmp_path / "ckpt")
        with gj.Table.load(tmp_path / "ckpt") as loaded:
            assert loaded.size == 1
            (row,) = np.flatnonzero(loaded.row_status()["length"] > 0)
            np.testing.assert_array_equal(loaded.columns["x"][row], np.full((2, 2), 7.0, np.float32))

"""Checkpoints of step rings (gear_jax/checkpoint.py): `Table.save(path)` and `Table.load(path)`.

A ring's checkpoint holds its committed episodes in insert order, each with only its own steps; a load
lays them back to back from the ring's start. Round trips restore the same episodes (steps, lengths,
priorities, insert order, rows) after the ring wrapped and retired old episodes; sampling and inserts go
on over the loaded ring; saves racing a writer process (and retirements landing mid-save, made on
purpose) keep only intact episodes; a checkpoint loads only into a table of its own kind and spec.
"""

import json
import os
import subprocess
import sys
import textwrap
import time
import zlib

import jax
import numpy as np
import pytest
from scipy import stats

import gear_jax as gj
from gear_jax import checkpoint
from tests.helpers.sampling import P_THRESHOLD
from tests.helpers.waits import wait_until

from . import test_checkpoint as checkpoint_tests

FIELDS = {"episode": gj.Field((), "int32"), "step": gj.Field((), "int32"), "obs": gj.Field((3,), "float32")}
STATUS = checkpoint_tests.STATUS
tables = checkpoint_tests.tables  # the fixture: tables to close when the test ends


def ring_spec(capacity=12, step_capacity=200, max_steps=40, fields=FIELDS):
    return gj.TableSpec(fields, capacity=capacity, step_capacity=step_capacity, max_steps=max_steps)


def padded_batch(episodes, lengths):
    """A [B, T] batch of the episodes, padded to the longest; each step names its episode and index."""
    longest = max(lengths)
    out = {name: np.zeros((len(episodes), longest, *f.shape), f.dtype) for name, f in FIELDS.items()}
    for i, (episode, length) in enumerate(zip(episodes, lengths)):
        out["episode"][i, :length] = episode
        out["step"][i, :length] = np.arange(length)
        out["obs"][i, :length] = np.stack([np.full(length, episode), np.arange(length), -np.ones(length)], 1)
    return out


def episodes_of(table):
    """{row: (status of the row, {field: its steps})} of every committed episode, its steps read from
    the ring with wrap-around."""
    status = table.row_status()
    ring = table.spec.step_capacity
    out = {}
    for row in np.flatnonzero((status["length"] > 0) & (status["generation"] % 2 == 0)):
        length, first = int(status["length"][row]), int(status["first_step"][row])
        slots = (first + np.arange(length)) % ring
        out[int(row)] = (
            {key: status[key][row] for key in (*STATUS, "first_step")},
            {name: table.columns[name][slots].copy() for name in table.spec.fields},
        )
    return out


def assert_intact(steps, episode_id, length):
    """The steps of one episode are its own: every step names the episode and its index."""
    np.testing.assert_array_equal(steps["episode"], np.full(length, episode_id))
    np.testing.assert_array_equal(steps["step"], np.arange(length))
    np.testing.assert_array_equal(steps["obs"][:, 0], np.full(length, episode_id, np.float32))


def assert_compacted(loaded):
    """The loaded episodes lie back to back from step 0 in insert order, and the step cursor follows."""
    status = loaded.row_status()
    rows = np.flatnonzero(status["length"] > 0)
    rows = rows[np.argsort(status["insert_seq"][rows])]
    lengths = status["length"][rows].astype(np.uint64)
    np.testing.assert_array_equal(status["first_step"][rows], np.cumsum(lengths) - lengths)
    assert loaded.native.step_cursors()[0] == lengths.sum()


def written_ring(rng, capacity=12, step_capacity=200, max_steps=40):
    """A ring that wrapped (next_step > 3 rings: old episodes retired), with varied lengths, priorities
    (0 included) and at least one live episode that wraps the ring's end; returns (table, next id)."""
    table = gj.Table.create(ring_spec(capacity, step_capacity, max_steps), reuse=False)
    next_id = 1
    while True:
        lengths = rng.integers(1, max_steps + 1, int(rng.integers(1, 4))).tolist()
        ids = list(range(next_id, next_id + len(lengths)))
        next_id += len(lengths)
        priorities = rng.uniform(0.2, 3.0, len(lengths)).astype(np.float32)
        priorities[rng.random(len(lengths)) < 0.15] = 0.0
        table.insert(padded_batch(ids, lengths), lengths=np.array(lengths), priorities=priorities)
        status = table.row_status()
        live = status["length"] > 0
        wraps = (status["first_step"] % step_capacity + status["length"] > step_capacity) & live
        if table.native.step_cursors()[0] > 3 * step_capacity and wraps.any() and live.sum() >= 5:
            return table, next_id


def test_round_trip_restores_the_same_episodes_compacted(tmp_path, tables):
    rng = np.random.default_rng(0)
    saved, next_id = written_ring(rng)
    tables(saved)
    jax.jit(lambda k: gj.sample(saved, k, 8, window=4))(jax.random.key(3))  # times_sampled > 0
    before = episodes_of(saved)
    assert sum(s["times_sampled"] for s, _ in before.values()) > 0
    path = tmp_path / "ckpt"
    saved.save(path)
    loaded = tables(gj.Table.load(path))
    assert loaded.spec == saved.spec
    after = episodes_of(loaded)
    assert sorted(after) == sorted(before)  # every episode, in the row it had
    for row, (status, steps) in before.items():
        loaded_status, loaded_steps = after[row]
        for key in STATUS:
            assert loaded_status[key] == status[key], (row, key)
        assert_intact(steps, int(steps["episode"][0]), int(status["length"]))
        for name in FIELDS:
            np.testing.assert_array_equal(loaded_steps[name], steps[name], err_msg=f"{row} {name}")
    assert_compacted(loaded)
    assert loaded.native.cursors() == saved.native.cursors()
    assert loaded.size == saved.size == len(before)
    assert loaded.native.selectable == saved.native.selectable
    manifest = json.loads((path / "current" / "manifest.json").read_text())
    assert manifest["version"] == 2 and manifest["layout"] == "step_ring"
    assert manifest["episodes"] == len(before) and manifest["episodes_left_out"] == 0
    assert manifest["steps"] == sum(int(s["length"]) for s, _ in before.values())
    assert manifest["next_step"] == saved.native.step_cursors()[0]

    # Ordered methods pick the same rows in the same order (same rows, insert_seq and priorities).
    for method in ("fifo", "lifo", "prioritized", "topk"):
        draw = jax.jit(lambda t, k, m=method: gj.sample(t, k, 6, method=m), static_argnums=0)
        a, b = draw(saved, jax.random.key(7)), draw(loaded, jax.random.key(7))
        np.testing.assert_array_equal(np.asarray(a.indices), np.asarray(b.indices), err_msg=method)
    fifo = np.asarray(gj.sample(loaded, jax.random.key(0), 5, method="fifo").indices)
    insert_seq = loaded.row_status()["insert_seq"]
    assert (np.diff(insert_seq[fifo].astype(np.int64)) > 0).all()

    # Windows of the loaded ring: each one of a live episode, with its own steps.
    window = 6
    s = jax.jit(lambda k: gj.sample(loaded, k, 64, window=window))(jax.random.key(1))
    batch = gj.gather(loaded, s, window=window)
    status = loaded.row_status()
    for i, row in enumerate(np.asarray(s.indices)):
        start, length = int(np.asarray(s.starts)[i]), int(status["length"][row])
        n = min(window, length - start)
        assert 0 <= start <= max(length - window, 0) and np.asarray(batch["valid"][i]).sum() == n
        np.testing.assert_array_equal(np.asarray(batch["step"][i, :n]), np.arange(start, start + n))
        np.testing.assert_array_equal(np.asarray(batch["episode"][i, :n]), before[int(row)][1]["episode"][0])

    # Inserts go on after the restored steps (wrapping the ring's end), and retire the oldest restored
    # episodes first.
    order = sorted(after, key=lambda r: after[r][0]["insert_seq"])
    assert manifest["steps"] > 80
    new_ids = list(range(next_id, next_id + 3))
    loaded.insert(padded_batch(new_ids, [40, 40, 40]), lengths=np.array([40, 40, 40]))
    now = episodes_of(loaded)
    new_rows = sorted(now, key=lambda r: now[r][0]["insert_seq"])[-3:]
    assert [int(now[r][0]["first_step"]) for r in new_rows] == [manifest["steps"] + k * 40 for k in range(3)]
    for row, episode_id in zip(new_rows, new_ids):
        assert_intact(now[row][1], episode_id, 40)
    survivors = [
        row for row in order if row in now and now[row][0]["insert_seq"] == after[row][0]["insert_seq"]
    ]
    assert 0 < len(survivors) < len(order)
    assert survivors == order[len(order) - len(survivors) :]  # a suffix in insert order
    for row in survivors:
        assert_intact(now[row][1], int(after[row][1]["episode"][0]), int(after[row][0]["length"]))


def test_uniform_windows_of_a_loaded_ring_are_uniform_over_every_valid_start(tmp_path, tables):
    """Needs the loaded ring's longest episode (the bound of the uniform law's rejection) restored."""
    lengths = [1, 3, 5, 8, 9, 12, 16, 20, 25, 31, 40]
    saved = tables(gj.Table.create(ring_spec(capacity=16, step_capacity=256), reuse=False))
    saved.insert(padded_batch(list(range(len(lengths))), lengths), lengths=np.array(lengths))
    saved.save(tmp_path / "ckpt")
    saved.close()
    loaded = tables(gj.Table.load(tmp_path / "ckpt"))
    window = 8
    windows = [(e, s) for e, n in enumerate(lengths) for s in range(max(n - window, 0) + 1)]
    fn = jax.jit(lambda k: gj.gather(loaded, gj.sample(loaded, k, 2000, window=window), window=window))
    counts = {}
    for i in range(15):
        batch = fn(jax.random.key(i))
        for key in zip(np.asarray(batch["episode"][:, 0]).tolist(), np.asarray(batch["step"][:, 0]).tolist()):
            counts[key] = counts.get(key, 0) + 1
    assert set(counts) <= set(windows)
    observed = np.array([counts.get(w, 0) for w in windows])
    assert stats.chisquare(observed).pvalue > P_THRESHOLD


def test_an_empty_ring_round_trips(tmp_path, tables):
    saved = tables(gj.Table.create(ring_spec(), reuse=False))
    saved.save(tmp_path / "ckpt")
    loaded = tables(gj.Table.load(tmp_path / "ckpt"))
    assert loaded.size == 0 and loaded.native.step_cursors()[0] == 0
    loaded.insert(padded_batch([5], [7]), lengths=np.array([7]))
    assert_intact(next(iter(episodes_of(loaded).values()))[1], 5, 7)


def test_checkpoint_size_is_the_stored_steps_not_the_ring(tmp_path, tables):
    fields = {"x": gj.Field((256,), "float32"), "episode": gj.Field((), "int32")}
    step_bytes = 256 * 4 + 4
    spec = gj.TableSpec(fields, capacity=64, step_capacity=1 << 14, max_steps=100)  # a 16 MiB ring
    table = tables(gj.Table.create(spec, reuse=False))
    lengths = [100, 37, 1, 64, 99]
    batch = {
        "x": np.random.default_rng(0).standard_normal((5, 100, 256), dtype=np.float32),
        "episode": np.repeat(np.arange(5, dtype=np.int32)[:, None], 100, 1),
    }
    table.insert(batch, lengths=np.array(lengths))
    path = tmp_path / "ckpt"
    table.save(path)
    data = path / os.readlink(path / "current")
    total = sum(f.stat().st_size for f in data.iterdir())
    stored = sum(lengths) * step_bytes
    assert stored <= total <= stored + 5 * 32 + 16384  # the steps, a few bytes per episode, the manifest
    assert (data / "field-000.bin").stat().st_size == sum(lengths) * 256 * 4
    loaded = tables(gj.Table.load(path))
    status = loaded.row_status()
    for row, length in enumerate(lengths):
        first = int(status["first_step"][row])
        np.testing.assert_array_equal(loaded.columns["x"][first : first + length], batch["x"][row, :length])


# -- retirements during a save ------------------------------------------------------------------------


class Meddling:
    """A table's native object whose `trigger`-th check of copied episodes first runs `meddle`: an
    insert that retires episodes after some of their steps were copied (and maybe written)."""

    def __init__(self, native, trigger, meddle):
        self._native, self._trigger, self._meddle = native, trigger, meddle
        self.checks = 0

    def __getattr__(self, name):
        return getattr(self._native, name)

    def read_states_at(self, rows):
        self.checks += 1
        if self.checks == self._trigger:
            self._meddle()
        return self._native.read_states_at(rows)


LENGTHS = [12, 45, 7, 70, 20, 9]  # steps [0, 163); chunks of 30 steps: ep 1 and ep 3 span chunks


@pytest.mark.parametrize(
    "trigger, expected",
    [
        (1, [2, 3, 4, 5]),  # ep 0 and ep 1 retired before the first check: neither saved
        (2, [0, 2, 3, 4, 5]),  # ep 1 retired after its first 18 steps were written: taken back
        (3, [0, 1, 2, 3, 4, 5]),  # both checked whole before the retirement
        (None, [0, 1, 2, 3, 4, 5]),
    ],
)
def test_episodes_retired_while_being_copied_are_left_out(tmp_path, tables, monkeypatch, trigger, expected):
    table = tables(gj.Table.create(ring_spec(capacity=16, step_capacity=256, max_steps=120), reuse=False))
    table.insert(padded_batch(list(range(len(LENGTHS))), LENGTHS), lengths=np.array(LENGTHS))

    def meddle():  # steps [163, 283): retires every episode below step 283 - 256 + 16 = 43 (ep 0, ep 1)
        table.insert(padded_batch([100], [120]), lengths=np.array([120]))

    meddling = Meddling(table.native, trigger, meddle)
    monkeypatch.setattr(gj.Table, "native", property(lambda self: meddling))
    monkeypatch.setattr(checkpoint, "CHUNK_BYTES", 30 * 20)  # 30 steps of 20 bytes a chunk
    taken_back = []
    take_back = checkpoint._StepFiles.take_back
    monkeypatch.setattr(
        checkpoint._StepFiles, "take_back", lambda files: (taken_back.append(1), take_back(files))
    )
    path = tmp_path / "ckpt"
    table.save(path)
    # 163 steps in chunks of 30; with the first check, the rest of ep 1 (steps 30 to 57) is not copied.
    assert meddling.checks == (5 if trigger == 1 else 6)
    assert bool(taken_back) == (trigger == 2)
    monkeypatch.undo()
    loaded = tables(gj.Table.load(path))
    episodes = episodes_of(loaded)
    saved_ids = sorted(int(steps["episode"][0]) for _, steps in episodes.values())
    assert saved_ids == expected
    for status, steps in episodes.values():
        assert_intact(steps, int(steps["episode"][0]), LENGTHS[int(steps["episode"][0])])
    assert_compacted(loaded)
    manifest = json.loads((path / "current" / "manifest.json").read_text())
    assert manifest["episodes_left_out"] == len(LENGTHS) - len(expected)
    assert manifest["steps"] == sum(LENGTHS[e] for e in expected)


# -- saving while another process writes ---------------------------------------------------------------

# Inserts batches of 8 episodes through the native module only (no JAX: starts fast). Every step carries
# its episode's id and index, and a payload derived from both; an episode's length comes from its id.
WRITER = """
    import importlib.util, sys, time
    import numpy as np

    spec = importlib.util.spec_from_file_location("_native", sys.argv[1])
    native = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(native)
    table = native.NativeTable.attach(sys.argv[2], False)
    longest, width = int(sys.argv[3]), int(sys.argv[4])
    steps = np.arange(longest, dtype=np.uint64)

    def payload(ids):  # [B, T, width] uint32
        k = np.arange(width, dtype=np.uint64)
        v = ids.astype(np.uint64)[:, None, None] * 2654435761 + steps[None, :, None] * 40503 + k * 97
        return (v % 2**32).astype(np.uint32)

    v = 1
    print("ready", flush=True)
    while True:
        ids = np.arange(v, v + 8, dtype=np.int64)
        v += 8
        lengths = (ids * 7919 % longest + 1).astype(np.int32)
        episode = np.repeat(ids[:, None], longest, axis=1).astype(np.int32)
        step = np.repeat(np.arange(longest, dtype=np.int32)[None], 8, axis=0)
        fields = [a.reshape(-1).view(np.uint8) for a in (episode, step, payload(ids))]
        table.insert(fields, 8, longest, lengths, np.ones(8, np.float32))
        time.sleep(0.0003)
"""


def test_save_while_another_process_inserts_holds_only_intact_episodes(tmp_path, tables, monkeypatch):
    longest, width = 64, 64
    fields = {
        "episode": gj.Field((), "int32"),
        "step": gj.Field((), "int32"),
        "p": gj.Field((width,), "uint32"),
    }
    spec = gj.TableSpec(fields, capacity=1024, step_capacity=8192, max_steps=longest)
    table = tables(gj.Table.create(spec, reuse=False))
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(WRITER),
            gj._native.__file__,
            table.name,
            str(longest),
            str(width),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    checked = left_out = 0
    try:
        assert writer.stdout.readline().strip() == "ready"
        wait_until(lambda: table.native.step_cursors()[0] > 3 * 8192, 120, "the writer to lap the ring")
        # Eight saves, and more (for at most a minute) until the writer wrote during one of them: a save
        # takes 18-85 ms, during which a writer descheduled on a loaded machine may write nothing.
        round = saves_during_writes = 0
        more_until = time.monotonic() + 60
        while round < 8 or (not saves_during_writes and time.monotonic() < more_until):
            # Whole-ring chunks, and chunks of 64 KiB (episodes span chunks, retirements land mid-save).
            monkeypatch.setattr(checkpoint, "CHUNK_BYTES", (4 << 20) if round % 2 == 0 else (64 << 10))
            round += 1
            before = table.native.cursors()[1]
            table.save(tmp_path / "ckpt")
            saves_during_writes += table.native.cursors()[1] > before
            manifest = json.loads((tmp_path / "ckpt" / "current" / "manifest.json").read_text())
            left_out += manifest["episodes_left_out"]
            loaded = gj.Table.load(tmp_path / "ckpt")
            try:
                status = loaded.row_status()
                rows = np.flatnonzero(status["length"] > 0)
                assert loaded.size == rows.size == manifest["episodes"]  # 0 if the writer lapped the save
                assert_compacted(loaded)
                k = np.arange(width, dtype=np.uint64)
                for row in rows:
                    first, length = int(status["first_step"][row]), int(status["length"][row])
                    ids = loaded.columns["episode"][first : first + length]
                    episode_id = int(ids[0])
                    assert (ids == episode_id).all(), "an episode mixes steps of two episodes"
                    assert length == episode_id * 7919 % longest + 1
                    np.testing.assert_array_equal(
                        loaded.columns["step"][first : first + length], np.arange(length)
                    )
                    t = np.arange(length, dtype=np.uint64)[:, None]
                    expected = ((episode_id * 2654435761 + t * 40503 + k * 97) % 2**32).astype(np.uint32)
                    assert (loaded.columns["p"][first : first + length] == expected).all(), "a torn episode"
                checked += rows.size
            finally:
                loaded.close()
    finally:
        writer.kill()
        writer.wait()
    assert saves_during_writes, f"the writer wrote during none of the {round} saves"
    assert checked > 100, f"only {checked} episodes saved ({left_out} left out)"


# -- refusals ----------------------------------------------------------------------------------------


def edit_manifest(data, change):
    """Changes the manifest and gives it a matching checksum (a forged manifest, not a damaged one)."""
    manifest = json.loads((data / "manifest.json").read_text())
    change(manifest)
    manifest["manifest_checksum"] = checkpoint.manifest_checksum(manifest)
    (data / "manifest.json").write_text(json.dumps(manifest))


def test_a_checkpoint_loads_only_into_a_table_of_its_kind_and_spec(tmp_path, tables):
    ring = tables(gj.Table.create(ring_spec(), reuse=False))
    ring.insert(padded_batch([1, 2], [5, 9]), lengths=np.array([5, 9]))
    padded = tables(gj.Table.create(gj.TableSpec(FIELDS, capacity=12, max_steps=40), reuse=False))
    padded.insert(padded_batch([1, 2], [5, 9]), lengths=np.array([5, 9]))
    ring.save(tmp_path / "ring")
    padded.save(tmp_path / "padded")
    name = f"gear_jax_test_ring_refused_{os.getpid()}"

    def into(spec):
        return lambda _: gj.Table.create(spec, name=name, reuse=False)

    cases = [
        (
            "ring",
            gj.TableSpec(FIELDS, capacity=12, max_steps=40),
            r"it holds a step ring \(step_capacity=200\), and "
            r"the table to load into is a table of padded rows \(max_steps=40\)",
        ),
        (
            "padded",
            ring_spec(),
            r"it holds a table of padded rows \(max_steps=40\), and the table to load into "
            r"is a step ring \(step_capacity=200\)",
        ),
        (
            "ring",
            ring_spec(step_capacity=400),
            r"another spec than the checkpoint's \(step_capacity=200 != 400\)",
        ),
        (
            "ring",
            ring_spec(fields={**FIELDS, "obs": gj.Field((4,), "float32")}),
            r"fields \{.*obs: float32\[3\]\}",
        ),
    ]
    for source, spec, match in cases:
        with pytest.raises(gj.CheckpointError, match=match) as error:
            checkpoint.load(tmp_path / source, into(spec))
        assert str(tmp_path / source) in str(error.value)
        assert not os.path.exists(f"/dev/shm/{name}")  # the table made for the load is removed

    # Forged manifests whose kind and spec disagree.
    ring_data = tmp_path / "ring" / os.readlink(tmp_path / "ring" / "current")
    padded_data = tmp_path / "padded" / os.readlink(tmp_path / "padded" / "current")
    ring_manifest = json.loads((ring_data / "manifest.json").read_text())
    edit_manifest(
        ring_data, lambda m: m.update(spec=gj.TableSpec(FIELDS, capacity=12, max_steps=40).to_json())
    )
    with pytest.raises(
        gj.CheckpointError,
        match=r"holds a step ring's episodes \(layout 'step_ring'\), but its "
        r"spec is a table of padded rows \(max_steps=40\)",
    ):
        gj.Table.load(tmp_path / "ring")
    edit_manifest(padded_data, lambda m: m.update(spec=ring_spec().to_json()))
    with pytest.raises(
        gj.CheckpointError, match=r"holds padded rows \(no layout\), but its spec is a step ring"
    ):
        gj.Table.load(tmp_path / "padded")
    edit_manifest(ring_data, lambda m: m.update(ring_manifest, version=1))
    with pytest.raises(gj.CheckpointError, match="in format version 1, which has no step rings"):
        gj.Table.load(tmp_path / "ring")
    edit_manifest(ring_data, lambda m: m.update(ring_manifest, steps=201))
    with pytest.raises(gj.CheckpointError, match=r"invalid steps 201 \(expected an int in \[0, 200\]\)"):
        gj.Table.load(tmp_path / "ring")
    edit_manifest(ring_data, lambda m: m.update(ring_manifest, steps=15))
    with pytest.raises(
        gj.CheckpointError, match=r"'field-000.bin' .*'shape': \[14\].* the spec implies .*\[15\]"
    ):
        gj.Table.load(tmp_path / "ring")
    edit_manifest(ring_data, lambda m: m.update(ring_manifest, layout="rows_of_steps"))
    with pytest.raises(
        gj.CheckpointError, match="has layout 'rows_of_steps'; this gear_jax reads padded rows"
    ):
        gj.Table.load(tmp_path / "ring")
    edit_manifest(ring_data, lambda m: m.update(ring_manifest))
    loaded = tables(gj.Table.load(tmp_path / "ring"))  # the restored manifest loads
    assert sorted(int(s["length"]) for s, _ in episodes_of(loaded).values()) == [5, 9]


def test_refuses_a_damaged_episode_index(tmp_path, tables):
    """Status files that pass their checksums (forged) but would lay episodes out wrongly."""
    ring = tables(gj.Table.create(ring_spec(), reuse=False))
    ring.insert(padded_batch([1, 2, 3], [5, 9, 2]), lengths=np.array([5, 9, 2]))
    path = tmp_path / "ckpt"
    ring.save(path)
    data = path / os.readlink(path / "current")
    manifest = json.loads((data / "manifest.json").read_text())

    def forge(file, values):
        raw = np.ascontiguousarray(values).tobytes()
        (data / file).write_bytes(raw)

        def change(m):
            m.update(manifest)
            for entry in m["columns"]:
                if entry["file"] == file:
                    entry["checksum"] = f"{zlib.crc32(raw):08x}"

        edit_manifest(data, change)

    original = {f: (data / f).read_bytes() for f in ("row.bin", "length.bin")}
    forge("row.bin", np.array([0, 1, 1], np.int32))
    with pytest.raises(gj.CheckpointError, match=r"'row.bin' holds rows outside \[0, 12\) or one twice"):
        gj.Table.load(path)
    forge("row.bin", np.frombuffer(original["row.bin"], np.int32))
    forge("length.bin", np.array([5, 9, 3], np.int32))
    with pytest.raises(
        gj.CheckpointError, match=r"'length.bin' holds lengths .* not summing to the 16 steps"
    ):
        gj.Table.load(path)


def test_closing_a_ring_while_its_steps_are_copied_out_does_not_unmap_them_under_the_copy():
    """A save copies the ring's steps with the GIL released (`copy_ring_steps`); a close from another
    thread meanwhile must wait for the copy to let go of the memory, not unmap it under the copy. Run in
    a fresh process, whose crash (SIGSEGV) the test would see."""
    from tests.helpers.processes import start_python

    process = start_python(
        """
        import threading, time, numpy as np, gear_jax as gj
        gj.configure_pool(max_tables=0)  # the close unmaps at once (no pool keeps the memory)
        steps = 1 << 16
        obs = {"obs": gj.Field((1024,), "uint8")}
        t = gj.Table.create(gj.TableSpec(obs, capacity=64, max_steps=1024, step_capacity=steps))
        t.insert({"obs": np.ones((60, 1024, 1024), np.uint8)})
        native, out = t.native, [np.empty((steps, 1024), np.uint8)]
        starts, counts = np.zeros(64, np.uint64), np.full(64, 1024, np.int64)
        copying, copies = threading.Event(), []

        def copy():
            copying.set()
            try:
                while True:
                    native.copy_ring_steps(starts, counts, out)  # 64 MiB, the GIL released
                    copies.append(1)
            except gj.TableClosedError:
                copies.append("closed")

        thread = threading.Thread(target=copy)
        thread.start()
        copying.wait()
        time.sleep(0.01)
        t.close()
        thread.join(60)
        print("copies", len(copies) - 1, copies[-1], flush=True)
        """
    )
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, (process.returncode, out, err[-2000:])
    assert out.strip().endswith("closed"), out

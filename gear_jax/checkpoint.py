"""Crash-safe checkpoints of tables on disk: `Table.save(path)` and `Table.load(path)`.

A checkpoint is a directory `path` (mode 0700) that holds

    current         a symbolic link to the data directory of the latest complete save
    data-<hex>/     manifest.json and one file per column (mode 0600)
    lock            taken (flock) by a save while it writes, so that two saves to one path take turns

A data directory holds one raw file per column, in the host's byte order (little-endian): the four
row-status columns (`state.bin`: generation << 32 | float32 priority bits, `length.bin`,
`insert_seq.bin`, `times_sampled.bin`) and `field-<i>.bin` for the i-th field,
`[capacity, max_steps, *shape]` of the field's dtype, rows without padding. `manifest.json` names the
format and its version, the table's spec, capacity and max_steps, the allocator cursor (`next_seq`)
and the last insert_seq handed out (`commit_seq`), and for every column its file, dtype, shape, byte
size and CRC-32; the manifest has a CRC-32 of its own (`manifest_checksum`).

Step rings (`TableSpec(step_capacity=N)`; format version 2, `"layout": "step_ring"` in the manifest;
tables of padded rows are still saved as version 1, unchanged). The checkpoint holds the ring's
committed episodes, N of them with S steps in all, in insert order: five status files of one entry per
episode (`row.bin`: int32, its row of the index; `state.bin`, `length.bin`, `insert_seq.bin`,
`times_sampled.bin` as above), and `field-<i>.bin`, `[S, *shape]`, the episodes' own steps back to back
in the same order (no padding, nothing else of the ring: the files hold S steps however large
step_capacity is). No first_step is stored: a load lays the episodes back to back from the start of a
new ring, episode k at first_step = length_0 + ... + length_(k-1), so each field file is read straight
into ring slots [0, S); the episodes go back into their rows, with their priorities, generations,
insert_seq and times_sampled (FIFO and LIFO order as before), the step cursor (next_step) is set to S
(the next insert claims the steps after them, and retires the restored episodes oldest first when it
needs their slots), and the row cursor and insert_seq counter are restored as for padded rows. The
manifest adds step_capacity, the counts `episodes` and `steps`, the saved table's `next_step`, and
`episodes_left_out` (rows being written when the save read the index, and episodes retired or replaced
before their steps were copied).

A checkpoint loads only into a table of its own kind and spec: a manifest whose layout and spec
disagree, and a `create` that makes a table of another kind or spec, are refused (CheckpointError).

Crash safety. A save writes a new data directory beside the current one, fsyncs every file and the
directory, then points `current` at it by renaming a new symbolic link over the old one (one atomic
rename), fsyncs `path`, and only then deletes the previous data directory. A process killed at any
instant leaves `current` naming a complete data directory: the previous one until the rename, the
new one after it (both are complete and fsynced at that moment, so a power loss before the final
fsync of `path` gives either). What a killed save leaves behind (an unfinished data directory, a
temporary link) is removed by the next save to the same path.

A load opens the manifest and every column file before it reads any: a save that replaces the
checkpoint meanwhile deletes names, not the files the load holds open.

Format. Plain files and a JSON manifest, chosen by measurement against orbax-checkpoint, and CRC-32
(zlib) checksums, chosen against BLAKE2b and SHA-256 for speed: they catch damaged and truncated files,
not deliberate tampering (docs/BENCHMARKS.md, "checkpoints: Table.save / Table.load against orbax").
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import secrets
import stat
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gear_jax._version import __version__
from gear_jax.errors import CheckpointError, InvalidArgumentError, SpecError
from gear_jax.spec import TableSpec
from gear_jax.table import STATE_GENERATION_SHIFT, state_generation, state_priority

if TYPE_CHECKING:
    from gear_jax.table import Table

FORMAT_NAME = "gear_jax.checkpoint"
# The newest format version this gear_jax reads. 1: tables of padded rows; 2: step rings. A table of
# padded rows is still saved as version 1, byte for byte as before (a gear_jax that reads only version 1
# loads it); a step ring is saved as version 2, which such a gear_jax refuses as newer.
FORMAT_VERSION = 2
PADDED_FORMAT_VERSION = 1
STEP_RING_FORMAT_VERSION = 2
STEP_RING_LAYOUT = "step_ring"  # the manifest's "layout" of a step ring (absent: padded rows)
MANIFEST = "manifest.json"
CURRENT = "current"
LOCK = "lock"
DATA_PREFIX = "data-"
LINK_PREFIX = ".current-"
CHECKSUM = "crc32"
CHUNK_BYTES = 4 << 20  # bytes of rows (every column together) copied, checksummed and written at once
MAX_MANIFEST_BYTES = 1 << 20
# Waits (seconds) before each new copy of rows that changed while they were copied; rows still
# changing after the last are saved as empty.
RETRY_WAITS = (0.0, 0.0005, 0.002)

_OUR_ENTRY = re.compile(r"^(data-[0-9a-f]+-[0-9a-f]{16}|\.current-[0-9a-f]{16})$")  # names saves make
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


@dataclass(frozen=True)
class _Column:
    """One file of a checkpoint: a row-status column or a field."""

    name: str  # "state", "length", "insert_seq", "times_sampled", or "field:<field name>"
    file: str
    dtype: np.dtype
    shape: tuple[int, ...]  # the first axis is the table's rows

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.row_bytes

    def describe(self) -> dict[str, Any]:
        """The manifest entry, without the checksum."""
        return {
            "column": self.name,
            "file": self.file,
            "dtype": self.dtype.name,
            "shape": list(self.shape),
            "bytes": self.nbytes,
        }


STATUS_COLUMNS = (
    ("state", "uint64"),
    ("length", "int32"),
    ("insert_seq", "uint64"),
    ("times_sampled", "uint32"),
)


# A step ring's checkpoint holds its saved episodes, in insert order: each one's row of the index and
# status (one entry per episode), and its steps back to back in the field files.
RING_STATUS_COLUMNS = (
    ("row", "int32"),
    ("state", "uint64"),
    ("length", "int32"),
    ("insert_seq", "uint64"),
    ("times_sampled", "uint32"),
)


def _columns_for(spec: TableSpec, episodes: int = 0, steps: int = 0) -> list[_Column]:
    """Every column a checkpoint of a table of `spec` holds, in file order: status, then fields. A step
    ring's columns hold `episodes` episodes of `steps` steps in all."""
    if spec.step_ring:
        columns = [
            _Column(name, f"{name}.bin", np.dtype(dtype), (episodes,)) for name, dtype in RING_STATUS_COLUMNS
        ]
        rows: tuple[int, ...] = (steps,)
    else:
        columns = [
            _Column(name, f"{name}.bin", np.dtype(dtype), (spec.capacity,)) for name, dtype in STATUS_COLUMNS
        ]
        rows = (spec.capacity, spec.max_steps)
    for index, (name, field) in enumerate(spec.fields.items()):
        columns.append(_Column(f"field:{name}", f"field-{index:03d}.bin", field.dtype, (*rows, *field.shape)))
    return columns


def _table_views(table: Table) -> dict[str, np.ndarray]:
    """The table's numpy views, by column name."""
    views = dict(table.status_columns)
    views.update({f"field:{name}": column for name, column in table.columns.items()})
    return views


# -- saving ------------------------------------------------------------------------------------------


def checkpoint_path(path: Any, op: str) -> Path:
    """`path` (a str or os.PathLike of str) as a Path; InvalidArgumentError naming `op` otherwise."""
    try:
        text = os.fspath(path)
    except TypeError:
        text = None
    if not isinstance(text, str) or not text:
        raise InvalidArgumentError(
            f"{op}: path={path!r} must be a non-empty str or os.PathLike (e.g. pathlib.Path) naming the "
            "checkpoint directory"
        )
    problem = _path_problem(text)
    if problem:
        raise InvalidArgumentError(f"{op}: path={_shown_path(text)} {problem}")
    return Path(text)


def _shown_path(text: str, limit: int = 120) -> str:
    """repr(text) for a message, its middle cut out when long (an over-long path is the fault)."""
    shown = repr(text)
    if len(shown) <= limit:
        return shown
    return f"{shown[: limit // 2]}...{shown[-limit // 2 :]} ({len(text)} characters)"


def _path_problem(text: str) -> str:
    """Why no file system can hold the checkpoint path `text` ("" when one may): a NUL byte, a name
    longer than the file system where it would be made takes, or a path longer than the system takes.
    The limits are those of the nearest existing directory above the path (os.pathconf)."""
    if "\0" in text:
        return "holds a NUL byte ('\\0'), which no file name can hold; remove it"
    try:
        raw = os.fsencode(text)
    except UnicodeEncodeError as e:
        return (
            f"holds {text[e.start : e.end]!r}, which the file system encoding ({e.encoding}) cannot write; "
            "use other characters"
        )
    path = Path(text)
    existing = next((p for p in (path, *path.parents) if _is_directory(p)), Path("."))
    name_max, path_max = _limit(existing, "PC_NAME_MAX", 255), _limit(existing, "PC_PATH_MAX", 4096)
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > name_max and part != os.sep:
            return (
                f"has a name of {size} bytes ({part[:24]!r}...); the file system there takes names of at "
                f"most {name_max} bytes: use a shorter name"
            )
    if len(raw) >= path_max:
        return (
            f"is {len(raw)} bytes long; the system takes paths shorter than {path_max} bytes: use a shorter "
            "path (or a relative one from a nearer working directory)"
        )
    return ""


def _is_directory(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):  # too long a path, say
        return False


def _limit(directory: Path, name: str, default: int) -> int:
    """os.pathconf(directory, name), or `default` where the system does not say."""
    try:
        value = os.pathconf(directory, name)
    except (OSError, ValueError):
        return default
    return value if value > 0 else default


def save(table: Table, path: str | os.PathLike[str]) -> None:
    """Writes a checkpoint of `table` to the directory `path` (see the module docstring for the layout
    and the crash-safety argument). Replaces an earlier checkpoint at `path` atomically.

    Consistency: row by row. Every saved row is a committed row as it was at some instant during the
    save, fields and status together; rows are copied a few MiB at a time, so two rows may come from
    different instants (a row overwritten after its chunk was copied keeps its old contents, one
    overwritten before keeps its new ones). Rows held by a writer (odd generation) when their chunk is
    copied, and rows that change again on each of a few re-copies, are saved as empty rows (length 0,
    priority 0, generation of their next publication), which load restores as unselectable. The
    allocator cursor and the insert_seq counter are read after the last row. A table nobody writes
    meanwhile is saved exactly.

    A step ring is saved episode by episode: the index's status is read first (a seqlock read of every
    row), then the steps of each episode committed in it are copied out of the ring a few MiB at a time
    and its state read again; an episode retired or replaced meanwhile is left out. Every saved episode
    is exact and all of them were committed together at the instant the index was read (so they fit in
    the ring together); episodes committed after that instant are not saved. Memory: a few bytes per row
    of the index and two chunks of steps, never the ring.

    Raises:
      CheckpointError: `path` exists and is not a gear_jax checkpoint directory (a file, or a
        non-empty directory without the `current` link), or the table is closed.
    """
    root = checkpoint_path(path, "Table.save")
    if table.closed:
        raise CheckpointError(
            f"checkpoint '{path}': can not save a closed table ({table.name!r}); save before closing it"
        )
    native = table.native
    root_fd = _open_checkpoint_root(root)
    try:
        lock_fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=root_fd)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)  # released when the process dies, too
            previous = _current_target(root_fd)
            _remove_leftovers(root_fd, keep=previous)
            data_name = f"{DATA_PREFIX}{time.time_ns():x}-{secrets.token_hex(8)}"
            os.mkdir(data_name, 0o700, dir_fd=root_fd)
            try:
                try:
                    _write_data_directory(table, native, root_fd, data_name)
                except OSError as e:  # a full disk, a quota, an I/O error: named, with the path
                    full = (
                        " (free space there or save elsewhere)"
                        if e.errno in (errno.ENOSPC, errno.EDQUOT)
                        else ""
                    )
                    raise CheckpointError(
                        f"checkpoint '{root}': writing the save failed: {e.strerror or e} (errno {e.errno})"
                        f"{full}; the previous checkpoint there, if any, is unchanged"
                    ) from e
                link_name = f"{LINK_PREFIX}{secrets.token_hex(8)}"
                os.symlink(data_name, link_name, dir_fd=root_fd)
                os.replace(link_name, CURRENT, src_dir_fd=root_fd, dst_dir_fd=root_fd)  # the commit point
                os.fsync(root_fd)
            except BaseException:
                if _current_target(root_fd) != data_name:
                    remove_entry(root_fd, data_name)
                raise
            if previous is not None and previous != data_name:
                remove_entry(root_fd, previous)
                os.fsync(root_fd)
        finally:
            os.close(lock_fd)
    finally:
        os.close(root_fd)


def _open_checkpoint_root(root: Path) -> int:
    """The checkpoint directory `root`, made (mode 0700, parent fsynced) when missing; refuses a path
    that holds something else."""
    try:
        try:
            os.mkdir(root, 0o700)
        except FileNotFoundError:
            raise CheckpointError(
                f"checkpoint '{root}': its parent directory '{root.parent}' does not exist; create it first "
                "(the save makes the checkpoint directory itself, not its parents)"
            ) from None
        parent_fd = os.open(root.parent if str(root.parent) else ".", os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(parent_fd)
        finally:
            os.close(parent_fd)
    except FileExistsError:
        pass
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except NotADirectoryError:
        raise CheckpointError(f"checkpoint '{root}': the path exists and is not a directory") from None
    try:
        entries = set(os.listdir(root_fd))
        # Without `current`, only what a killed first save leaves (the lock, its data directory and
        # link) may be there: anything else is someone else's directory.
        ours = LOCK in entries and all(e == LOCK or _OUR_ENTRY.match(e) for e in entries)
        if entries and CURRENT not in entries and not ours:
            raise CheckpointError(
                f"checkpoint '{root}': the directory is not empty and holds no gear_jax checkpoint "
                f"(no '{CURRENT}' link); save to a new path or an empty directory"
            )
        if CURRENT in entries:
            _current_target(root_fd, root)  # refuses a foreign `current`
    except BaseException:
        os.close(root_fd)
        raise
    return root_fd


def _current_target(root_fd: int, root: Path | None = None) -> str | None:
    """The data directory `current` names, None when there is no `current` yet."""
    try:
        target = os.readlink(CURRENT, dir_fd=root_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise CheckpointError(
                f"checkpoint '{root}': '{CURRENT}' is not a symbolic link; this is not a gear_jax checkpoint"
            ) from None
        raise
    if not _is_plain_name(target) or not target.startswith(DATA_PREFIX):
        raise CheckpointError(
            f"checkpoint '{root}': '{CURRENT}' points at {target!r}, outside the checkpoint directory "
            f"(expected a '{DATA_PREFIX}...' directory inside it)"
        )
    return target


def _remove_leftovers(root_fd: int, keep: str | None) -> None:
    """Removes what killed saves left: data directories `current` does not name, temporary links."""
    for entry in os.listdir(root_fd):
        if entry != keep and _OUR_ENTRY.match(entry):
            remove_entry(root_fd, entry)


def remove_entry(root_fd: int, entry: str) -> None:
    """Removes the file, link or directory tree `entry` of the directory `root_fd`, never following links."""
    try:
        info = os.stat(entry, dir_fd=root_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
        try:
            for inner in os.listdir(fd):
                remove_entry(fd, inner)
        finally:
            os.close(fd)
        os.rmdir(entry, dir_fd=root_fd)
    else:
        os.unlink(entry, dir_fd=root_fd)


def _write_data_directory(table: Table, native: Any, root_fd: int, data_name: str) -> None:
    """Writes every column and the manifest into the new data directory, each fsynced, then the directory."""
    spec = table.spec
    data_fd = os.open(data_name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=root_fd)
    try:
        fds: dict[str, int] = {}
        try:
            for c in _columns_for(spec):  # the files' names do not depend on the counts of a ring
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                fds[c.name] = os.open(c.file, flags, 0o600, dir_fd=data_fd)
            if spec.step_ring:
                columns, checksums, described = _write_ring_columns(table, native, fds)
            else:
                columns, checksums, described = _write_row_columns(table, native, fds)
            for fd in fds.values():
                os.fsync(fd)
        finally:
            for fd in fds.values():
                os.close(fd)
        manifest = {
            "format": FORMAT_NAME,
            "version": STEP_RING_FORMAT_VERSION if spec.step_ring else PADDED_FORMAT_VERSION,
            **({"layout": STEP_RING_LAYOUT} if spec.step_ring else {}),
            "spec": spec.to_json(),
            "capacity": spec.capacity,
            "max_steps": spec.max_steps,
            **described,
            "checksum": CHECKSUM,
            "columns": [{**c.describe(), "checksum": f"{checksums[c.name]:08x}"} for c in columns],
            "saved_at_unix_s": time.time(),
            "gear_jax_version": __version__,
        }
        manifest["manifest_checksum"] = manifest_checksum(manifest)
        text = json.dumps(manifest, indent=1).encode()
        fd = os.open(
            MANIFEST,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=data_fd,
        )
        try:
            write_all(fd, memoryview(text))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.fsync(data_fd)
    finally:
        os.close(data_fd)


def _write_row_columns(
    table: Table, native: Any, fds: dict[str, int]
) -> tuple[list[_Column], dict[str, int], dict[str, Any]]:
    """A table of padded rows: every row of every column, streamed. Returns the columns, their CRC-32s
    and the manifest's entries about the rows."""
    spec = table.spec
    columns = _columns_for(spec)
    checksums, saved_empty, states_summary = _stream_rows(
        native, spec, columns, _table_views(table), fds, table.times_sampled_counts
    )
    next_seq, commit_seq = native.cursors()  # after the last row: no saved row is newer
    return (
        columns,
        checksums,
        {
            "next_seq": int(next_seq),
            "commit_seq": int(commit_seq),
            "size": states_summary[0],
            "selectable": states_summary[1],
            "rows_saved_empty": saved_empty,
        },
    )


def manifest_checksum(manifest: dict[str, Any]) -> str:
    """The CRC-32 of a manifest's canonical JSON without its own checksum: covers the values no column
    checksum does (cursors, spec, the column checksums themselves)."""
    body = {key: value for key, value in manifest.items() if key != "manifest_checksum"}
    return f"{zlib.crc32(json.dumps(body, sort_keys=True, separators=(',', ':')).encode()):08x}"


def write_all(fd: int, data: memoryview) -> None:
    """Writes every byte of `data` to the file `fd` (os.write may write fewer at once)."""
    while data:
        data = data[os.write(fd, data) :]


class _ChunkBuffers:
    """One chunk of rows of every column, contiguous, ready to checksum and write."""

    def __init__(self, columns: list[_Column], rows: int):
        self.arrays = {c.name: np.empty((rows, *c.shape[1:]), c.dtype) for c in columns}


def _stream_rows(
    native: Any,
    spec: TableSpec,
    columns: list[_Column],
    views: dict[str, np.ndarray],
    fds: dict[str, int],
    times_sampled_counts: Any,
) -> tuple[dict[str, int], int, tuple[int, int]]:
    """Copies the rows chunk by chunk (a seqlock read: states, fields and status, states again, then
    re-copies of rows that changed), and writes each chunk on a second thread while the next is copied.

    Returns the columns' CRC-32s, the count of rows saved as empty because they were being written,
    and (size, selectable) of the saved rows.
    """
    capacity = spec.capacity
    rows_per_chunk = max(1, min(capacity, CHUNK_BYTES // sum(c.row_bytes for c in columns)))
    checksums = {c.name: 0 for c in columns}
    saved_empty = size = selectable = 0
    buffers = [_ChunkBuffers(columns, rows_per_chunk) for _ in range(2)]
    pending: list[Future | None] = [None, None]

    def write_chunk(chunk: _ChunkBuffers, rows: int) -> None:  # hashing and writing release the GIL
        for c in columns:
            data = memoryview(chunk.arrays[c.name][:rows].reshape(-1).view(np.uint8))
            checksums[c.name] = zlib.crc32(data, checksums[c.name])
            write_all(fds[c.name], data)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="gear_jax_checkpoint") as writer:
        for index, start in enumerate(range(0, capacity, rows_per_chunk)):
            stop = min(capacity, start + rows_per_chunk)
            slot = index % 2
            if pending[slot] is not None:
                pending[slot].result()  # this buffer's previous chunk is written
            chunk = buffers[slot]
            empty = _copy_consistent_rows(native, views, chunk.arrays, start, stop)
            counts = chunk.arrays["times_sampled"][: stop - start]
            counts[:] = times_sampled_counts(counts)  # a checkpoint keeps counts, not tags
            states = chunk.arrays["state"][: stop - start]
            saved_empty += empty
            committed = (state_generation(states) & np.uint64(1)) == 0
            size += int(np.count_nonzero(committed & (chunk.arrays["length"][: stop - start] > 0)))
            selectable += int(np.count_nonzero(committed & (state_priority(states) > 0)))
            pending[slot] = writer.submit(write_chunk, chunk, stop - start)
        for future in pending:
            if future is not None:
                future.result()
    return checksums, saved_empty, (size, selectable)


def _copy_consistent_rows(
    native: Any, views: dict[str, np.ndarray], out: dict[str, np.ndarray], start: int, stop: int
) -> int:
    """Copies rows [start, stop) of every column into `out` so that each row is a committed row as of
    one instant, or an empty row; returns how many were saved as empty. `out["state"]` gets the states
    the copies are consistent with."""
    rows = stop - start
    before = native.read_states(start, rows)
    for name, view in views.items():
        if name != "state":
            np.copyto(out[name][:rows], view[start:stop])
    after = native.read_states(start, rows)
    unsettled = _unsettled(before, after)
    for wait in RETRY_WAITS:
        if not unsettled.any():
            break
        time.sleep(wait)
        again = np.flatnonzero(unsettled)
        before = native.read_states(start, rows)
        for name, view in views.items():
            if name != "state":
                out[name][again] = view[start + again]
        recheck = native.read_states(start, rows)
        settled_now = np.zeros(rows, bool)
        settled_now[again] = ~_unsettled(before[again], recheck[again])
        after[settled_now] = recheck[settled_now]
        unsettled &= ~settled_now
    states = out["state"][:rows]
    states[:] = after
    empty = np.flatnonzero(unsettled)
    if empty.size:
        # The generation the row's writer will publish it with: an empty row that no Sample matches.
        generation = (state_generation(after[empty]) + np.uint64(1)) & ~np.uint64(1)
        states[empty] = generation << STATE_GENERATION_SHIFT
        out["length"][empty] = 0
        out["insert_seq"][empty] = 0
        out["times_sampled"][empty] = 0
    return int(empty.size)


def _unsettled(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """Rows whose copy may be torn: held by a writer (odd generation) or republished in between."""
    generation = state_generation(after)
    return (state_generation(before) != generation) | ((generation & np.uint64(1)) == 1)


# -- saving a step ring ------------------------------------------------------------------------------


def _write_ring_columns(
    table: Table, native: Any, fds: dict[str, int]
) -> tuple[list[_Column], dict[str, int], dict[str, Any]]:
    """A step ring: its committed episodes as of one instant of the save, in insert order, each with its
    own steps only. Returns the columns (sized by what was saved), their CRC-32s and the manifest's
    entries about the episodes.

    The status of every row is read first (a seqlock read, as rows are), and every episode committed in
    it is a candidate; its steps are then copied out of the ring (wrapping its end) a few MiB at a time
    and its state read again: an episode whose generation changed meanwhile was retired or replaced
    (its slots may be overwritten) and is left out. Each saved episode kept its generation from the
    status read to after its last step was copied, so all of them were committed, with exactly the
    saved steps, at the instant that read ended; the ring held them together then, so their steps fit
    in a ring of step_capacity."""
    spec = table.spec
    snapshot, unsettled = _snapshot_status(native, spec.capacity, dict(table.status_columns))
    snapshot["times_sampled"] = table.times_sampled_counts(snapshot["times_sampled"])
    states = snapshot["state"]
    candidates = np.flatnonzero(((state_generation(states) & np.uint64(1)) == 0) & (snapshot["length"] > 0))
    candidates = candidates[np.argsort(snapshot["insert_seq"][candidates], kind="stable")]  # insert order
    step_bytes = {f"field:{name}": field.step_bytes for name, field in spec.fields.items()}
    files = _StepFiles({name: fds[name] for name in step_bytes}, step_bytes)
    keep = _stream_ring_steps(native, spec, snapshot, candidates, files)
    next_seq, commit_seq = native.cursors()  # after the last episode: no saved one is newer
    next_step = native.step_cursors()[0]
    rows = candidates[keep]
    steps = int(snapshot["length"][rows].astype(np.int64).sum())
    if steps > spec.step_capacity or any(files.offsets[n] != steps * b for n, b in step_bytes.items()):
        raise CheckpointError(  # the ring's retirement (step_ring.cc) rules this out
            f"checkpoint of table {table.name!r}: the saved episodes hold {steps} steps, which no ring of "
            f"step_capacity={spec.step_capacity} held at once; not saved"
        )
    status = {
        "row": rows.astype(np.int32),
        "state": states[rows],
        "length": snapshot["length"][rows],
        "insert_seq": snapshot["insert_seq"][rows],
        "times_sampled": snapshot["times_sampled"][rows],
    }
    checksums = dict(files.checksums)
    for name, values in status.items():
        data = memoryview(np.ascontiguousarray(values).view(np.uint8))
        checksums[name] = zlib.crc32(data)
        write_all(fds[name], data)
    columns = _columns_for(spec, rows.size, steps)
    return (
        columns,
        checksums,
        {
            "step_capacity": spec.step_capacity,
            "episodes": int(rows.size),
            "steps": steps,
            "next_seq": int(next_seq),
            "commit_seq": int(commit_seq),
            "next_step": int(next_step),
            "size": int(rows.size),
            "selectable": int(np.count_nonzero(state_priority(status["state"]) > 0)),
            "episodes_left_out": unsettled + int(candidates.size - rows.size),
        },
    )


def _snapshot_status(
    native: Any, capacity: int, views: dict[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], int]:
    """Every row's status columns (first_step included), each row a committed row as of one instant or
    empty (held by a writer or changing on every re-read: length 0); and how many were such. A few
    bytes per row of the index, never the steps."""
    snapshot = {name: np.empty(capacity, view.dtype) for name, view in views.items()}
    rows_per_chunk = max(1, CHUNK_BYTES // sum(view.dtype.itemsize for view in views.values()))
    unsettled = 0
    for start in range(0, capacity, rows_per_chunk):
        stop = min(capacity, start + rows_per_chunk)
        out = {name: values[start:stop] for name, values in snapshot.items()}
        unsettled += _copy_consistent_rows(native, views, out, start, stop)
    return snapshot, unsettled


class _StepFiles:
    """The field files of a step ring's checkpoint, appended to chunk by chunk on the writer thread.

    An episode longer than what is left of a chunk goes on into the next, so its first steps are written
    before it is known to be intact: a write marks where such an episode begins (offset and CRC-32 of
    every file), and `take_back` returns there when it turns out changed. What follows overwrites its
    bytes, and `finish` cuts the files where the last write ended."""

    def __init__(self, fds: dict[str, int], step_bytes: dict[str, int]):
        self.fds = fds
        self.step_bytes = step_bytes
        self.offsets = {name: 0 for name in fds}
        self.checksums = {name: 0 for name in fds}
        self.marks = {name: (0, 0) for name in fds}

    def write(self, arrays: dict[str, np.ndarray], steps: int, mark_at: int | None) -> None:
        """Appends steps [0, steps) of every field; with `mark_at`, marks the place of step mark_at."""
        for name, array in arrays.items():
            data = memoryview(array[:steps].reshape(-1).view(np.uint8))
            if mark_at is None:
                self._append(name, data)
            else:
                split = mark_at * self.step_bytes[name]
                self._append(name, data[:split])
                self.marks[name] = (self.offsets[name], self.checksums[name])
                self._append(name, data[split:])

    def _append(self, name: str, data: memoryview) -> None:  # hashing and writing release the GIL
        self.checksums[name] = zlib.crc32(data, self.checksums[name])
        offset = self.offsets[name]
        while data:
            written = os.pwrite(self.fds[name], data, offset)
            data, offset = data[written:], offset + written
        self.offsets[name] = offset

    def take_back(self) -> None:
        for name, (offset, checksum) in self.marks.items():
            self.offsets[name], self.checksums[name] = offset, checksum

    def finish(self) -> None:
        for name, fd in self.fds.items():
            os.ftruncate(fd, self.offsets[name])


def _stream_ring_steps(
    native: Any, spec: TableSpec, snapshot: dict[str, np.ndarray], candidates: np.ndarray, files: _StepFiles
) -> np.ndarray:
    """Copies the steps of the candidate episodes (rows, in the order they are saved) out of the ring, a
    chunk of steps at a time (natively, wrapping the ring's end), checks each episode's state after
    every chunk that holds steps of it, and writes the chunk (without the episodes that changed) on a
    second thread while the next one is copied. Returns which candidates were saved."""
    lengths = snapshot["length"][candidates].astype(np.int64)
    first_steps = snapshot["first_step"][candidates]
    generations = state_generation(snapshot["state"][candidates])
    keep = np.ones(candidates.size, bool)
    # The candidates' steps back to back: candidate i holds [ends[i] - lengths[i], ends[i]).
    ends = np.cumsum(lengths)
    begins = ends - lengths
    total = int(ends[-1]) if ends.size else 0
    names = [f"field:{name}" for name in spec.fields]
    per_chunk = max(1, min(total, CHUNK_BYTES // sum(files.step_bytes.values())))
    buffers = [
        {f"field:{name}": np.empty((per_chunk, *f.shape), f.dtype) for name, f in spec.fields.items()}
        for _ in range(2 if total else 0)
    ]
    pending: list[Future | None] = [None, None]
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="gear_jax_checkpoint") as writer:
        position, index = 0, 0
        while position < total:
            stop = min(position + per_chunk, total)
            slot = index % 2
            index += 1
            if pending[slot] is not None:
                pending[slot].result()  # this buffer's previous chunk is written
            chunk = buffers[slot]
            first = int(np.searchsorted(ends, position, side="right"))  # the episode holding step `position`
            last = int(np.searchsorted(ends, stop, side="left"))  # the one holding step stop - 1
            pieces = np.arange(first, last + 1)
            skip = np.maximum(position - begins[pieces], 0)  # steps of each episode in earlier chunks
            counts = np.minimum(ends[pieces], stop) - begins[pieces] - skip
            native.copy_ring_steps(
                first_steps[pieces] + skip.astype(np.uint64), counts, [chunk[name] for name in names]
            )
            intact = state_generation(native.read_states_at(candidates[pieces])) == generations[pieces]
            keep[pieces[~intact]] = False
            if skip[0] > 0 and not intact[0]:  # begun in an earlier chunk: take its steps written back
                writer.submit(files.take_back)
            goes_on = int(ends[last]) > stop  # the last episode goes on into the next chunk
            position = stop
            if goes_on and not intact[-1]:
                position, goes_on = int(ends[last]), False  # the rest of a changed episode: not copied
            steps = int(counts.sum())
            arrays = chunk
            if not intact.all():
                mask = np.repeat(intact, counts)
                arrays = {name: chunk[name][:steps][mask] for name in names}
                steps = int(np.count_nonzero(mask))
            # Where an episode that goes on into the next chunk begins in this one (none when it began
            # in an earlier chunk: the mark stays where that chunk put it).
            mark_at = steps - int(counts[-1]) if goes_on and skip[-1] == 0 else None
            pending[slot] = writer.submit(files.write, arrays, steps, mark_at)
        for future in pending:
            if future is not None:
                future.result()
    files.finish()
    return keep


# -- loading -----------------------------------------------------------------------------------------


@dataclass
class _Checkpoint:
    """A validated manifest and the open files of its columns."""

    root: Path
    spec: TableSpec
    manifest: dict[str, Any]
    columns: list[_Column]
    checksums: dict[str, int]
    fds: dict[str, int]

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}


def load(
    path: str | os.PathLike[str],
    create: Callable[[TableSpec], Table],
) -> Table:
    """Reads the checkpoint at `path` into a new table made by `create(spec)` (a fresh table: every
    row empty, generation 0); see `Table.load`. A table of another kind (padded rows or step ring) or
    spec than the checkpoint's is refused (CheckpointError naming both) and closed."""
    checkpoint = _open_checkpoint(checkpoint_path(path, "Table.load"))
    try:
        table = create(checkpoint.spec)
        try:
            if table.spec != checkpoint.spec:
                raise _refuse(checkpoint.root, _spec_mismatch(checkpoint.spec, table.spec))
            if checkpoint.spec.step_ring:
                _restore_ring(table, checkpoint)
            else:
                _restore(table, checkpoint)
        except BaseException:
            table.close()
            raise
    finally:
        checkpoint.close()
    return table


def _refuse(root: Path, reason: str) -> CheckpointError:
    return CheckpointError(f"checkpoint '{root}': {reason}")


def _kind(spec: TableSpec) -> str:
    if spec.step_ring:
        return f"a step ring (step_capacity={spec.step_capacity})"
    return f"a table of padded rows (max_steps={spec.max_steps})"


def _spec_mismatch(saved: TableSpec, target: TableSpec) -> str:
    """Why a checkpoint of a table of `saved` does not load into a table of `target`."""
    if saved.step_ring != target.step_ring:
        return (
            f"it holds {_kind(saved)}, and the table to load into is {_kind(target)}: a checkpoint "
            "loads only into a table of its own kind and spec"
        )
    differences = [
        f"{attr}={getattr(saved, attr)} != {getattr(target, attr)}"
        for attr in ("capacity", "max_steps", "step_capacity")
        if getattr(saved, attr) != getattr(target, attr)
    ]
    if saved.fields != target.fields:

        def fields(spec: TableSpec) -> str:
            return ", ".join(f"{n}: {f.dtype.name}{list(f.shape)}" for n, f in spec.fields.items())

        differences.append(f"fields {{{fields(saved)}}} != {{{fields(target)}}}")
    return (
        f"the table to load into has another spec than the checkpoint's ({'; '.join(differences)}); "
        "a checkpoint loads only into a table of its own spec"
    )


def _is_plain_name(name: Any) -> bool:
    """Whether `name` names an entry of a directory itself: no separator, not '.' or '..'."""
    return isinstance(name, str) and bool(_PLAIN_NAME.match(name)) and name not in (".", "..")


class _Replaced(Exception):
    """A save replaced the checkpoint while a load opened it (its data directory went away)."""


def _open_checkpoint(root: Path) -> _Checkpoint:
    """Resolves `current`, reads and checks the manifest, and opens every column file (so that a save
    that replaces the checkpoint meanwhile can not delete them from under the load). A save that deletes
    the data directory between the link's read and the last file's open makes the load start again from
    the new link."""
    attempts = 5
    for attempt in range(attempts):
        try:
            return _open_checkpoint_once(root)
        except (FileNotFoundError, _Replaced) as e:
            if attempt == attempts - 1:
                if isinstance(e, _Replaced):
                    raise e.__cause__ from None
                raise
            time.sleep(0.01 * (attempt + 1))  # a save replaced the checkpoint meanwhile: again
    raise AssertionError("unreachable")


def _still_current(root: Path, target: str) -> bool:
    """Whether `current` under `root` still names the data directory `target`, and it still exists."""
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if _current_target(root_fd) != target:
            return False
        os.stat(target, dir_fd=root_fd, follow_symlinks=False)
        return True
    except (OSError, CheckpointError):
        return False
    finally:
        os.close(root_fd)


def _open_checkpoint_once(root: Path) -> _Checkpoint:
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint '{root}': no such directory") from None
    except NotADirectoryError:
        raise _refuse(root, "is not a directory; a checkpoint is a directory Table.save wrote") from None
    try:
        target = _current_target(root_fd, root)
        if target is None:
            raise _refuse(
                root, f"no '{CURRENT}' link: this is not a gear_jax checkpoint (or no save finished)"
            )
        try:
            data_fd = os.open(
                target, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd
            )
        except FileNotFoundError:
            raise
        except OSError:
            raise _refuse(root, f"'{CURRENT}' points at {target!r}, which is not a directory") from None
    finally:
        os.close(root_fd)
    try:
        try:
            manifest = _read_manifest(root, data_fd)
            spec, columns, checksums = _check_manifest(root, manifest)
            fds: dict[str, int] = {}
            try:
                for column in columns:
                    fds[column.name] = _open_column(root, data_fd, column)
            except BaseException:
                for fd in fds.values():
                    os.close(fd)
                raise
        except CheckpointError as e:
            # A file missing because a save deleted this data directory meanwhile is no damage: again.
            if not _still_current(root, target):
                raise _Replaced() from e
            raise
    finally:
        os.close(data_fd)
    return _Checkpoint(root, spec, manifest, columns, checksums, fds)


def _open_for_reading(name: str, data_fd: int) -> int:
    """`name` in the data directory opened for reading without blocking: O_NONBLOCK, so that a FIFO or a
    device in its place cannot hang the open (the caller checks the type with fstat), cleared again."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=data_fd)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_manifest(root: Path, data_fd: int) -> dict[str, Any]:
    try:
        fd = _open_for_reading(MANIFEST, data_fd)
    except FileNotFoundError:
        raise _refuse(root, f"no {MANIFEST}: this is not a gear_jax checkpoint") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _refuse(root, f"{MANIFEST} is a symbolic link; refusing to follow it") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO would block the read forever
            raise _refuse(root, f"{MANIFEST} is not a regular file")
        text = os.read(fd, MAX_MANIFEST_BYTES + 1)
    finally:
        os.close(fd)
    if len(text) > MAX_MANIFEST_BYTES:
        raise _refuse(root, f"{MANIFEST} is larger than {MAX_MANIFEST_BYTES} bytes: not a gear_jax manifest")
    try:
        manifest = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # ValueError: JSON's, an int too long
        raise _refuse(
            root,
            f"{MANIFEST} is not valid JSON ({type(e).__name__}: {str(e)[:200]}): not a gear_jax "
            "checkpoint, or damaged",
        ) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise _refuse(
            root, f"{MANIFEST} has format {found!r}, not {FORMAT_NAME!r}: not a gear_jax checkpoint"
        )
    version = manifest.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _refuse(root, f"{MANIFEST} has an invalid format version {version!r}")
    if version > FORMAT_VERSION:
        raise _refuse(
            root,
            f"has checkpoint format version {version}, newer than this gear_jax reads ({FORMAT_VERSION}); "
            "load it with a newer gear_jax",
        )
    if manifest.get("manifest_checksum") != manifest_checksum(manifest):
        raise _refuse(root, f"{MANIFEST} is corrupted: its checksum does not match its contents")
    return manifest


def _check_manifest(root: Path, manifest: dict[str, Any]) -> tuple[TableSpec, list[_Column], dict[str, int]]:
    """The spec, the columns it implies and their checksums, after checking the manifest against them."""
    try:
        spec = TableSpec.from_json(manifest["spec"])
    except (KeyError, TypeError, ValueError, SpecError) as e:
        raise _refuse(root, f"{MANIFEST} has no valid table spec ({e})") from None
    if manifest.get("capacity") != spec.capacity or manifest.get("max_steps") != spec.max_steps:
        raise _refuse(
            root,
            f"{MANIFEST} says capacity={manifest.get('capacity')}, max_steps={manifest.get('max_steps')}, "
            f"but its spec has capacity={spec.capacity}, max_steps={spec.max_steps}",
        )
    episodes, steps = _check_layout(root, manifest, spec)
    for key in ("next_seq", "commit_seq"):
        value = manifest.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**64:
            raise _refuse(root, f"{MANIFEST} has an invalid {key} {value!r}")
    if manifest.get("checksum") != CHECKSUM:
        raise _refuse(
            root, f"{MANIFEST} uses checksum {manifest.get('checksum')!r}; this gear_jax checks {CHECKSUM!r}"
        )
    entries = manifest.get("columns")
    expected = _columns_for(spec, episodes, steps)
    if not isinstance(entries, list) or len(entries) != len(expected):
        found = len(entries) if isinstance(entries, list) else entries
        raise _refuse(root, f"{MANIFEST} lists {found} columns; its spec needs {len(expected)}")
    columns, checksums = [], {}
    for entry, column in zip(entries, expected):
        if not isinstance(entry, dict):
            raise _refuse(root, f"{MANIFEST} has a column entry that is not an object: {entry!r}")
        name = entry.get("file")
        if not _is_plain_name(name):
            raise _refuse(
                root,
                f"{MANIFEST} names the file {name!r} for column {column.name!r}, which escapes the "
                "checkpoint directory (absolute paths, separators and '..' are refused)",
            )
        described = {k: entry.get(k) for k in ("column", "dtype", "shape", "bytes")}
        wanted = {k: v for k, v in column.describe().items() if k != "file"}
        if described != wanted:
            raise _refuse(
                root,
                f"{MANIFEST}'s entry for {name!r} is {described}, but the spec implies {wanted} "
                "(spec and sizes do not match)",
            )
        try:
            checksums[column.name] = int(entry["checksum"], 16)
        except (KeyError, TypeError, ValueError):
            raise _refuse(root, f"{MANIFEST} has no valid checksum for {name!r}") from None
        columns.append(_Column(column.name, name, column.dtype, column.shape))
    if len({c.file for c in columns}) != len(columns):
        raise _refuse(root, f"{MANIFEST} names one file for two columns")
    return spec, columns, checksums


def _check_layout(root: Path, manifest: dict[str, Any], spec: TableSpec) -> tuple[int, int]:
    """Checks that the manifest's layout (padded rows, or a step ring's episodes) is its spec's kind;
    returns a step ring's counts of episodes and steps (0, 0 for padded rows)."""
    layout = manifest.get("layout")
    if layout is not None and layout != STEP_RING_LAYOUT:
        raise _refuse(
            root,
            f"{MANIFEST} has layout {layout!r}; this gear_jax reads padded rows (no layout) and "
            f"{STEP_RING_LAYOUT!r}",
        )
    ring = layout == STEP_RING_LAYOUT
    if ring and manifest["version"] < STEP_RING_FORMAT_VERSION:
        raise _refuse(
            root,
            f"{MANIFEST} has layout {STEP_RING_LAYOUT!r} in format version {manifest['version']}, which "
            f"has no step rings (they came with version {STEP_RING_FORMAT_VERSION})",
        )
    if ring != spec.step_ring:
        held = f"a step ring's episodes (layout {STEP_RING_LAYOUT!r})" if ring else "padded rows (no layout)"
        raise _refuse(
            root,
            f"{MANIFEST} holds {held}, but its spec is {_kind(spec)}: the checkpoint's kind and its spec "
            "do not match",
        )
    if not ring:
        return 0, 0
    if manifest.get("step_capacity") != spec.step_capacity:
        raise _refuse(
            root,
            f"{MANIFEST} says step_capacity={manifest.get('step_capacity')!r}, but its spec has "
            f"step_capacity={spec.step_capacity}",
        )
    counts = []
    for key, high in (("episodes", spec.capacity), ("steps", spec.step_capacity)):
        value = manifest.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= high:
            raise _refuse(root, f"{MANIFEST} has an invalid {key} {value!r} (expected an int in [0, {high}])")
        counts.append(value)
    return counts[0], counts[1]


def _open_column(root: Path, data_fd: int, column: _Column) -> int:
    """The column's file, opened for reading after checking it is a regular file of the manifest's size."""
    try:
        fd = _open_for_reading(column.file, data_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _refuse(
                root, f"'{column.file}' is a symbolic link (it may point outside the checkpoint); refusing it"
            ) from None
        if e.errno == errno.ENOENT:
            raise _refuse(root, f"'{column.file}' is missing (the checkpoint is incomplete)") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refuse(root, f"'{column.file}' is not a regular file")
        if info.st_size < column.nbytes:
            raise _refuse(
                root,
                f"'{column.file}' is truncated: {info.st_size} bytes, the manifest says {column.nbytes}",
            )
        if info.st_size > column.nbytes:
            raise _refuse(
                root,
                f"'{column.file}' has {info.st_size} bytes, the manifest says {column.nbytes} "
                "(spec and sizes do not match)",
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_chunks(
    checkpoint: _Checkpoint, column: _Column, rows_per_chunk: int, into: np.ndarray | None = None
) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, rows) chunks of a column file, checksummed; raises CheckpointError after the last
    chunk when the checksum does not match (or the file shrank meanwhile).

    A second thread reads one chunk ahead while this one checksums the last (both release the GIL).
    With `into` (the table's view of the column) C-contiguous, chunks are read straight into it and the
    rows yielded are its own; otherwise into a buffer the caller copies from.
    """
    fd = checkpoint.fds[column.name]
    capacity = column.shape[0]
    direct = into is not None and into.flags.c_contiguous
    buffers = (
        [] if direct else [np.empty((rows_per_chunk, *column.shape[1:]), column.dtype) for _ in range(2)]
    )

    def read(start: int, slot: int) -> np.ndarray:
        rows = min(rows_per_chunk, capacity - start)
        array = into[start : start + rows] if direct else buffers[slot][:rows]
        data = memoryview(array.reshape(-1).view(np.uint8))
        offset, done = start * column.row_bytes, 0
        while done < len(data):
            got = os.preadv(fd, [data[done:]], offset + done)
            if got == 0:
                raise _refuse(checkpoint.root, f"'{column.file}' is truncated (it shrank while being read)")
            done += got
        return array

    crc = 0
    starts = list(range(0, capacity, rows_per_chunk))  # none for a step ring's checkpoint of no episodes
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="gear_jax_checkpoint") as reader:
        ahead = reader.submit(read, starts[0], 0) if starts else None
        for index, start in enumerate(starts):
            array = ahead.result()
            if index + 1 < len(starts):
                ahead = reader.submit(read, starts[index + 1], (index + 1) % 2)
            crc = zlib.crc32(memoryview(array.reshape(-1).view(np.uint8)), crc)
            yield start, array
    if crc != checkpoint.checksums[column.name]:
        raise _refuse(
            checkpoint.root,
            f"'{column.file}' is corrupted: its CRC-32 is {crc:08x}, the manifest says "
            f"{checkpoint.checksums[column.name]:08x}",
        )


def _restore(table: Table, checkpoint: _Checkpoint) -> None:
    """Fills the new table: fields and status first (rows stay empty, so nothing reads them), then the
    state words after every checksum passed, then the cursors and counters."""
    views = _table_views(table)
    max_steps = checkpoint.spec.max_steps
    for column in checkpoint.columns:
        if column.name == "state":
            continue
        rows_per_chunk = max(1, min(column.shape[0], CHUNK_BYTES // column.row_bytes))
        view = views[column.name]
        for start, rows in _read_chunks(checkpoint, column, rows_per_chunk, into=view):
            if column.name == "length" and ((rows < 0) | (rows > max_steps)).any():
                raise _refuse(checkpoint.root, f"'{column.file}' holds lengths outside [0, {max_steps}]")
            if not view.flags.c_contiguous:  # else read into the view itself
                view[start : start + len(rows)] = rows
    _check_cursors(checkpoint, views["insert_seq"])
    claimed = min(checkpoint.manifest["next_seq"], checkpoint.spec.capacity)
    if (views["length"][claimed:] != 0).any():
        raise _refuse(
            checkpoint.root, f"rows past the {claimed} the {MANIFEST}'s next_seq claimed hold steps"
        )
    state = next(c for c in checkpoint.columns if c.name == "state")
    rows_per_chunk = max(1, min(state.shape[0], CHUNK_BYTES // state.row_bytes))
    for start, states in _read_chunks(
        checkpoint, state, rows_per_chunk
    ):  # checked whole before any row shows
        _check_saved_states(checkpoint, state.file, states, "rows")
        # Rows never claimed are empty: priority 0 (their lengths were checked above). Their generations
        # need not be 0: a table on memory from the pool keeps the generations of the table before it.
        if (state_priority(states[max(0, claimed - start) :]) != 0).any():
            raise _refuse(
                checkpoint.root, f"rows past the {claimed} the {MANIFEST}'s next_seq claimed hold rows"
            )
    native = table.native
    for start, states in _read_chunks(checkpoint, state, rows_per_chunk):
        native.publish_restored_rows(start, states)
    native.restore_cursors(checkpoint.manifest["next_seq"], checkpoint.manifest["commit_seq"])


MAX_SEQ = 2**62  # more rows than any table hands out: a cursor past it is forged or damaged


def _check_cursors(checkpoint: _Checkpoint, insert_seq: np.ndarray, rows: np.ndarray | None = None) -> None:
    """Refuses cursors the saved rows contradict (a save reads them after its last row): a row cursor
    past MAX_SEQ (the next insert would wrap it), fewer commits than rows claimed allow, a row's
    insert_seq past the commit count, or (`rows`: a step ring's saved rows) a saved row past the rows
    claimed. A padded table's rows past the cursor are checked by the caller as it reads their states."""
    next_seq, commit_seq = checkpoint.manifest["next_seq"], checkpoint.manifest["commit_seq"]
    capacity = checkpoint.spec.capacity
    if next_seq > MAX_SEQ or commit_seq > next_seq:
        raise _refuse(
            checkpoint.root,
            f"{MANIFEST} has next_seq={next_seq} and commit_seq={commit_seq}: a table commits at most the "
            f"rows it claimed, and claims fewer than {MAX_SEQ}",
        )
    if insert_seq.size and int(insert_seq.max()) > commit_seq:
        raise _refuse(
            checkpoint.root,
            f"a saved row has insert_seq {int(insert_seq.max())}, past the {commit_seq} inserts the "
            f"{MANIFEST} counts",
        )
    if rows is not None and rows.size and int(rows.max()) >= min(next_seq, capacity):
        raise _refuse(
            checkpoint.root,
            f"a saved episode lies in row {int(rows.max())}, past the {min(next_seq, capacity)} rows the "
            f"{MANIFEST}'s next_seq says were claimed",
        )


def _check_saved_states(checkpoint: _Checkpoint, file: str, states: np.ndarray, what: str) -> None:
    """Refuses state words no save writes (odd generations, priorities not finite and >= 0): `what`
    ("rows", "episodes") of the file `file`."""
    priority = state_priority(states)
    if ((state_generation(states) & np.uint64(1)) == 1).any() or not (
        np.isfinite(priority) & (priority >= 0)
    ).all():
        raise _refuse(
            checkpoint.root, f"'{file}' holds {what} no save writes (odd generations or bad priorities)"
        )


def _restore_ring(table: Table, checkpoint: _Checkpoint) -> None:
    """Fills a new step ring: the episodes' status is read and checked whole first; then the step cursor
    is raised past the restored steps, the steps are read straight into the ring's slots [0, steps) (the
    episodes back to back in insert order, as saved) and the status into the episodes' rows, while every
    row is still empty; then the rows are published, and the cursors and counters restored last."""
    spec, manifest = checkpoint.spec, checkpoint.manifest
    columns = {c.name: c for c in checkpoint.columns}
    status: dict[str, np.ndarray] = {}
    for name, _ in RING_STATUS_COLUMNS:
        column = columns[name]
        status[name] = np.empty(column.shape, column.dtype)
        rows_per_chunk = max(1, CHUNK_BYTES // column.row_bytes)
        for _ in _read_chunks(checkpoint, column, rows_per_chunk, into=status[name]):
            pass  # read into status[name]; the checksum is checked after the last chunk
    rows, lengths, states = status["row"], status["length"], status["state"]
    if ((rows < 0) | (rows >= spec.capacity)).any() or np.unique(rows).size != rows.size:
        raise _refuse(
            checkpoint.root, f"'{columns['row'].file}' holds rows outside [0, {spec.capacity}) or one twice"
        )
    if ((lengths < 1) | (lengths > spec.max_steps)).any() or int(lengths.astype(np.int64).sum()) != (
        manifest["steps"]
    ):
        raise _refuse(
            checkpoint.root,
            f"'{columns['length'].file}' holds lengths outside [1, {spec.max_steps}] or not summing to the "
            f"{manifest['steps']} steps saved",
        )
    _check_saved_states(checkpoint, columns["state"].file, states, "episodes")
    _check_cursors(checkpoint, status["insert_seq"], rows)
    native = table.native
    native.restore_step_cursor(manifest["steps"])  # the next insert claims the steps after them
    for name in spec.fields:
        column = columns[f"field:{name}"]
        view = table.columns[name]
        rows_per_chunk = max(1, CHUNK_BYTES // column.row_bytes)
        for start, steps in _read_chunks(checkpoint, column, rows_per_chunk, into=view):
            if not view.flags.c_contiguous:  # else read into the ring itself
                view[start : start + len(steps)] = steps
    views = table.status_columns
    first_step = np.cumsum(lengths, dtype=np.uint64) - lengths.astype(np.uint64)
    views["first_step"][rows] = first_step
    views["length"][rows] = lengths
    views["insert_seq"][rows] = status["insert_seq"]
    views["times_sampled"][rows] = status["times_sampled"]
    native.publish_restored_rows_at(rows.astype(np.int64), states)
    native.restore_cursors(manifest["next_seq"], manifest["commit_seq"])

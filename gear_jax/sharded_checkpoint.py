"""Checkpoints of a `ShardedTable`: `ShardedTable.save(path)` and `ShardedTable.load(path, mesh)`, run on
every process of the job.

A sharded checkpoint is a directory `path` that holds one directory per save:

    save-<time>-<token>/    named alike on every process (process 0 draws the name)
        shard-<s>/          shard s's checkpoint, written by the process that owns it (`Table.save`'s
                            format: streamed, CRC-32'd, fsynced; see gear_jax/checkpoint.py)
        sharded.json        the commit record: the spec, the number of shards, the mesh axis, the
                            caller's metadata (e.g. the training step)

`path` may be on a file system every process shares, or a directory of the same name on each host (each
host then holds its own processes' shards).

Commit protocol. Every process writes its shards into the new save directory; then the processes agree
(an all-gather of each one's outcome) that every shard is durable; only then does each process write the
commit record (a temporary file, fsynced, renamed to `sharded.json`, the directory fsynced); they agree
again, and only then does each process delete its shards of the older saves (their records first). A
load takes the newest save whose record every process finds beside all of its own shards. So a process
killed at any moment (or every process) leaves a loadable checkpoint: before the first agreement no new
record exists and the previous save is whole; between the agreements a record proves every shard
durable, and the previous save is still whole on every host (per-host directories where only some hosts
wrote their record load the previous one); after the second, the new one is complete everywhere. What a
killed save leaves behind is removed by the next save.

A checkpoint loads into a mesh with as many devices along the axis as it has shards, shard s into the
process that owns device s (with per-host directories, that process must find shard s on its host).
Loading into another number of shards is refused: rows are not redistributed.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gear_jax import _agreement, checkpoint, sharded
from gear_jax._version import __version__
from gear_jax.errors import CheckpointError, InvalidArgumentError, SpecError
from gear_jax.spec import TableSpec
from gear_jax.table import Table

if TYPE_CHECKING:
    from jax.sharding import Mesh


FORMAT_NAME = "gear_jax.sharded_checkpoint"
FORMAT_VERSION = 1
RECORD = "sharded.json"
SAVE_PREFIX = "save-"
MAX_RECORD_BYTES = 1 << 20
MAX_LISTED_SAVES = 32  # the newest complete saves each process reports when the processes agree on one
_SAVE_NAME = re.compile(r"^save-[0-9a-f]{16}-[0-9a-f]{16}$")
_NAME_BYTES = 48  # room for a save directory's name in the all-gather


def save(
    table: sharded.ShardedTable, path: str | os.PathLike[str], metadata: dict[str, Any] | None = None
) -> None:
    """Writes this process's shards of `table` into a new save under `path` and commits it on every
    process (module docstring), with `metadata` (JSON) in its record. Call it on every process of the
    job at the same point."""
    op = "ShardedTable.save"
    drawn = _agreed_token()  # a collective: before anything that can fail
    root, save_dir, error = None, None, None
    try:
        metadata = checked_metadata(metadata, op)
        root = checkpoint.checkpoint_path(path, op)
        _open_root(root, op)
        save_dir = root / f"{SAVE_PREFIX}{drawn}"
        _remove_unfinished_saves(root, keep=save_dir.name, shards=table.local_shards)
        try:
            os.mkdir(save_dir, 0o700)
        except FileExistsError:  # another process on the same file system made it
            pass
        _fsync_directory(root)
        for s, shard in table.local_shards.items():
            checkpoint.save(shard, save_dir / f"shard-{s}")
    except Exception as e:
        error = e
    _agreement.agree(error, op, fallback=CheckpointError)  # every shard durable everywhere
    error = None
    try:
        _write_record(save_dir, table, metadata)
    except Exception as e:
        error = e
    _agreement.agree(error, op, fallback=CheckpointError)  # the record written everywhere
    _remove_older_saves(root, keep=save_dir.name, shards=table.local_shards)


def load(
    path: str | os.PathLike[str],
    mesh: Mesh,
    axis: str = "replay",
    name: str | None = None,
    pin: bool = True,
) -> sharded.ShardedTable:
    """The newest save under `path` that every process can read, loaded into new shards over `mesh`
    (module docstring). Call it on every process of the job."""
    op = "ShardedTable.load"
    error, devices, listed, root = None, [], [], None
    try:
        root = checkpoint.checkpoint_path(path, op)
        devices = sharded.mesh_devices(None, mesh, axis, op)
        listed = _complete_saves(root, _local_shards(devices))
    except Exception as e:
        error = e
    names = np.zeros((MAX_LISTED_SAVES, _NAME_BYTES), np.uint8)
    for i, entry in enumerate(listed[:MAX_LISTED_SAVES]):
        names[i, : len(entry)] = np.frombuffer(entry.encode(), np.uint8)
    every = _agreement.agree(error, op, payload=names, fallback=CheckpointError)
    found = [{bytes(row).rstrip(b"\0").decode() for row in rows if row.any()} for rows in every]
    common = set.intersection(*found)
    if not common:
        lacking = [p for p, names in enumerate(found) if not names]
        raise CheckpointError(
            f"{op}: no save under '{root}' that every process can read "
            + (
                f"(processes {lacking} find none: the path is missing or empty there, or their shards are "
                "on another host)"
                if lacking
                else "(the processes find different saves: per-host directories from different jobs?)"
            )
        )
    return load_save(root / max(common), devices, mesh, axis, name, pin, op)


def write_save(save_dir: Path, table: sharded.ShardedTable, metadata: dict[str, Any] | None) -> None:
    """This process's shards of `table` into `save_dir` (made when missing), then the record: one save,
    as `save` writes it, without the commit protocol (gear_jax/orbax.py: orbax's own commits it). Not
    agreed: the caller agrees on its outcome."""
    os.makedirs(save_dir, mode=0o700, exist_ok=True)
    for s, shard in table.local_shards.items():
        checkpoint.save(shard, save_dir / f"shard-{s}")
    _write_record(save_dir, table, metadata)


def load_save(
    save_dir: Path, devices: list[Any], mesh: Mesh, axis: str, name: str | None, pin: bool, op: str
) -> sharded.ShardedTable:
    """The sharded table of the save in `save_dir` (every process names the same one), each process
    loading the shards of its devices; agreed: every process raises when one fails."""
    spec, metadata, error = None, None, None
    try:
        spec, metadata = _read_record(save_dir, len(devices))
    except Exception as e:
        error = e
    name = sharded.agreed_name(spec, name, error, op)
    shards: dict[int, Table] = {}
    error = None
    try:
        for s in _local_shards(devices):
            table = Table.load(save_dir / f"shard-{s}", name=sharded.shard_name(name, s), pin=pin)
            shards[s] = table
            if table.spec != spec:
                raise CheckpointError(
                    f"{op}: shard {s} of '{save_dir}' holds a table of another spec than the save's record"
                )
    except Exception as e:
        error = e
    try:
        _agreement.agree(error, op, fallback=CheckpointError)
    except BaseException:
        for table in shards.values():
            table.close()
        raise
    table = sharded.ShardedTable(spec, mesh, axis, name, devices, shards)
    table.checkpoint_metadata = metadata
    return table


def _agreed_token() -> str:
    """A save directory's name suffix drawn by process 0 and taken by every process: the time, then random."""
    from jax.experimental import multihost_utils

    mine = np.frombuffer(np.uint64(time.time_ns()).tobytes() + secrets.token_bytes(8), np.uint8)
    drawn = np.asarray(multihost_utils.broadcast_one_to_all(mine)).astype(np.uint8).tobytes()
    return f"{int.from_bytes(drawn[:8], 'little'):016x}-{drawn[8:].hex()}"


def _local_shards(devices: list[Any]) -> list[int]:
    import jax

    me = jax.process_index()
    return [s for s, device in enumerate(devices) if device.process_index == me]


def _open_root(root: Path, op: str) -> None:
    """Makes the directory `root` when missing (its parent must exist); refuses a path that holds
    something other than a sharded checkpoint."""
    try:
        os.mkdir(root, 0o700)
        _fsync_directory(root.parent if str(root.parent) else Path("."))
    except FileExistsError:
        pass
    except FileNotFoundError:
        raise CheckpointError(
            f"{op}: the parent directory of '{root}' does not exist; create it first (the save makes the "
            "checkpoint directory itself, not its parents)"
        ) from None
    if not root.is_dir():
        raise CheckpointError(f"{op}: '{root}' exists and is not a directory")
    foreign = [entry for entry in os.listdir(root) if not _SAVE_NAME.match(entry)]
    if foreign:
        hint = (
            " (it holds a Table's checkpoint: load it with Table.load)"
            if checkpoint.CURRENT in foreign
            else ""
        )
        raise CheckpointError(
            f"{op}: '{root}' holds {sorted(foreign)[:3]}, which is not a ShardedTable checkpoint{hint}; save "
            "to a new path or an empty directory"
        )


def _record_checksum(record: dict[str, Any]) -> str:
    body = {key: value for key, value in record.items() if key != "record_checksum"}
    return f"{zlib.crc32(json.dumps(body, sort_keys=True, separators=(',', ':')).encode()):08x}"


def checked_metadata(metadata: Any, op: str) -> dict[str, Any] | None:
    """`metadata` when it is None or a dict that JSON writes and reads back unchanged (str keys; str,
    numbers, bools, None, lists and dicts of them), at most MAX_RECORD_BYTES / 2 of JSON."""
    if metadata is None:
        return None
    fix = (
        "pass a small dict of str keys and JSON values (numbers, str, bool, None, lists, dicts), e.g. "
        "{'step': 1000}"
    )
    if not isinstance(metadata, dict):
        raise InvalidArgumentError(
            f"{op}: metadata must be a dict or None, got {type(metadata).__name__}; {fix}"
        )
    try:
        text = json.dumps(metadata, allow_nan=False)
        same = json.loads(text) == metadata
    except (TypeError, ValueError, RecursionError) as e:
        raise InvalidArgumentError(f"{op}: metadata is not JSON ({e}); {fix}") from None
    if not same:
        raise InvalidArgumentError(
            f"{op}: metadata does not read back as written (tuples, non-str keys?); {fix}"
        )
    if len(text) > MAX_RECORD_BYTES // 2:
        raise InvalidArgumentError(
            f"{op}: metadata takes {len(text)} bytes of JSON, more than {MAX_RECORD_BYTES // 2}; {fix}"
        )
    return metadata


def _write_record(save_dir: Path, table: sharded.ShardedTable, metadata: dict[str, Any] | None) -> None:
    """The commit record of `save_dir`: written to a temporary file, fsynced, renamed into place, the
    directory fsynced. Every process writes the same record (on a shared file system the renames of
    equal files race harmlessly)."""
    record = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "gear_jax_version": __version__,
        "spec": json.loads(table.spec.to_json()),
        "num_shards": table.num_shards,
        "axis": table.axis,
        "saved_at": time.time(),
        "metadata": metadata,
    }
    record["record_checksum"] = _record_checksum(record)
    temporary = save_dir / f".{RECORD}-{secrets.token_hex(8)}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        checkpoint.write_all(fd, memoryview(json.dumps(record, indent=1).encode()))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, save_dir / RECORD)
    _fsync_directory(save_dir)


def _read_record(save_dir: Path, num_shards: int) -> tuple[TableSpec, dict[str, Any] | None]:
    """The spec and metadata of the save in `save_dir`, after checking its record and that it has
    `num_shards` shards."""
    where = f"ShardedTable.load: checkpoint '{save_dir}'"
    record = _record_of(save_dir)
    if record is None:
        raise CheckpointError(f"{where}: its record {RECORD} is missing, damaged or of another format")
    if record["version"] > FORMAT_VERSION:
        raise CheckpointError(
            f"{where}: format version {record['version']} is newer than this gear_jax reads "
            f"({FORMAT_VERSION}); load it with a newer gear_jax"
        )
    try:
        spec = TableSpec.from_json(json.dumps(record["spec"]))
    except (SpecError, ValueError, TypeError, KeyError) as e:
        raise CheckpointError(f"{where}: its record holds an invalid spec ({e})") from None
    saved = record.get("num_shards")
    if saved != num_shards:
        raise CheckpointError(
            f"{where}: it holds {saved} shards and the mesh has {num_shards} devices along its axis; load it "
            f"into a mesh of {saved} devices along the axis (rows are not redistributed over another "
            "number of shards)"
        )
    metadata = record.get("metadata")
    return spec, metadata if isinstance(metadata, dict) else None


def _record_of(save_dir: Path) -> dict[str, Any] | None:
    """The commit record of `save_dir` when it is a complete one (a regular file, valid JSON of this
    format, its checksum right), else None."""
    try:
        fd = os.open(save_dir / RECORD, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO would block a read forever
            return None
        text = os.read(fd, MAX_RECORD_BYTES + 1)
    finally:
        os.close(fd)
    try:
        record = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(record, dict) or record.get("format") != FORMAT_NAME:
        return None
    version = record.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return None
    if record.get("record_checksum") != _record_checksum(record):
        return None
    return record


def _complete_saves(root: Path, shards: list[int]) -> list[str]:
    """The saves under `root` with a valid record and a directory for each of `shards` it has (a shard
    past its count is left to the record's check, which names both counts), newest first."""
    try:
        entries = os.listdir(root)
    except FileNotFoundError:
        return []
    complete = []
    for entry in sorted((e for e in entries if _SAVE_NAME.match(e)), reverse=True):
        save_dir = root / entry
        record = _record_of(save_dir)
        if record is None:
            continue
        saved = record.get("num_shards")
        if all((save_dir / f"shard-{s}").is_dir() for s in shards if not isinstance(saved, int) or s < saved):
            complete.append(entry)
    return complete


def _remove_unfinished_saves(root: Path, keep: str, shards: dict[int, Table]) -> None:
    """This process's shards of saves without a record (what a killed save left), then those saves'
    directories where nothing else is left in them; never `keep` (the save under way, which another
    process may have made already)."""
    for entry in os.listdir(root):
        if _SAVE_NAME.match(entry) and entry != keep and _record_of(root / entry) is None:
            _remove_save(root / entry, shards, record=False)


def _remove_older_saves(root: Path, keep: str, shards: dict[int, Table]) -> None:
    """Every save but `keep`: its record first (so that it is no longer complete anywhere), then this
    process's shards, then the directory where nothing else is left in it. Best effort: a failure leaves
    garbage the next save removes, never a damaged checkpoint."""
    try:
        entries = os.listdir(root)
    except OSError:
        return
    for entry in entries:
        if _SAVE_NAME.match(entry) and entry != keep:
            _remove_save(root / entry, shards, record=True)


def _remove_save(save_dir: Path, shards: dict[int, Table], record: bool) -> None:
    try:
        if record:
            try:
                os.unlink(save_dir / RECORD)
            except FileNotFoundError:
                pass
            _fsync_directory(save_dir)
        fd = os.open(save_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for s in shards:
                checkpoint.remove_entry(fd, f"shard-{s}")
            for entry in os.listdir(fd):
                if entry.startswith(f".{RECORD}-"):  # a killed record write's temporary file
                    checkpoint.remove_entry(fd, entry)
        finally:
            os.close(fd)
        os.rmdir(save_dir)  # fails while another process's shards are still there
    except OSError:
        pass


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

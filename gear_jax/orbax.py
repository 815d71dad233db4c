"""gear_jax tables in orbax checkpoints: save the replay with the train state in one
`orbax.checkpoint.CheckpointManager` step.

    import orbax.checkpoint as ocp
    import gear_jax.orbax as gjo

    manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(max_to_keep=3))
    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                               replay=gjo.TableSave(table)))
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(state),
                                                             replay=gjo.TableRestore()))
    table = restored.replay  # a new Table with the saved rows, priorities, generations and cursors

`TableSave` / `TableRestore` carry a `Table` (`Table.save`'s format in the item's directory);
`ShardedTableSave` / `ShardedTableRestore` a `ShardedTable`, on every process of a multi-process job
(each process writes its own shards into the item's directory, as `ShardedTable.save` does; the item
directory must be on a file system every process shares, as orbax's multi-host checkpoints need). Orbax
makes the step directory appear only once every process finished writing, and keeps, deletes and lists
steps by its options. The handlers write synchronously: with `enable_async_checkpointing` (orbax's
default) the other items of the step still save in the background, and the replay is written before
`manager.save` returns. A failure on one process raises on every process (naming it), never leaving the
others waiting in orbax's barrier.

Importing this module needs orbax-checkpoint; `gear_jax` itself does not import it.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp
from jax.sharding import Mesh

from gear_jax import _agreement, checkpoint, sharded_checkpoint
from gear_jax.errors import CheckpointError, InvalidArgumentError
from gear_jax.sharded import ShardedTable, mesh_devices
from gear_jax.table import Table

TABLE_DIRECTORY = "table"  # the Table's checkpoint inside the item's directory


@dataclasses.dataclass
class TableSave(ocp.args.CheckpointArgs):
    """Saves `table` (a `gear_jax.Table`) as an item of an orbax checkpoint."""

    table: Table


@dataclasses.dataclass
class TableRestore(ocp.args.CheckpointArgs):
    """Restores a `gear_jax.Table` item into a new table; `name` and `pin` are `Table.load`'s."""

    name: str | None = None
    pin: bool = True


@dataclasses.dataclass
class ShardedTableSave(ocp.args.CheckpointArgs):
    """Saves `table` (a `gear_jax.ShardedTable`), on every process, with `metadata` (a small JSON dict)
    as `ShardedTable.save` keeps it."""

    table: ShardedTable
    metadata: dict[str, Any] | None = None


@dataclasses.dataclass
class ShardedTableRestore(ocp.args.CheckpointArgs):
    """Restores a `gear_jax.ShardedTable` item over `mesh`, on every process; `axis`, `name` and `pin` are
    `ShardedTable.load`'s (as many devices along `axis` as the item has shards)."""

    mesh: Mesh
    axis: str = "replay"
    name: str | None = None
    pin: bool = True


def _local_path(directory: Any) -> Path:
    """An orbax directory (an epath.Path) as a local path; gear_jax writes through the OS."""
    return Path(os.fspath(directory))


class TableCheckpointHandler(ocp.CheckpointHandler):
    """Writes and reads a `Table` item: `Table.save`'s checkpoint in the item's directory."""

    def save(self, directory: Any, args: TableSave) -> None:
        if not isinstance(args, TableSave) or not isinstance(args.table, Table):
            raise InvalidArgumentError(
                "gear_jax.orbax: save a Table item with args=gear_jax.orbax.TableSave(table), got "
                f"{type(getattr(args, 'table', args)).__name__}"
            )
        root = _local_path(directory)
        os.makedirs(root, mode=0o700, exist_ok=True)
        checkpoint.save(args.table, root / TABLE_DIRECTORY)

    def restore(self, directory: Any, args: TableRestore | None = None) -> Table:
        args = args or TableRestore()
        return Table.load(_local_path(directory) / TABLE_DIRECTORY, name=args.name, pin=args.pin)


class ShardedTableCheckpointHandler(ocp.CheckpointHandler):
    """Writes and reads a `ShardedTable` item: every process's shards and the record, as one save of
    `ShardedTable.save` (gear_jax/sharded_checkpoint.py), the commit left to orbax."""

    def save(self, directory: Any, args: ShardedTableSave) -> None:
        op = "gear_jax.orbax.ShardedTableSave"
        error = None
        try:
            if not isinstance(args, ShardedTableSave) or not isinstance(args.table, ShardedTable):
                raise InvalidArgumentError(
                    f"{op}: save a ShardedTable item with args=gear_jax.orbax.ShardedTableSave(table), got "
                    f"{type(getattr(args, 'table', args)).__name__}"
                )
            metadata = sharded_checkpoint.checked_metadata(args.metadata, op)
            sharded_checkpoint.write_save(_local_path(directory), args.table, metadata)
        except Exception as e:
            error = e
        _agreement.agree(error, op, fallback=CheckpointError)

    def restore(self, directory: Any, args: ShardedTableRestore | None = None) -> ShardedTable:
        op = "gear_jax.orbax.ShardedTableRestore"
        error, devices = None, []
        try:
            if not isinstance(args, ShardedTableRestore):
                raise InvalidArgumentError(
                    f"{op}: restore a ShardedTable item with args=gear_jax.orbax.ShardedTableRestore(mesh)"
                )
            devices = mesh_devices(None, args.mesh, args.axis, op)
        except Exception as e:
            error = e
        _agreement.agree(error, op)
        return sharded_checkpoint.load_save(
            _local_path(directory), devices, args.mesh, args.axis, args.name, args.pin, op
        )


ocp.args.register_with_handler(TableCheckpointHandler, for_save=True)(TableSave)
ocp.args.register_with_handler(TableCheckpointHandler, for_restore=True)(TableRestore)
ocp.args.register_with_handler(ShardedTableCheckpointHandler, for_save=True)(ShardedTableSave)
ocp.args.register_with_handler(ShardedTableCheckpointHandler, for_restore=True)(ShardedTableRestore)

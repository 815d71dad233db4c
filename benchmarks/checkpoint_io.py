"""Checkpoint throughput: `Table.save` / `Table.load` against orbax-checkpoint (tensorstore), one table;
with --sharded, `ShardedTable.save` / `ShardedTable.load` of a sharded table of 2 shards in this process.

    python benchmarks/checkpoint_io.py [--gib 1] [--dir /tmp] [--repeats 3] [--no-orbax] [--sharded]

Fills a table of `--gib` GiB (rows of a 4 KiB float32 observation, an int32 action, a float32 reward)
and reports GB/s (bytes of every column, status included, divided by seconds) for
  save:       Table.save (checksums, every file and directory fsynced, the link flipped);
  load_warm:  Table.load with the files in the page cache (right after the save);
  load_cold:  Table.load after the files were dropped from the page cache (posix_fadvise DONTNEED);
and the same for orbax's StandardCheckpointer on a dict of the table's columns (numpy arrays; the load
then copies them into a new table, since a checkpoint is only useful as a table). With --sharded: the
same table split over 2 shards (2 CPU devices of this process: the GB/s are per process), saved and
loaded by `ShardedTable.save` / `ShardedTable.load` (gear_jax), by orbax's StandardCheckpointer on a
dict of both shards' columns (orbax), and by an orbax CheckpointManager step holding the sharded table
as a `gear_jax.orbax.ShardedTableSave` item (gear_jax_in_orbax). Not a suite of `python -m
gear_jax.bench`: a one-off measurement behind the choice of format in gear_jax/checkpoint.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "2")  # --sharded: two shards in this process
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

import gear_jax as gj  # noqa: E402


OBS = 1024


def make_spec(gib: float) -> gj.TableSpec:
    row_bytes = OBS * 4 + 4 + 4
    capacity = int(gib * (1 << 30)) // row_bytes
    return gj.TableSpec(
        {
            "obs": gj.Field((OBS,), "float32"),
            "action": gj.Field((), "int32"),
            "reward": gj.Field((), "float32"),
        },
        capacity=capacity,
    )


def fill(table: gj.Table) -> None:
    capacity = table.capacity
    rng = np.random.default_rng(0)
    batch = 4096
    block = {
        "obs": rng.standard_normal((batch, OBS), dtype=np.float32),
        "action": rng.integers(0, 18, batch, dtype=np.int32),
        "reward": rng.standard_normal(batch, dtype=np.float32),
    }
    for start in range(0, capacity, batch):
        rows = min(batch, capacity - start)
        table.insert({k: v[:rows] for k, v in block.items()}, priorities=rng.uniform(0.1, 2, rows))


def make_table(gib: float) -> gj.Table:
    table = gj.Table.create(make_spec(gib))
    fill(table)
    return table


def make_sharded(gib: float) -> gj.ShardedTable:
    """`gib` GiB over 2 shards (2 CPU devices of this process)."""
    half = make_spec(gib / 2)
    mesh = Mesh(np.array(jax.devices()[:2]), ("replay",))
    table = gj.ShardedTable.create(half, mesh, name=f"gear_jax_ckpt_bench_{os.getpid()}")
    for shard in table.local_shards.values():
        fill(shard)
    return table


def table_bytes(table: gj.Table) -> int:
    status = table.capacity * (8 + 4 + 8 + 4)
    return status + sum(c[:, : table.max_steps].nbytes for c in table.columns.values())


def drop_cache(directory: Path) -> None:
    """Asks the kernel to forget the pages of every file under `directory` (written back first)."""
    for file in directory.rglob("*"):
        if file.is_file() and not file.is_symlink():
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_gear(table: gj.Table, root: Path, repeats: int) -> dict[str, list[float]]:
    path = root / "gear_ckpt"
    out: dict[str, list[float]] = {"save": [], "load_warm": [], "load_cold": []}
    for _ in range(repeats):
        out["save"].append(timed(lambda: table.save(path)))
        loaded: list[gj.Table] = []
        out["load_warm"].append(timed(lambda: loaded.append(gj.Table.load(path))))
        loaded.pop().close()
        drop_cache(path)
        out["load_cold"].append(timed(lambda: loaded.append(gj.Table.load(path))))
        loaded.pop().close()
    shutil.rmtree(path)
    return out


def bench_orbax(table: gj.Table, root: Path, repeats: int) -> dict[str, list[float]]:
    import orbax.checkpoint as ocp

    out: dict[str, list[float]] = {"save": [], "load_warm": [], "load_cold": []}
    checkpointer = ocp.StandardCheckpointer()

    def columns() -> dict[str, np.ndarray]:
        tree = {name: np.asarray(c[:, : table.max_steps]) for name, c in table.columns.items()}
        status = table.status_columns
        tree.update(
            state=status["state"],
            length=status["length"],
            insert_seq=status["insert_seq"],
            times=status["times_sampled"],
        )
        return tree

    def restore() -> None:
        tree = checkpointer.restore(path)
        fresh = gj.Table.create(table.spec, reuse=False)
        for name, column in fresh._columns.items():
            column[:] = tree[name]
        fresh._state[:] = tree["state"]
        fresh._length[:] = tree["length"]
        fresh._insert_seq[:] = tree["insert_seq"]
        fresh._times_sampled[:] = tree["times"]
        fresh.close()

    for index in range(repeats):
        path = (root / f"orbax_{index}").resolve()

        def save() -> None:
            checkpointer.save(path, columns())
            checkpointer.wait_until_finished()

        out["save"].append(timed(save))
        out["load_warm"].append(timed(restore))
        drop_cache(path)
        out["load_cold"].append(timed(restore))
        shutil.rmtree(path)
    return out


def restore_into_fresh(spec: gj.TableSpec, tree: dict[str, np.ndarray], prefix: str = "") -> None:
    """orbax's restored columns copied into a new table (a checkpoint is only useful as a table)."""
    fresh = gj.Table.create(spec, reuse=False)
    for name, column in fresh._columns.items():
        column[:] = tree[prefix + name]
    fresh._state[:] = tree[prefix + "state"]
    fresh._length[:] = tree[prefix + "length"]
    fresh._insert_seq[:] = tree[prefix + "insert_seq"]
    fresh._times_sampled[:] = tree[prefix + "times"]
    fresh.close()


def shard_columns(table: gj.Table, prefix: str = "") -> dict[str, np.ndarray]:
    tree = {prefix + name: np.asarray(c[:, : table.max_steps]) for name, c in table.columns.items()}
    status = table.status_columns
    for name, key in (
        ("state", "state"),
        ("length", "length"),
        ("insert_seq", "insert_seq"),
        ("times", "times_sampled"),
    ):
        tree[prefix + name] = status[key]
    return tree


def bench_gear_sharded(table: gj.ShardedTable, root: Path, repeats: int) -> dict[str, list[float]]:
    path = root / "gear_sharded"
    out: dict[str, list[float]] = {"save": [], "load_warm": [], "load_cold": []}
    for _ in range(repeats):
        out["save"].append(timed(lambda: table.save(path)))
        loaded: list[gj.ShardedTable] = []
        out["load_warm"].append(timed(lambda: loaded.append(gj.ShardedTable.load(path, table.mesh))))
        loaded.pop().close()
        drop_cache(path)
        out["load_cold"].append(timed(lambda: loaded.append(gj.ShardedTable.load(path, table.mesh))))
        loaded.pop().close()
    shutil.rmtree(path)
    return out


def bench_orbax_sharded(table: gj.ShardedTable, root: Path, repeats: int) -> dict[str, list[float]]:
    import orbax.checkpoint as ocp

    out: dict[str, list[float]] = {"save": [], "load_warm": [], "load_cold": []}
    checkpointer = ocp.StandardCheckpointer()
    shards = table.local_shards

    def restore(path: Path) -> None:
        tree = checkpointer.restore(path)
        for s in shards:
            restore_into_fresh(table.spec, tree, f"shard{s}_")

    for index in range(repeats):
        path = (root / f"orbax_sharded_{index}").resolve()

        def save() -> None:
            tree = {}
            for s, shard in shards.items():
                tree.update(shard_columns(shard, f"shard{s}_"))
            checkpointer.save(path, tree)
            checkpointer.wait_until_finished()

        out["save"].append(timed(save))
        out["load_warm"].append(timed(lambda: restore(path)))
        drop_cache(path)
        out["load_cold"].append(timed(lambda: restore(path)))
        shutil.rmtree(path)
    return out


def bench_gear_in_orbax(table: gj.ShardedTable, root: Path, repeats: int) -> dict[str, list[float]]:
    import orbax.checkpoint as ocp

    import gear_jax.orbax as gjo

    out: dict[str, list[float]] = {"save": [], "load_warm": [], "load_cold": []}
    path = (root / "gear_in_orbax").resolve()
    manager = ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(max_to_keep=1))

    def restore(step: int) -> None:
        args = ocp.args.Composite(replay=gjo.ShardedTableRestore(table.mesh))
        manager.restore(step, args=args).replay.close()

    for step in range(repeats):

        def save() -> None:
            manager.save(step, args=ocp.args.Composite(replay=gjo.ShardedTableSave(table)))
            manager.wait_until_finished()

        out["save"].append(timed(save))
        out["load_warm"].append(timed(lambda: restore(step)))
        drop_cache(path)
        out["load_cold"].append(timed(lambda: restore(step)))
    manager.close()
    shutil.rmtree(path)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-orbax", action="store_true")
    parser.add_argument("--sharded", action="store_true", help="a ShardedTable of 2 shards in this process")
    args = parser.parse_args()
    table = make_sharded(args.gib) if args.sharded else make_table(args.gib)
    shards = list(table.local_shards.values()) if args.sharded else [table]
    nbytes = sum(table_bytes(t) for t in shards)
    print(
        f"table: {sum(t.capacity for t in shards)} rows in {len(shards)} shard(s), {nbytes / 1e9:.3f} GB of "
        f"columns; {os.cpu_count()} CPUs",
        flush=True,
    )
    root = Path(tempfile.mkdtemp(prefix="gear_jax_ckpt_bench_", dir=args.dir))
    try:
        if args.sharded:
            systems = {"gear_jax": bench_gear_sharded}
            if not args.no_orbax:
                systems.update(orbax=bench_orbax_sharded, gear_jax_in_orbax=bench_gear_in_orbax)
        else:
            systems = {"gear_jax": bench_gear}
            if not args.no_orbax:
                systems["orbax"] = bench_orbax
        for system, bench in systems.items():
            times = bench(table, root, args.repeats)
            for op, seconds in times.items():
                best, median = min(seconds), statistics.median(seconds)
                print(
                    f"{system:17s} {op:10s} median {nbytes / median / 1e9:6.2f} GB/s "
                    f"(best {nbytes / best / 1e9:6.2f} GB/s, {median:.2f} s)",
                    flush=True,
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
        table.close()
    sys.exit(0)


if __name__ == "__main__":
    main()

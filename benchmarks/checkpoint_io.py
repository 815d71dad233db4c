"""Checkpoint throughput: `Table.save` / `Table.load` against orbax-checkpoint (tensorstore), one table.

    python benchmarks/checkpoint_io.py [--gib 1] [--dir /tmp] [--repeats 3] [--no-orbax]

Fills a table of `--gib` GiB (rows of a 4 KiB float32 observation, an int32 action, a float32 reward)
and reports GB/s (bytes of every column, status included, divided by seconds) for
  save:       Table.save (checksums, every file and directory fsynced, the link flipped);
  load_warm:  Table.load with the files in the page cache (right after the save);
  load_cold:  Table.load after the files were dropped from the page cache (posix_fadvise DONTNEED);
and the same for orbax's StandardCheckpointer on a dict of the table's columns (numpy arrays; the load
then copies them into a new table, since a checkpoint is only useful as a table). Not a suite of
`python -m gear_jax.bench`: a one-off measurement behind the choice of format in gear_jax/checkpoint.py.
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

import numpy as np

import gear_jax as gj


def make_table(gib: float) -> gj.Table:
    obs = 1024
    row_bytes = obs * 4 + 4 + 4
    capacity = int(gib * (1 << 30)) // row_bytes
    spec = gj.TableSpec(
        {
            "obs": gj.Field((obs,), "float32"),
            "action": gj.Field((), "int32"),
            "reward": gj.Field((), "float32"),
        },
        capacity=capacity,
    )
    table = gj.Table.create(spec)
    rng = np.random.default_rng(0)
    batch = 4096
    block = {
        "obs": rng.standard_normal((batch, obs), dtype=np.float32),
        "action": rng.integers(0, 18, batch, dtype=np.int32),
        "reward": rng.standard_normal(batch, dtype=np.float32),
    }
    for start in range(0, capacity, batch):
        rows = min(batch, capacity - start)
        table.insert({k: v[:rows] for k, v in block.items()}, priorities=rng.uniform(0.1, 2, rows))
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-orbax", action="store_true")
    args = parser.parse_args()
    table = make_table(args.gib)
    nbytes = table_bytes(table)
    print(
        f"table: {table.capacity} rows, {nbytes / 1e9:.3f} GB of columns; {os.cpu_count()} CPUs", flush=True
    )
    root = Path(tempfile.mkdtemp(prefix="gear_jax_ckpt_bench_", dir=args.dir))
    try:
        systems = {"gear_jax": bench_gear}
        if not args.no_orbax:
            systems["orbax"] = bench_orbax
        for system, bench in systems.items():
            times = bench(table, root, args.repeats)
            for op, seconds in times.items():
                best, median = min(seconds), statistics.median(seconds)
                print(
                    f"{system:9s} {op:10s} median {nbytes / median / 1e9:6.2f} GB/s "
                    f"(best {nbytes / best / 1e9:6.2f} GB/s, {median:.2f} s)",
                    flush=True,
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
        table.close()
    sys.exit(0)


if __name__ == "__main__":
    main()

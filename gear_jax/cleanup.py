"""Lists the gear_jax tables in /dev/shm, and removes those whose processes are all gone.

A table lives in /dev/shm until its creator closes it (or exits normally, which closes it). A creator
that dies otherwise (SIGKILL, SIGTERM's default action, `os._exit`, a crash) leaves it there; it is
*dead* once neither its creator nor any process that attached it or wrote to it is alive. The next
`Table.create` on the host removes dead tables (at most once a second per process), except those
created with `Table.create(..., outlive_creator=True)` ("persistent"). This command shows every table
and what keeps it, and removes the dead ones when asked:

    python -m gear_jax.cleanup                    # list only
    python -m gear_jax.cleanup --remove           # remove dead tables and orphaned pool memory
    python -m gear_jax.cleanup --remove --include_persistent   # dead persistent tables too

States:
  live             its creator, or a process that attached it or holds a writer slot, is alive
  dead             all of them are gone: removed by --remove (persistent ones: --include_persistent)
  pool             memory of a closed table, kept by the pool of a live process (`gear_jax.pool`)
  pool-orphan      the same, its process gone: removed by --remove, or by the next process that pools
  other-namespace  created in (or attached from) another PID namespace, such as another container
                   sharing /dev/shm: whether its processes live cannot be told from here, so it is
                   never removed automatically; --ignore_pid_namespaces removes it when no pid it
                   records is alive here (right only once those processes are known to be gone)
  other-format     a table of another gear_jax version: never removed (remove it by hand)

A state followed by "(truncated)": the file is shorter than its header says, cut after the table was
made (by hand, or by a tool that truncates files in /dev/shm). Never truncate a table file: a process
that has it mapped and touches a page past the new end is killed by SIGBUS, the kernel's signal for a
mapped file's missing pages, with no chance to raise an error; attaches refuse such a file
(TableMismatchError). Remove it once its processes are gone.

The same from Python: `find_tables()` and `remove_dead_tables()`.
"""

from __future__ import annotations

import dataclasses
import fnmatch

from gear_jax import _native


@dataclasses.dataclass(frozen=True)
class TableRecord:
    """One gear_jax table in /dev/shm, as its header describes it (see the module's docstring)."""

    name: str
    nbytes: int
    format_version: int
    pool: bool  # a name of the pool of closed tables
    creator_pid: int
    creator_pid_namespace: int  # inode of the creator's /proc/self/ns/pid (0: unknown)
    persistent: bool  # created with outlive_creator=True
    closed: bool  # its creator closed it
    mixed_pid_namespaces: bool  # a process of another PID namespace attached it
    same_pid_namespace: bool  # this process can tell whether the table's processes live
    creator_alive: bool
    attached_alive: int  # processes signed in by attach (or fork) that are alive
    writers_alive: int  # processes holding a writer slot that are alive
    mapped_elsewhere: bool  # no slot names a live process, but /proc shows a process mapping it (more
    # processes attached than there are slots, or a fork)
    truncated: bool  # the file is shorter than its header says (cut after its creation)
    state: str  # live, dead, pool, pool-orphan, other-namespace, other-format
    removable: bool  # by remove_dead_tables with the options find_tables was given


def find_tables(
    match: str = "*", include_persistent: bool = False, ignore_pid_namespaces: bool = False
) -> list[TableRecord]:
    """The gear_jax tables in /dev/shm whose name matches `match` (a shell pattern), by name.

    `include_persistent` and `ignore_pid_namespaces` only decide each record's `removable`, as for
    `remove_dead_tables`. Files without a gear_jax header are skipped (and never changed).
    """
    return [
        TableRecord(**record)
        for record in _native.find_tables(bool(include_persistent), bool(ignore_pid_namespaces))
        if fnmatch.fnmatchcase(record["name"], match)
    ]


def remove_dead_tables(
    match: str = "*",
    include_persistent: bool = False,
    ignore_pid_namespaces: bool = False,
    dry_run: bool = False,
) -> list[str]:
    """Removes the dead tables (and orphaned pool memory) whose name matches `match`; returns their names.

    Args:
      match: a shell pattern of the names to consider.
      include_persistent: also remove dead tables created with `outlive_creator=True`.
      ignore_pid_namespaces: also remove tables of other PID namespaces when no process they record is
        alive in this one; kill(pid, 0) here says nothing of another namespace's processes, so only
        when those are known to be gone.
      dry_run: remove nothing; return what would be removed.

    Each table is checked again as it is removed (a process attaching meanwhile keeps it).
    """
    removed = []
    for record in find_tables(match, include_persistent, ignore_pid_namespaces):
        if not record.removable:
            continue
        if dry_run or _native.remove_dead_table(record.name, include_persistent, ignore_pid_namespaces):
            removed.append(record.name)
    return removed


def _size(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f}{unit}" if unit == "B" else f"{nbytes:.1f}{unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


def format_tables(records: list[TableRecord]) -> str:
    """A text table of `records`: one line each, columns aligned, a header line first."""
    header = ("name", "size", "format", "creator", "alive", "attached", "writers", "persistent", "state")
    yes = {True: "yes", False: "no"}
    rows = [header]
    for r in records:
        current = r.format_version == _native.format_version
        rows.append(
            (
                r.name,
                _size(r.nbytes),
                str(r.format_version),
                str(r.creator_pid) if current else "?",
                yes[r.creator_alive] if current else "?",
                str(r.attached_alive) if current else "?",
                str(r.writers_alive) if current else "?",
                yes[r.persistent] if current else "?",
                r.state + (" (truncated)" if current and r.truncated else ""),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _define_flags() -> None:
    from absl import flags

    flags.DEFINE_bool("remove", False, "remove the dead tables and orphaned pool memory (default: list only)")
    flags.DEFINE_bool(
        "include_persistent", False, "with --remove: also dead tables created with outlive_creator=True"
    )
    flags.DEFINE_bool(
        "ignore_pid_namespaces",
        False,
        "with --remove: also tables of other PID namespaces none of whose pids is alive here (only once "
        "their processes are known to be gone: pids of another namespace mean nothing here)",
    )
    flags.DEFINE_string("match", "*", "only tables whose name matches this shell pattern")


def _main(argv: list[str]) -> None:
    from absl import app, flags, logging

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    FLAGS = flags.FLAGS
    records = find_tables(FLAGS.match, FLAGS.include_persistent, FLAGS.ignore_pid_namespaces)
    print(format_tables(records) if records else "no gear_jax tables in /dev/shm", flush=True)
    candidates = [r.name for r in records if r.removable]
    if not FLAGS.remove:
        if candidates:
            logging.info("%d removable (dead) tables; --remove removes them", len(candidates))
        return
    removed = remove_dead_tables(FLAGS.match, FLAGS.include_persistent, FLAGS.ignore_pid_namespaces)
    for name in removed:
        logging.info("removed /dev/shm/%s", name)
    for name in sorted(set(candidates) - set(removed)):
        logging.warning("kept /dev/shm/%s: a process opened it meanwhile, or it is gone already", name)
    logging.info("removed %d of %d tables", len(removed), len(records))


if __name__ == "__main__":
    from absl import app

    _define_flags()
    app.run(_main)

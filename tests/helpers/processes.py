"""Other Python processes for tests: code run in a fresh interpreter, and writers racing a reader."""

import dataclasses
import subprocess
import sys
import textwrap
import time

from tests.helpers.waits import wait_until


def start_python(code: str, *args: str, stdin: bool = False) -> subprocess.Popen:
    """Starts `code` (dedented) in a fresh interpreter with `args` in sys.argv; stdout and stderr piped,
    and stdin too with `stdin=True` (for a process that waits to be told to go on)."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def hold_a_row(table, then: str, step: str = '{"x": 1}') -> str:
    """Code for a process that attaches to `table`, starts an episode with one step (`step`: the source
    of the step's dict, `np` being numpy), prints the row it holds, then runs `then`."""
    return f"""
        import os, time, numpy as np, gear_jax as gj
        t = gj.Table.attach({table.name!r})
        w = t.writer()
        w.append({step})
        print(int(np.flatnonzero(t.row_status()["generation"] % 2 == 1)[0]), flush=True)  # the row held
        {then}
    """


def start_uniform_writers(table, width, seconds, bases=(0, 1_000_000)):
    """One process per base that attaches to `table` (a field "v" of `width` int32) and, for `seconds`,
    inserts one row at a time holding a single value in every element (base + 1, base + 2, ...), so
    that a row read while it was rewritten would mix two values. Returns the processes (stderr piped)."""
    code = f"""
        import numpy as np, gear_jax as gj, sys, time
        base, i = int(sys.argv[1]), 0
        with gj.Table.attach({table.name!r}) as t:
            end = time.monotonic() + {seconds}
            while time.monotonic() < end:
                i += 1
                t.insert({{"v": np.full((1, {width}), base + i, np.int32)}})
    """
    return [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), str(base)], stderr=subprocess.PIPE, text=True
        )
        for base in bases
    ]


@dataclasses.dataclass
class Race:
    """What `read_while_uniform_writers_write` saw: batches read, rows valid and invalid in them, and the
    table's last commit order number when the reads started and when they ended."""

    batches: int = 0
    valid_rows: int = 0
    invalid_rows: int = 0
    first_commit: int = 0
    last_commit: int = 0


def read_while_uniform_writers_write(table, width, read, seconds, bases=(0, 1_000_000), timeout=120):
    """Races `read(i)` (i = 0, 1, ...: a jitted read, compiled beforehand) against
    `start_uniform_writers(table, width, seconds, bases)`; `read` returns a batch's "v" [B, width] and
    "valid" [B] as numpy arrays. The reads start at the writers' first commit (a fresh interpreter takes
    about a second to import jax) and go on until the writers exit (`timeout` only bounds a hang). Every
    batch is checked: no valid row mixes two writes, every invalid row is zeroed. Whether a read lands in
    the middle of a write is the scheduler's choice, so invalid rows are counted, not required."""

    def committed():
        return int(table.row_status()["insert_seq"].max())  # the last commit order number

    def exited():
        return all(w.poll() is not None for w in writers)

    race = Race()
    before = committed()
    writers = start_uniform_writers(table, width, seconds, bases)
    try:
        wait_until(lambda: committed() > before or exited(), timeout, "a writer's first commit")
        race.first_commit = committed()
        deadline = time.monotonic() + timeout
        while not exited() and time.monotonic() < deadline:
            v, ok = read(race.batches)
            assert (v == v[:, :1]).all(axis=1)[ok].all(), "a valid row mixes two writes"
            assert (v[~ok] == 0).all(), "an invalid row was not zeroed"
            race.valid_rows += int(ok.sum())
            race.invalid_rows += int((~ok).sum())
            race.batches += 1
        race.last_commit = committed()
    finally:
        for w in writers:
            w.wait(timeout=timeout)
    assert all(w.returncode == 0 for w in writers), [w.stderr.read() for w in writers]
    print(f"{race.batches} batches, {race.valid_rows} valid, {race.invalid_rows} invalid rows, commits "
          f"{race.first_commit} -> {race.last_commit}")
    return race

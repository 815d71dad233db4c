"""Other Python processes for tests: code run in a fresh interpreter, and writers racing a reader."""

import subprocess
import sys
import textwrap


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

"""gear_jax's malloc thresholds (gear_jax/malloc.py): result buffers come from glibc's heaps and are
reused, so a jitted step's results do not page-fault; the tuning is skipped when the user says so.

Each case runs in a fresh interpreter, since the thresholds are set once per process at import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

glibc_only = pytest.mark.skipif(
    not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"), reason="the tuning is glibc's mallopt"
)

# A 31 MiB malloc through the C library, and whether glibc served it from a fresh mapping (mallinfo2's
# count of mapped blocks rises) or from a heap.
PROBE = textwrap.dedent(
    """
    import ctypes, json, sys
    import gear_jax as gj

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before = libc.mallinfo2().hblks
    block = libc.malloc(31 << 20)
    mapped = libc.mallinfo2().hblks - before
    libc.free(block)
    json.dump({"tuning": gj.malloc_tuning(), "mapped_blocks": mapped}, sys.stdout)
    """
)


def probe(**env: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@glibc_only
def test_blocks_below_the_mmap_threshold_come_from_the_heap() -> None:
    tuned = probe(GEAR_JAX_MALLOC_TUNING="1")
    assert tuned["tuning"]["applied"] is True, tuned
    assert tuned["tuning"]["mmap_threshold"] == 32 << 20 and tuned["tuning"]["trim_threshold"] == 256 << 20
    assert tuned["mapped_blocks"] == 0, tuned
    # The control: glibc's own threshold (128 KiB, raised only by freed mapped blocks) maps it fresh.
    default = probe(GEAR_JAX_MALLOC_TUNING="0")
    assert default["tuning"] == {"applied": False, "why": "GEAR_JAX_MALLOC_TUNING=0"}
    assert default["mapped_blocks"] == 1, default


@glibc_only
def test_glibc_tunables_of_the_user_win() -> None:
    mine = probe(GLIBC_TUNABLES="glibc.malloc.mmap_threshold=65536", GEAR_JAX_MALLOC_TUNING="1")
    assert mine["tuning"] == {"applied": False, "why": "GLIBC_TUNABLES sets the malloc thresholds"}
    assert mine["mapped_blocks"] == 1, mine  # 64 KiB: the user's threshold holds


@glibc_only
def test_jitted_batches_of_1_mib_take_no_page_faults() -> None:
    script = textwrap.dedent(
        """
        import json, resource, sys
        import jax, numpy as np
        import gear_jax as gj

        spec = gj.TableSpec(fields={"x": gj.Field((1024,), "uint8")}, capacity=20000)
        with gj.Table.create(spec) as table:
            for start in range(0, 20000, 1000):
                table.insert({"x": np.full((1000, 1024), start % 251, np.uint8)})

            @jax.jit
            def step(i):
                key = jax.random.fold_in(jax.random.key(0), i)
                return gj.sample_gather(table, key, 1024, fields=("x",))[1]

            for i in range(50):
                jax.block_until_ready(step(i))
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for i in range(300):
                jax.block_until_ready(step(50 + i))
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        json.dump({"faults_per_call": faults / 300}, sys.stdout)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "GEAR_JAX_MALLOC_TUNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # A fresh 1 MiB result would take 256 faults; reused heap memory takes none.
    assert json.loads(done.stdout)["faults_per_call"] < 4, done.stdout

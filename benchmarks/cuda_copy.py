"""The host-to-device bandwidth reference: timed `cudaMemcpyAsync` of pinned host bytes, through ctypes.

The benchmarks measure gear_jax's gather against a plain copy of the same bytes out of the same pinned
table memory. That copy is benchmark-only work, so it lives here, beside the suites, and calls the
CUDA runtime library (libcudart) directly rather than through gear_jax's native module.

A table that gear_jax pinned (`Table.pinned`) is registered with `cudaHostRegister(mapped | portable)`,
which holds for every CUDA context and runtime in the process, so a copy from its host address here is
a pinned (DMA) copy. Which libcudart: one already loaded in this process (the one JAX's CUDA plugin
uses) first, then `ctypes.util.find_library("cudart")`, the nvidia pip wheels on `sys.path`
(`nvidia/cu13/lib`, `nvidia/cuda_runtime/lib`), then `$CUDA_HOME`, `$CUDA_PATH`, `/usr/local/cuda`
(`lib64`); the first one that loads is used.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os
import sys

import numpy as np

_CUDA_MEMCPY_HOST_TO_DEVICE = 1  # cudaMemcpyKind
_CUDA_STREAM_NON_BLOCKING = 1  # cudaStreamNonBlocking


class CudaCopyError(RuntimeError):
    """The CUDA runtime could not be loaded, or one of its calls failed."""


def _loaded_in_process() -> list[str]:
    """Paths of the libcudart libraries this process has mapped already."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libcudart.so" in line}
    except OSError:
        return []
    return sorted(paths)


def candidates() -> list[str]:
    """Where libcudart may be, in the order tried (see the module docstring); may hold duplicates."""
    found = _loaded_in_process()
    name = ctypes.util.find_library("cudart")
    if name:
        found.append(name)
    for base in sys.path:  # the nvidia-cuda-runtime wheels: CUDA 13, then CUDA 12 layout
        nvidia = os.path.join(base, "nvidia")
        found += sorted(glob.glob(os.path.join(nvidia, "cu[0-9]*", "lib", "libcudart.so*")), reverse=True)
        found += sorted(glob.glob(os.path.join(nvidia, "cuda_runtime", "lib", "libcudart.so*")), reverse=True)
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            found += sorted(glob.glob(os.path.join(root, "lib64", "libcudart.so*")), reverse=True)
    return found


@functools.cache
def load_cudart() -> ctypes.CDLL:
    """The CUDA runtime library; CudaCopyError naming the places looked at when none loads."""
    tried = list(dict.fromkeys(candidates()))
    for path in tried:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        return lib
    raise CudaCopyError(f"no loadable libcudart (looked at: {', '.join(tried) or 'nothing found'})")


def _check(lib: ctypes.CDLL, status: int, call: str) -> None:
    if status != 0:
        raise CudaCopyError(f"{call} failed: {lib.cudaGetErrorString(status).decode()} (error {status})")


def time_host_to_device_copies(host: np.ndarray, device: int = 0, repeats: int = 20) -> list[float]:
    """Seconds taken by each of `repeats` timed copies of the bytes of `host` into a buffer on CUDA
    device `device`, after one untimed copy: CUDA events recorded around each `cudaMemcpyAsync` on a
    non-blocking stream of its own, so each figure is the copy's device time alone.

    Args:
      host: a C-contiguous array over the bytes to copy, at least one byte: a slice of pinned
        (registered) host memory, such as a view of a pinned gear_jax table's mapping. Keep it alive
        for the call. Unpinned memory works too, but is then copied through a staging buffer.
      device: the CUDA device ordinal.
      repeats: timed copies, >= 1.

    Returns:
      float seconds, one per timed copy.

    Raises:
      ValueError: `host` is not C-contiguous or is empty, or repeats < 1.
      CudaCopyError: no CUDA runtime loads, or a CUDA call failed (its name and the CUDA error).
    """
    if not isinstance(host, np.ndarray) or not host.flags.c_contiguous:
        raise ValueError("`host` must be a C-contiguous numpy array over the bytes to copy")
    if host.nbytes < 1 or repeats < 1:
        raise ValueError(f"host.nbytes={host.nbytes} and repeats={repeats} must be >= 1")
    lib = load_cudart()
    source, nbytes = ctypes.c_void_p(host.ctypes.data), ctypes.c_size_t(host.nbytes)
    previous = ctypes.c_int(0)
    restore = lib.cudaGetDevice(ctypes.byref(previous)) == 0
    buffer, stream = ctypes.c_void_p(), ctypes.c_void_p()
    start, stop = ctypes.c_void_p(), ctypes.c_void_p()
    elapsed_ms = ctypes.c_float(0.0)
    seconds: list[float] = []
    try:
        _check(lib, lib.cudaSetDevice(ctypes.c_int(device)), "cudaSetDevice")
        _check(lib, lib.cudaMalloc(ctypes.byref(buffer), nbytes), "cudaMalloc")
        flags = ctypes.c_uint(_CUDA_STREAM_NON_BLOCKING)
        _check(lib, lib.cudaStreamCreateWithFlags(ctypes.byref(stream), flags), "cudaStreamCreateWithFlags")
        _check(lib, lib.cudaEventCreate(ctypes.byref(start)), "cudaEventCreate")
        _check(lib, lib.cudaEventCreate(ctypes.byref(stop)), "cudaEventCreate")
        kind = ctypes.c_int(_CUDA_MEMCPY_HOST_TO_DEVICE)
        for i in range(repeats + 1):  # copy 0 is not timed
            _check(lib, lib.cudaEventRecord(start, stream), "cudaEventRecord")
            _check(lib, lib.cudaMemcpyAsync(buffer, source, nbytes, kind, stream), "cudaMemcpyAsync")
            _check(lib, lib.cudaEventRecord(stop, stream), "cudaEventRecord")
            _check(lib, lib.cudaEventSynchronize(stop), "cudaEventSynchronize")
            status = lib.cudaEventElapsedTime(ctypes.byref(elapsed_ms), start, stop)
            _check(lib, status, "cudaEventElapsedTime")
            if i > 0:
                seconds.append(elapsed_ms.value * 1e-3)
    finally:
        for event in (start, stop):
            if event:
                lib.cudaEventDestroy(event)
        if stream:
            lib.cudaStreamDestroy(stream)
        if buffer:
            lib.cudaFree(buffer)
        if restore:
            lib.cudaSetDevice(previous)
        lib.cudaGetLastError()  # leaves no error of ours for a later cudaGetLastError check in the process
    return seconds

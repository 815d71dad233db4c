"""The host-to-device bandwidth reference: timed `cudaMemcpyAsync` of pinned host bytes, through ctypes.

The benchmarks measure gear_jax's gather against a plain copy of the same bytes out of the same pinned
table memory. That copy is benchmark-only work, so it lives here, beside the suites, and calls the
CUDA runtime library directly rather than through gear_jax's native module.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys

_CUDA_MEMCPY_HOST_TO_DEVICE = 1
_CUDA_STREAM_NON_BLOCKING = 1


class CudaCopyError(RuntimeError):
    """The CUDA runtime could not be loaded, or one of its calls failed."""


def _candidates() -> list[str]:
    found = []
    name = ctypes.util.find_library("cudart")
    if name:
        found.append(name)
    for base in sys.path:  # the nvidia-cuda-runtime wheels (CUDA 13 and 12 layouts)
        found += sorted(glob.glob(os.path.join(base, "nvidia", "cu*", "lib", "libcudart.so*")))
        found += sorted(glob.glob(os.path.join(base, "nvidia", "cuda_runtime", "lib", "libcudart.so*")))
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            found += sorted(glob.glob(os.path.join(root, "lib64", "libcudart.so*")))
    return found


def load_cudart() -> ctypes.CDLL:
    """The CUDA runtime library; CudaCopyError naming the places looked at when there is none."""
    tried = _candidates()
    for path in tried:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    raise CudaCopyError(f"no loadable libcudart (looked at {tried or 'nothing: none found'})")


def _check(lib: ctypes.CDLL, status: int, call: str) -> None:
    if status != 0:
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        raise CudaCopyError(f"{call} failed: {lib.cudaGetErrorString(status).decode()} ({status})")


def time_host_to_device_copies(
    host_address: int, nbytes: int, device: int = 0, repeats: int = 20
) -> list[float]:
    """Seconds taken by each of `repeats` timed copies (after one untimed copy) of `nbytes` from
    `host_address`, registered (pinned) host memory, into a buffer on `device`: CUDA events around
    each `cudaMemcpyAsync` on a non-blocking stream, so the figure is the copy's device time alone.

    Raises:
      ValueError: nbytes < 1 or repeats < 1.
      CudaCopyError: no CUDA runtime, or a CUDA call failed.
    """
    if nbytes < 1 or repeats < 1:
        raise ValueError(f"nbytes={nbytes} and repeats={repeats} must be >= 1")
    lib = load_cudart()
    previous = ctypes.c_int(0)
    restore = lib.cudaGetDevice(ctypes.byref(previous)) == 0
    buffer, stream = ctypes.c_void_p(), ctypes.c_void_p()
    start, stop = ctypes.c_void_p(), ctypes.c_void_p()
    seconds: list[float] = []
    try:
        _check(lib, lib.cudaSetDevice(ctypes.c_int(device)), "cudaSetDevice")
        _check(lib, lib.cudaMalloc(ctypes.byref(buffer), ctypes.c_size_t(nbytes)), "cudaMalloc")
        _check(
            lib,
            lib.cudaStreamCreateWithFlags(ctypes.byref(stream), ctypes.c_uint(_CUDA_STREAM_NON_BLOCKING)),
            "cudaStreamCreateWithFlags",
        )
        _check(lib, lib.cudaEventCreate(ctypes.byref(start)), "cudaEventCreate")
        _check(lib, lib.cudaEventCreate(ctypes.byref(stop)), "cudaEventCreate")
        for i in range(repeats + 1):  # the first copy is not timed
            _check(lib, lib.cudaEventRecord(start, stream), "cudaEventRecord")
            _check(
                lib,
                lib.cudaMemcpyAsync(
                    buffer,
                    ctypes.c_void_p(host_address),
                    ctypes.c_size_t(nbytes),
                    ctypes.c_int(_CUDA_MEMCPY_HOST_TO_DEVICE),
                    stream,
                ),
                "cudaMemcpyAsync",
            )
            _check(lib, lib.cudaEventRecord(stop, stream), "cudaEventRecord")
            _check(lib, lib.cudaEventSynchronize(stop), "cudaEventSynchronize")
            ms = ctypes.c_float(0.0)
            _check(lib, lib.cudaEventElapsedTime(ctypes.byref(ms), start, stop), "cudaEventElapsedTime")
            if i > 0:
                seconds.append(ms.value * 1e-3)
    finally:
        if start:
            lib.cudaEventDestroy(start)
        if stop:
            lib.cudaEventDestroy(stop)
        if stream:
            lib.cudaStreamDestroy(stream)
        if buffer:
            lib.cudaFree(buffer)
        if restore:
            lib.cudaSetDevice(previous)
    return seconds

"""Builds gear_jax._native with CMake: the CPU handlers always, the CUDA handlers when nvcc is found.

Environment: GEAR_JAX_CUDA=AUTO|ON|OFF (default AUTO), CMAKE_BUILD_PARALLEL_LEVEL.
"""

import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _version() -> str:
    for line in (ROOT / "gear_jax" / "_version.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=")[1].strip().strip("\"'")
    raise RuntimeError("gear_jax/_version.py has no __version__")


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        import jax.ffi
        import pybind11

        out_dir = Path(self.get_ext_fullpath(ext.name)).parent.resolve()
        build_dir = Path(self.build_temp).resolve() / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        configure = [
            "cmake", str(ROOT), "-G", "Ninja",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            f"-DXLA_FFI_INCLUDE_DIR={jax.ffi.include_dir()}",
            f"-DGEAR_JAX_CUDA={os.environ.get('GEAR_JAX_CUDA', 'AUTO')}",
            f"-DGEAR_JAX_VERSION={_version()}",
            "-DCMAKE_BUILD_TYPE=Release",
        ]
        subprocess.run(configure, cwd=build_dir, check=True)
        subprocess.run(["cmake", "--build", ".", "--target", "_native"], cwd=build_dir, check=True)


setup(
    version=_version(),
    ext_modules=[CMakeExtension("gear_jax._native")],
    cmdclass={"build_ext": CMakeBuild},
)

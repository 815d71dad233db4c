"""The project's style, checked with every test run: ruff (pyproject.toml) on the Python code and
clang-format (.clang-format) on the C++ and CUDA code. Both are pinned in requirements-test.txt."""

import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
NATIVE_SUFFIXES = (".h", ".cc", ".cu", ".cuh")


def tracked(*suffixes: str) -> list[str]:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [f for f in files.split() if f.endswith(suffixes)]


def test_python_passes_ruff():
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--output-format", "concise", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (
        f"ruff check found problems (fix them, or `ruff check --fix`):\n{done.stdout}"
    )


def test_native_code_is_clang_formatted():
    files = tracked(*NATIVE_SUFFIXES)
    assert any(f.startswith("kernels/") for f in files) and any(f.startswith("xla_ffi/") for f in files)
    clang_format = (
        shutil.which("clang-format", path=str(pathlib.Path(sys.executable).parent)) or "clang-format"
    )
    done = subprocess.run(
        [clang_format, "--dry-run", "--Werror", *files], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (
        f"clang-format would change (run `clang-format -i` on them):\n{done.stderr[-4000:]}"
    )

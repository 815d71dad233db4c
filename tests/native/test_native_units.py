"""The native unit tests (tests/native/*.cc, Boost.Test): the pieces Python cannot reach directly, namely
layout planning, the rate limiter's admission, Philox and the counter window's RAII. The test binary is
compiled here from those sources and the runtime files they test (no XLA, no Python), cached under
build/native-tests/ by a hash of every input, and each C++ test case runs as one pytest test."""

import concurrent.futures
import hashlib
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent
# The runtime files the tests link, beside the tests' own sources.
RUNTIME = [
    "xla_ffi/shared_table.cc",
    "xla_ffi/table_layout.cc",
    "xla_ffi/table_processes.cc",
    "xla_ffi/table_mapping.cc",
    "xla_ffi/row_protocol.cc",
    "xla_ffi/step_ring.cc",
    "xla_ffi/counter_window.cc",
    "xla_ffi/rate_limiter.cc",
    "xla_ffi/priority_indexes.cc",
    "kernels/priority_index.cc",
]
FLAGS = ["-std=c++17", "-O1", "-Wall", "-Wextra", "-pthread", "-DGEAR_JAX_WITH_CUDA=0"]
SUITE = re.compile(r"BOOST_AUTO_TEST_SUITE\((\w+)\)")
CASE = re.compile(r"BOOST_AUTO_TEST_CASE\((\w+)\)")


def _test_sources() -> list[pathlib.Path]:
    return sorted(HERE.glob("*.cc"))


def _declared_cases() -> list[str]:
    """suite/case of every test case the sources declare (one suite per file)."""
    cases = []
    for source in _test_sources():
        text = source.read_text()
        suite = SUITE.search(text)
        cases += [f"{suite.group(1)}/{case}" if suite else case for case in CASE.findall(text)]
    return cases


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


def _boost_include() -> pathlib.Path:
    spec = importlib.util.find_spec("boost_headers")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("Boost.Test headers missing: pip install -r requirements-test.txt -c constraints.txt")
    include = pathlib.Path(next(iter(spec.submodule_search_locations))) / "include"
    if not (include / "boost" / "test" / "included" / "unit_test.hpp").is_file():
        pytest.fail(f"boost_headers has no boost/test/included/unit_test.hpp under {include}")
    return include


def _build(compiler: str) -> pathlib.Path:
    """The test binary, compiled unless a build of the same inputs is cached."""
    include = _boost_include()
    sources = [*_test_sources(), *(ROOT / f for f in RUNTIME)]
    inputs = sorted({*sources, *(ROOT / "xla_ffi").glob("*.h"), *(ROOT / "kernels").glob("*.h")})
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    digest = hashlib.sha256("\0".join([compiler, version, str(include), *FLAGS]).encode())
    for path in inputs:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    binary = ROOT / "build" / "native-tests" / digest.hexdigest()[:16] / "native_tests"
    if binary.is_file():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=binary.parent) as work:

        def compile_one(source: pathlib.Path) -> pathlib.Path:
            obj = pathlib.Path(work) / f"{source.parent.name}_{source.stem}.o"
            cmd = [compiler, *FLAGS, f"-I{ROOT}", "-isystem", str(include), "-c", str(source), "-o", str(obj)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                pytest.fail(f"compiling {source} failed:\n{done.stderr[-6000:]}")
            return obj

        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            objects = list(pool.map(compile_one, sources))
        linked = pathlib.Path(work) / "native_tests"
        link = [compiler, "-pthread", *map(str, objects), "-o", str(linked), "-lrt"]
        done = subprocess.run(link, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.fail(f"linking the native tests failed:\n{done.stderr[-6000:]}")
        os.replace(linked, binary)  # whole or absent, for a test run beside this one
    return binary


@pytest.fixture(scope="module")
def native_tests() -> pathlib.Path:
    compiler = _compiler()
    if compiler is None:
        pytest.skip("no C++ compiler (g++, c++ or clang++; or set CXX)")
    return _build(compiler)


def test_every_declared_case_is_run(native_tests):
    """The cases below come from the sources; the binary's own list must be the same."""
    listed = subprocess.run([native_tests, "--list_content"], capture_output=True, text=True, timeout=60)
    suite, cases = None, []
    for line in (listed.stdout + listed.stderr).splitlines():
        name = line.strip().rstrip("*")
        if not name:
            continue
        if line.startswith(" "):
            cases.append(f"{suite}/{name}")
        else:
            suite = name
    assert sorted(cases) == sorted(_declared_cases())


@pytest.mark.parametrize("case", _declared_cases())
def test_native(native_tests, case):
    done = subprocess.run(
        [native_tests, f"--run_test={case}", "--log_level=test_suite", "--color_output=no"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{case} failed:\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"

#!/usr/bin/env bash
# The wheel as a user gets it: builds it with `python -m build` (build isolation: pyproject.toml's build
# requirements, pinned by constraints.txt) from a copy of the sources: the sdist, then the wheel from the
# sdist, so that MANIFEST.in is checked too (SDIST=0: `python -m build --wheel` from the copy, no sdist).
# Installs the wheel in a fresh
# virtual environment (dependencies with -c constraints.txt), and runs the tests that need no source tree
# against the installed package, from a folder outside the checkout. Checks that `gear_jax.__file__` lies
# in the venv's site-packages, that the native module and `gear_jax.bench` came with the wheel, and that
# the wheel holds no test, doc or C++ source files. Exits non-zero on any failure. Not run by CI (a native
# build: about 10 minutes on 2 cores with the CUDA handlers, less with GEAR_JAX_CUDA=OFF).
#
#   scripts/check_wheel.sh                       # Python 3.11, CUDA handlers where nvcc is found
#   GEAR_JAX_CUDA=OFF scripts/check_wheel.sh     # CPU handlers only (faster)
#   PYTHON=python3.12 scripts/check_wheel.sh     # another interpreter (a name or a path)
#   SOURCE=worktree scripts/check_wheel.sh       # the working tree instead of the commit HEAD
#   KEEP=1 scripts/check_wheel.sh                # keep the temporary folder (venvs, wheel, logs)
#   TESTS="unit/test_table.py unit/test_ops_gather.py" ...  # other test files under tests/ (conftest.py,
#                                                # helpers/ and the packages' __init__.py always come)
#
# The tests run from copies in a temporary folder, laid out as tests/ is (the package `tests` with its
# conftest.py, helpers/ and the chosen files), so nothing of the checkout is on sys.path: `import gear_jax`
# can only find the installed wheel.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3.11}"
SOURCE="${SOURCE:-HEAD}"
# Tests of the table, sampling, gathering and host calls: they import gear_jax and tests/helpers only, and
# read no file of the repository (examples, README, benchmarks, scripts).
TESTS="${TESTS:-unit/test_spec.py unit/test_table.py unit/test_ops_sample.py unit/test_ops_gather.py}"
TESTS="$TESTS unit/test_ops_sample_gather.py unit/test_host.py unit/test_casting.py"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
TMP="$(mktemp -d "${TMPDIR:-/tmp}/gear_jax_wheel.XXXXXX")"
if [[ -z "${KEEP:-}" ]]; then trap 'rm -rf "$TMP"' EXIT; else echo "keeping $TMP"; fi
LOG="$TMP/log.txt"
start=$SECONDS

fail() {
  echo "FAIL check_wheel after $((SECONDS - start)) s: $1; the end of $LOG:"
  tail -n 40 "$LOG"
  [[ -n "${KEEP:-}" ]] || echo "(rerun with KEEP=1 to keep the logs)"
  exit 1
}

mkdir -p "$TMP/src" "$TMP/dist" "$TMP/run"
if [[ "$SOURCE" == worktree ]]; then  # a deleted but still tracked file is skipped
  (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
    | tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$TMP/src"
else
  git -C "$ROOT" archive "$SOURCE" | tar -xf - -C "$TMP/src"
fi
for name in __init__.py conftest.py helpers unit/__init__.py $TESTS; do
  [[ -e "$TMP/src/tests/$name" ]] || fail "tests/$name is not in $SOURCE (set TESTS to the files to run)"
  mkdir -p "$(dirname "$TMP/run/tests/$name")"
  cp -r "$TMP/src/tests/$name" "$TMP/run/tests/$name"
done

if [[ "${SDIST:-1}" == 0 ]]; then what=(--wheel); else what=(); fi  # none: sdist, then wheel from it
echo "== build: $PYTHON -m build ${what[*]:-(sdist, then the wheel from it)} (GEAR_JAX_CUDA=${GEAR_JAX_CUDA:-AUTO}; log: $LOG)"
"$PYTHON" -m venv "$TMP/build-venv" >"$LOG" 2>&1 || fail "no venv for $PYTHON"
# PIP_CONSTRAINT reaches the isolated build environment, so it gets the pinned jax, pybind11 and cmake.
PIP_CONSTRAINT="$ROOT/constraints.txt" "$TMP/build-venv/bin/pip" install build >>"$LOG" 2>&1 \
  || fail "pip install build"
(cd "$TMP/src" && PIP_CONSTRAINT="$ROOT/constraints.txt" "$TMP/build-venv/bin/python" -m build "${what[@]}" \
  --outdir "$TMP/dist" .) >>"$LOG" 2>&1 || fail "python -m build ${what[*]}"
wheels=("$TMP"/dist/gear_jax-*.whl)
[[ -f "${wheels[0]}" && ${#wheels[@]} -eq 1 ]] || fail "expected one wheel in $TMP/dist"
wheel="${wheels[0]}"
echo "   $(basename "$wheel"), $(du -h "$wheel" | cut -f1), built in $((SECONDS - start)) s"

# What the wheel holds: the package, its native module and the benchmarks, nothing from the repository.
"$TMP/build-venv/bin/python" - "$wheel" >>"$LOG" 2>&1 <<'EOF' || fail "the wheel's contents"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
assert any(n.startswith("gear_jax/_native") and n.endswith(".so") for n in names), "no gear_jax/_native*.so"
for needed in ("gear_jax/__init__.py", "gear_jax/_version.py", "gear_jax/bench/__main__.py"):
    assert needed in names, f"{needed} is missing"
stray = [n for n in names if not n.startswith(("gear_jax/", "gear_jax-"))]
assert not stray, f"files outside the package: {stray}"
sources = [n for n in names if n.endswith((".cc", ".cu", ".cuh", ".h"))]
assert not sources, f"C++ sources in the wheel: {sources}"
print(f"wheel: {len(names)} files")
EOF

echo "== install the wheel in a fresh venv, run ${TESTS// /, } from $TMP/run/tests"
"$PYTHON" -m venv "$TMP/venv" >>"$LOG" 2>&1 || fail "no venv for $PYTHON"
# The test files' own imports (pytest, scipy, hypothesis, torch, gymnasium), pinned like the package's.
"$TMP/venv/bin/pip" install "$wheel" pytest scipy hypothesis torch gymnasium -c "$ROOT/constraints.txt" \
  >>"$LOG" 2>&1 || fail "pip install of the wheel"
cd "$TMP/run" || fail "no $TMP/run"
"$TMP/venv/bin/python" - >>"$LOG" 2>&1 <<'EOF' || fail "gear_jax imported from outside site-packages"
import pathlib, sysconfig
import gear_jax, gear_jax.bench
site = pathlib.Path(sysconfig.get_paths()["purelib"]).resolve()
for module in (gear_jax, gear_jax.bench, gear_jax._native):
    where = pathlib.Path(module.__file__).resolve()
    assert site in where.parents, f"{module.__name__} from {where}, not from {site}"
print("gear_jax", gear_jax.__version__, "from", pathlib.Path(gear_jax.__file__).parent, gear_jax.build_info())
EOF
grep '^gear_jax .* from ' "$LOG" | sed 's/^/   /'
if ! "$TMP/venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$TMP/run" \
    $(printf 'tests/%s ' $TESTS) >>"$LOG" 2>&1; then
  fail "tests against the installed wheel"
fi
echo "PASS check_wheel in $((SECONDS - start)) s: $(grep -E '^[0-9]+ passed' "$LOG" | tail -1)"

#!/usr/bin/env bash
# What a new user gets: in fresh virtual environments with Python 3.11 and 3.12, the README's first
# command's install (requirements.txt with constraints.txt, then gear_jax itself), then
# `python examples/quickstart.py --smoke`. Exits non-zero on any failure. Not run by CI (minutes of
# downloads and a native build per Python); run it after changing requirements*.txt or constraints.txt.
#
#   scripts/check_fresh_install.sh                  # Python 3.11 and 3.12
#   PYTHONS="3.12" scripts/check_fresh_install.sh   # versions, or interpreters' paths
#   SOURCE=worktree scripts/check_fresh_install.sh  # the working tree instead of the commit HEAD
#   KEEP=1 scripts/check_fresh_install.sh           # keep the temporary folder (venvs, logs)
#   WHEEL=0 scripts/check_fresh_install.sh          # skip the wheel check (scripts/check_wheel.sh)
#
# Each Python installs from its own copy of the sources, as a clone would have them: the commit
# $SOURCE (default HEAD), or with SOURCE=worktree the working tree's tracked files and the untracked ones
# git does not ignore. Never from this checkout: the editable install builds gear_jax/_native*.so in place.
# Only the main job's requirements are installed, not requirements-test.txt: on Python 3.12 its torch
# pin would download a multi-GB CUDA build where no local CPU build is offered (the test command's
# install is what .ci/run runs, on the CI machine's Python).
# Then scripts/check_wheel.sh, with the first of $PYTHONS and the same $SOURCE: the wheel built in a clean
# environment, installed, and tested from outside the checkout (GEAR_JAX_CUDA passes through).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHONS="${PYTHONS:-3.11 3.12}"
SOURCE="${SOURCE:-HEAD}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
TMP="$(mktemp -d "${TMPDIR:-/tmp}/gear_jax_fresh.XXXXXX")"
if [[ -z "${KEEP:-}" ]]; then trap 'rm -rf "$TMP"' EXIT; else echo "keeping $TMP"; fi

failed=()
# An interpreter for "3.12": python3.12 where it runs, else the newest pyenv 3.12.x (pyenv's shim of a
# version that is not selected fails); a path is taken as it is.
find_python() {
  local want=$1 candidate
  if [[ "$want" == */* ]]; then echo "$want"; return; fi
  for candidate in "python$want" $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$want".*/bin/python 2>/dev/null \
      | sort -rV); do
    if "$candidate" -c 'import sys' >/dev/null 2>&1; then echo "$candidate"; return; fi
  done
  return 1
}

for want in $PYTHONS; do
  if ! py="$(find_python "$want")"; then
    echo "FAIL Python $want: no interpreter found"; failed+=("$want"); continue
  fi
  version="$("$py" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"
  dir="$TMP/py$version"
  mkdir -p "$dir/src"
  if [[ "$SOURCE" == worktree ]]; then  # a deleted but still tracked file is skipped
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
      | tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$dir/src"
  else
    git -C "$ROOT" archive "$SOURCE" | tar -xf - -C "$dir/src"
  fi
  log="$dir/log.txt"
  echo "== Python $version ($py): fresh venv, install, quickstart --smoke (log: $log)"
  start=$SECONDS
  if "$py" -m venv "$dir/venv" >"$log" 2>&1 && (
    set -e
    cd "$dir/src"
    . "$dir/venv/bin/activate"
    # The README's first command, with its run reduced to --smoke.
    pip install -r requirements.txt -c constraints.txt
    pip install --no-build-isolation --no-deps -e .
    python examples/quickstart.py --smoke
  ) >>"$log" 2>&1; then
    resolved="$("$dir/venv/bin/pip" freeze 2>/dev/null \
      | grep -iE '^(jax|jaxlib|gymnax|flax|optax|chex|numpy|ml.dtypes)==' | tr '\n' ' ')"
    echo "PASS Python $version in $((SECONDS - start)) s: $resolved"
    grep '^summary: ' "$log"
  else
    echo "FAIL Python $version after $((SECONDS - start)) s; the end of $log:"
    tail -n 30 "$log"
    failed+=("$want")
  fi
done

if [[ "${WHEEL:-1}" != 0 ]]; then
  first="${PYTHONS%% *}"
  if ! py="$(find_python "$first")"; then
    echo "FAIL wheel check: no interpreter for Python $first"; failed+=("wheel")
  elif ! PYTHON="$py" SOURCE="$SOURCE" "$ROOT/scripts/check_wheel.sh"; then
    failed+=("wheel")
  fi
fi

if ((${#failed[@]})); then
  echo "check_fresh_install: FAILED for ${failed[*]}"
  [[ -n "${KEEP:-}" ]] || echo "(rerun with KEEP=1 to keep the logs)"
  exit 1
fi
[[ "${WHEEL:-1}" != 0 ]] && wheel=checked || wheel=skipped
echo "check_fresh_install: all passed ($PYTHONS; wheel $wheel)"

#!/usr/bin/env bash
# For a machine with a CUDA GPU and no network: builds gear_jax with its CUDA handlers, runs the GPU
# tests, the gather benchmark and the GPU tests again under compute-sanitizer's memcheck.
# Reports go to $OUT (default /tmp/gear_jax_gpu_check), at most 8 files. Exits non-zero when the build, the
# tests or memcheck fail; a failing benchmark is only logged.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gear_jax_gpu_check}"
mkdir -p "$OUT"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PYTHONUNBUFFERED=1

nvidia-smi >"$OUT/nvidia_smi.txt" 2>&1

if ! GEAR_JAX_CUDA=ON python -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1; then
  tail -n 60 "$OUT/build.log"
  echo "gpu_check: the CUDA build failed (log: $OUT/build.log)"
  exit 1
fi
if ! python -c 'import gear_jax as gj, jax; print(gj.build_info(), jax.devices("gpu"))'; then
  echo "gpu_check: jax sees no GPU, or gear_jax does not import"
  exit 1
fi

python -m pytest -m gpu tests/test_gpu.py -v -rs --junitxml="$OUT/test_gpu.xml" 2>&1 | tee "$OUT/test_gpu.log"
status=${PIPESTATUS[0]}

timeout 900 python -m gear_jax.bench gather --item_bytes=512,4096,65536 --batch_size=256,1024 \
  --json "$OUT/gather_gpu.json" >"$OUT/bench_gather.log" 2>&1 || echo "gpu_check: the gather benchmark failed (log: $OUT/bench_gather.log)"

if command -v compute-sanitizer >/dev/null; then
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 1800 compute-sanitizer --tool memcheck --error-exitcode 3 \
    python -m pytest -m gpu tests/test_gpu.py -x -q >"$OUT/memcheck.log" 2>&1
  memcheck=$?
  tail -n 20 "$OUT/memcheck.log"
  if [ "$memcheck" -ne 0 ]; then
    echo "gpu_check: memcheck failed with status $memcheck (log: $OUT/memcheck.log)"
    [ "$status" -eq 0 ] && status=$memcheck
  fi
else
  echo "gpu_check: compute-sanitizer not found; memcheck skipped"
fi
exit "$status"

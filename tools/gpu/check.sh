#!/usr/bin/env bash
# tools/gpu/check.sh [OUT] — the one script a GPU machine runs (issue 20): builds dualemb without
# TensorFlow (with nvcc: libdualemb_cuda.so), runs the host math tests, the GPU tests and the GPU
# benchmark, and writes logs and JSON under OUT (default $OUT). Needs Python 3.12 with jax (CUDA
# plugin), numpy, pytest, pybind11, scikit-build deps, nlohmann-json, cmake, ninja and nvcc; no
# network. Every step runs even if an earlier one fails; the exit status is the first failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:?usage: tools/gpu/check.sh OUT (or set OUT)}}
mkdir -p "$out"
py=${PYTHON:-python}
build=build/gpu
status=0
step() {  # step NAME CMD...: runs CMD, logs to OUT/NAME.log, records the exit status
  local name=$1; shift
  echo "== $name"
  local t0=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $((SECONDS - t0))}" >>"$out/steps.jsonl"
  [ $rc -eq 0 ] || { echo "   failed (rc=$rc): $out/$name.log"; [ $status -ne 0 ] || status=$rc; }
}

{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  nvcc --version 2>&1 | tail -1
  "$py" -c "import jax; print('jax', jax.__version__, jax.devices())" 2>&1
} >"$out/machine.txt"

step configure cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$(command -v "$py")" -Dpybind11_DIR="$("$py" -m pybind11 --cmakedir)" \
  -DDUALEMB_BUILD_TF=OFF -DDUALEMB_BUILD_TESTS=ON
step build cmake --build "$build" -j"$(nproc)"
export DUALEMB_NATIVE_DIR=$PWD/$build/dualemb PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
step host_math "$build/dualemb/dualemb_gpu_host_math_tests"
step gpu_tests "$py" -m pytest -q -rs --junitxml="$out/gpu_tests.xml" -p no:cacheprovider \
  tests/gpu/test_gpu_table.py
step bench "$py" benchmarks/bench_gpu.py --out "$out/bench_gpu.json"
echo "status $status; logs and JSON in $out"
exit $status

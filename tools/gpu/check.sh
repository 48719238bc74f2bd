#!/usr/bin/env bash
# tools/gpu/check.sh [OUT] — the one script a GPU machine runs (issue 20): builds dualemb from
# source there without TensorFlow (its nvcc, its jax's XLA FFI headers: the FFI modules must be
# built against the jax that loads them, 0.11 on the GPU machines), runs the GPU table's host
# math tests, the GPU tests (tests/gpu: every table op, JAX on a GPU table and the checkpoint
# round trip against the CPU core) and the op-list checks, then a short GPU benchmark. Writes
# under OUT (default $OUT) at most 5 files, as the lent machine returns them:
#   log.txt         every step's output, in order
#   gpu_tests.xml   pytest's junit report of tests/gpu
#   bench_gpu.json  benchmarks/bench_gpu.py --quick
#   bench_gpu_step.json  benchmarks/bench_gpu_step.py --quick
#   summary.json    device, driver, date, each step's exit status and seconds, pass/fail/skip
# Needs Python 3.12 with jax (CUDA plugin), numpy, pytest, pybind11, cmake, ninja and nvcc; no
# network. nlohmann-json's headers (a build requirement the GPU machines lack) come from
# .gpu_carry/ when Python cannot import nlohmann_json: run tools/gpu/prepare_carry.sh here first
# and carry .gpu_carry. Each step has a time limit and the run a budget (BUDGET_S, 480 s), so the whole run
# ends within about 8 minutes; every step runs even if an earlier one fails; the exit status is the first failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:?usage: tools/gpu/check.sh OUT (or set OUT)}}
mkdir -p "$out"
py=${PYTHON:-python3}
build=build/gpu
log=$out/log.txt
steps=$out/steps.jsonl.tmp
: >"$log"
: >"$steps"
status=0
# nvcc where CMake looks for it (the CUDA toolkit's bin may be missing from PATH).
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
# The GPU tables allocate with cudaMalloc beside XLA: keep XLA from taking 75% of the memory.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
# The whole run stays inside BUDGET_S (default 480 s), so that the summary is written before the
# lent machine's own limit: each step gets at most what is left of it.
budget=${BUDGET_S:-480}
step() {  # step NAME LIMIT_S CMD...: runs CMD under a time limit, appends to the log
  local name=$1 limit=$2
  shift 2
  case " ${SKIP_STEPS:-} " in *" $name "*)  # SKIP_STEPS="a b": steps a rerun does not need
    echo "== $name: skipped (SKIP_STEPS)" | tee -a "$log"
    echo "{\"step\": \"$name\", \"rc\": null, \"seconds\": 0, \"skipped\": \"SKIP_STEPS\"}" >>"$steps"
    return;;
  esac
  local left=$((budget - SECONDS))
  [ $left -lt $limit ] && limit=$left
  if [ $limit -lt 5 ]; then
    echo "== $name: skipped, the run's budget is spent" | tee -a "$log"
    echo "{\"step\": \"$name\", \"rc\": null, \"seconds\": 0, \"skipped\": \"budget spent\"}" >>"$steps"
    return
  fi
  echo "== $name (limit ${limit}s)" | tee -a "$log"
  local t0=$SECONDS
  timeout "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $((SECONDS - t0))}" >>"$steps"
  echo "   rc=$rc in $((SECONDS - t0))s" | tee -a "$log"
  [ $rc -eq 0 ] || [ $status -ne 0 ] || status=$rc
}

{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  nvcc --version 2>&1 | tail -1
  "$py" -c "import sys, jax; print('python', sys.version.split()[0], 'jax', jax.__version__, jax.devices())" 2>&1
} | tee -a "$log"

json_args=()
if ! "$py" -c "import nlohmann_json" 2>/dev/null; then
  json_args=(-DDUALEMB_NLOHMANN_JSON_INCLUDE_DIR="$PWD/.gpu_carry/nlohmann_json/include")
fi
step configure 60 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$(command -v "$py")" -Dpybind11_DIR="$("$py" -m pybind11 --cmakedir)" \
  -DDUALEMB_BUILD_TF=OFF -DDUALEMB_BUILD_TESTS=ON -DDUALEMB_WITH_REDIS=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90 "${json_args[@]}"
step build 180 cmake --build "$build" -j"$(nproc)" --target dualemb_core _core _jax_ffi \
  dualemb_cuda _jax_ffi_cuda dualemb_gpu_host_math_tests
export DUALEMB_NATIVE_DIR=$PWD/$build/dualemb PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
step host_math 20 "$build/dualemb/dualemb_gpu_host_math_tests"
# -v names each test as it starts (a hung kernel shows where); the thread timeout dumps every
# stack and ends pytest, since a hung GPU would stall every later test too.
step gpu_tests 180 "$py" -m pytest -v -rs --tb=short --durations=10 --junitxml="$out/gpu_tests.xml" \
  -p no:cacheprovider --timeout=90 -o timeout_method=thread tests/gpu
step bench_step 100 "$py" benchmarks/bench_gpu_step.py --quick --out "$out/bench_gpu_step.json"
step bench 120 "$py" benchmarks/bench_gpu.py --quick --out "$out/bench_gpu.json" ${BENCH_ARGS:-}
step op_lists 30 "$py" -m pytest -q -rs -p no:cacheprovider tests/repo/test_op_lists.py \
  -k "jax or cuda"
# What is left of the budget: the JAX tests on the GPU backend (host tables there go through the
# host callbacks), as far as they get.
step jax_tests_gpu_backend 120 "$py" -m pytest -v --maxfail=8 -rs --tb=line -p no:cacheprovider \
  --timeout=60 tests/jax

"$py" - "$out" "$status" <<'PY' | tee -a "$log"
import json, os, subprocess, sys, time
import xml.etree.ElementTree as ET
out, status = sys.argv[1], int(sys.argv[2])
def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except Exception as e:  # noqa: BLE001
        return str(e)
summary = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "gpu": sh("nvidia-smi --query-gpu=name,driver_version,memory.total "
                     "--format=csv,noheader"),
           "nvcc": sh("nvcc --version | tail -1"), "status": status, "steps": []}
steps = os.path.join(out, "steps.jsonl.tmp")
with open(steps) as f:
    summary["steps"] = [json.loads(line) for line in f if line.strip()]
os.remove(steps)
xml = os.path.join(out, "gpu_tests.xml")
if os.path.exists(xml):
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    n["passed"] = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    summary["gpu_tests"] = n
print(json.dumps(summary, indent=1))
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
PY
echo "status $status; log, junit XML and JSON in $out"
exit $status

#!/usr/bin/env bash
# Development build into build/<name> without reinstalling the package:
#   tools/dev_build.sh <name> [extra cmake args]
# then run Python with DUALEMB_NATIVE_DIR=build/<name>/dualemb PYTHONPATH=$PWD.
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: tools/dev_build.sh <name> [cmake args]}
shift
py=${PYTHON:-python}
cmake -S . -B "build/$name" -G Ninja -DPython_EXECUTABLE="$(command -v "$py")" \
  -Dpybind11_DIR="$("$py" -m pybind11 --cmakedir)" "$@" >/dev/null
cmake --build "build/$name" -j2
echo "DUALEMB_NATIVE_DIR=$PWD/build/$name/dualemb"

#!/usr/bin/env bash
# tools/gpu/prepare_carry.sh — run here, before a GPU run: copies what tools/gpu/check.sh needs
# and the GPU machines lack into .gpu_carry/ (git-ignored; name it in the run's `carry`):
# nlohmann-json's headers (a build requirement of the core, from this Python's nlohmann_json).
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-python}
src=$("$py" -c "import nlohmann_json; print(nlohmann_json.get_include())")
rm -rf .gpu_carry
mkdir -p .gpu_carry/nlohmann_json
cp -r "$src" .gpu_carry/nlohmann_json/include
du -sh .gpu_carry

#!/usr/bin/env bash
# CI's second leg (issue 23), run by .ci/run after the README's install and tests: the tests
# that depend on the jax/flax/optax/orbax release, on Python 3.12 with the newest releases pip
# finds within pyproject.toml's pins, in a fresh virtualenv built from this checkout. The first
# leg (the default Python, 3.11) gets jax 0.10.x, the oldest supported set; jax >= 0.11 needs
# Python >= 3.12. Also runs alone: tools/ci_newest_jax.sh
#
# Kept cheap, for CI's time budget: no TensorFlow (neither installed nor built), no CUDA table
# and no Redis backend in the build (the first leg compiled and tested both; neither depends
# on JAX), only the pyproject extras these tests import, and the tests in two workers like the
# README's command. It prints the time of each part (venv + pip, build, tests).
set -euo pipefail
cd "$(dirname "$0")/.."

# Python 3.12 from pyenv (on the CI machine image). Missing, the leg fails: it never skips.
pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
py312=$(ls -d "$pyenv_root"/versions/3.12*/bin/python3 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$py312" ]; then
  echo "FAIL: no Python 3.12 under $pyenv_root/versions (pyenv install 3.12): CI's second" \
       "leg (tools/ci_newest_jax.sh) needs it" >&2
  exit 1
fi

t_start=$SECONDS
venv312=$(mktemp -d)/venv312
"$py312" -m venv "$venv312"
source "$venv312/bin/activate"
python -m pip install -q --upgrade pip
# What the build needs, less TensorFlow; pyproject's jax extra (jax, jaxlib, optax, flax,
# orbax-checkpoint) and, of its test extra, what these tests import: one resolve, newest first.
python - > "$venv312/requirements.txt" <<'EOF'
import tomllib
extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
build = [l.strip() for l in open("requirements-build.txt") if l.strip() and l[0] != "#"]
want = ("pytest", "pytest-timeout", "pytest-xdist", "safetensors")
test = [r for r in extras["test"] if r.split(">")[0].split("=")[0].split("[")[0] in want]
print("\n".join([r for r in build if not r.startswith("tensorflow")] + extras["jax"] + test))
EOF
python -m pip install -q --upgrade -r "$venv312/requirements.txt"
t_pip=$SECONDS

python -m pip install -q --no-build-isolation --no-deps -e . -Ccmake.define.DUALEMB_BUILD_TF=OFF \
  -Ccmake.define.DUALEMB_BUILD_CUDA=OFF -Ccmake.define.DUALEMB_WITH_REDIS=OFF
t_build=$SECONDS
python -c 'import importlib.metadata as m, sys; print("second leg: Python", sys.version.split()[0], *(f"{p} {m.version(p)}" for p in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy")))'

# What depends on the jax/flax/optax/orbax release: the JAX tests, the checkpoint tests that go
# through dualemb.jax and Orbax, the Optax parity of the core's optimizers and the XLA worker
# threads' float mode. The rest of tests/core and tests/checkpoint ran in the first leg and does
# not import JAX. Left to the first leg, as multi-process clusters that add minutes and little
# here: test_jax_multiprocess.py (2- and 4-process jax.distributed jobs; jax.distributed with
# gloo on this release stays covered by test_jax_host_callback.py's 2-process case, sharding by
# test_jax_sharded.py and test_jax_nnx_sharded.py) and test_jax_sharded_checkpoint.py (P -> Q
# process checkpoints: the format's logic, not JAX's; its TensorFlow part cannot run here).
python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -p no:cacheprovider \
  tests/jax --ignore=tests/jax/test_jax_multiprocess.py \
  --ignore=tests/jax/test_jax_sharded_checkpoint.py \
  tests/checkpoint/test_checkpoint_atomic.py tests/checkpoint/test_checkpoint_paths.py \
  tests/core/test_optimizers.py tests/core/test_core_denormal_mode.py
t_tests=$SECONDS
echo "second leg times: venv + pip $((t_pip - t_start)) s, build $((t_build - t_pip)) s," \
     "tests $((t_tests - t_build)) s, total $((t_tests - t_start)) s"

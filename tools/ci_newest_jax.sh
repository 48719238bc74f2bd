#!/usr/bin/env bash
# The JAX-and-core tests on Python 3.12 with the newest jax/flax/orbax/optax (issue 23's "second
# leg"), in a fresh virtualenv from this checkout. Not part of .ci/run yet: with the CUDA build
# and this session's new tests the first leg alone is near CI's 20-minute budget, and this leg
# adds about 8-11 minutes on an idle 2-core machine (estimated, not yet measured idle). Run it by
# hand before changing the jax pins: tools/ci_newest_jax.sh
set -euxo pipefail
cd "$(dirname "$0")/.."
# ---- Second leg: the JAX-and-core tests on Python 3.12 with the newest jax/flax/orbax/optax ----
# (jax >= 0.11 needs Python >= 3.12; the first leg's default Python gets jax 0.10.x, the oldest
# supported set). TensorFlow is left out of this leg (no TF tests run here, and its op library
# would add minutes of build); tests that need TF skip, naming it.
pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
py312=$(ls -d "$pyenv_root"/versions/3.12*/bin/python3 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$py312" ]; then
  echo "FAIL: no Python 3.12 under $pyenv_root/versions (pyenv install 3.12): the second CI leg needs it" >&2
  exit 1
fi
leg2_start=$SECONDS
venv312=$(mktemp -d)/venv312
"$py312" -m venv "$venv312"
source "$venv312/bin/activate"
python -m pip install --upgrade pip
grep -v '^tensorflow' requirements-build.txt > "$venv312/requirements-build-no-tf.txt"
pip install --upgrade -r "$venv312/requirements-build-no-tf.txt"
pip install --upgrade --no-build-isolation -e ".[jax,test]" -Ccmake.define.DUALEMB_BUILD_TF=OFF \
  -Ccmake.define.DUALEMB_BUILD_CUDA=OFF  # the first leg compiled the CUDA table already
python -c 'import importlib.metadata as m, sys; print("second leg: Python", sys.version.split()[0], *(f"{p} {m.version(p)}" for p in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy")))'
# What depends on the jax/flax/optax/orbax release: every JAX test, the checkpoint tests that go
# through dualemb.jax, and a core smoke test on this Python (the core's own tests ran in the first
# leg; they do not depend on JAX, and the 20-minute CI budget has no room for them twice).
python -m pytest -q tests/jax tests/checkpoint/test_checkpoint.py \
  tests/checkpoint/test_checkpoint_paths.py tests/core/test_core_table.py tests/core/test_spec_json.py
echo "second leg (install + build + tests): $((SECONDS - leg2_start)) s"

"""The TF op library supports TensorFlow 2.21 only: configuring the build against another
TensorFlow fails with a message naming both versions and the way out (the runtime check that a
built library matches the imported TF is tests/tf/test_tf_ops.py's).

The build is configured (not compiled) with a stand-in ``tensorflow`` package on PYTHONPATH
that reports the version under test; no TensorFlow is needed.
"""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _configure(tmp_path, tf_version):
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not on PATH (it is a build requirement: requirements-build.txt)")
    fake = tmp_path / "fake_tf" / "tensorflow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f'__version__ = "{tf_version}"\nfrom . import sysconfig\n')
    (fake / "sysconfig.py").write_text(textwrap.dedent("""
        def get_compile_flags():
            return ["-D_GLIBCXX_USE_CXX11_ABI=1"]
        def get_link_flags():
            return []
    """))
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "fake_tf"))
    cmd = ["cmake", "-S", str(ROOT), "-B", str(tmp_path / "build"),
           f"-DPython_EXECUTABLE={sys.executable}", "-DDUALEMB_BUILD_PYTHON=OFF",
           "-DDUALEMB_BUILD_JAX=OFF", "-DDUALEMB_BUILD_TF=ON", "-DDUALEMB_WITH_REDIS=OFF"]
    if shutil.which("ninja"):
        cmd += ["-G", "Ninja"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("version", ["2.20.0", "2.22.0"])
def test_configuring_against_another_tensorflow_fails_naming_the_supported_one(tmp_path,
                                                                                 version):
    out = _configure(tmp_path, version)
    assert out.returncode != 0
    text = " ".join((out.stdout + out.stderr).split())
    assert "supports TensorFlow 2.21.x only" in text, text[-3000:]
    assert f"has TensorFlow {version}" in text
    assert "DUALEMB_BUILD_TF=OFF" in text and "tensorflow-cpu==2.21.*" in text


def test_configuring_against_tensorflow_2_21_goes_ahead(tmp_path):
    out = _configure(tmp_path, "2.21.3")
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "building the TF op library against TensorFlow 2.21.3" in out.stdout

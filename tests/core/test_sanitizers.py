"""Builds the core and its C++ unit tests under AddressSanitizer + UndefinedBehaviorSanitizer
and runs them: memory errors and undefined behaviour in the core fail this test."""

import os
import shutil
import subprocess

import pytest

from _paths import ROOT


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("g++") is None,
                    reason="needs cmake and g++ (installed by requirements-build.txt / the OS)")
def test_core_under_asan_and_ubsan(tmp_path):
    build = tmp_path / "asan"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(
        ["cmake", "-S", str(ROOT), "-B", str(build), *generator, "-DCMAKE_BUILD_TYPE=Debug",
         "-DDUALEMB_SANITIZE=ON", "-DDUALEMB_BUILD_TESTS=ON", "-DDUALEMB_BUILD_PYTHON=OFF",
         "-DDUALEMB_BUILD_JAX=OFF", "-DDUALEMB_BUILD_TF=OFF"],
        check=True, capture_output=True, text=True)
    subprocess.run(["cmake", "--build", str(build), "-j2"], check=True, capture_output=True,
                   text=True)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    env.pop("LD_PRELOAD", None)
    run = subprocess.run([str(build / "dualemb" / "dualemb_core_tests")], env=env,
                         capture_output=True, text=True, timeout=300)
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    assert "all core tests passed" in run.stdout
    assert "runtime error" not in report and "AddressSanitizer" not in report

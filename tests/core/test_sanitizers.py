"""Builds the core and its C++ unit tests under AddressSanitizer + UndefinedBehaviorSanitizer
and runs them: memory errors and undefined behaviour in the core fail this test. The GPU table's
host-compiled logic (csrc/cuda/tests: per-element optimizer/initializer math, probe and dedup,
checked against the CPU core) runs the same way: it is the part of the GPU table a machine
without a GPU can run."""

import os
import shutil
import subprocess

import pytest

from _paths import ROOT

pytestmark = [
    pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("g++") is None,
                       reason="needs cmake and g++ (installed by requirements-build.txt / the OS)"),
    # The build (in the first test's setup) compiles the core at -O0 with ASan: minutes on 2
    # cores, and past the suite's 600 s default on a loaded machine.
    pytest.mark.timeout(1800),
]

TARGETS = ("dualemb_core_tests", "dualemb_gpu_host_math_tests")


@pytest.fixture(scope="module")
def asan_build(tmp_path_factory):
    """One Debug + ASan/UBSan build of the C++ test executables (no Python, TF, JAX or CUDA
    library: none of them runs here), shared by the tests below."""
    build = tmp_path_factory.mktemp("asan")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(
        ["cmake", "-S", str(ROOT), "-B", str(build), *generator, "-DCMAKE_BUILD_TYPE=Debug",
         "-DDUALEMB_SANITIZE=ON", "-DDUALEMB_BUILD_TESTS=ON", "-DDUALEMB_BUILD_PYTHON=OFF",
         "-DDUALEMB_BUILD_JAX=OFF", "-DDUALEMB_BUILD_TF=OFF", "-DDUALEMB_BUILD_CUDA=OFF"],
        check=True, capture_output=True, text=True)
    subprocess.run(["cmake", "--build", str(build), "-j2", "--target", *TARGETS], check=True,
                   capture_output=True, text=True)
    return build


def _run(build, name):
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    env.pop("LD_PRELOAD", None)
    run = subprocess.run([str(build / "dualemb" / name)], env=env, capture_output=True,
                         text=True, timeout=300)
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    assert "runtime error" not in report and "AddressSanitizer" not in report
    return run.stdout


def test_core_under_asan_and_ubsan(asan_build):
    assert "all core tests passed" in _run(asan_build, "dualemb_core_tests")


def test_gpu_table_host_math_under_asan_and_ubsan(asan_build):
    assert "host math checks passed" in _run(asan_build, "dualemb_gpu_host_math_tests")

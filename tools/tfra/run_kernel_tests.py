"""Run TFRA's own unit tests against ``dualemb.tf`` (or against TFRA itself, for the baseline).

    python tools/tfra/run_kernel_tests.py --tfra-src /path/to/recommenders-addons [--tfra]
        [--python PY] [--only FILE ...] [--out results.json]

``--tfra-src`` is a checkout of tensorflow/recommenders-addons, or its bare git directory (files
are then read at HEAD). The test files are copied to a temporary directory; nothing of them is
kept or committed. Against dualemb the only change is the import: TFRA's module paths are mapped
to dualemb.tf's (``IMPORTS`` below). With ``--tfra`` the files run unchanged with ``--python``
(an interpreter with TFRA 0.8.1 installed, e.g. compare_tfra.py's venv), which gives the
baseline: which tests pass on TFRA itself in TF2 eager mode.

Scope (issue 13): TF2 eager mode, ``tf.function`` and Keras. A ``conftest.py`` in the temporary
directory turns TF's test decorators into that scope: ``run_in_graph_and_eager_modes`` (and the
class form) runs the eager half only; ``run_deprecated_v1``, ``run_v1_only`` and
``deprecated_graph_mode_only`` skip, and so does a test that calls ``disable_eager_execution``
(TF1 graph mode and sessions are out of scope; that call would also turn every later test of the
file into a graph-mode test). ``DESELECT`` leaves out GPU-sized stress tests. The Keras-2
test files (``KERAS2``) run with ``TF_USE_LEGACY_KERAS=1``, as TFRA's Keras code needs.

Prints (and writes to ``--out``) JSON: per file pass / fail / skip counts and the failing test
names with the first line of their error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

KERNEL_DIR = "tensorflow_recommenders_addons/dynamic_embedding/python/kernel_tests"
LAYER_DIR = "tensorflow_recommenders_addons/dynamic_embedding/python/keras/layers"
FILES = [
    f"{KERNEL_DIR}/dynamic_embedding_variable_test.py",
    f"{KERNEL_DIR}/dynamic_embedding_ops_test.py",
    f"{KERNEL_DIR}/restrict_policies_test.py",
    f"{KERNEL_DIR}/shadow_embedding_ops_test.py",
    f"{KERNEL_DIR}/cuckoo_hashtable_ops_test.py",
    f"{KERNEL_DIR}/hkv_hashtable_ops_test.py",
    f"{KERNEL_DIR}/ragged_embedding_ops_test.py",
    f"{KERNEL_DIR}/warm_start_util_test.py",
    f"{LAYER_DIR}/embedding_test.py",
    f"{LAYER_DIR}/dynamic_layer_normalization_test.py",
]
KERAS2 = {"embedding_test.py", "dynamic_layer_normalization_test.py"}
# Tests left out, with the reason: sized for a GPU's memory (minutes of CPU time each).
DESELECT = {"hkv_hashtable_ops_test.py": ["test_insert_repeat_data", "test_reach_max_hbm"]}

_TFRA_OPS = "tensorflow_recommenders_addons.dynamic_embedding.python.ops"
# TFRA module path -> dualemb.tf module path: the import is all that changes.
IMPORTS = [
    ("from tensorflow_recommenders_addons import dynamic_embedding as de", "import dualemb.tf as de"),
    (f"import {_TFRA_OPS}.data_flow_grad", "import dualemb.tf.data_flow"),
    (f"{_TFRA_OPS}.data_flow_ops", "dualemb.tf.data_flow"),
    (f"{_TFRA_OPS}.math_ops", "dualemb.tf.math"),
    (f"{_TFRA_OPS}.ragged_embedding_ops", "dualemb.tf.ragged_embedding_ops"),
    (f"{_TFRA_OPS}.shadow_embedding_ops", "dualemb.tf.shadow_ops"),
    ("tensorflow_recommenders_addons.utils.check_platform", "_check_platform"),
]

CHECK_PLATFORM = '''"""TFRA's platform predicates, for the tests that import them: this is Linux x86-64."""
import platform
def is_windows(): return False
def is_macos(): return False
def is_arm64(): return platform.machine() in ("arm64", "aarch64")
def is_linux(): return True
def is_raspi_arm(): return False
'''

CONFTEST = '''"""Issue 13's scope for TFRA's tests: TF2 eager mode (graph halves and TF1-only tests skip)."""
import unittest
from tensorflow.python.framework import ops, test_util


def _eager_half(func=None, config=None, use_gpu=True, reset_test=True, assert_no_eager_garbage=False):
    # TF2 runs tests eagerly already: running the function as it is is the eager half.
    if func is None:
        return lambda f: f
    return func


def _tf1_only(*args, **kwargs):
    def skip(f):
        return unittest.skip("TF1 graph mode / sessions: out of scope")(f)
    if args and callable(args[0]) and not isinstance(args[0], str):
        return skip(args[0])
    return skip


def _no_graph_mode():
    # Some tests switch the whole process to TF1 graph mode, which would also turn every later
    # test of the file into a graph-mode test: the test that asks for it skips instead.
    raise unittest.SkipTest("disables eager execution (TF1 graph mode): out of scope")


ops.disable_eager_execution = _no_graph_mode
test_util.run_in_graph_and_eager_modes = _eager_half
test_util.run_deprecated_v1 = _tf1_only
test_util.run_v1_only = _tf1_only
test_util.deprecated_graph_mode_only = _tf1_only
'''


def read_test_files(src: str) -> dict[str, str]:
    out = {}
    bare = not os.path.isdir(os.path.join(src, "tensorflow_recommenders_addons"))
    for path in FILES:
        if bare:
            text = subprocess.run(["git", "--git-dir", src, "show", f"HEAD:{path}"], check=True,
                                  capture_output=True, text=True).stdout
        else:
            with open(os.path.join(src, path)) as f:
                text = f.read()
        out[os.path.basename(path)] = text
    return out


def rewrite_imports(text: str) -> str:
    for old, new in IMPORTS:
        text = text.replace(old, new)
    return text


def parse_junit(path: str) -> dict:
    passed, skipped, failed = 0, 0, []
    if not os.path.exists(path):
        return {"pass": 0, "fail": 0, "skip": 0, "failures": ["<no report: collection failed>"]}
    for case in ET.parse(path).getroot().iter("testcase"):
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            first = (bad.get("message") or "").strip().splitlines()[:1]
            failed.append(f"{case.get('name')}: {first[0][:200] if first else ''}")
        elif case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    return {"pass": passed, "fail": len(failed), "skip": skipped, "failures": failed}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tfra-src", required=True)
    ap.add_argument("--tfra", action="store_true", help="run the files unchanged (TFRA baseline)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    results = {"side": "tfra" if args.tfra else "dualemb", "files": {}}
    with tempfile.TemporaryDirectory(prefix="tfra_tests_") as tmp:
        with open(os.path.join(tmp, "conftest.py"), "w") as f:
            f.write(CONFTEST)
        with open(os.path.join(tmp, "_check_platform.py"), "w") as f:
            f.write(CHECK_PLATFORM)
        for name, text in read_test_files(args.tfra_src).items():
            if args.only and name not in args.only:
                continue
            if not args.tfra:
                text = rewrite_imports(text)
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
            env = dict(os.environ, PYTHONPATH=tmp, TF_CPP_MIN_LOG_LEVEL="2")
            if name in KERAS2:
                env["TF_USE_LEGACY_KERAS"] = "1"
            report = os.path.join(tmp, name + ".xml")
            cmd = [args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   f"--junitxml={report}", name]
            for test in DESELECT.get(name, []):
                cmd += ["--deselect", f"{name}::HkvHashtableTest::{test}"]
            try:
                proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True,
                                      timeout=args.timeout)
                tail = proc.stdout[-400:]
            except subprocess.TimeoutExpired:
                tail = f"timed out after {args.timeout} s"
            res = parse_junit(report)
            if res["failures"] == ["<no report: collection failed>"]:
                res["failures"] = [re.sub(r"\s+", " ", tail)]
            results["files"][name] = res
            print(f"{name}: {res['pass']} / {res['fail']} / {res['skip']}", file=sys.stderr)
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()

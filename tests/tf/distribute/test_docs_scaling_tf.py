"""docs/scaling_tf.md's ParameterServerStrategy examples run as written, as scripts (each starts a
local cluster on 127.0.0.1 and kills it on exit): the custom loop's tables end up on the PS tasks
holding every id it trained; tf_keras ``model.fit`` runs every step with rows on both PS tasks."""

import os
import re
import subprocess
import sys

import pytest

from _paths import ROOT


def ps_example(fit: bool = False) -> str:
    """The custom-loop example, or (``fit``) the tf_keras ``model.fit`` one."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "scaling_tf.md").read_text(),
                        re.S)
    found = [b for b in blocks if "ParameterServerStrategy(" in b and "LocalCluster(" in b
             and ("model.fit(" in b) == fit]
    assert len(found) == 1, "expected one PS LocalCluster example of each kind"
    return found[0]


def run_script(tmp_path, source):
    script = tmp_path / "ps_example.py"
    script.write_text(source)
    path = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    env = dict(os.environ, PYTHONPATH=path, TF_CPP_MIN_LOG_LEVEL="2")
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def rows_per_ps(stdout):
    sizes = re.search(r"rows per PS: \{(.*)\}", stdout).group(1)
    devices = re.findall(r"'(/job:ps/replica:0/task:\d)/device:CPU:0': (\d+)", sizes)
    assert [d for d, _ in devices] == ["/job:ps/replica:0/task:0", "/job:ps/replica:0/task:1"]
    assert all(int(n) > 0 for _, n in devices)


@pytest.mark.timeout(900)
def test_ps_example_runs(tmp_path):
    run = run_script(tmp_path, ps_example())
    rows_per_ps(run.stdout)
    trained, on_ps = re.search(r"distinct ids trained: (\d+) rows on the PS tasks: (\d+)",
                               run.stdout).groups()
    assert int(trained) == int(on_ps)


@pytest.mark.timeout(900)
def test_tf_keras_fit_example_runs(tmp_path):
    pytest.importorskip("tf_keras", reason="tf_keras (Keras 2) is not installed")
    run = run_script(tmp_path, ps_example(fit=True))
    rows_per_ps(run.stdout)
    assert re.search(r"steps: (\d+)", run.stdout).group(1) == "20"  # 2 epochs x 10 steps

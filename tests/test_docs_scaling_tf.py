"""docs/scaling_tf.md's ParameterServerStrategy example runs as written, as a script (it starts a
local cluster of 1 worker and 2 PS on 127.0.0.1 and kills it on exit), and its tables end up on
the PS tasks holding every id it trained."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def ps_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "scaling_tf.md").read_text(),
                        re.S)
    found = [b for b in blocks if "ParameterServerStrategy(" in b and "LocalCluster(" in b]
    assert len(found) == 1, "expected one ParameterServerStrategy LocalCluster example"
    return found[0]


@pytest.mark.timeout(300)
def test_ps_example_runs(tmp_path):
    script = tmp_path / "ps_example.py"
    script.write_text(ps_example())
    path = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    env = dict(os.environ, PYTHONPATH=path, TF_CPP_MIN_LOG_LEVEL="2")
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    sizes = re.search(r"rows per PS: \{(.*)\}", run.stdout).group(1)
    devices = re.findall(r"'(/job:ps/replica:0/task:\d)/device:CPU:0': (\d+)", sizes)
    assert [d for d, _ in devices] == ["/job:ps/replica:0/task:0", "/job:ps/replica:0/task:1"]
    assert all(int(n) > 0 for _, n in devices)
    trained, on_ps = re.search(r"distinct ids trained: (\d+) rows on the PS tasks: (\d+)",
                               run.stdout).groups()
    assert int(trained) == int(on_ps)

"""The README's Python examples run as written (in a subprocess, as a new user would run them).
The TFRA-migration lines read a user's own checkpoint path, so they are swapped for the
committed TFRA fixture."""

import os
import re
import subprocess
import sys

from _paths import ROOT
FIXTURE = ROOT / "tests" / "fixtures" / "tfra" / "tf2_checkpoint"


def test_readme_examples_run(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) >= 4
    code = "\n".join(blocks).replace("/tmp/", f"{tmp_path}/")
    migration = 'migrate.read_tfra_checkpoint("old_model/ckpt-10")'
    assert migration in code
    # The fixture's variable has dim 4: migrate it into a 4-dim Variable instead of `emb`.
    code = code.replace(migration, f'migrate.read_tfra_checkpoint({str(FIXTURE)!r})')
    code = code.replace("migrate.load_tfra_into(emb.params, data",
                        "migrate.load_tfra_into(de.Variable(dim=4, name='migrated'), data")
    script = tmp_path / "readme_examples.py"
    script.write_text(code)
    # The source tree first on the path, as when the examples are run from a checkout.
    path = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, env=dict(os.environ, PYTHONPATH=path))
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "ckpt_tf" / "manifest.json").exists()
    assert (tmp_path / "ckpt_jax" / "manifest.json").exists()

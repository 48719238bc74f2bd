"""The documented snippets a newcomer runs first run as written (each in a fresh process, as a
user would paste it): docs/interop.md's first block, docs/scaling_jax.md's first block,
docs/tf_saving.md's serving example, docs/migrating_from_tfra.md's snippets (on the repo's TFRA
fixture), docs/redis.md's core config; and examples/jax_flax_train.py's --ckpt never deletes a
directory that is not its own. Paths under /tmp/ are moved into the test's tmp_path."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def block(doc: str, marker: str) -> str:
    """The ```python block of docs/<doc> that contains `marker`."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / doc).read_text(), re.S)
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"{doc}: {len(found)} blocks contain {marker!r}"
    return found[0]


def run(code: str, tmp_path, cwd=None, timeout=600) -> str:
    script = tmp_path / "snippet.py"
    script.write_text(code.replace("/tmp/", f"{tmp_path}/"))
    path = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    r = subprocess.run([sys.executable, str(script)], cwd=cwd or tmp_path, capture_output=True,
                       text=True, timeout=timeout, env=dict(os.environ, PYTHONPATH=path))
    assert r.returncode == 0, r.stderr[-4000:]
    return r.stdout


def test_interop_first_block_runs(tmp_path):
    code = block("interop.md", "tables = {")
    # Afterwards: the JAX table holds the Keras table's rows, and Keras got Flax's weights back.
    code += ("\nimport numpy as np\n"
             "keys = np.arange(64)\n"
             "rows = dej.lookup(table, dej.ids(keys))\n"
             "np.testing.assert_array_equal(np.asarray(rows), emb.params.lookup(keys).numpy())\n"
             "np.testing.assert_array_equal(model.get_layer('head').kernel.numpy(),\n"
             "                              np.asarray(flax_model.head.kernel.value))\n"
             "print('ok')\n")
    assert run(code, tmp_path).strip().endswith("ok")


def test_scaling_jax_first_block_runs(tmp_path):
    out = run(block("scaling_jax.md", "xla_force_host_platform_device_count"), tmp_path)
    assert out.strip().endswith("(8, 16)")


def test_tf_saving_serving_signature_block_runs(tmp_path):
    run(block("tf_saving.md", 'signatures["serving_default"](ids='), tmp_path)


def test_migrating_snippets_run_on_the_repo_fixture(tmp_path):
    first = block("migrating_from_tfra.md", 'read_tfra_checkpoint("tests/fixtures')
    second = block("migrating_from_tfra.md", "de.Variable(key_dtype=tf.int64, dim=4")
    code = first + second + (
        "\nimport numpy as np\n"
        "entry = data['user/emb']\n"
        "assert sum(report['rows']) == len(entry['keys']) > 0\n"
        "assert int(emb.size()) == len(entry['keys'])\n"
        "v, found = emb.lookup(entry['keys'], return_exists=True)\n"
        "assert found.numpy().all()\n"
        "np.testing.assert_array_equal(v.numpy(), entry['values'])\n"
        "print('ok')\n")
    assert run(code, tmp_path, cwd=ROOT).strip().endswith("ok")


def test_redis_core_config_block_runs(tmp_path):
    from redis_server import RedisServer
    s = RedisServer()
    try:
        code = block("redis.md", "config, _ = t.describe()").replace("127.0.0.1:6379", s.address)
        code += ("\nimport numpy as np\n"
                 "t.insert_or_assign(np.array([5]), np.ones((1, 8), np.float32))\n"
                 "assert same.find(np.array([5]))[1].all() and same.size() == 1\n"
                 "print('ok')\n")
        assert run(code, tmp_path).strip().endswith("ok")
    finally:
        s.cleanup()


def load_flax_example():
    spec = importlib.util.spec_from_file_location("jax_flax_train",
                                                  ROOT / "examples" / "jax_flax_train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_flax_example_ckpt_refuses_a_directory_that_is_not_its_own(tmp_path, capsys):
    ex = load_flax_example()
    mine = tmp_path / "mine"
    (mine / "notes").mkdir(parents=True)
    (mine / "notes" / "keep.txt").write_text("precious")
    (mine / "100").mkdir()
    with pytest.raises(SystemExit, match="not this example's checkpoints.*notes"):
        ex.prepare_ckpt_dir(str(mine))
    assert (mine / "notes" / "keep.txt").read_text() == "precious" and (mine / "100").exists()
    # An earlier run's step folders are deleted, and it says so.
    earlier = tmp_path / "earlier"
    for step in ("100", "300"):
        (earlier / step / "tables").mkdir(parents=True)
    assert ex.prepare_ckpt_dir(str(earlier)) == str(earlier)
    assert not earlier.exists() and "deleting the checkpoints of an earlier run" in \
        capsys.readouterr().out
    assert ex.prepare_ckpt_dir(str(tmp_path / "new")) == str(tmp_path / "new")

"""Crash safety of checkpoint.save: a save killed at any point over an existing checkpoint leaves
that checkpoint loadable with its exact contents, and nothing else that looks complete."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

from dualemb.core import Table, checkpoint
from dualemb.core.checkpoint import _fs

# The child builds a table, then saves it over `path`. Modes:
#   slow               export pages slowly and say "WRITING" once the save is under way
#                      (the test SIGKILLs it)
#   exit-before-publish   os._exit just before the finished temporary directory is published
#   exit-between-renames  portable scheme: os._exit after `path` was moved aside, before the new
#                         checkpoint is renamed in
#   exit-after-exchange   os._exit right after the atomic exchange, before the old copy is deleted
CHILD = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from dualemb.core import Table, checkpoint
    from dualemb.core.checkpoint import _fs, _write

    mode, path, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
    t = Table(dim=16)
    t.reserve(rows)
    rng = np.random.default_rng(1)
    for i in range(0, rows, 1 << 17):
        k = np.arange(i, min(rows, i + (1 << 17)), dtype=np.int64) * 3 + 1
        t.insert_or_assign(k, rng.standard_normal((len(k), 16), dtype=np.float32))

    if mode == "slow":
        pages = [0]
        def slow(table, offset, limit):
            pages[0] += 1
            if pages[0] == 20:
                print("WRITING", flush=True)
            time.sleep(0.001)
            return table.export(offset, limit)
        _write._export_page = slow
    elif mode == "exit-before-publish":
        _fs.publish = lambda tmp, path: os._exit(3)
    elif mode == "exit-between-renames":
        _fs.exchange = lambda a, b: False
        real_rename = os.rename
        def rename(a, b):
            real_rename(a, b)
            if b == _fs.aside_path(path):
                os._exit(3)
        os.rename = rename
    elif mode == "exit-after-exchange":
        real = _fs.exchange
        def exchange(a, b):
            assert real(a, b), "this filesystem has no RENAME_EXCHANGE"
            os._exit(3)
        _fs.exchange = exchange
    checkpoint.save(path, {"t": t}, steps=2, page_rows=1000)
    print("DONE", flush=True)
""")


def run_child(mode, path, rows, kill_after=None):
    proc = subprocess.Popen([sys.executable, "-c", CHILD, mode, path, str(rows)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if kill_after is None:
        out, err = proc.communicate(timeout=60)
        return proc.returncode, out, err
    try:
        line = proc.stdout.readline()
        assert line.strip() == "WRITING", (line, proc.stderr.read())
        time.sleep(kill_after)
        os.kill(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


def snapshot(t):
    e = t.export()
    order = np.argsort(e["keys"])
    return {k: v[order] for k, v in e.items()}


def complete_dirs(parent):
    """Every directory under `parent` (hidden ones included) holding a manifest.json."""
    return sorted(os.path.relpath(root, parent) for root, _, files in os.walk(parent)
                  if "manifest.json" in files)


@pytest.fixture
def good(tmp_path):
    """A good checkpoint at tmp_path/ckpt/model (with its own parent dir), and its contents."""
    parent = tmp_path / "ckpt"
    parent.mkdir()
    path = str(parent / "model")
    t = Table(dim=16)
    rng = np.random.default_rng(0)
    t.insert_or_assign(np.arange(5000) * 7, rng.standard_normal((5000, 16)).astype(np.float32))
    checkpoint.save(path, {"t": t}, steps=1, metadata={"tag": "good"})
    return path, snapshot(t)


def assert_good(path, expected):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the aside fallback warns
        ck = checkpoint.load(path)
    assert ck.metadata == {"tag": "good"} and ck.steps == {"t": 1}
    got = snapshot(ck.tables["t"])
    for k in expected:
        np.testing.assert_array_equal(got[k], expected[k])


@pytest.mark.parametrize("kill_after", [0.0, 0.3])
def test_sigkill_mid_save_keeps_previous_checkpoint(good, kill_after):
    path, expected = good
    rc, out, err = run_child("slow", path, 2_000_000, kill_after=kill_after)
    assert rc == -signal.SIGKILL and "DONE" not in out, err
    parent = os.path.dirname(path)
    assert complete_dirs(parent) == ["model"]
    assert any(n.startswith(".model.tmp-") for n in os.listdir(parent))  # it was mid-save
    assert_good(path, expected)
    # the next save removes the dead process's temporary directory
    t = Table(dim=16)
    checkpoint.save(path, {"t": t})
    assert os.listdir(parent) == ["model"]


def test_exit_before_publish(good):
    path, expected = good
    rc, out, err = run_child("exit-before-publish", path, 20_000)
    assert rc == 3, err
    assert_good(path, expected)
    # the finished but unpublished copy sits under a hidden temporary name only
    parent = os.path.dirname(path)
    assert [d for d in complete_dirs(parent) if not d.startswith(".model.tmp-")] == ["model"]
    checkpoint.save(path, {"t": Table(dim=16)})
    assert os.listdir(parent) == ["model"]


def test_exit_between_renames_of_portable_scheme(good):
    path, expected = good
    rc, out, err = run_child("exit-between-renames", path, 20_000)
    assert rc == 3, err
    parent = os.path.dirname(path)
    assert not os.path.exists(path) and os.path.isdir(_fs.aside_path(path))
    with pytest.warns(RuntimeWarning, match="interrupted save"):
        assert checkpoint.read_manifest(path)["metadata"] == {"tag": "good"}
    assert_good(path, expected)
    checkpoint.save(path, {"t": Table(dim=16)})
    assert os.listdir(parent) == ["model"]


def test_exit_after_exchange(good):
    path, _ = good
    rc, out, err = run_child("exit-after-exchange", path, 20_000)
    if rc != 3 and "RENAME_EXCHANGE" in err:
        pytest.skip("filesystem without renameat2(RENAME_EXCHANGE)")
    assert rc == 3, err
    ck = checkpoint.load(path)  # the new checkpoint is complete and in place
    assert ck.tables["t"].size() == 20_000 and ck.steps == {"t": 2}
    parent = os.path.dirname(path)
    checkpoint.save(path, {"t": Table(dim=16)})
    assert os.listdir(parent) == ["model"]

"""Which leftovers of earlier saves the next save removes (docs/checkpoint_format.md §6, "What
a crash leaves"): staging directories of dead saves, decided by their lock, never one a live
save holds, whoever holds it; the rules for directories from another host or without a lock.
The processes here are real (a child that holds a staging directory, then is SIGKILLed)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from dualemb.core import Table, checkpoint
from dualemb.core.checkpoint import _fs, _staging

# Begins a save to argv[1] (a staging directory with one shard-like file in it, its lock held),
# prints the directory and waits on stdin: a save that is alive until the test kills it.
HOLDER = textwrap.dedent("""
    import sys
    from dualemb.core.checkpoint._staging import Staging
    s = Staging.begin(sys.argv[1])
    with open(s.file("table-0000-shard-00000.safetensors"), "wb") as f:
        f.write(b"half a shard")
    print(s.directory, flush=True)
    sys.stdin.read()
""")


def table(seed):
    t = Table(dim=3)
    rng = np.random.default_rng(seed)
    t.insert_or_assign(np.arange(50, dtype=np.int64) * 11 + seed,
                       rng.standard_normal((50, 3)).astype(np.float32))
    return t


def rows(t):
    e = t.export()
    order = np.argsort(e["keys"])
    return e["keys"][order], e["values"][order]


def assert_holds(path, t):
    got = rows(checkpoint.load(path).tables["t"])
    want = rows(t)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.fixture
def holder(tmp_path):
    """Starts a process that holds a live staging directory of tmp_path/model; yields
    (process, directory); the process is killed in the end."""
    path = str(tmp_path / "model")
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, path], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line, proc.stderr.read() if proc.poll() is not None else "no directory printed"
        yield proc, line
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


def test_a_live_save_is_left_alone_and_a_killed_one_removed(tmp_path, holder):
    proc, staging = holder
    path = str(tmp_path / "model")
    first = table(1)
    checkpoint.save(path, {"t": first})  # a concurrent save to the same path
    assert os.path.isdir(staging) and os.path.exists(staging + _staging.LOCK_SUFFIX), \
        "the staging directory of a live save was removed"
    assert_holds(path, first)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert os.path.isdir(staging)  # debris of the killed save, until the next save
    assert_holds(path, first)
    second = table(2)
    checkpoint.save(path, {"t": second})
    assert os.listdir(tmp_path) == ["model"]
    assert_holds(path, second)


def make_debris(tmp_path, owner, *, lock=True, age=0.0):
    """A staging directory ``.model.tmp-<owner>`` holding a shard-like file (and a free lock
    file), last modified ``age`` seconds ago."""
    d = tmp_path / f".model.tmp-{owner}"
    d.mkdir()
    (d / "table-0000-shard-00000.safetensors").write_bytes(b"half a shard")
    paths = [d / "table-0000-shard-00000.safetensors", d]
    if lock:
        lock_file = tmp_path / f".model.tmp-{owner}{_staging.LOCK_SUFFIX}"
        lock_file.write_bytes(b"")
        paths.append(lock_file)
    then = time.time() - age
    for p in paths:
        os.utime(p, (then, then))
    return d


def test_a_dead_save_whose_pid_is_reused_is_removed(tmp_path):
    # A restarted container has the same host name and often the same pid as the process that
    # died: a live pid says nothing. The lock, free since the owner died, decides.
    checkpoint.save(tmp_path / "model", {"t": table(1)})
    live_pid = os.getppid()
    debris = make_debris(tmp_path, f"{_fs._host()}-{live_pid}-{12345:016x}")
    checkpoint.save(tmp_path / "model", {"t": table(2)})
    assert not debris.exists()
    assert os.listdir(tmp_path) == ["model"]


@pytest.mark.parametrize("owner", ["otherhost-123-0000000000abcdef", "job-1a2b3c4d"])
@pytest.mark.parametrize("lock", [True, False])
def test_debris_of_another_host_or_without_owner_is_removed_once_idle(tmp_path, owner, lock):
    # Another host's lock may be invisible here, and `job-<hex>` (dualemb.jax before this
    # protocol) names no owner: such a directory is removed only once untouched for an hour.
    checkpoint.save(tmp_path / "model", {"t": table(1)})
    fresh = make_debris(tmp_path, owner, lock=lock, age=60)
    checkpoint.save(tmp_path / "model", {"t": table(2)})
    assert fresh.exists(), "a possibly live save of another host was removed"
    for p in fresh.iterdir():
        os.utime(p, (time.time() - 2 * _staging.FOREIGN_STALE_S,) * 2)
    os.utime(fresh, (time.time() - 2 * _staging.FOREIGN_STALE_S,) * 2)
    checkpoint.save(tmp_path / "model", {"t": table(3)})
    assert not fresh.exists()
    assert_holds(tmp_path / "model", table(3))


def test_debris_without_lock_of_this_host_follows_its_pid(tmp_path):
    # Written by an older dualemb (no lock file): removed when its process is gone.
    checkpoint.save(tmp_path / "model", {"t": table(1)})
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    dead = make_debris(tmp_path, f"{_fs._host()}-{proc.pid}-0a0b0c0d", lock=False)
    alive = make_debris(tmp_path, f"{_fs._host()}-{os.getppid()}-0a0b0c0e", lock=False)
    checkpoint.save(tmp_path / "model", {"t": table(2)})
    assert not dead.exists() and alive.exists()


def test_an_orphan_lock_file_is_removed_once_old(tmp_path):
    checkpoint.save(tmp_path / "model", {"t": table(1)})
    lock = tmp_path / f".model.tmp-{_fs._host()}-1-{7:016x}{_staging.LOCK_SUFFIX}"
    lock.write_bytes(b"")
    checkpoint.save(tmp_path / "model", {"t": table(2)})
    assert lock.exists()  # its maker may be about to create the directory
    os.utime(lock, (time.time() - 600,) * 2)
    checkpoint.save(tmp_path / "model", {"t": table(3)})
    assert os.listdir(tmp_path) == ["model"]

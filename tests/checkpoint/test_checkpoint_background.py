"""Background saves (checkpoint.save(..., blocking=False)): the checkpoint holds the state as of
the call while training goes on, saves run one after the other, errors and cancellation come out
of the handle, the snapshot copies are freed, and a kill -9 mid-save leaves the last complete
checkpoint. References: numpy exports and a blocking save of the same state, file for file."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from dualemb.core import Table, checkpoint
from dualemb.core.checkpoint import _background, _write
from dualemb.core.checkpoint._manifest import CheckpointError
from background_saves import no_save_left_running  # noqa: F401 (autouse fixture)
from table_rows import assert_same, snapshot  # tests/ helper

DIM = 8
KEYS = 2000


def train(t, steps, first=1, seed=0):
    rng = np.random.default_rng(seed + first)
    for step in range(first, first + steps):
        keys = rng.integers(0, KEYS, 300)
        t.apply_gradients(keys, rng.standard_normal((300, DIM)).astype(np.float32), 0.01, step)


def adam_table():
    return Table(DIM, initializer={"initializer": "uniform", "seed": 5},
                 optimizer={"name": "adam", "amsgrad": True})


def complete_dirs(parent):
    return sorted(os.path.relpath(root, parent) for root, _, files in os.walk(parent)
                  if "manifest.json" in files)


@pytest.fixture
def gated_pages(monkeypatch):
    """Makes page exports wait until `gate` is set (and counts them), so a test controls when a
    background save gets past its first page."""
    gate = threading.Event()
    started = threading.Event()
    real = _write._export_page

    def export_page(table, offset, limit):
        started.set()
        assert gate.wait(30), "the test never opened the gate"
        return real(table, offset, limit)

    monkeypatch.setattr(_write, "_export_page", export_page)
    yield gate, started
    gate.set()
    _background.wait_running()


def test_background_save_holds_the_state_of_the_call(tmp_path, gated_pages):
    gate, started = gated_pages
    t = adam_table()
    train(t, 5)
    at_k = snapshot(t)
    clock_k = t.clock
    dense = {"w": np.arange(6, dtype=np.float32)}
    gate.set()  # the reference: a blocking save of the same state
    checkpoint.save(str(tmp_path / "ref"), {"t": t}, steps=5, dense=dense, page_rows=500)
    gate.clear()
    started.clear()
    h = checkpoint.save(str(tmp_path / "bg"), {"t": t}, steps=5, dense=dense, page_rows=500,
                        blocking=False)
    assert isinstance(h, checkpoint.SaveHandle)
    dense["w"][:] = -1  # changed after the call: not in the checkpoint
    assert started.wait(30) and not h.done()
    train(t, 10, first=6)  # training goes on while the save waits at its first page
    assert t.clock != clock_k
    gate.set()
    h.wait(60)
    assert h.done() and h.exception() is None and not h.cancelled()
    ck = checkpoint.load(str(tmp_path / "bg"))
    assert ck.steps == {"t": 5}
    assert_same(snapshot(ck.tables["t"]), at_k)
    np.testing.assert_array_equal(checkpoint.load_dense(str(tmp_path / "bg"))["w"],
                                  np.arange(6, dtype=np.float32))
    # file for file what the blocking save wrote (the manifest differs only in its time)
    ref_files = sorted(f for f in os.listdir(tmp_path / "ref") if f.endswith(".safetensors"))
    assert ref_files == sorted(f for f in os.listdir(tmp_path / "bg")
                               if f.endswith(".safetensors"))
    for f in ref_files:
        assert (tmp_path / "ref" / f).read_bytes() == (tmp_path / "bg" / f).read_bytes(), f
    # the live table went on to step 15
    assert not np.array_equal(snapshot(t)["values"], at_k["values"])


def test_second_save_waits_for_the_first(tmp_path, gated_pages):
    gate, started = gated_pages
    t = adam_table()
    train(t, 2)
    h1 = checkpoint.save(str(tmp_path / "a"), {"t": t}, steps=2, blocking=False)
    assert started.wait(30)
    second = {}
    trained = threading.Event()

    def save_again():
        train(t, 1, first=3)
        trained.set()
        second["handle"] = checkpoint.save(str(tmp_path / "b"), {"t": t}, steps=3,
                                           blocking=False)
        second["first_done"] = h1.done()

    th = threading.Thread(target=save_again)
    th.start()
    assert trained.wait(30)
    after_3 = snapshot(t)
    th.join(0.3)
    assert th.is_alive() and not h1.done()  # still waiting for the first save
    gate.set()
    th.join(30)
    assert not th.is_alive() and second["first_done"]
    h1.wait(30)
    second["handle"].wait(30)
    assert checkpoint.read_manifest(str(tmp_path / "a"))["tables"][0]["step"] == 2
    assert_same(snapshot(checkpoint.load(str(tmp_path / "b")).tables["t"]), after_3)
    # a blocking save also waits for a running background save (then writes)
    checkpoint.save(str(tmp_path / "c"), {"t": t}, steps=3)
    assert complete_dirs(tmp_path) == ["a", "b", "c"]


def failing_pages(monkeypatch, after=1):
    real = _write._export_page
    calls = [0]

    def export_page(table, offset, limit):
        calls[0] += 1
        if calls[0] > after:
            raise OSError("disk on fire (test)")
        return real(table, offset, limit)

    monkeypatch.setattr(_write, "_export_page", export_page)


def test_writer_error_comes_out_of_wait_and_leaves_the_previous_checkpoint(tmp_path,
                                                                           monkeypatch):
    t = adam_table()
    train(t, 3)
    path = str(tmp_path / "ck")
    checkpoint.save(path, {"t": t}, steps=3)
    before = snapshot(checkpoint.load(path).tables["t"])
    train(t, 2, first=4)
    failing_pages(monkeypatch)
    h = checkpoint.save(path, {"t": t}, steps=5, page_rows=100, blocking=False)
    with pytest.raises(OSError, match="disk on fire"):
        h.wait(30)
    assert isinstance(h.exception(), OSError)
    assert os.listdir(tmp_path) == ["ck"]  # no staging directory left
    assert checkpoint.read_manifest(path)["tables"][0]["step"] == 3
    assert_same(snapshot(checkpoint.load(path).tables["t"]), before)
    monkeypatch.undo()
    checkpoint.save(path, {"t": t}, steps=5)  # observed: the next save runs


def test_unobserved_error_is_raised_by_the_next_save(tmp_path, monkeypatch):
    t = adam_table()
    train(t, 1)
    failing_pages(monkeypatch, after=0)
    h = checkpoint.save(str(tmp_path / "x"), {"t": t}, blocking=False)
    deadline = time.monotonic() + 30
    while not h.done() and time.monotonic() < deadline:  # ended, but nobody asked how
        time.sleep(0.01)
    monkeypatch.undo()
    with pytest.raises(CheckpointError, match="background save to .*x failed.*disk on fire"):
        checkpoint.save(str(tmp_path / "y"), {"t": t}, blocking=False)
    assert h.done() and not (tmp_path / "y").exists() and not (tmp_path / "x").exists()
    # reported once; the save after it runs
    checkpoint.save(str(tmp_path / "y"), {"t": t}, blocking=False).wait(30)
    assert complete_dirs(tmp_path) == ["y"]


def test_unwritable_path_fails_in_wait(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    t = adam_table()
    h = checkpoint.save(str(tmp_path / "file" / "ck"), {"t": t}, blocking=False)
    with pytest.raises(OSError):
        h.wait(30)
    assert os.listdir(tmp_path) == ["file"]


def test_error_never_waited_for_is_logged_at_exit(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    child = textwrap.dedent("""
        import sys
        from dualemb.core import Table, checkpoint
        checkpoint.save(sys.argv[1], {"t": Table(2)}, blocking=False)
    """)
    run = subprocess.run([sys.executable, "-c", child, str(tmp_path / "file" / "ck")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "background checkpoint save to" in run.stderr and "never waited" in run.stderr


def test_bad_arguments_raise_at_the_call(tmp_path):
    t = adam_table()
    with pytest.raises(TypeError, match="mapping"):
        checkpoint.save(str(tmp_path / "c"), t, blocking=False)
    with pytest.raises(ValueError, match="JSON"):
        checkpoint.save(str(tmp_path / "c"), {"t": t}, metadata={"x": object()}, blocking=False)
    with pytest.raises(TypeError, match="blocking"):
        checkpoint.save(str(tmp_path / "c"), {"t": t}, blocking="no")
    assert not (tmp_path / "c").exists()


def test_cancel_stops_before_the_commit(tmp_path, gated_pages):
    gate, started = gated_pages
    t = adam_table()
    train(t, 2)
    path = str(tmp_path / "ck")
    gate.set()
    checkpoint.save(path, {"t": t}, steps=2)
    before = snapshot(checkpoint.load(path).tables["t"])
    gate.clear()
    started.clear()
    train(t, 1, first=3)
    h = checkpoint.save(path, {"t": t}, steps=3, blocking=False)
    assert started.wait(30)
    with pytest.raises(TimeoutError, match="still running"):
        h.wait(0.05)
    assert h.cancel() and h.cancel() and h.cancelled()
    gate.set()
    with pytest.raises(checkpoint.SaveCancelled, match="cancelled"):
        h.wait(30)
    assert os.listdir(tmp_path) == ["ck"]
    assert_same(snapshot(checkpoint.load(path).tables["t"]), before)
    # a cancelled save is not a failure the next save reports
    h2 = checkpoint.save(path, {"t": t}, steps=3, blocking=False)
    h2.wait(30)
    assert not h2.cancel()  # too late: it published
    assert checkpoint.read_manifest(path)["tables"][0]["step"] == 3


def test_cancel_just_before_publishing(tmp_path, monkeypatch):
    """A cancel that arrives after the last page but before the manifest still stops it."""
    t = adam_table()
    train(t, 1)
    real = _background.SaveHandle._hook

    def hook(self, final):
        if final:
            self.cancel()  # as if cancel() came now, from the training thread
        real(self, final)

    monkeypatch.setattr(_background.SaveHandle, "_hook", hook)
    h = checkpoint.save(str(tmp_path / "ck"), {"t": t}, blocking=False)
    with pytest.raises(checkpoint.SaveCancelled):
        h.wait(30)
    assert os.listdir(tmp_path) == []


def test_snapshots_are_freed_and_string_tables_round_trip(tmp_path, monkeypatch):
    made = []
    real = _background.snapshot_tables

    def snapshot(tables):
        out = real(tables)
        made.extend(c.id for shards in out.values() for c in shards)
        return out

    monkeypatch.setattr(_background, "snapshot_tables", snapshot)
    sk = Table(2, key_dtype="string")
    skeys = np.array([b"a", b"", b"\x00z", "é".encode()], object)
    svals = np.arange(8, dtype=np.float32).reshape(4, 2)
    sk.insert_or_assign(skeys, svals)
    sv = Table(2, value_dtype="string")
    vals = np.array([[b"1", b""], [b"x" * 100, b"\xff"], [b"", b""], [b"q", b"r"]], object)
    sv.insert_or_assign([4, 3, 2, 1], vals)
    shards = [adam_table(), adam_table()]
    train(shards[1], 2)
    h = checkpoint.save(str(tmp_path / "ck"), {"sk": sk, "sv": sv, "sharded": shards},
                        blocking=False)
    sk.erase(skeys[:2])
    sv.insert_or_assign([4], [[b"changed", b""]])
    h.wait(30)
    assert len(made) == 4 and not any(_exists(i) for i in made)
    ck = checkpoint.load(str(tmp_path / "ck"))
    got = ck.tables["sk"].export()
    assert {k: v.tolist() for k, v in zip(got["keys"], got["values"])} == \
        {k: v.tolist() for k, v in zip(skeys, svals)}
    got = ck.tables["sv"].export()
    assert {int(k): tuple(v) for k, v in zip(got["keys"], got["values"])} == \
        {k: tuple(v) for k, v in zip([4, 3, 2, 1], vals)}
    assert ck.tables["sharded"].size() == shards[1].size()


def _exists(table_id):
    try:
        Table.attach(table_id)
        return True
    except KeyError:
        return False


# The child saves a good checkpoint, starts a slow background save over it and trains on; the
# test kills it with SIGKILL once the save is under way.
CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np
    from dualemb.core import Table, checkpoint
    from dualemb.core.checkpoint import _write

    path = sys.argv[1]
    t = Table(dim=16, optimizer="adagrad")
    keys = np.arange(50_000, dtype=np.int64)
    t.apply_gradients(keys, np.ones((len(keys), 16), np.float32), 0.1, 1)
    checkpoint.save(path, {"t": t}, steps=1, metadata={"tag": "good"})
    real = _write._export_page
    def slow(table, offset, limit):
        if offset >= 2000:
            print("WRITING", flush=True)
        time.sleep(0.01)
        return real(table, offset, limit)
    _write._export_page = slow
    h = checkpoint.save(path, {"t": t}, steps=2, page_rows=1000, blocking=False)
    for step in range(2, 100000):
        t.apply_gradients(keys[:1000], np.ones((1000, 16), np.float32), 0.1, step)
        time.sleep(0.001)
""")


def kill_when_writing(script, *args):
    """Runs ``script`` in a child process, SIGKILLs it once it prints WRITING (its save is
    writing files) and checks that the kill ended it; the child is ended by its pid also when
    a check fails."""
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "WRITING", (line, proc.stderr.read())
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigkill_during_background_save_keeps_the_last_checkpoint(tmp_path):
    parent = tmp_path / "p"
    parent.mkdir()
    path = str(parent / "model")
    kill_when_writing(CHILD, path)
    assert complete_dirs(parent) == ["model"]
    assert any(n.startswith(".model.tmp-") for n in os.listdir(parent))  # it was mid-save
    ck = checkpoint.load(path)
    assert ck.metadata == {"tag": "good"} and ck.steps == {"t": 1}
    e = snapshot(ck.tables["t"])
    np.testing.assert_array_equal(e["keys"], np.arange(50_000))
    # adagrad from zeros, one step of gradient 1: every row is exactly what a fresh table gets
    ref = Table(dim=16, optimizer="adagrad")
    ref.apply_gradients(np.arange(50_000), np.ones((50_000, 16), np.float32), 0.1, 1)
    assert_same(e, snapshot(ref))
    checkpoint.save(path, {"t": Table(dim=16)})  # the next save removes the dead one's files
    assert os.listdir(parent) == ["model"]


# The same for a background *delta*: the child saves a full base, changes 20,000 of its 50,000
# rows, starts a slow background delta on top of it and trains on; the test kills it with SIGKILL
# once the delta's files are being written.
CHILD_DELTA = textwrap.dedent("""
    import sys, time
    import numpy as np
    from dualemb.core import Table, checkpoint
    from dualemb.core.checkpoint import _safetensors

    base, delta = sys.argv[1], sys.argv[2]
    t = Table(dim=16, optimizer="adagrad")
    keys = np.arange(50_000, dtype=np.int64)
    t.apply_gradients(keys, np.ones((len(keys), 16), np.float32), 0.1, 1)
    checkpoint.save(base, {"t": t}, steps=1, metadata={"tag": "base"})
    t.apply_gradients(keys[:20_000], np.ones((20_000, 16), np.float32), 0.1, 2)
    real = _safetensors.Writer.write_at
    said = []
    def slow(self, name, pos, data):
        if not said:
            said.append(1)
            print("WRITING", flush=True)
        time.sleep(0.01)
        return real(self, name, pos, data)
    _safetensors.Writer.write_at = slow
    h = checkpoint.save(delta, {"t": t}, steps=2, base=base, page_rows=1000, blocking=False)
    for step in range(3, 100000):
        t.apply_gradients(keys[:1000], np.ones((1000, 16), np.float32), 0.1, step)
        time.sleep(0.001)
""")


def test_sigkill_during_background_delta_keeps_the_base(tmp_path):
    parent = tmp_path / "p"
    parent.mkdir()
    base, delta = str(parent / "base"), str(parent / "d1")
    kill_when_writing(CHILD_DELTA, base, delta)
    assert complete_dirs(parent) == ["base"]  # no delta that looks complete
    assert any(n.startswith(".d1.tmp-") for n in os.listdir(parent))  # it was mid-save
    assert not os.path.exists(delta)
    ck = checkpoint.load(base)
    assert ck.metadata == {"tag": "base"} and ck.steps == {"t": 1}
    ref = Table(dim=16, optimizer="adagrad")  # one adagrad step of gradient 1 on every key
    ref.apply_gradients(np.arange(50_000), np.ones((50_000, 16), np.float32), 0.1, 1)
    assert_same(snapshot(ck.tables["t"]), snapshot(ref))

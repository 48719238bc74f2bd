"""A SavedModel served from a fresh Python process follows the trainer's delta checkpoints.

The test process is the trainer: it exports a module with a de.Variable lookup as a SavedModel,
then publishes a full checkpoint and deltas (``de.save(..., base=...)``) into a directory. One
server subprocess (tests/tf/serving_process.py) loads the SavedModel, follows the directory with
``de.saving.follow`` and, asked for step k, answers with its lookup of every key once it applied
checkpoint k. The reference: the trainer's own lookup at step k, equal bit for bit. Lockstep
(the trainer publishes k+1 only after the server answered k), so each answer is one step's state.
The server is ended by its pid on any failure; every wait is bounded.
"""

import os
import queue
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf

import dualemb.tf as de

pytestmark = pytest.mark.multiprocess

SERVER = os.path.join(os.path.dirname(__file__), "serving_process.py")
DIM = 8
KEYS = np.arange(-50, 250, dtype=np.int64)  # the first 200 are inserted at step 0
REPLY_S = 120  # safety bound per reply (TF's import in the fresh process on a loaded machine)


class Server:
    """The serving subprocess, its stdout lines read by a thread (so every wait has a bound)."""

    def __init__(self, tmp_path, model_dir, ckpt_dir, keys_path):
        self.out = tmp_path / "answers"
        self.out.mkdir()
        self.log = tmp_path / "server.log"
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, SERVER, str(model_dir), str(ckpt_dir), str(keys_path),
                 str(self.out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                text=True, env=env)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)  # the server exited

    def expect(self, prefix: str) -> str:
        try:
            line = self.lines.get(timeout=REPLY_S)
        except queue.Empty:
            raise AssertionError(f"no {prefix!r} from the server within {REPLY_S} s:\n"
                                 f"{self.log.read_text()[-3000:]}") from None
        if line is None or not line.startswith(prefix):
            raise AssertionError(f"the server said {line!r}, expected {prefix!r}:\n"
                                 f"{self.log.read_text()[-3000:]}")
        return line

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def rows_at(self, step: int) -> np.ndarray:
        self.send(str(step))
        assert self.expect("rows ") == f"rows {step}"
        return np.load(self.out / f"rows-{step}.npy")

    def close(self):
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            pass
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=30)


def test_fresh_process_saved_model_serves_each_delta(tmp_path):
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    # Started first: its imports overlap the export below; it loads the model on "load".
    server = Server(tmp_path, tmp_path / "model", ckpts, tmp_path / "keys.npy")
    try:
        export_and_serve(tmp_path, ckpts, server)
    finally:
        server.close()
    assert server.proc.returncode == 0, server.log.read_text()[-3000:]


def export_and_serve(tmp_path, ckpts, server):
    var = de.Variable(dim=DIM, devices=["/CPU:0"] * 2, name="emb")
    module = tf.Module()
    module.var = var
    module.lookup = tf.function(lambda k: var.lookup(k),
                                input_signature=[tf.TensorSpec([None], tf.int64)])
    tf.saved_model.save(module, str(tmp_path / "model"))  # exported empty: step 0 fills it
    keys = tf.constant(KEYS)
    np.save(tmp_path / "keys.npy", KEYS)
    rng = np.random.default_rng(0)
    var.upsert(tf.constant(KEYS[:200]), rng.normal(size=(200, DIM)).astype(np.float32))
    de.save(var, ckpts / "step-0", step=0)
    server.send("load")
    server.expect("ready")
    want = var.lookup(keys).numpy()
    np.testing.assert_array_equal(server.rows_at(0), want)
    prev = ckpts / "step-0"
    for step in range(1, 4):
        written = rng.choice(KEYS, 60, replace=False)  # new keys among them
        var.upsert(tf.constant(written), rng.normal(size=(60, DIM)).astype(np.float32))
        var.remove(tf.constant(rng.choice(KEYS, 15, replace=False)))
        path = ckpts / f"step-{step}"
        de.save(var, path, step=step, base=prev)
        prev = path
        want = var.lookup(keys).numpy()
        got = server.rows_at(step)
        assert not np.array_equal(got, np.load(server.out / f"rows-{step - 1}.npy"))
        np.testing.assert_array_equal(got, want, err_msg=f"the served rows at step {step}")

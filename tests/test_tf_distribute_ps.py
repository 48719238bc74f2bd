"""ParameterServerStrategy with dynamic embeddings, on a real local cluster.

Each test starts PS and worker tasks as ``python -m dualemb.tf.server`` subprocesses on free
127.0.0.1 ports (``dualemb.tf.distribute.local_cluster``) and the chief as another subprocess
(``tests/tf_distribute/ps_job.py``), all bounded in time and killed by pid when the test ends.
The reference is the same job run single-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from dualemb.core.routing import shard_of
from dualemb.tf.distribute.local_cluster import LocalCluster

JOB = os.path.join(os.path.dirname(__file__), "tf_distribute", "ps_job.py")
CHIEF_TIMEOUT = 240
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def run_job(out, *args, cluster=None, expect_ok=True):
    cmd = [sys.executable, JOB, "--out", str(out), *args]
    if cluster is not None:
        cmd += ["--cluster", json.dumps(cluster.spec)]
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=CHIEF_TIMEOUT)
    if expect_ok:
        assert proc.returncode == 0, proc.stderr[-4000:]
        return dict(np.load(out))
    return proc


def rows_by_key(state):
    """key -> (row, slots, shard index), over every shard."""
    out = {}
    for i in range(int(state["num_shards"])):
        for k, v, s in zip(state[f"shard{i}_keys"], state[f"shard{i}_values"],
                           state[f"shard{i}_slots"]):
            assert int(k) not in out, f"key {k} in two shards"
            out[int(k)] = (v, s, i)
    return out


def assert_keys_routed(state):
    """Every shard holds exactly the keys shard_of routes to it."""
    n = int(state["num_shards"])
    for i in range(n):
        keys = state[f"shard{i}_keys"]
        assert keys.size > 0
        np.testing.assert_array_equal(shard_of(keys, n), np.full(keys.shape, i))


def batch_keys(steps):
    sys.path.insert(0, os.path.dirname(JOB))
    from ps_job import batches
    return {int(k) for ids, _ in batches(steps) for k in ids.ravel()}


@pytest.fixture(scope="module")
def single_adam(tmp_path_factory):
    return run_job(tmp_path_factory.mktemp("single") / "r.npz", "--model", "dense",
                   "--optimizer", "adam")


@pytest.mark.timeout(300)
def test_one_worker_equals_single_process(tmp_path, single_adam):
    with LocalCluster(num_workers=1, num_ps=2, env=ENV) as cluster:
        state = run_job(tmp_path / "ps.npz", "--model", "dense", "--optimizer", "adam",
                        cluster=cluster)
    # Shards live on the PS tasks (default placement: one per PS), not in the chief's process.
    assert str(state["shard0_device"]) == "/job:ps/replica:0/task:0/device:CPU:0"
    assert str(state["shard1_device"]) == "/job:ps/replica:0/task:1/device:CPU:0"
    assert not state["shard_in_chief_process"].any()
    assert_keys_routed(state)
    got, want = rows_by_key(state), rows_by_key(single_adam)
    assert set(got) == set(want) == batch_keys(12)
    for k, (v, s, _) in got.items():  # one worker runs the steps in order: exactly equal
        np.testing.assert_array_equal(v, want[k][0], err_msg=f"row {k}")
        np.testing.assert_array_equal(s, want[k][1], err_msg=f"Adam slots of {k}")
    np.testing.assert_array_equal(state["dense0"], single_adam["dense0"])
    np.testing.assert_array_equal(state["dense1"], single_adam["dense1"])


@pytest.mark.timeout(300)
def test_two_workers_apply_every_gradient(tmp_path):
    """Two workers run steps in a nondeterministic order. The model is linear in the rows, so
    each step's gradient does not depend on the state and SGD's result is the initial row minus
    lr times the sum of all gradients in any order: equal to the single-process run up to float
    summation order (tolerance 1e-5)."""
    single = run_job(tmp_path / "single.npz", "--model", "linear", "--optimizer", "sgd")
    with LocalCluster(num_workers=2, num_ps=2, env=ENV) as cluster:
        state = run_job(tmp_path / "ps.npz", "--model", "linear", "--optimizer", "sgd",
                        "--shards-per-ps", "2", cluster=cluster)
    # devices= honoured: 4 shards, shard i on ps:(i mod 2).
    assert int(state["num_shards"]) == 4
    for i in range(4):
        assert str(state[f"shard{i}_device"]) == f"/job:ps/replica:0/task:{i % 2}/device:CPU:0"
    assert_keys_routed(state)
    got, want = rows_by_key(state), rows_by_key(single)
    assert set(got) == set(want) == batch_keys(12)
    for k, (v, _, _) in got.items():
        np.testing.assert_allclose(v, want[k][0], rtol=1e-5, atol=1e-5, err_msg=f"row {k}")


@pytest.mark.skip(reason="open: with a worker killed (and restarted on its port) mid-training, "
                  "the chief did not finish within 240 s on TF 2.21 here; not yet diagnosed "
                  "(see docs/scaling_tf.md, Faults)")
@pytest.mark.timeout(300)
def test_worker_killed_mid_training_loses_no_row(tmp_path):
    """A worker dies with steps queued and in flight; the coordinator retries them on the other
    worker and the run completes. TF's guarantee is at-least-once: a step that had applied its
    update before the worker died may be applied again. So every key trained is present with a
    row moved by at least each of its steps' updates once: with the order-free SGD model, a row
    is init - lr * sum_k m_k g_k with every m_k in {1, 2}."""
    single = run_job(tmp_path / "single.npz", "--model", "linear", "--optimizer", "sgd",
                     "--steps", "24")
    marker = tmp_path / "marker"
    with LocalCluster(num_workers=2, num_ps=2, env=ENV) as cluster:
        chief = subprocess.Popen(
            [sys.executable, JOB, "--out", str(tmp_path / "ps.npz"), "--model", "linear",
             "--optimizer", "sgd", "--steps", "24", "--kill-worker-after", "6", "--marker",
             str(marker), "--cluster", json.dumps(cluster.spec)],
            env=ENV, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + CHIEF_TIMEOUT
            while not marker.exists():
                assert chief.poll() is None, chief.stderr.read()[-4000:]
                assert time.monotonic() < deadline, "the chief never reached the kill point"
                time.sleep(0.05)
            victim = cluster.processes[("worker", 1)]
            cluster.kill("worker", 1)
            assert victim.poll() is not None
            marker.unlink()  # the chief goes on scheduling while worker 1 is dead
            time.sleep(3)
            cluster.restart("worker", 1)  # as a cluster manager would; TF reconnects to it
            _, err = chief.communicate(timeout=CHIEF_TIMEOUT)
            assert chief.returncode == 0, err[-4000:]
        finally:
            if chief.poll() is None:
                chief.kill()
                chief.wait()
        state = dict(np.load(tmp_path / "ps.npz"))
    assert_keys_routed(state)
    got, want = rows_by_key(state), rows_by_key(single)
    assert set(got) == set(want) == batch_keys(24)  # no row lost
    # (want - got) / lr = sum_s e_s c_sk, where e_s = m_s - 1 is how many extra times step s was
    # applied and c_sk its gradient coefficient for key k (the linear model's gradient of a row is
    # the sum of its examples' labels, the same in every column). A retried step can have reached
    # one shard and not the other before the worker died, so e is solved per shard.
    coeff = step_coefficients(24)
    for shard in range(int(state["num_shards"])):
        keys = [k for k in got if got[k][2] == shard]
        c = np.array([[coeff[s].get(k, 0.0) for s in range(24)] for k in keys])
        y = np.array([(want[k][0][0] - got[k][0][0]) / 0.1 for k in keys])
        assert np.linalg.matrix_rank(c) == 24
        extra, *_ = np.linalg.lstsq(c, y, rcond=None)
        np.testing.assert_allclose(extra, np.round(extra), atol=2e-3)
        assert set(np.round(extra).astype(int)) <= {0, 1}, f"shard {shard}: steps applied {extra}"
        # and every column moved like the first (nothing partially applied inside a row)
        for k in keys:
            np.testing.assert_allclose(want[k][0] - got[k][0], want[k][0][0] - got[k][0][0],
                                       atol=1e-5)


def step_coefficients(steps):
    """Per step, key -> the linear model's gradient of that key's row (sum of its examples'
    labels, one occurrence per id)."""
    sys.path.insert(0, os.path.dirname(JOB))
    from ps_job import batches
    out = []
    for ids, labels in batches(steps):
        c = {}
        for row, label in zip(ids, labels[:, 0]):
            for k in row:
                c[int(k)] = c.get(int(k), 0.0) + float(label)
        out.append(c)
    return out


# ---- checkpoints of a distributed job ------------------------------------------------------------

@pytest.fixture(scope="module")
def one_ps_cluster():
    """1 worker, 1 PS, shared by the tests below that need a second, smaller cluster."""
    with LocalCluster(num_workers=1, num_ps=1, env=ENV) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def ps_checkpoint(tmp_path_factory, one_ps_cluster):
    """A 1-worker, 2-PS Adam job saved with tf.train.Checkpoint and de.save after 12 steps, and
    its rows, slots and dense weights exported from the PS tasks when it saved; plus the same
    checkpoints restored (no training) by a 1-PS cluster."""
    d = tmp_path_factory.mktemp("ps_ckpt")
    with LocalCluster(num_workers=1, num_ps=2, env=ENV) as cluster:
        state = run_job(d / "ps.npz", "--model", "dense", "--optimizer", "adam",
                        "--save-dir", str(d / "save"), cluster=cluster)
    restored = {}
    for kind in ("tf", "common"):
        restored[kind] = run_job(d / f"restored_{kind}.npz", "--steps", "0",
                                 "--restore-dir", str(d / "save"), "--restore-kind", kind,
                                 cluster=one_ps_cluster)
    return d / "save", state, restored


def assert_same_rows(got_state, want_state):
    got, want = rows_by_key(got_state), rows_by_key(want_state)
    assert set(got) == set(want) == batch_keys(12)
    for k, (v, s, _) in want.items():
        np.testing.assert_array_equal(got[k][0], v, err_msg=f"row {k}")
        np.testing.assert_array_equal(got[k][1], s, err_msg=f"Adam slots of {k}")


def local_job(num_shards):
    sys.path.insert(0, os.path.dirname(JOB))
    from ps_job import Job
    return Job("dense", "adam", local_shards=num_shards)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", ["tf", "common"])
@pytest.mark.parametrize("num_shards", [1, 3])
def test_ps_checkpoint_restores_into_single_process(ps_checkpoint, kind, num_shards):
    save_dir, state, _ = ps_checkpoint
    assert int(state["num_shards"]) == 2 and not state["shard_in_chief_process"].any()
    job = local_job(num_shards)
    before = job.table_state()
    assert int(before["num_shards"]) == num_shards
    job.restore(str(save_dir), kind)
    after = job.table_state()
    assert_keys_routed(after)  # re-routed over this variable's own shard count
    assert_same_rows(after, state)
    np.testing.assert_array_equal(after["dense0"], state["dense0"])
    np.testing.assert_array_equal(after["dense1"], state["dense1"])


@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", ["tf", "common"])
def test_ps_checkpoint_restores_into_a_smaller_cluster(ps_checkpoint, kind):
    _, state, restored = ps_checkpoint
    got = restored[kind]
    assert int(got["num_shards"]) == 1
    assert str(got["shard0_device"]) == "/job:ps/replica:0/task:0/device:CPU:0"
    assert not got["shard_in_chief_process"].any()
    assert_same_rows(got, state)
    np.testing.assert_array_equal(got["dense0"], state["dense0"])


@pytest.mark.timeout(400)
def test_ps_checkpoint_restores_into_jax(ps_checkpoint):
    import dualemb.jax as dej
    from dualemb.core import checkpoint as core_ckpt
    save_dir, state, _ = ps_checkpoint
    path = save_dir / "common"
    names = [t["name"] for t in core_ckpt.read_manifest(path)["tables"]]
    assert len(names) == 1
    table = dej.load(path, names[0])
    try:
        assert int(table.step) == 12
        page = table.core().export()
        got = {int(k): (v, s) for k, v, s in zip(page["keys"], page["values"], page["slots"])}
        want = rows_by_key(state)
        assert set(got) == set(want)
        for k, (v, s, _) in want.items():
            np.testing.assert_array_equal(got[k][0], v, err_msg=f"row {k}")
            np.testing.assert_array_equal(got[k][1], s, err_msg=f"Adam slots of {k}")
    finally:
        dej.destroy(table)


@pytest.mark.timeout(300)
def test_embedding_update_without_step_raises_under_ps(tmp_path, one_ps_cluster):
    """optimizer.apply(...) without step= under ParameterServerStrategy raises the documented
    ValueError when the step function is traced, before any update reaches the PS."""
    state = run_job(tmp_path / "nostep.npz", "--omit-step", cluster=one_ps_cluster)
    assert "needs the step number" in str(state["error"])
    assert "step=step" in str(state["error"])
    for i in range(int(state["num_shards"])):
        assert state[f"shard{i}_keys"].size == 0  # nothing was looked up or applied

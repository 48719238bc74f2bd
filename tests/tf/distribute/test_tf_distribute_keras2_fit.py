"""tf_keras (Keras 2) ``model.fit`` under ParameterServerStrategy, on a real local cluster.

The chief (tests/tf/distribute/jobs/keras2_fit_ps_job.py) and the PS/worker tasks
(``python -m dualemb.tf.server``) run as subprocesses with ``TF_USE_LEGACY_KERAS=1``, so
``tf.keras`` and ``de.keras.layers`` are tf_keras there and never in this process; every process
is bounded in time and killed by pid. The reference is the same tf_keras model fitted in one
process on the same batches.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("tf_keras", reason="tf_keras (Keras 2) is not installed")

from dualemb.core.routing import shard_of  # noqa: E402
from dualemb.tf.distribute.local_cluster import LocalCluster  # noqa: E402

JOB = os.path.join(os.path.dirname(__file__), "jobs", "keras2_fit_ps_job.py")
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_USE_LEGACY_KERAS": "1"}
STEPS, LR = 12, 0.1
# Safety bounds only, generous so that they hold on a loaded machine (2 cores at load 6 and
# more): every wait is on a condition (a file, an exit), never a fixed sleep.
JOB_TIMEOUT = 600
EVENT_TIMEOUT = 300  # the longest a test waits for one event of a cluster


def run_job(out, *args, cluster=None):
    cmd = [sys.executable, JOB, "--out", str(out), *args]
    if cluster is not None:
        cmd += ["--cluster", json.dumps(cluster.spec)]
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(np.load(out))


def shards(state):
    """key -> (row, slots, update count), over every shard; and asserts every shard holds
    exactly the keys shard_of routes to it."""
    n, out = int(state["num_shards"]), {}
    for i in range(n):
        keys = state[f"shard{i}_keys"]
        assert keys.size > 0
        np.testing.assert_array_equal(shard_of(keys, n), np.full(keys.shape, i))
        for k, v, s, c in zip(keys, state[f"shard{i}_values"], state[f"shard{i}_slots"],
                              state[f"shard{i}_update_count"]):
            assert int(k) not in out, f"key {k} in two shards"
            out[int(k)] = (v, s, int(c))
    return out


# Clusters shared by this module's tests (each task is a process importing TF; each chief makes
# tables of its own, so a second chief on the same tasks starts from empty tables). The fault
# tests restart the workers they kill; the PS-death test, last, leaves its cluster broken.
@pytest.fixture(scope="module")
def two_ps_cluster():
    """1 worker, 2 PS."""
    with LocalCluster(num_workers=1, num_ps=2, env=ENV) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def two_worker_cluster():
    """2 workers, 2 PS."""
    with LocalCluster(num_workers=2, num_ps=2, env=ENV) as cluster:
        yield cluster


def start_paused_chief(tmp_path, cluster, marker, *args):
    """The chief, with fit's 5th step pausing on its worker after its updates (until
    ``marker.release`` exists), its stderr to ``tmp_path/chief.log`` (a pipe nobody reads while
    the test waits can fill and block it); waits until the step has paused. The caller ends it
    with ``end`` in finally."""
    with open(tmp_path / "chief.log", "w") as log:
        chief = subprocess.Popen(
            [sys.executable, JOB, "--out", str(tmp_path / "ps.npz"), *args, "--pause-step", "5",
             "--marker", str(marker), "--cluster", json.dumps(cluster.spec)], env=ENV,
            stderr=log)
    deadline = time.monotonic() + EVENT_TIMEOUT
    while not marker.exists():
        if chief.poll() is not None:
            raise AssertionError(chief_log(tmp_path)[-4000:])
        assert time.monotonic() < deadline, "fit never reached the paused step"
        time.sleep(0.05)
    return chief


def chief_log(tmp_path) -> str:
    return (tmp_path / "chief.log").read_text(errors="replace")


def end(chief):
    if chief.poll() is None:
        chief.kill()
        chief.wait(timeout=60)


def batch_list():
    sys.path.insert(0, os.path.dirname(JOB))
    from ps_job import batches
    return list(batches(STEPS))


@pytest.mark.timeout(1200)
def test_fit_one_worker_equals_single_process_fit(tmp_path, two_ps_cluster):
    single = run_job(tmp_path / "single.npz", "--model", "dense", "--optimizer", "adam")
    cluster = two_ps_cluster
    state = run_job(tmp_path / "ps.npz", "--model", "dense", "--optimizer", "adam",
                    cluster=cluster)
    assert bool(state["layer_is_tf_keras"]) and bool(single["layer_is_tf_keras"])
    # One shard per PS (default placement), each holding exactly its keys.
    assert str(state["shard0_device"]) == "/job:ps/replica:0/task:0/device:CPU:0"
    assert str(state["shard1_device"]) == "/job:ps/replica:0/task:1/device:CPU:0"
    got, want = shards(state), shards(single)
    assert set(got) == set(want) == {int(k) for ids, _ in batch_list() for k in ids.ravel()}
    # One worker runs fit's steps in order, each op as in one process: exactly equal.
    for k, (v, s, c) in got.items():
        np.testing.assert_array_equal(v, want[k][0], err_msg=f"row {k}")
        np.testing.assert_array_equal(s, want[k][1], err_msg=f"Adam slots of {k}")
        assert c == want[k][2], f"update count of {k}"
    np.testing.assert_array_equal(state["dense0"], single["dense0"])
    np.testing.assert_array_equal(state["dense1"], single["dense1"])
    assert int(state["iterations"]) == int(single["iterations"]) == STEPS


def sgd_rows(initial, batch_prefixes):
    """Rows of the linear model (loss sum(pred * label), pred the sum of the example's rows)
    after SGD on each of ``batch_prefixes`` first batches: every occurrence of key k in an
    example with label y adds y to k's gradient (in every dimension), whatever the state."""
    rows = dict(initial)
    for n in batch_prefixes:
        for ids, labels in batch_list()[:n]:
            for example, y in zip(ids, labels[:, 0]):
                for k in example:
                    rows[int(k)] = rows[int(k)] - LR * y
    return rows


@pytest.mark.timeout(1200)
def test_fit_two_workers_apply_every_step_once(tmp_path, two_worker_cluster):
    """Under PS, fit gives every worker its own iterator over the dataset, and the coordinator
    hands the 12 steps to whichever worker is free: worker 0 trains on the first ``n`` batches,
    worker 1 on the first ``12 - n``, ``n`` decided by timing. The model is linear in the rows
    and trained with SGD, so the result does not depend on the order: it must equal the
    state-free reference for one ``n`` (tolerance 1e-5: float summation order)."""
    single = run_job(tmp_path / "single.npz", "--model", "linear", "--optimizer", "sgd")
    initial = {int(k): r for k, r in zip(single["initial_keys"], single["initial_rows"])}
    reference = sgd_rows(initial, [STEPS])
    for k, (v, _, _) in shards(single).items():  # the reference is right in one process
        np.testing.assert_allclose(v, reference[k], rtol=1e-5, atol=1e-5)

    cluster = two_worker_cluster
    state = run_job(tmp_path / "ps.npz", "--model", "linear", "--optimizer", "sgd",
                    "--shards-per-ps", "2", cluster=cluster)
    assert int(state["num_shards"]) == 4  # devices= honoured: shard i on ps:(i mod 2)
    for i in range(4):
        assert str(state[f"shard{i}_device"]) == f"/job:ps/replica:0/task:{i % 2}/device:CPU:0"
    got = shards(state)
    assert int(state["iterations"]) == STEPS  # tf_keras counts every step (assign_add)

    def matches(n):
        want = sgd_rows(initial, [n, STEPS - n])
        keys = {int(k) for ids, _ in batch_list()[:max(n, STEPS - n)] for k in ids.ravel()}
        return set(got) == keys and all(
            np.allclose(v, want[k], rtol=1e-5, atol=1e-5) for k, (v, _, _) in got.items())

    assert any(matches(n) for n in range(STEPS + 1)), \
        "no split of the 12 steps between the workers gives the trained rows"


def one_batch_gradient():
    """key -> d(loss)/d(row) of the linear model on the first batch (the same in every dimension):
    the sum of the labels of the examples the key occurs in, once per occurrence."""
    ids, labels = batch_list()[0]
    grad = {}
    for example, y in zip(ids, labels[:, 0]):
        for k in example:
            grad[int(k)] = grad.get(int(k), 0.0) + float(y)
    return grad


@pytest.mark.timeout(1500)
def test_fit_step_applied_again_when_its_workers_die_after_the_update(tmp_path, two_worker_cluster):
    """fit's 5th step to run, once its updates reached the PS tasks, writes a marker and pauses
    on its worker; the test kills both workers then and restarts them on their ports. The
    coordinator retries the closures it lost, fit completes, and wait_for_recovery lets the chief
    exit. Every step feeds the same batch to the linear model with SGD, so each shard's rows are
    init - lr * m * g with m the number of applications on that shard: TF's at-least-once retry
    gives m >= 13 (12 steps, the paused one twice), and at most one more application per failed
    attempt (the other worker's step in flight, a retry failing again during the recovery: the
    custom-loop test saw 3 applications). Checked exactly per shard: every key's update_count is
    m, and every row moved by exactly m gradient steps."""
    single = run_job(tmp_path / "single.npz", "--model", "linear", "--optimizer", "sgd",
                     "--same-batch")
    initial = {int(k): r for k, r in zip(single["initial_keys"], single["initial_rows"])}
    grad = one_batch_gradient()
    for k, (v, _, c) in shards(single).items():  # the reference is right in one process
        assert c == STEPS
        np.testing.assert_allclose(v, initial[k] - LR * STEPS * grad[k], rtol=1e-5, atol=1e-5)

    marker = tmp_path / "marker"
    cluster = two_worker_cluster
    chief = start_paused_chief(tmp_path, cluster, marker, "--model", "linear",
                               "--optimizer", "sgd", "--same-batch")
    try:
        for task in (0, 1):  # the paused step's worker among them
            cluster.kill("worker", task)
        # Killed in its pause, the step's RPC fails: the coordinator sees it whenever it
        # looks, so the restart needs no delay. The release lets a retry through at once.
        (tmp_path / "marker.release").write_text("go")
        # Both at once (TF reconnects to them at the same address): one back and the other
        # not yet makes the coordinator's cluster update fail and retry.
        cluster.restart("worker", 0, ("worker", 1))
        chief.wait(timeout=EVENT_TIMEOUT)
        err = chief_log(tmp_path)
        assert chief.returncode == 0, err[-4000:]
    finally:
        end(chief)
    state = dict(np.load(tmp_path / "ps.npz"))
    assert "failed with UnavailableError" in err  # the fault path ran
    got = shards(state)
    assert set(got) == set(grad)  # no row lost
    applied = []
    for i in range(int(state["num_shards"])):
        counts = {int(c) for c in state[f"shard{i}_update_count"]}
        assert len(counts) == 1, f"shard {i}: keys of one batch updated unequally: {counts}"
        m = counts.pop()
        assert STEPS + 1 <= m <= STEPS + 3, f"shard {i} applied {m} steps"
        applied.append(m)
        for k in state[f"shard{i}_keys"]:
            np.testing.assert_allclose(got[int(k)][0], initial[int(k)] - LR * m * grad[int(k)],
                                       rtol=1e-5, atol=1e-5, err_msg=f"row {k}")
    print(f"steps applied per shard: {applied}, iterations {int(state['iterations'])}")


@pytest.mark.timeout(1500)
def test_fit_fails_clearly_when_a_ps_dies(tmp_path, two_ps_cluster):
    """A PS dies during fit (after fit's 5th step updated it): TF does not retry PS failures (the
    rows it held are gone), so fit raises UnavailableError naming the PS's address within a
    bounded time, and the chief exits with an error instead of hanging or finishing as if
    nothing happened. (Restarting from a checkpoint is the custom loop's test: same
    coordinator.)"""
    marker = tmp_path / "marker"
    cluster = two_ps_cluster
    chief = start_paused_chief(tmp_path, cluster, marker, "--model", "linear",
                               "--optimizer", "sgd", "--same-batch")
    try:
        cluster.kill("ps", 1)
        (tmp_path / "marker.release").write_text("go")  # the paused step goes on, and fails
        chief.wait(timeout=EVENT_TIMEOUT)
        err = chief_log(tmp_path)
    finally:
        end(chief)
    assert chief.returncode != 0
    assert not (tmp_path / "ps.npz").exists()  # it did not finish as if nothing happened
    raised = [ln for ln in err.splitlines() if re.match(r"\S*Error: ", ln)]  # the traceback's
    assert raised and "UnavailableError" in raised[-1], err[-4000:]
    message = err[err.index(raised[-1]):]
    message = message[:message.find("[Op:")]  # the exception's text, not TF's exit-time logs
    assert cluster.spec["ps"][1] in message and "/job:ps/replica:0/task:1" in message, message

"""ParameterServerStrategy with dynamic embeddings, on a real local cluster.

Each test starts PS and worker tasks as ``python -m dualemb.tf.server`` subprocesses on free
127.0.0.1 ports (``dualemb.tf.distribute.local_cluster``) and the chief as another subprocess
(``tests/tf/distribute/jobs/ps_job.py``), all bounded in time and killed by pid when the test ends.
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

JOB = os.path.join(os.path.dirname(__file__), "jobs", "ps_job.py")
# Safety bounds only, generous so that they hold on a loaded machine (2 cores at load 6 and
# more): every wait is on a condition (a file, a log line, an exit), never a fixed sleep.
CHIEF_TIMEOUT = 600
IDLE_TIMEOUT = 300  # the longest a test waits for one event of a cluster
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


# Clusters shared by the tests of this module: each chief makes tables of its own on the PS
# tasks, so a second chief on the same tasks starts from empty tables (the restores into
# one_ps_cluster and then the training run on it compare exactly with a fresh single-process
# run), and tests take turns on one set of tasks instead of each starting its own (every task
# is a process importing TF: most of this module's time). The fault tests kill and restart
# tasks on their ports; a restarted task is as good as a new one for the tests after them.
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


@pytest.mark.timeout(1200)
def test_one_worker_equals_single_process(ps_checkpoint, single_adam):
    """The checkpointed job (1 worker, 2 PS, Adam, 12 steps; its state exported from the PS
    tasks when it saved, before its delta chain trained on) against the same steps in one
    process."""
    _, state, _ = ps_checkpoint
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


@pytest.mark.timeout(1200)
def test_two_workers_apply_every_gradient(tmp_path, two_worker_cluster):
    """Two workers run steps in a nondeterministic order. The model is linear in the rows, so
    each step's gradient does not depend on the state and SGD's result is the initial row minus
    lr times the sum of all gradients in any order: equal to the single-process run up to float
    summation order (tolerance 1e-5)."""
    single = run_job(tmp_path / "single.npz", "--model", "linear", "--optimizer", "sgd")
    state = run_job(tmp_path / "ps.npz", "--model", "linear", "--optimizer", "sgd",
                    "--shards-per-ps", "2", cluster=two_worker_cluster)
    # devices= honoured: 4 shards, shard i on ps:(i mod 2).
    assert int(state["num_shards"]) == 4
    for i in range(4):
        assert str(state[f"shard{i}_device"]) == f"/job:ps/replica:0/task:{i % 2}/device:CPU:0"
    assert_keys_routed(state)
    got, want = rows_by_key(state), rows_by_key(single)
    assert set(got) == set(want) == batch_keys(12)
    for k, (v, _, _) in got.items():
        np.testing.assert_allclose(v, want[k][0], rtol=1e-5, atol=1e-5, err_msg=f"row {k}")


def start_chief(tmp_path, cluster, *args):
    """Starts the chief (ps_job.py) on ``cluster``, its stderr to ``tmp_path/chief.log`` (a file,
    not a pipe: a pipe nobody reads while the test waits can fill and block the chief). The
    caller ends it with ``end`` in finally."""
    with open(tmp_path / "chief.log", "w") as log:
        return subprocess.Popen(
            [sys.executable, JOB, "--out", str(tmp_path / "ps.npz"), *args,
             "--cluster", json.dumps(cluster.spec)], env=ENV, stderr=log)


def chief_log(tmp_path) -> str:
    return (tmp_path / "chief.log").read_text(errors="replace")


def wait_until(condition, chief, tmp_path, what):
    """Polls ``condition()`` until it holds; raises if the chief exits first or IDLE_TIMEOUT
    passes."""
    deadline = time.monotonic() + IDLE_TIMEOUT
    while not condition():
        if chief.poll() is not None:
            raise AssertionError(f"the chief exited before {what}:\n{chief_log(tmp_path)[-4000:]}")
        assert time.monotonic() < deadline, f"{what}: not within {IDLE_TIMEOUT} s"
        time.sleep(0.05)


def finish(chief, tmp_path):
    """Waits for the chief to exit (bounded); returns its stderr."""
    chief.wait(timeout=IDLE_TIMEOUT)
    return chief_log(tmp_path)


def run_chief_until_marker(tmp_path, cluster, *args):
    """Starts the chief with --marker and waits until it has scheduled the steps up to the kill
    point; returns (chief Popen, marker path). The caller kills it in finally."""
    marker = tmp_path / "marker"
    chief = start_chief(tmp_path, cluster, *args, "--marker", str(marker))
    wait_until(marker.exists, chief, tmp_path, "the chief reached the kill point")
    return chief, marker


def end(chief):
    if chief.poll() is None:
        chief.kill()
        chief.wait(timeout=60)


@pytest.mark.timeout(1200)
def test_worker_killed_mid_training_loses_no_row(tmp_path, two_worker_cluster):
    """A worker dies with steps queued and in flight, and is restarted on its port (as a cluster
    manager would). The coordinator retries the failed closure on a live worker and the run
    completes; dualemb.tf.distribute.wait_for_recovery lets the chief exit (without it the chief
    hung at exit, see recovery.py). TF's guarantee is at-least-once: a step whose update reached a
    shard before its worker died is applied again there. Checked per shard, exactly: every key's
    update_count is the number of applications of the steps that contain it, and with the
    order-free SGD model its row is init - lr * sum_s m_s g_s, with each step's multiplicity
    m_s in {1, 2} (never 0: no step lost)."""
    steps = 24
    single = run_job(tmp_path / "single.npz", "--model", "linear", "--optimizer", "sgd",
                     "--steps", str(steps))
    cluster = two_worker_cluster
    chief, marker = run_chief_until_marker(
        tmp_path, cluster, "--model", "linear", "--optimizer", "sgd", "--steps", str(steps),
        "--kill-worker-after", "6")
    try:
        cluster.kill("worker", 1)
        assert cluster.processes[("worker", 1)].poll() is not None
        marker.unlink()  # the chief goes on scheduling while worker 1 is dead
        # Restarted only once the coordinator has seen it fail (a fixed sleep was a race on
        # a loaded machine: restarted too early, no failure was ever seen).
        wait_until(lambda: FAILED in chief_log(tmp_path), chief, tmp_path,
                   "the coordinator saw worker 1 fail")
        cluster.restart("worker", 1)  # TF reconnects to it at the same address
        err = finish(chief, tmp_path)
        assert chief.returncode == 0, err[-4000:]
    finally:
        end(chief)
    state = dict(np.load(tmp_path / "ps.npz"))
    assert FAILED in err  # the fault path ran: the coordinator saw worker 1 fail
    assert_keys_routed(state)
    got, want = rows_by_key(state), rows_by_key(single)
    assert set(got) == set(want) == batch_keys(steps)  # no row lost
    extra = extra_applications(state, single, steps)
    print(f"steps applied twice, per shard: {[list(np.flatnonzero(e) + 1) for e in extra]}")


@pytest.mark.timeout(1500)
def test_ps_killed_fails_clearly_and_restarts_from_checkpoint(tmp_path, two_ps_cluster):
    """A PS dies mid-training: TF does not retry (the rows it held are gone), so the chief's
    schedule/join raises UnavailableError within a bounded time instead of hanging. The PS is
    restarted on its port (empty) and a new chief restores the checkpoint saved before the kill
    (tf.train.Checkpoint, then the common format): the tables hold exactly that checkpoint's
    keys, rows and Adam slots, with nothing left from the steps trained after it (the surviving
    PS still held those in the dead chief's tables)."""
    save = tmp_path / "save"
    cluster = two_ps_cluster
    chief, marker = run_chief_until_marker(
        tmp_path, cluster, "--model", "dense", "--optimizer", "adam", "--steps", "24",
        "--save-dir", str(save), "--save-after", "8", "--kill-worker-after", "12")
    try:
        cluster.kill("ps", 1)
        marker.unlink()
        err = finish(chief, tmp_path)
    finally:
        end(chief)
    assert chief.returncode == 3, err[-4000:]
    failed = dict(np.load(tmp_path / "ps.npz"))
    assert str(failed["error_type"]) == "UnavailableError", str(failed["error"])
    ps1 = cluster.spec["ps"][1]
    assert ps1 in str(failed["error"]) or "/job:ps" in str(failed["error"]), failed["error"]

    saved = dict(np.load(save / "saved.npz"))
    assert batch_keys(8) == set(rows_by_key(saved))
    cluster.restart("ps", 1)
    for kind in ("tf", "common"):
        got = run_job(tmp_path / f"restored_{kind}.npz", "--steps", "0",
                      "--restore-dir", str(save), "--restore-kind", kind, cluster=cluster)
        assert_keys_routed(got)
        assert_same_rows(got, saved, batch_keys(8))
        np.testing.assert_array_equal(got["dense0"], saved["dense0"])
        np.testing.assert_array_equal(got["dense1"], saved["dense1"])


FAILED = "Worker /job:worker/replica:0/task:1 failed with UnavailableError"


def extra_applications(state, single, steps, max_extra=1):
    """Per shard, how many extra times each step was applied there (an int array [steps]),
    solved exactly from the exported update counts, after checking that every count and every
    row agrees with those multiplicities (each in 1 .. 1 + max_extra: no step lost, and at most
    one extra application per failed attempt)."""
    got, want = rows_by_key(state), rows_by_key(single)
    assert set(got) == set(want) == batch_keys(steps)  # no row lost
    counts = {int(k): int(c) for i in range(int(state["num_shards"]))
              for k, c in zip(state[f"shard{i}_keys"], state[f"shard{i}_update_count"])}
    single_counts = {int(k): int(c) for i in range(int(single["num_shards"]))
                     for k, c in zip(single[f"shard{i}_keys"], single[f"shard{i}_update_count"])}
    coeff = step_coefficients(steps)
    out = []
    for shard in range(int(state["num_shards"])):
        keys = [k for k in got if got[k][2] == shard]
        # update_count: one per apply that contained the key (the single run: its step count).
        a = np.array([[float(k in coeff[s]) for s in range(steps)] for k in keys])
        np.testing.assert_array_equal(a.sum(1), [single_counts[k] for k in keys])
        assert np.linalg.matrix_rank(a) == steps
        y = np.array([counts[k] - single_counts[k] for k in keys], float)
        extra = np.round(np.linalg.lstsq(a, y, rcond=None)[0]).astype(int)
        np.testing.assert_array_equal(a @ extra, y)
        assert set(extra) <= set(range(max_extra + 1)), \
            f"shard {shard}: extra applications per step {extra}"
        # The rows moved by exactly those applications: (want - got) / lr = sum_s e_s c_sk, the
        # same in every column (the linear model's row gradient is the sum of its labels).
        c = np.array([[coeff[s].get(k, 0.0) for s in range(steps)] for k in keys])
        for k, moved in zip(keys, c @ extra):
            np.testing.assert_allclose((want[k][0] - got[k][0]) / 0.1, np.full(4, moved),
                                       atol=2e-4, err_msg=f"row {k}")
        out.append(extra)
    return out


@pytest.mark.timeout(1500)
def test_step_applied_again_when_its_worker_dies_after_the_update(tmp_path, two_worker_cluster):
    """Forces TF's at-least-once case: step 7's closure applies its updates on both PS tasks,
    then (ps_job --pause-step) writes a marker and busy-waits on its worker until the test
    releases it; the test kills both workers then (it cannot tell which one runs step 7),
    releases the pause (for the retry) and restarts them on their ports. The
    coordinator re-runs step 7: it is applied again on every shard, no step is lost, and
    update_count and rows agree exactly with the multiplicities found. Two workers fail, so a
    step may be attempted up to 3 times, each failed attempt possibly applied: step 7 was seen
    applied 3 times (TF recovered the two workers in two rounds, and the retry, paused after its
    updates, failed once more) as well as twice."""
    steps = 12
    single = run_job(tmp_path / "single.npz", "--model", "linear", "--optimizer", "sgd",
                     "--steps", str(steps))
    updated = tmp_path / "step7_updated"
    cluster = two_worker_cluster
    chief = start_chief(tmp_path, cluster, "--model", "linear", "--optimizer", "sgd",
                        "--steps", str(steps), "--pause-step", "7",
                        "--pause-marker", str(updated))
    try:
        wait_until(updated.exists, chief, tmp_path, "step 7 reached its pause")
        cluster.kill("worker", 0)
        cluster.kill("worker", 1)
        updated.unlink()
        (tmp_path / "step7_updated.release").write_text("go")  # the retry does not wait
        cluster.restart("worker", 0, ("worker", 1))  # both at once: see LocalCluster.restart
        err = finish(chief, tmp_path)
        assert chief.returncode == 0, err[-4000:]
    finally:
        end(chief)
    state = dict(np.load(tmp_path / "ps.npz"))
    assert "failed with UnavailableError" in err
    assert updated.exists()  # the retried step 7 ran its pause again, on a restarted worker
    assert_keys_routed(state)
    extra = extra_applications(state, single, steps, max_extra=2)
    print(f"extra applications per shard and step: {[e.tolist() for e in extra]}")
    for shard, e in enumerate(extra):
        assert e[6] >= 1, f"shard {shard}: step 7 applied once, expected again after the kill"


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
def ps_checkpoint(tmp_path_factory, one_ps_cluster, two_ps_cluster):
    """A 1-worker, 2-PS Adam job saved with tf.train.Checkpoint and de.save after 12 steps, and
    its rows, slots and dense weights exported from the PS tasks when it saved; plus the same
    checkpoints restored (no training) by a 1-PS cluster. The same chief then writes a chain of
    deltas on its de.save and a full save at the chain's last step (ps_job.delta_chain)."""
    d = tmp_path_factory.mktemp("ps_ckpt")
    cluster = two_ps_cluster
    state = run_job(d / "ps.npz", "--model", "dense", "--optimizer", "adam",
                    "--save-dir", str(d / "save"), "--delta-chain", cluster=cluster)
    restored = {}
    for kind in ("tf", "common"):
        restored[kind] = run_job(d / f"restored_{kind}.npz", "--steps", "0",
                                 "--restore-dir", str(d / "save"), "--restore-kind", kind,
                                 cluster=one_ps_cluster)
    return d / "save", state, restored


def assert_same_rows(got_state, want_state, keys=None):
    got, want = rows_by_key(got_state), rows_by_key(want_state)
    assert set(got) == set(want) == (batch_keys(12) if keys is None else keys)
    for k, (v, s, _) in want.items():
        np.testing.assert_array_equal(got[k][0], v, err_msg=f"row {k}")
        np.testing.assert_array_equal(got[k][1], s, err_msg=f"Adam slots of {k}")


def local_job(num_shards):
    sys.path.insert(0, os.path.dirname(JOB))
    from ps_job import Job
    return Job("dense", "adam", local_shards=num_shards)


@pytest.mark.timeout(1500)
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


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("kind", ["tf", "common"])
def test_ps_checkpoint_restores_into_a_smaller_cluster(ps_checkpoint, kind):
    _, state, restored = ps_checkpoint
    got = restored[kind]
    assert int(got["num_shards"]) == 1
    assert str(got["shard0_device"]) == "/job:ps/replica:0/task:0/device:CPU:0"
    assert not got["shard_in_chief_process"].any()
    assert_same_rows(got, state)
    np.testing.assert_array_equal(got["dense0"], state["dense0"])


@pytest.mark.timeout(1500)
def test_ps_checkpoint_restores_into_jax(ps_checkpoint):
    import dualemb.jax as dej
    from dualemb.core import checkpoint as core_ckpt
    save_dir, state, _ = ps_checkpoint
    path = save_dir / "common"
    names = [t["name"] for t in core_ckpt.read_manifest(path)["tables"]]
    assert len(names) == 1
    want = rows_by_key(state)
    # dej.load (one table) and dej.load_tables (all of a checkpoint's tables, verified first)
    for table in (dej.load(path, names[0]), dej.load_tables(path)[names[0]]):
        try:
            assert int(table.step) == 12
            page = table.core().export()
            got = {int(k): (v, s) for k, v, s in zip(page["keys"], page["values"],
                                                      page["slots"])}
            assert set(got) == set(want)
            for k, (v, s, _) in want.items():
                np.testing.assert_array_equal(got[k][0], v, err_msg=f"row {k}")
                np.testing.assert_array_equal(got[k][1], s, err_msg=f"Adam slots of {k}")
        finally:
            dej.destroy(table)


@pytest.mark.timeout(1500)
def test_plain_apply_gradients_one_worker_equals_single_process(tmp_path, one_ps_cluster,
                                                                single_adam):
    """optimizer.apply_gradients(zip(grads, variables)) without step=, as Keras users write it:
    the fused update reads iterations as Keras does for the dense weights, and one worker runs
    the steps one after another, so rows, Adam slots, dense weights and iterations equal a
    single-process run of the same call bit for bit, and the run that passes step= too."""
    single = run_job(tmp_path / "single.npz", "--plain-apply")
    state = run_job(tmp_path / "ps.npz", "--plain-apply", cluster=one_ps_cluster)
    assert not state["shard_in_chief_process"].any()
    assert str(state["shard0_device"]) == "/job:ps/replica:0/task:0/device:CPU:0"
    for reference in (single, single_adam):
        got, want = rows_by_key(state), rows_by_key(reference)
        assert set(got) == set(want) == batch_keys(12)
        for k, (v, s, _) in got.items():
            np.testing.assert_array_equal(v, want[k][0], err_msg=f"row {k}")
            np.testing.assert_array_equal(s, want[k][1], err_msg=f"Adam slots of {k}")
        np.testing.assert_array_equal(state["dense0"], reference["dense0"])
        np.testing.assert_array_equal(state["dense1"], reference["dense1"])
        assert int(state["iterations"]) == int(reference["iterations"]) == 12


# ---- delta checkpoints of a PS job ------------------------------------------------------------

def core_rows(path):
    """(key -> (values, slots, last_update, update_count, stepped), step) of the one table of
    the checkpoint at ``path``, its chain followed, loaded into one core table."""
    from dualemb.core import checkpoint as core_ckpt
    ck = core_ckpt.load(path)
    (name, table), = ck.tables.items()
    try:
        page = table.export()
    finally:
        table.destroy()
    rows = {int(k): tuple(page[f][i] for f in ("values", "slots", "last_update", "update_count",
                                               "stepped"))
            for i, k in enumerate(page["keys"])}
    return rows, ck.steps[name]


def assert_same_core_rows(got, want, what):
    assert set(got) == set(want), what
    for k, fields in want.items():
        for name, a, b in zip(("values", "slots", "last_update", "update_count", "stepped"),
                              got[k], fields):
            np.testing.assert_array_equal(a, b, err_msg=f"{what}: {name} of key {k}")


def update_counts(state):
    return {int(k): int(c) for i in range(int(state["num_shards"]))
            for k, c in zip(state[f"shard{i}_keys"], state[f"shard{i}_update_count"])}


@pytest.mark.timeout(1500)
def test_ps_delta_chain_holds_the_state_at_each_save(ps_checkpoint):
    """Each delta the chief wrote (on the previous one, down to the job's full save) loads to
    the rows, Adam slots and update counts the PS tasks held when it was saved (delta 3 was
    saved in the background while the job trained on), holds fewer rows than the table, and
    lists the erased and restricted keys as tombstones; the last equals the full save at the
    same step bit for bit (metadata and step included)."""
    from dualemb.core import checkpoint as core_ckpt
    sys.path.insert(0, os.path.dirname(JOB))
    from ps_job import DELTA_ROUNDS
    chain = ps_checkpoint[0] / "chain"
    previous = set(rows_by_key(ps_checkpoint[1]))
    for r in range(1, DELTA_ROUNDS + 1):
        want = dict(np.load(chain / f"state-{r}.npz"))
        got, step = core_rows(chain / f"delta-{r}")
        assert set(got) == set(rows_by_key(want)), f"delta {r}"
        for k, (v, s, _) in rows_by_key(want).items():
            np.testing.assert_array_equal(got[k][0], v, err_msg=f"delta {r}: row {k}")
            np.testing.assert_array_equal(got[k][1], s, err_msg=f"delta {r}: slots of {k}")
        assert {k: int(f[3]) for k, f in got.items()} == update_counts(want), f"delta {r}"
        assert step == 12 + 2 * r + (r == 4)  # round 3 trained one step after its snapshot
        (entry,) = core_ckpt.read_manifest(chain / f"delta-{r}")["tables"]
        gone = previous - set(got)  # erased or restricted since the previous save
        assert len(gone) > 0 and entry["tombstones"]["rows"] == len(gone)
        assert 0 < sum(s["rows"] for s in entry["shards"]) < len(got)
        previous = set(got)
    full, full_step = core_rows(chain / "full")
    last, last_step = core_rows(chain / f"delta-{DELTA_ROUNDS}")
    assert last_step == full_step
    assert_same_core_rows(last, full, "delta chain vs full save")


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("num_shards", [1, 3])
def test_ps_delta_chain_restores_into_single_process(ps_checkpoint, num_shards):
    """de.load of the last delta (its chain followed) into 1 and 3 local shards equals de.load
    of the full save at the same step: rows, slots, update counts, dense weights, iterations."""
    import dualemb.tf as de
    chain = ps_checkpoint[0] / "chain"
    from_chain, from_full = local_job(num_shards), local_job(num_shards)
    de.load(from_chain.model, chain / "delta-4", optimizer=from_chain.optimizer)
    de.load(from_full.model, chain / "full", optimizer=from_full.optimizer)
    got, want = from_chain.table_state(), from_full.table_state()
    assert_keys_routed(got)
    got_rows, want_rows = rows_by_key(got), rows_by_key(want)
    assert set(got_rows) == set(want_rows) and len(want_rows) > 100
    for k, (v, s, _) in want_rows.items():
        np.testing.assert_array_equal(got_rows[k][0], v, err_msg=f"row {k}")
        np.testing.assert_array_equal(got_rows[k][1], s, err_msg=f"Adam slots of {k}")
    assert update_counts(got) == update_counts(want)
    np.testing.assert_array_equal(got["dense0"], want["dense0"])
    np.testing.assert_array_equal(got["dense1"], want["dense1"])
    assert int(got["iterations"]) == int(want["iterations"]) == 21


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("break_it", ["missing", "replaced"])
def test_ps_delta_chain_broken_is_refused_table_unchanged(ps_checkpoint, tmp_path, break_it):
    """A chain whose middle delta is gone, or was replaced by another checkpoint, is refused
    with a CheckpointError naming the base, before any table or weight changes."""
    import shutil

    import dualemb.tf as de
    from dualemb.core.checkpoint import CheckpointError
    save = tmp_path / "save"
    shutil.copytree(ps_checkpoint[0], save)
    shutil.rmtree(save / "chain" / "delta-2")
    if break_it == "replaced":
        shutil.copytree(save / "chain" / "delta-1", save / "chain" / "delta-2")
    job = local_job(3)
    de.load(job.model, save / "common", optimizer=job.optimizer)
    before = job.table_state()
    with pytest.raises(CheckpointError, match="delta-2.*(missing|replaced)"):
        de.load(job.model, save / "chain" / "delta-4", optimizer=job.optimizer)
    after = job.table_state()
    assert set(before) == set(after)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)


# ---- string keys ------------------------------------------------------------------------------

def string_rows_by_key(state):
    """key bytes -> (row, slots, shard index), over every shard of a --string-keys result."""
    from dualemb.core import _string_keys
    out = {}
    for i in range(int(state["num_shards"])):
        keys = _string_keys.unpack(state[f"shard{i}_key_offsets"], state[f"shard{i}_key_bytes"])
        for k, v, s in zip(keys, state[f"shard{i}_values"], state[f"shard{i}_slots"]):
            assert k not in out, f"key {k!r} in two shards"
            out[k] = (v, s, i)
    return out


def assert_same_string_rows(got_state, want_state, num_shards):
    """Same keys (those of the batches), same rows and Adam slots, every key in the shard TFRA's
    string partitioner (tf.strings.to_hash_bucket_fast) names."""
    import tensorflow as tf
    sys.path.insert(0, os.path.dirname(JOB))
    from ps_job import batches
    keys = {k for ids, _ in batches(12, string_keys=True) for k in ids.ravel()}
    got, want = string_rows_by_key(got_state), string_rows_by_key(want_state)
    assert set(got) == set(want) == keys
    assert any(k.endswith(b"\x00") for k in keys) and any(k[:1] == b"\xff" for k in keys)
    ordered = sorted(got)
    buckets = tf.strings.to_hash_bucket_fast(tf.constant(ordered, tf.string), num_shards).numpy()
    for k, bucket in zip(ordered, buckets):
        assert got[k][2] == bucket, k
        np.testing.assert_array_equal(got[k][0], want[k][0], err_msg=f"row {k!r}")
        np.testing.assert_array_equal(got[k][1], want[k][1], err_msg=f"Adam slots of {k!r}")


@pytest.mark.timeout(1500)
def test_string_keys_one_worker_equals_single_process(tmp_path, two_ps_cluster):
    """key_dtype=tf.string under ParameterServerStrategy: shards on the PS tasks, string ids
    routed by to_hash_bucket_fast, rows and Adam slots equal to the single-process run; the
    job's TF checkpoint and de.save (gathered from the PS tasks) restore into one process."""
    single = run_job(tmp_path / "single.npz", "--string-keys")
    cluster = two_ps_cluster
    state = run_job(tmp_path / "ps.npz", "--string-keys", "--save-dir",
                    str(tmp_path / "save"), cluster=cluster)
    assert str(state["shard1_device"]) == "/job:ps/replica:0/task:1/device:CPU:0"
    assert not state["shard_in_chief_process"].any()
    assert_same_string_rows(state, single, 2)
    np.testing.assert_array_equal(state["dense0"], single["dense0"])
    import tensorflow as tf
    sys.path.insert(0, os.path.dirname(JOB))
    from ps_job import Job
    for kind in ("tf", "common"):
        job = Job("dense", "adam", local_shards=3, key_dtype=tf.string)
        job.restore(str(tmp_path / "save"), kind)
        assert_same_string_rows(job.table_state(), state, 3)

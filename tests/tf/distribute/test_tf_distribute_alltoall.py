"""The all-to-all embedding (``de.keras.layers.HvdAllToAllEmbedding``) under MirroredStrategy over
2 logical CPUs and MultiWorkerMirroredStrategy with 2 worker processes on 127.0.0.1.

Each run is a subprocess (``tests/tf/distribute/jobs/mirrored_job.py``; logical devices must be set
before TF starts), bounded in time and killed by pid. The reference is the same job trained in a
single process on the concatenated batch. Tolerance: the replicas' loss gradients are summed in a
different order (dense gradients by the all-reduce, a key's row gradients by the owner's fused
step) than in one process, so float32 results agree to rounding, not bit for bit — measured
<= 3e-8 on rows of magnitude ~0.1 after 8 steps, checked at atol 1e-6.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dualemb.core.routing import shard_of
from dualemb.tf.distribute.local_cluster import free_ports

JOB = os.path.join(os.path.dirname(__file__), "jobs", "mirrored_job.py")
TIMEOUT = 600  # a safety bound per process, generous so that it holds on a loaded machine
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
ATOL = 1e-6


def run(out, mode, optimizer, env=None, extra=()):
    proc = subprocess.run([sys.executable, JOB, "--mode", mode, "--out", str(out),
                           "--optimizer", optimizer, *extra], env=env or ENV, capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(np.load(out))


def run_two_workers(tmp, optimizer, extra=()):
    """Both workers of a 2-worker MultiWorkerMirroredStrategy job; each killed by pid at the
    end. ``extra``: more job arguments, ``{task}`` replaced by the worker's index."""
    workers = [f"127.0.0.1:{p}" for p in free_ports(2)]
    procs = []
    try:
        for task in range(2):
            env = {**ENV, "TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                                   "task": {"type": "worker", "index": task}})}
            log = open(tmp / f"worker{task}.log", "w+")
            procs.append((subprocess.Popen(
                [sys.executable, JOB, "--mode", "multiworker", "--optimizer", optimizer,
                 "--out", str(tmp / f"worker{task}.npz"),
                 *[a.replace("{task}", str(task)) for a in extra]], env=env, stdout=log,
                stderr=subprocess.STDOUT), log))
        for proc, log in procs:
            try:
                proc.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                pass
        for task, (proc, log) in enumerate(procs):
            log.seek(0)
            assert proc.returncode == 0, f"worker {task}: rc {proc.returncode}\n{log.read()[-4000:]}"
        return [dict(np.load(tmp / f"worker{task}.npz")) for task in range(2)]
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=60)
            log.close()


def shards(*states):
    """replica -> (keys, values, slots), over the local shards of every process."""
    out = {}
    for state in states:
        for i in range(int(state["num_local_shards"])):
            replica = int(state["first_replica"]) + i
            assert replica not in out
            out[replica] = (state[f"shard{i}_keys"], state[f"shard{i}_values"],
                            state[f"shard{i}_slots"])
    return out


def assert_owned_by_replica(by_replica, n):
    assert sorted(by_replica) == list(range(n))
    for replica, (keys, _, _) in by_replica.items():
        assert keys.size > 0
        np.testing.assert_array_equal(shard_of(keys, n), np.full(keys.shape, replica))


def assert_equals_reference(by_replica, dense_states, reference):
    ref = {int(k): (v, s) for k, v, s in zip(reference["shard0_keys"], reference["shard0_values"],
                                             reference["shard0_slots"])}
    got = {}
    for keys, values, slots in by_replica.values():
        for k, v, s in zip(keys, values, slots):
            assert int(k) not in got, f"key {k} in two shards"
            got[int(k)] = (v, s)
    assert sorted(got) == sorted(ref)
    for k in ref:
        np.testing.assert_allclose(got[k][0], ref[k][0], rtol=0, atol=ATOL, err_msg=f"key {k}")
        np.testing.assert_allclose(got[k][1], ref[k][1], rtol=0, atol=ATOL, err_msg=f"key {k}")
    for state in dense_states:
        np.testing.assert_allclose(state["kernel"], reference["kernel"], rtol=0, atol=ATOL)
        np.testing.assert_allclose(state["bias"], reference["bias"], rtol=0, atol=ATOL)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run(tmp_path_factory.mktemp("single") / "r.npz", "single", "adam")


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    return run(tmp_path_factory.mktemp("mirrored") / "m.npz", "mirrored", "adam")


@pytest.mark.timeout(1500)
def test_mirrored_two_cpus_equals_single_process(mirrored, reference):
    assert int(mirrored["num_replicas"]) == 2 and int(mirrored["num_local_shards"]) == 2
    assert_equals_reference(shards(mirrored), [mirrored], reference)


@pytest.mark.timeout(1500)
def test_mirrored_each_replica_holds_exactly_its_keys(mirrored):
    assert_owned_by_replica(shards(mirrored), 2)


@pytest.mark.timeout(1500)
def test_multiworker_two_processes_equals_single_process(tmp_path, reference):
    states = run_two_workers(tmp_path, "adam")
    assert [int(s["first_replica"]) for s in states] == [0, 1]
    by_replica = shards(*states)
    assert_owned_by_replica(by_replica, 2)
    assert_equals_reference(by_replica, states, reference)


# ---- the layer outside a strategy (in-process) ------------------------------------------------
def test_outside_a_strategy_it_is_an_embedding():
    import tensorflow as tf

    import dualemb.tf as de
    layer = de.keras.layers.HvdAllToAllEmbedding(embedding_size=3, name="a2a_plain")
    plain = de.keras.layers.Embedding(3, name="a2a_plain")  # same name: same initial rows
    ids = tf.constant([[5, -7], [5, 123456789012]], tf.int64)
    np.testing.assert_array_equal(layer(ids).numpy(), plain(ids).numpy())
    assert len(layer.params.tables) == 1 and layer._exchange is None


def test_tfra_arguments_and_config_round_trip():
    import dualemb.tf as de
    layer = de.keras.layers.HvdAllToAllEmbedding(False, False, 1, 32, embedding_size=4,
                                                 name="a2a_cfg")
    config = layer.get_config()
    assert (config["with_unique"], config["with_secondary_unique"], config["mpi_size"],
            config["batch_size"]) == (False, False, 1, 32)
    assert "all_to_all" not in config
    again = de.keras.layers.HvdAllToAllEmbedding.from_config(config)
    assert (again.with_unique, again.with_secondary_unique, again.embedding_size) == (False, False,
                                                                                       4)


def test_mpi_size_that_is_not_the_replica_count_raises():
    import dualemb.tf as de
    with pytest.raises(ValueError, match="mpi_size=2.*outside a strategy"):
        de.keras.layers.HvdAllToAllEmbedding(embedding_size=4, mpi_size=2, name="a2a_mpi")


def test_bytes_per_lookup():
    from dualemb.tf.distribute.alltoall import bytes_per_lookup
    # 2 replicas, buckets padded to 10 ids, dim 4: sizes 12, ids 2*10*8, rows and gradients
    # 2 * (2*10*16).
    assert bytes_per_lookup(10, 2, 4) == 12 + 160 + 640
    assert bytes_per_lookup(10, 2, 4, training=False) == 12 + 160 + 320


# ---- Keras 3 model.fit ---------------------------------------------------------------------------
FIT_JOB = os.path.join(os.path.dirname(__file__), "jobs", "fit_job.py")


def run_fit(out, mode):
    proc = subprocess.run([sys.executable, FIT_JOB, "--mode", mode, "--out", str(out)], env=ENV,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    state = dict(np.load(out))
    state["first_replica"] = np.array(0)
    return state


@pytest.mark.timeout(1500)
def test_fit_mirrored_two_cpus_equals_single_process_fit(tmp_path):
    """model.fit with the all-to-all embedding under MirroredStrategy (2 logical CPUs) equals
    model.fit in one process on the same batches (tolerance as above)."""
    reference = run_fit(tmp_path / "single.npz", "single")
    mirrored = run_fit(tmp_path / "mirrored.npz", "mirrored")
    assert int(mirrored["num_local_shards"]) == 2
    by_replica = shards(mirrored)
    assert_owned_by_replica(by_replica, 2)
    assert_equals_reference(by_replica, [mirrored], reference)

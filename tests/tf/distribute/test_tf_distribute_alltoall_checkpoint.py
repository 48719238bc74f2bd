"""Checkpoints of the all-to-all embedding (docs/scaling_tf.md, "Checkpoints of an all-to-all
job"): a 2-worker MultiWorkerMirroredStrategy job saves one common-format checkpoint
(``de.save`` called by both workers), which restores exactly into one process, into a
MirroredStrategy job of 3 replicas, and into ``dualemb.jax``; a one-process checkpoint (common
format and ``tf.train.Checkpoint``) restores into the 2 workers, each keeping exactly its keys;
``tf.train.Checkpoint`` of the split job is refused.

The jobs are subprocesses (``tests/tf/distribute/jobs/mirrored_job.py``), bounded in time and killed by
pid. The reference is what the saving job itself exported (numpy): a restore copies rows, slots
and dense weights bit for bit, so every comparison is exact.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file
from test_tf_distribute_alltoall import assert_owned_by_replica, run, run_two_workers, shards

from dualemb.core.routing import shard_of


def rows(*states) -> dict:
    """key -> (values, slots) over every local shard of the given process results."""
    out = {}
    for keys, values, slots in shards(*states).values():
        for k, v, s in zip(keys, values, slots):
            assert int(k) not in out, f"key {k} in two shards"
            out[int(k)] = (v, s)
    return out


def assert_same_rows(got: dict, want: dict):
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k][0], want[k][0], err_msg=f"values of key {k}")
        np.testing.assert_array_equal(got[k][1], want[k][1], err_msg=f"slots of key {k}")


def assert_same_dense(state, reference):
    np.testing.assert_array_equal(state["kernel"], reference["kernel"])
    np.testing.assert_array_equal(state["bias"], reference["bias"])
    assert int(state["iterations"]) == int(reference["iterations"])


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The 2-worker job after 8 Adam steps, and the checkpoint both workers saved."""
    tmp = tmp_path_factory.mktemp("job")
    ckpt = tmp / "ckpt"
    states = run_two_workers(tmp, "adam", extra=["--save", str(ckpt),
                                                 "--tf-save", str(tmp / "tf{task}" / "ck")])
    return states, ckpt


@pytest.fixture(scope="module")
def single_saved(tmp_path_factory):
    """A one-process run of the same training, saved in both formats."""
    tmp = tmp_path_factory.mktemp("single_saved")
    state = run(tmp / "s.npz", "single", "adam",
                extra=["--save", str(tmp / "ckpt"), "--tf-save", str(tmp / "tf" / "ck")])
    return state, tmp / "ckpt", tmp / "tf" / "ck"


@pytest.mark.timeout(1800)
def test_job_checkpoint_has_one_shard_file_per_replica(job):
    states, ckpt = job
    manifest = json.load(open(ckpt / "manifest.json"))
    (table,) = manifest["tables"]
    assert table["step"] == 8 and len(table["shards"]) == 2
    assert table["rows"] == sum(len(s["shard0_keys"]) for s in states)
    for j, shard in enumerate(table["shards"]):
        keys = load_file(os.path.join(ckpt, shard["file"]))["keys"]
        np.testing.assert_array_equal(np.sort(keys), np.sort(states[j]["shard0_keys"]))
        np.testing.assert_array_equal(shard_of(keys, 2), np.full(keys.shape, j))
    assert not [n for n in os.listdir(ckpt.parent) if n.startswith(".ckpt")], \
        "staging directory left behind"


@pytest.mark.timeout(1800)
def test_job_checkpoint_restores_into_one_process(job, tmp_path):
    states, ckpt = job
    got = run(tmp_path / "r.npz", "single", "adam", extra=["--steps", "0", "--restore", str(ckpt)])
    assert int(got["num_local_shards"]) == 1
    assert_same_rows(rows(got), rows(*states))
    assert_same_dense(got, states[0])


@pytest.mark.timeout(1800)
def test_job_checkpoint_restores_into_three_replicas(job, tmp_path):
    states, ckpt = job
    got = run(tmp_path / "m.npz", "mirrored", "adam",
              extra=["--cpus", "3", "--steps", "0", "--restore", str(ckpt)])
    assert int(got["num_replicas"]) == 3
    assert_owned_by_replica(shards(got), 3)  # keys re-routed by shard_of(key, 3)
    assert_same_rows(rows(got), rows(*states))
    assert_same_dense(got, states[0])


@pytest.mark.timeout(1800)
def test_job_checkpoint_loads_in_jax(job):
    import dualemb.jax as dej
    states, ckpt = job
    (name,) = [t["name"] for t in json.load(open(ckpt / "manifest.json"))["tables"]]
    table = dej.load_tables(str(ckpt))[name]
    page = table.core().export()
    got = {int(k): (v, s) for k, v, s in zip(page["keys"], page["values"], page["slots"])}
    assert_same_rows(got, rows(*states))


@pytest.mark.timeout(1800)
def test_tf_checkpoint_of_a_split_job_is_refused(job):
    states, _ = job
    # Each worker holds half the table: tf.train.Checkpoint would keep the chief's half only.
    assert [bool(s["tf_save_refused"]) for s in states] == [True, True]


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("fmt", ["common", "tf"])
def test_one_process_checkpoint_restores_into_two_workers(single_saved, tmp_path, fmt):
    reference, ckpt, tf_ckpt = single_saved
    flag = ["--restore", str(ckpt)] if fmt == "common" else ["--tf-restore", str(tf_ckpt)]
    states = run_two_workers(tmp_path, "adam", extra=["--steps", "0", *flag])
    assert_owned_by_replica(shards(*states), 2)  # each worker kept exactly its own keys
    assert_same_rows(rows(*states), rows(reference))
    for state in states:
        assert_same_dense(state, reference)


@pytest.fixture(scope="module")
def mirrored_saved(tmp_path_factory):
    """MirroredStrategy on 2 logical CPUs (both shards in one process), saved in both formats."""
    tmp = tmp_path_factory.mktemp("mirrored_saved")
    state = run(tmp / "m.npz", "mirrored", "adam",
                extra=["--save", str(tmp / "ckpt"), "--tf-save", str(tmp / "tf" / "ck")])
    assert not bool(state["tf_save_refused"])  # every shard is in this process: TF's save works
    return state, tmp / "ckpt", tmp / "tf" / "ck"


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("fmt", ["common", "tf"])
def test_mirrored_checkpoint_restores_into_one_process(mirrored_saved, tmp_path, fmt):
    saved, ckpt, tf_ckpt = mirrored_saved
    flag = ["--restore", str(ckpt)] if fmt == "common" else ["--tf-restore", str(tf_ckpt)]
    got = run(tmp_path / "r.npz", "single", "adam", extra=["--steps", "0", *flag])
    assert_same_rows(rows(got), rows(saved))
    assert_same_dense(got, saved)

"""A P-process job writes ONE common-format checkpoint that loads into Q != P processes, into one
process (dualemb.jax.load) and into dualemb.tf (3 shards), with slots and step; continuing from
it equals not stopping.

Batches here have no repeated id within a step (WORKER_DRAW=1 draws them unique over the
global batch), so every run sums the same gradients in the same order: comparisons are exact."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import _scale_util as U
from test_jax_sharded import assert_same_state

UNIQUE = {"WORKER_DRAW": "1"}
ARGS = ["--unique-per-device"]


def run(tmp, name, processes, args, devices=1):
    d = tmp / name
    d.mkdir()
    U.check_ok(U.run_processes(d, processes, ARGS + args, devices=devices, extra_env=UNIQUE))
    return U.load_state(d, processes)


def test_checkpoint_p_to_q_to_one_to_tf(tmp_path):
    ck1, ck2 = str(tmp_path / "ck-p2"), str(tmp_path / "ck-q4")
    straight = run(tmp_path, "straight", 1, ["--reference", "--steps", "5"])
    # P = 2 processes train 3 steps and save one checkpoint
    run(tmp_path, "p2", 2, ["--steps", "3", "--save", ck1])
    names = sorted(os.listdir(ck1))
    assert names.count("manifest.json") == 1
    assert [n for n in names if n.endswith(".safetensors")] == [
        "table-0000-shard-00000.safetensors", "table-0000-shard-00001.safetensors"]
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n], "a temporary directory left"
    # Q = 4 processes continue 2 steps from it: equal to never stopping
    q4 = run(tmp_path, "q4", 4, ["--load", ck1, "--start-step", "3", "--steps", "2",
                                 "--save", ck2])
    assert_same_state(q4, straight, exact=True)
    # one process (dualemb.jax.load) continues from the 2-process checkpoint
    one = run(tmp_path, "one", 1, ["--reference", "--load", ck1, "--start-step", "3",
                                   "--steps", "2"])
    assert_same_state(one, straight, exact=True)
    # dualemb.tf reads the 4-process checkpoint into a 3-shard de.Variable (the JAX checks above
    # have passed; CI's Python 3.12 leg runs without TensorFlow)
    tf = pytest.importorskip("tensorflow", reason="the last part reads the checkpoint with "
                             "dualemb.tf, and TensorFlow is not installed")
    import dualemb.tf as de
    from dualemb.core.table import Table
    from dualemb.core.routing import shard_of
    var = de.Variable(key_dtype=tf.int64, dim=4, name="table", devices=["/CPU:0"] * 3)
    holder = tf.Module()
    holder.table = var
    opt = de.DynamicEmbeddingOptimizer(__import__("keras").optimizers.Adam(0.05))
    de.load(holder, ck2, optimizer=opt)
    assert int(opt.iterations.numpy()) == straight["step"] == 5
    parts = [Table.attach(s.table_id).export() for s in var.tables]
    for i, p in enumerate(parts):
        assert (shard_of(p["keys"], 3) == i).all()
    keys = np.concatenate([p["keys"] for p in parts])
    order = np.argsort(keys)
    np.testing.assert_array_equal(keys[order], straight["keys"])
    for f in ("values", "slots"):
        np.testing.assert_array_equal(np.concatenate([p[f] for p in parts])[order],
                                      straight[f])


# ---- a coordinator killed mid-save (issue 24, item 5) -------------------------------------------

def saved_state(path):
    """What the checkpoint at `path` holds, as load_state gives a job's state."""
    from dualemb.core import checkpoint
    ck = checkpoint.load(path, num_shards=1)
    (t,) = ck.tables.values()
    t = t[0] if isinstance(t, list) else t
    e = t.export()
    order = np.argsort(e["keys"])
    return {"keys": e["keys"][order], "values": e["values"][order],
            "slots": e["slots"][order], "step": next(iter(ck.steps.values()))}


def staging_dirs(parent):
    return sorted(n for n in os.listdir(parent)
                  if ".tmp-" in n and os.path.isdir(os.path.join(parent, n)))


def kill_coordinator_mid_save(tmp, processes, ckpt, devices=1):
    """Runs a job that continues from `ckpt` and saves over it, with process 0 held after every
    shard file is written (before the manifest); checks the staging directory a live save owns
    survives another save to the path; SIGKILLs process 0 (then the rest). Returns the staging
    directory left behind."""
    from dualemb.core import checkpoint
    d = tmp / "killed"
    d.mkdir()
    marker = str(tmp / "holding")
    procs = U.start_processes(d, processes, ARGS + ["--load", ckpt, "--start-step", "3",
                                                    "--steps", "2", "--save", ckpt,
                                                    "--hold-save", marker],
                                 devices=devices, extra_env=UNIQUE)
    try:
        deadline = time.monotonic() + 240
        while not os.path.exists(marker):
            assert all(p.poll() is None for p, _ in procs), \
                f"a worker ended before the save was held: {U.end_processes(procs)}"
            assert time.monotonic() < deadline, "the save never reached the manifest step"
            time.sleep(0.2)
        with open(marker) as f:
            staging = f.read()
        names = os.listdir(staging)
        assert "manifest.json" not in names
        assert sorted(n for n in names if n.endswith(".safetensors")) == [
            "table-0000-shard-00000.safetensors", "table-0000-shard-00001.safetensors"]
        # Another save to the path while this one is alive (the same contents, re-saved from
        # this process) must leave the live save's staging directory alone.
        ck = checkpoint.load(ckpt)
        checkpoint.save(ckpt, ck.tables, steps=ck.steps, metadata=ck.metadata)
        assert os.path.isdir(staging), "the staging directory of a live save was removed"
        coordinator = procs[0][0]
        os.kill(coordinator.pid, signal.SIGKILL)
        coordinator.wait(timeout=30)
    finally:
        U.end_processes(procs)
    assert os.path.isdir(staging)  # what the crash leaves, until the next save
    return staging


def test_killed_coordinator_then_next_sharded_save_cleans_up(tmp_path):
    ck = str(tmp_path / "ckpts" / "ck")
    os.mkdir(tmp_path / "ckpts")
    saved = run(tmp_path, "p2", 2, ["--steps", "3", "--save", ck])
    staging = kill_coordinator_mid_save(tmp_path, 2, ck)
    # the last complete checkpoint still loads, equal to what the first job saved
    assert_same_state(saved_state(ck), saved, exact=True)
    # the next sharded.save to the path (a new 2-process job) removes the dead job's directory
    after = run(tmp_path, "next", 2, ["--load", ck, "--start-step", "3", "--steps", "2",
                                      "--save", ck])
    assert not os.path.exists(staging)
    assert os.listdir(tmp_path / "ckpts") == ["ck"]
    assert_same_state(saved_state(ck), after, exact=True)
    assert after["step"] == 5


def test_killed_sharded_save_then_next_dej_save_cleans_up(tmp_path):
    import dualemb.jax as dej
    ck = str(tmp_path / "ckpts" / "ck")
    os.mkdir(tmp_path / "ckpts")
    saved = run(tmp_path, "p1", 1, ["--steps", "3", "--save", ck], devices=2)  # 2 shards
    staging = kill_coordinator_mid_save(tmp_path, 1, ck, devices=2)
    assert_same_state(saved_state(ck), saved, exact=True)
    # the next single-process dej.save to the path removes the dead save's directory
    dej.save(dej.load(ck), ck)
    assert not os.path.exists(staging)
    assert os.listdir(tmp_path / "ckpts") == ["ck"]
    assert_same_state(saved_state(ck), saved, exact=True)

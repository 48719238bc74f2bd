"""A P-process job writes ONE common-format checkpoint that loads into Q != P processes, into one
process (dualemb.jax.load) and into dualemb.tf (3 shards), with slots and step; continuing from
it equals not stopping.

Batches here have no repeated id within a step (WORKER_DRAW=1 draws them unique over the
global batch), so every run sums the same gradients in the same order: comparisons are exact."""

from __future__ import annotations

import os

import numpy as np
import pytest

import _scale_util as U
from test_jax_sharded import assert_same_state

UNIQUE = {"WORKER_DRAW": "1"}
ARGS = ["--unique-per-device"]


def run(tmp, name, processes, args):
    d = tmp / name
    d.mkdir()
    U.check_ok(U.run_processes(d, processes, ARGS + args, extra_env=UNIQUE))
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

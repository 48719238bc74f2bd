"""Live serving updates from TF: a SavedModel loaded for serving (its own fresh tables) follows
the delta checkpoints a trainer writes with ``de.save(..., base=...)``, applied in place while
its signature answers lookups. References: the trainer Variable's lookups at each step, and rows
whose elements all equal one version (a half-written row would mix two)."""
import threading

import numpy as np
import tensorflow as tf

import dualemb.tf as de
from dualemb.tf.saving import follow

DIM = 8
KEYS = np.arange(-60, 240, dtype=np.int64)


def test_loaded_saved_model_follows_the_trainers_deltas(tmp_path):
    var = de.Variable(dim=DIM, devices=["/CPU:0"] * 2, name="emb")
    var.upsert(tf.constant(KEYS), tf.zeros([len(KEYS), DIM]))
    module = tf.Module()
    module.var = var
    module.lookup = tf.function(lambda k: var.lookup(k),
                                input_signature=[tf.TensorSpec([None], tf.int64)])
    tf.saved_model.save(module, str(tmp_path / "model"))
    served = tf.saved_model.load(str(tmp_path / "model"))  # its own tables, as in a new process
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    de.save(var, ckpts / "step-000", step=0)
    follower = follow(ckpts, {"emb": served.var})
    assert [a.delta for a in follower.poll()] == [False]

    stop, problems = threading.Event(), []

    def reader():
        while not stop.is_set() and len(problems) < 5:
            rows = served.lookup(tf.constant(KEYS)).numpy()
            bad = rows.min(axis=1) != rows.max(axis=1)
            if bad.any():
                problems.append(rows[bad][0])

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        rng = np.random.default_rng(0)
        prev = ckpts / "step-000"
        for version in range(1, 5):
            pick = rng.choice(KEYS, 150, replace=False)
            var.upsert(tf.constant(pick), tf.fill([150, DIM], float(version)))
            gone = rng.choice(KEYS, 10, replace=False)
            var.remove(tf.constant(gone))
            path = ckpts / f"step-{version:03d}"
            de.save(var, path, step=version, base=prev)
            prev = path
            if version == 1:  # the served tables are the loaded model's own: not yet updated
                assert not served.lookup(tf.constant(pick)).numpy().any()
            applied = follower.poll()
            assert [(a.steps["emb"], a.delta) for a in applied] == [(version, True)]
            np.testing.assert_array_equal(served.lookup(tf.constant(KEYS)).numpy(),
                                          var.lookup(tf.constant(KEYS)).numpy())
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive() and problems == []

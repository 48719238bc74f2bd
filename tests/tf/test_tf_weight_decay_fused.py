"""Keras' decoupled ``weight_decay`` runs inside the core's fused step for every optimizer (issue
19): the spec the wrapper attaches carries it, and a checkpoint saved while the TF front end
still decayed the rows itself (its optimizer spec has no ``weight_decay``) continues with its
slots, against a dense Keras reference started from the saved rows and slots.

The parity of SGD, Adagrad, Adam, RMSprop and Lion with weight decay against dense Keras models
is in test_tf_optimizer_parity.py.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import shutil  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import _paths  # noqa: E402
import dualemb.tf as de  # noqa: E402
from dualemb.core import Table  # noqa: E402
from dualemb.core import checkpoint  # noqa: E402
from dualemb.tf.optimizers import fused_specs  # noqa: E402

FIXTURE = _paths.FIXTURES / "legacy_v1" / "common"  # table "ints": keras Adagrad, dim 2


@pytest.mark.parametrize("make, name", [
    (lambda: keras.optimizers.SGD(0.1, weight_decay=0.2), "sgd"),
    (lambda: keras.optimizers.Adagrad(0.1, weight_decay=0.2), "adagrad"),
    (lambda: keras.optimizers.Adam(0.1, weight_decay=0.2), "adamw"),
])
def test_the_spec_carries_the_weight_decay(make, name):
    spec = fused_specs.fused_spec(make(), decay=True)
    assert spec["name"] == name and spec["weight_decay"] == pytest.approx(0.2)
    assert "weight_decay" not in fused_specs.fused_spec(keras.optimizers.SGD(0.1), decay=True)
    assert "weight_decay" not in fused_specs.fused_spec(make(), decay=False)  # excluded var


def _step_loss(rows):
    return tf.reduce_sum(rows * rows * tf.constant([[1.0, -0.5]]))


def test_old_checkpoint_continues_with_its_slots(tmp_path):
    path = str(tmp_path / "ck")
    shutil.copytree(FIXTURE, path)
    var = de.Variable(dim=2, name="wd_old_checkpoint")
    live = Table.attach(var.tables[0].table_id)
    checkpoint.load(path, {"ints": live}, names=["ints"])
    saved = live.export()
    assert "weight_decay" not in live.optimizer  # the spec of the old front-end decay
    keys = saved["keys"]
    assert np.any(saved["slots"][:, 0] != np.float32(0.1))  # trained accumulators to keep

    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adagrad(0.1, weight_decay=0.2))
    dense = tf.Variable(saved["values"])
    ref = keras.optimizers.Adagrad(0.1, weight_decay=0.2)
    ref.build([dense])
    ref.variables[-1].assign(saved["slots"][:, 0])  # the accumulator, from the checkpoint
    assert "accumulator" in ref.variables[-1].path
    for _ in range(2):
        with tf.GradientTape() as tape:
            rows, trainable = de.embedding_lookup(var, tf.constant(keys), name="wd",
                                                  return_trainable=True)
            loss = _step_loss(rows)
        opt.apply_gradients(zip(tape.gradient(loss, [trainable]), [trainable]))
        with tf.GradientTape() as tape:
            loss = _step_loss(dense)
        ref.apply_gradients([(tape.gradient(loss, dense), dense)])
    assert live.optimizer["weight_decay"] == pytest.approx(0.2)
    got = live.export()
    order = np.argsort(got["keys"])
    np.testing.assert_array_equal(got["keys"][order], np.sort(keys))
    want = np.argsort(keys)
    np.testing.assert_allclose(got["values"][order], dense.numpy()[want], rtol=1e-6)
    np.testing.assert_allclose(got["slots"][order][:, 0], ref.variables[-1].numpy()[want],
                               rtol=1e-6)

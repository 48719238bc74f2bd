"""Slot views list exactly the keys the optimizer has stepped (issue 24, item 6).

"One id missing after fit": no id was dropped from the table; the slot view left out a trained
id whose gradient was exactly zero (an embedding row that meets only dead ReLUs), because it
listed the rows whose slots differ from the initial slots, and Adagrad's accumulator does not
move for g = 0. TFRA 0.8.1's slot tables hold every key of a batch ``apply_gradients`` updated:
its wrapper upserts the slot rows of all the lookup's ids after each step, whatever their
gradient (dynamic_embedding_optimizer.py, ``_s.update_op``). Here the core marks such rows
"stepped". The zero gradient is built on purpose (a mask on the loss), so the test is exact:
before the mark it fails (key 2 missing from the view); the slot values are checked against a
dense Keras Adagrad over the same rows.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import uuid  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import dualemb.tf as de  # noqa: E402
from dualemb.core import checkpoint as ckpt  # noqa: E402
from dualemb.core import Table  # noqa: E402

DIM = 3
TRAINED = [1, 2, 3]  # key 2's gradient is exactly zero
MASK = np.array([[1.0] * DIM, [0.0] * DIM, [1.0] * DIM], np.float32)


def _variable():
    init = keras.initializers.RandomNormal(stddev=0.5, seed=5)
    return de.Variable(dim=DIM, initializer=init, name=f"stepped_{uuid.uuid4().hex[:8]}")


def _step(var, opt, keys, mask):
    with tf.GradientTape() as tape:
        rows, trainable = de.embedding_lookup(var, tf.constant(keys, tf.int64), name="t",
                                              return_trainable=True)
        loss = tf.reduce_sum(rows * rows * mask)
    opt.apply_gradients(zip(tape.gradient(loss, [trainable]), [trainable]))


@pytest.fixture(scope="module")
def trained():
    """A Variable stepped twice over keys 1, 2, 3 (key 2 with zero gradients), with key 9
    upserted and key 7 read by a lookup only; and the dense Keras reference of the same rows."""
    var = _variable()
    var.upsert(tf.constant([9], tf.int64), tf.constant([[0.5] * DIM]))
    initial = var.lookup(tf.constant(TRAINED, tf.int64)).numpy()
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adagrad(0.1))
    for _ in range(2):
        _step(var, opt, TRAINED, MASK)
    var.lookup(tf.constant([7], tf.int64))  # a plain lookup (not inserted, not stepped)

    dense = tf.Variable(initial)
    ref = keras.optimizers.Adagrad(0.1)
    for _ in range(2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(dense * dense * MASK)
        ref.apply_gradients([(tape.gradient(loss, dense), dense)])
    accumulator = [v for v in ref.variables if "accumulator" in v.name][0]
    return var, opt, dense.numpy(), accumulator.numpy()


def _view(var, opt):
    (slot,) = var.get_slot_variables(opt)
    keys, values = slot.export()
    order = np.argsort(keys.numpy())
    return keys.numpy()[order].tolist(), values.numpy()[order], int(slot.size())


def test_zero_gradient_row_is_in_the_slot_view(trained):
    var, opt, dense_rows, dense_accumulator = trained
    keys, values, size = _view(var, opt)
    assert keys == TRAINED and size == 3  # key 2 (zero gradient) included; 9 and 7 are not
    np.testing.assert_allclose(values, dense_accumulator, rtol=1e-6)
    np.testing.assert_array_equal(values[1], np.full(DIM, np.float32(0.1)))  # never moved
    rows = var.lookup(tf.constant(TRAINED, tf.int64)).numpy()
    np.testing.assert_allclose(rows, dense_rows, rtol=1e-6)
    assert sorted(var.export()[0].numpy().tolist()) == [1, 2, 3, 9]


def test_common_checkpoint_keeps_the_view(trained, tmp_path):
    var, opt, _, _ = trained
    shards = [Table.attach(t.table_id) for t in var.tables]
    ckpt.save(str(tmp_path / "ck"), {"v": shards[0]})
    restored = Table(dim=DIM)
    ckpt.load(str(tmp_path / "ck"), {"v": restored})
    page = restored.export()
    stepped = sorted(page["keys"][page["stepped"]].tolist())
    assert stepped == TRAINED
    restored.destroy()


def test_keras_weights_keep_the_view():
    """A layer's saved state (model.save_weights) carries the marks: the zero-gradient key is
    still listed after loading into a fresh layer."""
    layer = de.keras.layers.Embedding(DIM, name=f"stepped_layer_{uuid.uuid4().hex[:8]}")
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adagrad(0.1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(tf.constant(TRAINED, tf.int64)) ** 2 * MASK)
    opt.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables),
                            layer.trainable_variables))
    assert _view(layer.params, opt)[0] == TRAINED
    store = {}
    layer.save_own_variables(store)
    fresh = de.keras.layers.Embedding(DIM, name=f"stepped_fresh_{uuid.uuid4().hex[:8]}")
    fresh(tf.constant([1], tf.int64))  # built
    fresh.load_own_variables(store)
    (slot,) = fresh.params.get_slot_variables()
    assert sorted(slot.export()[0].numpy().tolist()) == TRAINED


def test_tf_checkpoint_restores_the_default_view(trained, tmp_path):
    """TF object checkpoints do not store the marks (a new tensor name would make every older
    checkpoint fail to restore): rows restored from one are marked where their slots differ
    from the initial slots, so the zero-gradient key 2 is not listed (docs/tf.md)."""
    var, opt, _, _ = trained
    path = tf.train.Checkpoint(v=var).write(str(tmp_path / "tf"))
    fresh = _variable()
    fresh_opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adagrad(0.1))
    _step(fresh, fresh_opt, [5], np.ones([1, DIM], np.float32))  # attaches the optimizer
    tf.train.Checkpoint(v=fresh).read(path).assert_consumed()
    assert _view(fresh, fresh_opt)[0] == [1, 3]


def test_upsert_and_a_new_optimizer_do_not_mark_rows():
    t = Table(dim=2, optimizer={"name": "adagrad"})
    try:
        t.import_rows(np.array([4], np.int64), np.ones([1, 2], np.float32))
        t.apply_gradients(np.array([1, 2], np.int64), np.zeros([2, 2], np.float32), lr=0.1, step=1)
        t.insert_or_assign(np.array([1, 5], np.int64), np.ones([2, 2], np.float32))
        page = t.export()
        assert dict(zip(page["keys"].tolist(), page["stepped"].tolist())) == {
            1: True, 2: True, 4: False, 5: False}  # an upsert keeps the mark, adds none
        t.set_optimizer({"name": "adam"})  # fresh slots: nothing stepped by the new optimizer
        assert not t.export()["stepped"].any()
    finally:
        t.destroy()


def test_import_without_marks_uses_the_slots():
    """Rows imported with slots but no marks (a checkpoint written before the mark existed)
    count as stepped where their slots differ from the initial slots."""
    t = Table(dim=2, optimizer={"name": "adagrad", "initial_accumulator_value": 0.1})
    try:
        slots = np.array([[[0.1, 0.1]], [[0.3, 0.1]]], np.float32)
        t.import_rows(np.array([1, 2], np.int64), np.ones([2, 2], np.float32), slots)
        page = t.export()
        assert dict(zip(page["keys"].tolist(), page["stepped"].tolist())) == {1: False, 2: True}
        t.import_rows(np.array([1, 2], np.int64), np.ones([2, 2], np.float32), slots,
                      stepped=np.array([True, False]))
        page = t.export()
        assert dict(zip(page["keys"].tolist(), page["stepped"].tolist())) == {1: True, 2: False}
    finally:
        t.destroy()

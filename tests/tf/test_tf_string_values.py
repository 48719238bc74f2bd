"""de.Variable(value_dtype=tf.string) (TFRA: int64/int32 keys with string values): lookups with
the default row, upsert, remove, export, size, eagerly and in tf.function, sharded, through
tf.train.Checkpoint, and the refusals (accum, training, Keras layers, string keys), against a
dict reference."""

import os

import numpy as np
import pytest
import tensorflow as tf

import dualemb.tf as de

WEIRD = [b"", b"\x00", b"a\x00b", b"x\x00", b"\xff\xfe", "é日本".encode(), b"L" * 3000]
DIM = 2


def _rows(n, salt=0):
    return np.array([[WEIRD[(i + salt) % len(WEIRD)], f"{i}-{salt}".encode()] for i in range(n)],
                    object)


def _contents(var):
    keys, values = var.export()
    return {int(k): tuple(v) for k, v in zip(keys.numpy(), values.numpy())}


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.int32])
@pytest.mark.parametrize("devices", [None, ["/CPU:0", "/CPU:0", "/CPU:0"]])
def test_variable_operations_match_a_dict(key_dtype, devices):
    name = f"strval_{key_dtype.name}_{0 if devices is None else len(devices)}"
    v = de.get_variable(name, key_dtype=key_dtype, value_dtype=tf.string, dim=DIM,
                        initializer="default", devices=devices)
    assert v.value_dtype == tf.string
    keys = tf.constant(np.arange(-20, 40, 3), key_dtype)
    miss = v.lookup(keys)
    assert miss.dtype == tf.string and miss.shape == (len(keys), DIM)
    assert set(miss.numpy().reshape(-1).tolist()) == {b"default"}
    assert int(v.size()) == 0  # lookups do not insert
    ref = {}
    for salt in range(3):
        sub = keys[salt::2]
        rows = _rows(len(sub), salt)
        v.upsert(sub, tf.constant(rows))
        ref.update({int(k): tuple(r) for k, r in zip(sub.numpy(), rows)})
    v.remove(tf.constant([-20, 1000], key_dtype))
    ref.pop(-20, None)
    got, exists = v.lookup(tf.reshape(keys, [4, -1]), return_exists=True)
    assert got.shape == (4, len(keys) // 4, DIM)
    for k, row, e in zip(keys.numpy(), got.numpy().reshape(-1, DIM), exists.numpy().reshape(-1)):
        assert bool(e) == (int(k) in ref)
        assert tuple(row) == ref.get(int(k), (b"default", b"default"))
    assert int(v.size()) == len(ref)
    assert _contents(v) == ref


def test_inside_tf_function():
    v = de.Variable(value_dtype=tf.string, dim=DIM, name="strval_fn", initializer=["p", "q"])

    @tf.function
    def write_then_read(k, rows):
        v.upsert(k, rows)
        return v.lookup(tf.concat([k, [999]], 0))

    rows = _rows(4)
    out = write_then_read(tf.constant([1, 2, 3, 4], tf.int64), tf.constant(rows)).numpy()
    assert out[:4].tolist() == rows.tolist()
    assert out[4].tolist() == [b"p", b"q"]

    @tf.function
    def size_after_remove(k):
        v.remove(k)
        return v.size()

    assert int(size_after_remove(tf.constant([1, 2], tf.int64))) == 2
    assert _contents(v) == {3: tuple(rows[2]), 4: tuple(rows[3])}


def test_tf_train_checkpoint_round_trip_is_exact(tmp_path):
    src = de.Variable(value_dtype=tf.string, dim=DIM, name="strval_ck", initializer="z",
                      devices=["/CPU:0", "/CPU:0"])
    keys = tf.constant(np.arange(50) * 11, tf.int64)
    rows = _rows(50)
    src.upsert(keys, tf.constant(rows))
    ref = _contents(src)
    path = tf.train.Checkpoint(emb=src).save(str(tmp_path / "ck"))
    src.upsert(tf.constant([1], tf.int64), tf.constant([[b"new", b"new"]]))
    src.remove(keys[:10])
    tf.train.Checkpoint(emb=src).restore(path).assert_consumed()
    assert _contents(src) == ref
    dst = de.Variable(value_dtype=tf.string, dim=DIM, name="strval_ck2", initializer="z")
    tf.train.Checkpoint(emb=dst).restore(path)
    assert _contents(dst) == ref
    assert dst.lookup(tf.constant([7], tf.int64)).numpy().tolist() == [[b"z", b"z"]]


def test_common_format_round_trip(tmp_path):
    src = de.Variable(value_dtype=tf.string, dim=DIM, name="strval_common")
    src.upsert(tf.constant([5, 6], tf.int64), tf.constant(_rows(2)))
    de.save(src, str(tmp_path / "c"))
    src.upsert(tf.constant([7], tf.int64), tf.constant([[b"later", b""]]))
    dst = de.Variable(value_dtype=tf.string, dim=DIM, name="strval_common")
    de.load(dst, str(tmp_path / "c"))
    src.remove(tf.constant([7], tf.int64))
    assert _contents(dst) == _contents(src)


def test_refusals():
    with pytest.raises(TypeError, match="string-string"):
        de.Variable(key_dtype=tf.string, value_dtype=tf.string, dim=2, name="strval_ss")
    v = de.Variable(value_dtype=tf.string, dim=DIM, name="strval_refuse")
    v.upsert(tf.constant([1], tf.int64), tf.constant([[b"a", b"b"]]))
    before = _contents(v)
    with pytest.raises(TypeError, match="accum.*string"):
        v.accum(tf.constant([1], tf.int64), tf.constant([[b"a", b"b"]]),
                tf.constant([[b"c", b"d"]]), tf.constant([True]))
    with pytest.raises(TypeError, match="value_dtype"):
        v.upsert(tf.constant([1], tf.int64), tf.ones([1, DIM]))
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        v.upsert(tf.constant([1, 2], tf.int64), tf.constant([[b"a", b"b"]]))
    opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))
    rows, trainable = de.embedding_lookup(v, tf.constant([1, 2], tf.int64),
                                          return_trainable=True)
    assert rows.dtype == tf.string
    grad = tf.IndexedSlices(tf.ones([2, DIM]), tf.constant([1, 2], tf.int64))
    with pytest.raises(TypeError, match="value_dtype string, which cannot be trained"):
        opt.apply_gradients([(grad, trainable)])
    for layer_cls in (de.keras.layers.Embedding, de.keras.layers.SquashedEmbedding):
        for trainable in (True, False):
            with pytest.raises(TypeError, match="numeric rows"):
                layer_cls(2, value_dtype=tf.string, trainable=trainable, name="strval_layer")
    with pytest.raises(ValueError, match="not valid UTF-8"):
        de.Variable(value_dtype=tf.string, dim=2, name="strval_bad_init", initializer=b"\xff")
    sp = tf.SparseTensor([[0, 0], [0, 1]], tf.constant([1, 2], tf.int64), [1, 2])
    with pytest.raises(TypeError, match="value_dtype string: sparse lookups"):
        de.embedding_lookup_sparse(v, sp, None, combiner="sum")
    # Dense lookups of string rows work (no combining).
    assert de.embedding_lookup(v, tf.constant([[1]], tf.int64)).numpy().tolist() == [[[b"a", b"b"]]]
    assert _contents(v) == before


def test_jax_refuses_string_tables_clearly():
    dej = pytest.importorskip("dualemb.jax")
    with pytest.raises(TypeError, match="JAX arrays cannot hold strings"):
        dej.create(2, value_dtype="string")
    from dualemb.core import Table

    t = Table(2, value_dtype="string")
    try:
        with pytest.raises(TypeError, match="JAX arrays cannot hold strings"):
            dej.attach(t.id)
    finally:
        t.destroy()


class _Served(tf.Module):
    def __init__(self):
        self.v = de.Variable(value_dtype=tf.string, dim=DIM, name="strval_saved", initializer="q")

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def __call__(self, k):
        return self.v.lookup(k)


def test_saved_model_serves_string_rows_in_a_fresh_process(tmp_path):
    import subprocess
    import sys

    m = _Served()
    m.v.upsert(tf.constant([1, 2], tf.int64), tf.constant([[b"a\x00", b"\xff"], [b"", b"zz"]]))
    tf.saved_model.save(m, str(tmp_path / "sm"))
    code = ("import tensorflow as tf, dualemb.tf\n"
            f"m = tf.saved_model.load({str(tmp_path / 'sm')!r})\n"
            "print(repr(m(tf.constant([1, 2, 3], tf.int64)).numpy().tolist()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == repr(
        [[b"a\x00", b"\xff"], [b"", b"zz"], [b"q", b"q"]])

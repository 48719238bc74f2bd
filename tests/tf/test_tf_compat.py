"""TFRA code runs unchanged: the rest of TFRA's public surface, and exporting a model for
serving (Keras' model.export and de.keras.models.save_model) into a fresh process."""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import dualemb.tf as de

TFRA_NAMES = [
    "Variable", "get_variable", "GraphKeys", "embedding_lookup", "embedding_lookup_unique",
    "embedding_lookup_sparse", "safe_embedding_lookup_sparse", "DynamicEmbeddingOptimizer",
    "TrainableWrapper", "trainable_wrapper_filter", "ModelMode", "enable_train_mode",
    "enable_inference_mode", "get_model_mode", "RestrictPolicy", "TimestampRestrictPolicy",
    "FrequencyRestrictPolicy", "KVCreator", "CuckooHashTableConfig", "CuckooHashTableCreator",
    "HkvHashTableConfig", "HkvHashTableCreator", "HkvEvictStrategy", "RedisTableConfig",
    "RedisTableCreator", "FileSystemSaver", "math", "data_flow", "ragged_embedding_ops",
    "shadow_ops", "keras", "train",
]


def test_tfra_names_exist():
    missing = [n for n in TFRA_NAMES if not hasattr(de, n)]
    assert not missing
    for n in ("Embedding", "BasicEmbedding", "SquashedEmbedding", "FieldWiseEmbedding"):
        assert hasattr(de.keras.layers, n)
    assert callable(de.keras.models.save_model)
    assert de.train.Checkpoint is tf.train.Checkpoint
    assert callable(de.save) and callable(de.load)


def test_shadow_ops_and_filter():
    var = de.Variable(dim=2, name="compat_shadow", initializer=1.0)
    shadow = de.shadow_ops.ShadowVariable(var, name="s")
    assert var.get_trainable_by_name("s") is shadow
    with tf.GradientTape() as tape:
        emb = de.shadow_ops.embedding_lookup_unique(shadow, tf.constant([[1, 1]], tf.int64), 2)
        loss = tf.reduce_sum(emb)
    grad = tape.gradient(loss, shadow)
    assert isinstance(grad, tf.IndexedSlices)
    dense_var = tf.Variable(1.0)
    dense, sparse = de.trainable_wrapper_filter([(grad, shadow), (1.0, dense_var)])
    assert len(dense) == 1 and sparse[0][1] is shadow


def test_math_data_flow_ragged_ops():
    sp = tf.SparseTensor([[0, 0], [2, 1]], tf.constant([3, 4], tf.int64), [3, 2])
    filled, empty = de.math.sparse_fill_empty_rows(sp, tf.constant(0, tf.int64))
    assert empty.numpy().tolist() == [False, True, False]
    parts = de.data_flow.dynamic_partition(tf.constant([1, 2, 3]), tf.constant([0, 1, 0]), 2)
    back = de.data_flow.dynamic_stitch([tf.constant([0, 2]), tf.constant([1])], parts)
    assert back.numpy().tolist() == [1, 2, 3]
    var = de.Variable(dim=1, name="compat_ragged", initializer=2.0)
    out = de.ragged_embedding_ops.embedding_lookup_sparse(
        var, tf.ragged.constant([[1, 2], [3]], dtype=tf.int64), None, combiner="sum")
    np.testing.assert_array_equal(out.numpy(), [[4.0], [2.0]])


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
def test_ragged_fill_empty_rows_matches_sparse(dtype):
    """TFRA's private ragged helper, which its tests import: the same fill as TF's sparse one."""
    rows = [[1, 2, 3], [], [4], [], [5, 6], []]
    ragged = tf.ragged.constant(rows, dtype=dtype)
    filled, empty = de.ragged_embedding_ops._fill_empty_rows(ragged, -7)
    assert filled.to_list() == [r or [-7] for r in rows]
    assert filled.dtype == dtype
    sp_filled, sp_empty = tf.sparse.fill_empty_rows(ragged.to_sparse(), tf.constant(-7, dtype))
    np.testing.assert_array_equal(empty.numpy(), sp_empty.numpy())
    np.testing.assert_array_equal(tf.sparse.to_dense(sp_filled, default_value=99).numpy(),
                                  filled.to_tensor(default_value=99).numpy())
    with pytest.raises(TypeError, match="RaggedTensor"):
        de.ragged_embedding_ops._fill_empty_rows(tf.constant([[1]]), 0)


SERVE = textwrap.dedent("""
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import numpy as np, tensorflow as tf
    import dualemb.tf  # registers the ops
    x = tf.constant([[1, 2], [3, 11]], tf.int64)
    loaded = tf.saved_model.load(sys.argv[1])
    if sys.argv[2] == "serve":
        out = loaded.serve(x)
    else:
        out = list(loaded.signatures["serving_default"](x).values())[0]
    print("PRED", " ".join(repr(float(v)) for v in out.numpy().ravel()))
""")


@pytest.mark.parametrize("how", ["export", "save_model"])
def test_exported_model_serves_in_a_fresh_process(tmp_path, how):
    de.enable_inference_mode()
    try:
        inp = keras.Input((2,), dtype="int64", name="ids")
        emb = de.keras.layers.Embedding(4, name=f"serve_{how}", devices=["/CPU:0"] * 2)
        model = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Flatten()(emb(inp))))
    finally:
        de.enable_train_mode()
    emb.params.upsert(np.arange(10, dtype=np.int64),
                      np.arange(40, dtype=np.float32).reshape(10, 4) / 10)
    x = np.array([[1, 2], [3, 11]], np.int64)
    expected = model.predict(x, verbose=0).ravel()
    path = str(tmp_path / "model")
    if how == "export":
        model.export(path, verbose=False)
    else:
        de.keras.models.save_model(model, path)
    emb.params.clear()  # the export holds its own copy of the rows
    out = subprocess.run([sys.executable, "-c", SERVE, path,
                          "serve" if how == "export" else "signature"],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ))
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("PRED")]
    assert line, out.stderr[-3000:]
    np.testing.assert_allclose([float(v) for v in line[0].split()[1:]], expected, rtol=1e-6)

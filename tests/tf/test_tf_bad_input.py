"""Bad input gets a clear exception and leaves the table unchanged; importing dualemb.tf
patches nothing in TensorFlow or Keras."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import dualemb.tf as de

_n = [0]


@pytest.fixture
def var():
    _n[0] += 1
    v = de.Variable(dim=3, name=f"bad_{_n[0]}", devices=["/CPU:0"] * 2)
    v.upsert(np.array([1, 2], np.int64), np.ones((2, 3), np.float32))
    return v


def _unchanged(v):
    keys, values = v.export()
    order = np.argsort(keys.numpy())
    np.testing.assert_array_equal(keys.numpy()[order], [1, 2])
    np.testing.assert_array_equal(values.numpy()[order], np.ones((2, 3)))


@pytest.mark.parametrize("keys", [tf.constant([1], tf.int32), np.array([1], np.int32),
                                  tf.constant([1.0]), tf.constant(["a"])])
def test_key_dtype_mismatch(var, keys):
    for call in (lambda: var.lookup(keys), lambda: var.upsert(keys, tf.zeros([1, 3])),
                 lambda: var.remove(keys), lambda: de.embedding_lookup(var, keys),
                 lambda: de.embedding_lookup_unique(var, keys)):
        with pytest.raises(TypeError, match="dtype"):
            call()
    _unchanged(var)


@pytest.mark.parametrize("keys, values", [
    (tf.constant([4.0, 5.0]), tf.zeros([2, 3])),            # keys of another dtype
    (tf.constant([7, 8], tf.int64), tf.constant([["a"] * 3] * 2)),  # rows of another dtype
    ([4.5, 5.5], tf.zeros([2, 3])),                         # Python floats as keys
])
def test_dtype_mismatch_is_both_type_and_value_error(var, keys, values):
    """TFRA raises ValueError (TF's convert_to_tensor), dualemb's contract says TypeError: code
    written for either catches the same exception."""
    from dualemb.tf.errors import DtypeMismatchError
    for expected in (TypeError, ValueError, DtypeMismatchError):
        with pytest.raises(expected, match="dtype"):
            var.upsert(keys, values)
    if not isinstance(keys, list):
        with pytest.raises(ValueError, match="dtype"):
            var.lookup(tf.constant([1, 2], tf.int32))
    _unchanged(var)


def test_int32_table_refuses_int64_ids_without_truncating():
    v = de.Variable(key_dtype=tf.int32, dim=1, name="bad_int32")
    with pytest.raises(TypeError, match="int64"):
        v.lookup(tf.constant([2**40], tf.int64))
    with pytest.raises(ValueError, match="do not fit"):
        v.upsert([2**40], [[1.0]])  # a Python int beyond int32 does not wrap around to 0
    with pytest.raises(ValueError, match="do not fit"):
        v.lookup(2**31)
    assert int(v.size()) == 0


@pytest.mark.parametrize("values, error", [
    (tf.zeros([2, 4]), ValueError),           # wrong dim
    (tf.zeros([3, 3]), ValueError),           # wrong number of rows
    (tf.zeros([2, 3], tf.float64), TypeError),
    (np.zeros((2, 3), np.int32), TypeError),
    ([["a", "b", "c"], ["d", "e", "f"]], TypeError),
])
def test_values_of_wrong_shape_or_dtype(var, values, error):
    with pytest.raises(error, match="shape|dtype|convert"):
        var.upsert(tf.constant([7, 8], tf.int64), values)
    _unchanged(var)


@pytest.mark.parametrize("values", [
    np.arange(6, dtype=np.float32),                      # flat: as many elements, refused
    np.zeros((3, 2), np.float32),                        # transposed
    np.zeros((2, 2), np.float32),                        # too few keys
    np.zeros((2, 1), np.float32),                        # too small a dim
])
def test_wrong_shape_eagerly_is_both_errors_tfra_code_catches(var, values):
    """Eagerly the shape is checked before any op: the error is a ValueError and, as TFRA's
    kernel error for it, an InvalidArgumentError whose message says "Expected shape"."""
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"Expected shape \(2, 3\)") as e:
        var.upsert(tf.constant([7, 8], tf.int64), tf.constant(values))
    assert isinstance(e.value, ValueError) and f"got {values.shape}" in str(e.value)
    _unchanged(var)


def test_wrong_shape_inside_a_function_is_an_op_error(var):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64),
                                  tf.TensorSpec([None, None], tf.float32)])
    def upsert(keys, values):
        var.upsert(keys, values)

    with pytest.raises(tf.errors.InvalidArgumentError, match="keys.shape"):
        upsert(tf.constant([7, 8], tf.int64), tf.zeros([2, 5]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="keys.shape"):
        upsert(tf.constant([7, 8, 9, 10], tf.int64), tf.zeros([2, 6]))  # same element count
    _unchanged(var)
    single = de.Variable(dim=3, name="bad_single")

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64),
                                  tf.TensorSpec([None, None], tf.float32)])
    def upsert_single(keys, values):
        single.upsert(keys, values)

    with pytest.raises(tf.errors.InvalidArgumentError, match="keys.shape"):
        upsert_single(tf.constant([7, 8, 9, 10], tf.int64), tf.zeros([2, 6]))
    assert int(single.size()) == 0


def test_lookup_takes_a_list_of_one_variable_as_tfra(var):
    """TFRA's lookups take ``[var]`` (tf.nn.embedding_lookup's form) as ``var``; two refused."""
    ids = tf.constant([[1, 9], [2, 1]], tf.int64)
    want = var.lookup(ids).numpy()
    for fn in (de.embedding_lookup, de.embedding_lookup_unique):
        np.testing.assert_array_equal(fn([var], ids).numpy(), want)
        np.testing.assert_array_equal(fn((var,), ids).numpy(), want)
        with pytest.raises(TypeError, match="dualemb.tf.Variable"):
            fn([var, var], ids)
    _unchanged(var)


@pytest.mark.parametrize("params", [tf.Variable(tf.zeros([3, 3])), [None], np.zeros((3, 3)),
                                    "table"])
def test_lookup_needs_a_dynamic_embedding_variable(params):
    for fn in (de.embedding_lookup, de.embedding_lookup_unique):
        with pytest.raises(TypeError, match="dualemb.tf.Variable"):
            fn(params, tf.constant([1], tf.int64))
    sp = tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [1, 1])
    with pytest.raises(TypeError, match="dualemb.tf.Variable"):
        de.embedding_lookup_sparse(params, sp, None)
    with pytest.raises(TypeError, match="dualemb.tf.Variable"):
        de.safe_embedding_lookup_sparse(params, sp)


def test_unknown_combiner(var):
    sp = tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [1, 1])
    with pytest.raises(ValueError, match="combiner"):
        de.embedding_lookup_sparse(var, sp, None, combiner="max")
    with pytest.raises(ValueError, match="combiner"):
        de.safe_embedding_lookup_sparse(var, sp, combiner="avg")
    with pytest.raises(ValueError, match="combiner"):
        de.keras.layers.SquashedEmbedding(2, combiner="median", name="bad_sq")
    with pytest.raises(ValueError, match="combiner"):
        de.keras.layers.FieldWiseEmbedding(2, 3, combiner="max", name="bad_fw")


def test_sparse_tensor_required(var):
    for ids in (tf.constant([[1]], tf.int64), [[1]], np.array([[1]])):
        with pytest.raises(TypeError, match="SparseTensor"):
            de.embedding_lookup_sparse(var, ids, None)
        with pytest.raises(TypeError, match="SparseTensor"):
            de.safe_embedding_lookup_sparse(var, ids)
    with pytest.raises(TypeError, match="SparseTensor"):
        de.embedding_lookup(var, tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [1, 1]))


def test_bad_variable_arguments():
    with pytest.raises(TypeError, match="key_dtype"):
        de.Variable(key_dtype=tf.float32, name="bad_kd")
    with pytest.raises(TypeError, match="value_dtype"):
        de.Variable(value_dtype=tf.complex64, name="bad_vd")  # int32 is supported now
    with pytest.raises(ValueError, match="dim"):
        de.Variable(dim=0, name="bad_dim")
    with pytest.raises(TypeError, match="partitioner"):
        de.Variable(partitioner=3, name="bad_part")


def test_unwrappable_optimizer_names_the_supported_ones():
    # TF1 Momentum's update differs from every fused optimizer's: refused, naming what wraps.
    with pytest.raises(TypeError) as info:
        de.DynamicEmbeddingOptimizer(tf.compat.v1.train.MomentumOptimizer(0.1, 0.9))
    msg = str(info.value)
    assert "MomentumOptimizer" in msg
    for name in ("GradientDescentOptimizer", "AdamOptimizer", "AdagradOptimizer"):
        assert f"tf.compat.v1.train.{name}" in msg or name in msg
    for name in ("SGD", "Nadam", "RMSprop", "Ftrl", "Adadelta", "Lion"):
        assert name in msg


def test_checkpoint_of_another_dim_or_dtype_is_refused(tmp_path, var):
    pytest.importorskip("dualemb.tf.saving")
    path = tf.train.Checkpoint(v=var).write(str(tmp_path / "ckpt"))
    for other in (de.Variable(dim=4, name="bad_restore_dim"),
                  de.Variable(dim=3, key_dtype=tf.int32, name="bad_restore_kd")):
        other.upsert(tf.constant([9], other.key_dtype), tf.zeros([1, other.dim]))
        with pytest.raises(Exception, match="dim|dtype"):
            tf.train.Checkpoint(v=other).read(path).assert_consumed()
        keys, _ = other.export()
        assert keys.numpy().tolist() == [9]


NO_PATCH = textwrap.dedent("""
    import os
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import inspect
    import tensorflow as tf
    import keras

    def snapshot():
        out = {"TensorShape.as_list": tf.TensorShape.as_list,
               "tf.compat.v1.train.Saver": tf.compat.v1.train.Saver,
               "tf.train.Checkpoint": tf.train.Checkpoint,
               "tf.saved_model.save": tf.saved_model.save,
               "tf.saved_model.load": tf.saved_model.load,
               "keras.Model.save": keras.Model.save,
               "keras.Model.save_weights": keras.Model.save_weights,
               "keras.Model.load_weights": keras.Model.load_weights,
               "tf.compat.v1.train.Optimizer": tf.compat.v1.train.Optimizer,
               "tf.keras.optimizers.Adam": tf.keras.optimizers.Adam}
        classes = [getattr(keras.optimizers, n) for n in dir(keras.optimizers)
                   if inspect.isclass(getattr(keras.optimizers, n))]
        classes += [tf.train.Checkpoint, tf.train.CheckpointManager, tf.compat.v1.train.Saver,
                    tf.compat.v1.train.Optimizer, tf.TensorShape, tf.Variable,
                    keras.initializers.VarianceScaling, keras.layers.Embedding]
        for cls in classes:
            for name, value in vars(cls).items():
                out[f"{cls.__module__}.{cls.__qualname__}.{name}"] = value
        from tensorflow.python.checkpoint import checkpoint, restore
        for mod in (checkpoint, restore):
            for name, value in vars(mod).items():
                if callable(value):
                    out[f"{mod.__name__}.{name}"] = value
        for cls in (restore.CheckpointPosition,):
            for name, value in vars(cls).items():
                out[f"CheckpointPosition.{name}"] = value
        return out

    before = snapshot()
    import dualemb.tf as de
    after = snapshot()
    changed = sorted(k for k in before if k not in after or after[k] is not before[k])
    added = sorted(k for k in after if k not in before)
    print("CHANGED", changed)
    print("ADDED", added)
    try:
        tf.TensorShape(None).as_list()
        print("AS_LIST_UNPATCHED False")
    except ValueError:
        print("AS_LIST_UNPATCHED True")
""")


def test_import_patches_nothing():
    out = subprocess.run([sys.executable, "-c", NO_PATCH], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ))
    assert "CHANGED []" in out.stdout, out.stdout + out.stderr[-3000:]
    assert "ADDED []" in out.stdout, out.stdout
    assert "AS_LIST_UNPATCHED True" in out.stdout, out.stdout

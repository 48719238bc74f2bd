"""de.shadow_ops.ShadowVariable: TFRA's API (ids, read_value, size, lookups through it) with
TFRA's documented results (its shadow_embedding_ops_test), and training through it with Keras 3,
tf_keras and TF1 optimizers against a dense variable."""

import numpy as np
import pytest
import tensorflow as tf

import keras
import dualemb.tf as de


def _params(name, initializer=0.1, **kwargs):
    params = de.Variable(dim=2, name=name, initializer=initializer, **kwargs)
    params.upsert(tf.constant([1, 2, 3], tf.int64),
                  tf.constant([[1., 1.], [2., 2.], [3., 3.]]))
    return params


def test_create_records_dtypes_and_registers_under_its_name():
    params = _params("sv_create")
    shadow = de.shadow_ops.ShadowVariable(params, name="sv-shadow", trainable=False)
    assert shadow.params is params and shadow.dtype == params.value_dtype
    assert shadow.ids.dtype == params.key_dtype and shadow.exists.dtype == tf.bool
    assert params.get_trainable_by_name("sv-shadow") is shadow and not shadow.trainable
    with pytest.raises(TypeError, match="dualemb.tf.Variable"):
        de.shadow_ops.ShadowVariable(tf.Variable(1.0))


def test_read_value_prefetches_the_ids_or_returns_the_kept_rows():
    """TFRA's ShadowVariableBasicBehaviorTest.test_read_value."""
    shadow = de.shadow_ops.ShadowVariable(_params("sv_read"))
    assert shadow.read_value().numpy().tolist() == []
    shadow._reset_ids(tf.constant([2, 3, 4], tf.int64))
    assert shadow.read_value(do_prefetch=False).numpy().tolist() == []
    # TFRA code reads the buffer through its handle too.
    from tensorflow.python.ops import gen_resource_variable_ops

    def buffer():
        return gen_resource_variable_ops.read_variable_op(shadow._handle, tf.float32).numpy()

    assert buffer().tolist() == []
    np.testing.assert_allclose(shadow.read_value(do_prefetch=True),
                               [[2., 2.], [3., 3.], [0.1, 0.1]])
    assert shadow.exists.numpy().tolist() == [True, True, False]
    shadow._reset_ids(tf.constant([3, 4, 5], tf.int64))
    np.testing.assert_allclose(shadow.read_value(do_prefetch=False),
                               [[2., 2.], [3., 3.], [0.1, 0.1]])
    np.testing.assert_allclose(buffer(), [[2., 2.], [3., 3.], [0.1, 0.1]])
    np.testing.assert_allclose(shadow.read_value(do_prefetch=True),
                               [[3., 3.], [0.1, 0.1], [0.1, 0.1]])
    np.testing.assert_allclose(buffer(), [[3., 3.], [0.1, 0.1], [0.1, 0.1]])


def test_size_is_the_tables():
    shadow = de.shadow_ops.ShadowVariable(_params("sv_size"))
    assert int(shadow.size()) == 3


def test_lookups_read_the_current_table_and_record_the_ids():
    params = _params("sv_lookup")
    shadow = de.shadow_ops.ShadowVariable(params)
    ids = tf.constant([2, 3, 4], tf.int64)
    np.testing.assert_allclose(de.shadow_ops.embedding_lookup(shadow, ids),
                               [[2., 2.], [3., 3.], [0.1, 0.1]])
    assert shadow.ids.numpy().tolist() == [2, 3, 4]
    params.upsert(tf.constant([1, 2, 3], tf.int64),
                  tf.constant([[1.1, 1.1], [2.2, 2.2], [3.3, 3.3]]))
    np.testing.assert_allclose(de.shadow_ops.embedding_lookup(shadow, ids),
                               [[2.2, 2.2], [3.3, 3.3], [0.1, 0.1]])
    assert int(params.size()) == 3  # lookups never insert
    with pytest.raises(ValueError, match="not matched"):
        de.shadow_ops.embedding_lookup(shadow, tf.constant([1], tf.int32))


def test_lookup_unique_dense_and_ragged():
    shadow = de.shadow_ops.ShadowVariable(_params("sv_unique"))
    dense = de.shadow_ops.embedding_lookup_unique(
        shadow, tf.constant([[2, 3], [4, 5], [1, 0]], tf.int64), 2, True)
    np.testing.assert_allclose(dense, [[[2., 2.], [3., 3.]], [[0.1, 0.1], [0.1, 0.1]],
                                       [[1., 1.], [0.1, 0.1]]])
    ragged = tf.RaggedTensor.from_row_splits(tf.constant([2, 3, 4, 5, 1], tf.int64), [0, 2, 5])
    out = de.shadow_ops.embedding_lookup_unique(shadow, ragged, 2, True)
    assert isinstance(out, tf.RaggedTensor)
    np.testing.assert_allclose(out.flat_values,
                               [[2., 2.], [3., 3.], [0.1, 0.1], [0.1, 0.1], [1., 1.]])
    assert out.row_splits.numpy().tolist() == [0, 2, 5]


def test_the_lookup_functions_take_a_shadow_variable():
    shadow = de.shadow_ops.ShadowVariable(_params("sv_family"), max_norm=None)
    sp = tf.sparse.SparseTensor([[0, 2], [1, 5]], tf.constant([2, 5], tf.int64), [2, 6])
    # TFRA's test_safe_embedding_lookup_sparse (5 is absent: its initializer row).
    np.testing.assert_allclose(de.safe_embedding_lookup_sparse(shadow, sp),
                               [[2., 2.], [0.1, 0.1]])
    np.testing.assert_allclose(de.embedding_lookup_sparse(shadow, sp, None, combiner="sum"),
                               [[2., 2.], [0.1, 0.1]])
    np.testing.assert_allclose(de.embedding_lookup(shadow, tf.constant([3], tf.int64)),
                               [[3., 3.]])
    np.testing.assert_allclose(shadow.embedding_lookup(tf.constant([1], tf.int64)), [[1., 1.]])
    with pytest.raises(TypeError, match="dtype"):
        de.safe_embedding_lookup_sparse(
            shadow, tf.sparse.SparseTensor([[0, 0]], tf.constant([2], tf.int32), [1, 1]))


def test_max_norm_of_the_shadow_clips_its_lookups():
    shadow = de.shadow_ops.ShadowVariable(_params("sv_norm"), max_norm=1.0)
    rows = de.shadow_ops.embedding_lookup(shadow, tf.constant([3], tf.int64)).numpy()
    np.testing.assert_allclose(rows, [[3 / np.sqrt(18)] * 2], rtol=1e-6)


OPTIMIZERS = {
    "keras3_adam": lambda: keras.optimizers.Adam(1e-2),
    "v1_adam": lambda: tf.compat.v1.train.AdamOptimizer(1e-2),
}
try:
    import tf_keras

    OPTIMIZERS["tf_keras_adam"] = lambda: tf_keras.optimizers.Adam(1e-2)
    OPTIMIZERS["tf_keras_legacy_adagrad_sgd"] = lambda: tf_keras.optimizers.legacy.SGD(0.1)
except ImportError:  # tf-keras is in the test extra; the Keras 3 / TF1 cases still run
    pass


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_training_through_the_shadow_equals_a_dense_variable(name):
    """TFRA's test_update_by_optimizer: rows 1 and 3 trained through the shadow equal the same
    optimizer on a dense variable; the kept rows show the updated values."""
    params = _params(f"sv_train_{name}", initializer=0.0)
    shadow = de.shadow_ops.ShadowVariable(params)
    dense = tf.Variable([[1., 1.], [2., 2.], [3., 3.]])
    optimizer = de.DynamicEmbeddingOptimizer(OPTIMIZERS[name]())
    reference = OPTIMIZERS[name]()
    weights = tf.constant([[1.0, -2.0], [0.5, 3.0]])
    for _ in range(5):
        with tf.GradientTape() as tape:
            emb = de.shadow_ops.embedding_lookup(shadow, tf.constant([1, 3], tf.int64))
            loss = tf.reduce_sum(tf.tanh(emb * weights))
        optimizer.apply_gradients([(tape.gradient(loss, shadow), shadow)])
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.tanh(tf.gather(dense, [0, 2]) * weights))
        reference.apply_gradients([(tf.convert_to_tensor(tape.gradient(loss, dense)), dense)])
    np.testing.assert_allclose(params.lookup(tf.constant([1, 2, 3], tf.int64)), dense,
                               rtol=1e-5, atol=1e-6)
    assert not np.allclose(dense.numpy()[0], [1., 1.])  # it trained
    np.testing.assert_allclose(shadow.read_value(do_prefetch=False), dense.numpy()[[0, 2]],
                               rtol=1e-5, atol=1e-6)
    assert shadow.ids.numpy().tolist() == [1, 3]
    slots = params.get_slot_variables(optimizer)
    if "adam" in name:
        assert len(slots) == 2


def test_minimize_in_tf_function_grows_the_table_and_the_restrict_status():
    """TFRA's test_wrapper_tf_function / test_training_with_restrict_policy, with a tf.function
    loss and TF1's minimize."""
    params = de.Variable(dim=2, name="sv_fn", initializer=0.1,
                         restrict_policy=de.TimestampRestrictPolicy)
    shadow = de.shadow_ops.ShadowVariable(params, name="sv_fn-shadow")
    optimizer = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(1e-4))

    @tf.function
    def compute(ids):
        return tf.reduce_mean(de.shadow_ops.embedding_lookup(shadow, ids))

    start, size = 0, 0
    for i in range(5):
        ids = tf.range(start, i + 1, dtype=tf.int64)
        start = i + 1
        size += int(tf.size(ids))
        optimizer.minimize(lambda: compute(ids), var_list=[shadow])
        assert int(params.size()) == size
        assert int(params.restrict_policy.status.size()) == size


def test_embedding_lookup_unique_base_dense_and_ragged():
    """TFRA's test_embedding_lookup_unique_hvd / test_ragged_embedding_lookup_unique_hvd: the
    helper over a plain gather."""
    params = tf.Variable([[0.1, 0.1], [1., 1.], [2., 2.], [3., 3.], [0.1, 0.1], [0.1, 0.1]])
    calls = []

    def gather(ids):
        calls.append(int(tf.size(ids)))
        return tf.gather(params, ids)

    dense = de.shadow_ops.embedding_lookup_unique_base(
        tf.constant([[2, 3], [4, 2], [1, 0]], tf.int64), 2, gather, True)
    np.testing.assert_allclose(dense, params.numpy()[[[2, 3], [4, 2], [1, 0]]])
    assert calls == [5]  # 2 read once
    ragged = tf.RaggedTensor.from_row_splits(tf.constant([2, 3, 4, 5, 1], tf.int64), [0, 2, 5])
    out = de.shadow_ops.embedding_lookup_unique_base(ragged, 2, gather, False)
    np.testing.assert_allclose(out.flat_values, params.numpy()[[2, 3, 4, 5, 1]])
    assert out.row_splits.numpy().tolist() == [0, 2, 5]


def test_hvd_variable_says_horovod_is_not_supported():
    with pytest.raises(NotImplementedError, match="Horovod"):
        de.shadow_ops.HvdVariable("hvd", None, 1, mpi_size=1)


@pytest.mark.parametrize("var_list", ["given", "watched"])
def test_shadow_as_a_tf_function_argument(var_list):
    """TFRA's test_wrapper_tf_function: the shadow is an argument of the tf.function (passed as
    itself, not converted to a tensor); TF1's minimize with var_list=[shadow], or without one
    (then it returns the variables its tape watched: the shadow's, routed to the table)."""
    params = de.Variable(dim=2, name=f"sv_arg_{var_list}", initializer=0.1)
    shadow = de.shadow_ops.ShadowVariable(params)
    optimizer = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0))

    @tf.function
    def compute(shadow_arg, ids):
        return tf.reduce_sum(de.shadow_ops.embedding_lookup(shadow_arg, ids))

    size = 0
    for i in range(3):
        ids = tf.range(2 * i, 2 * i + 2, dtype=tf.int64)
        size += 2
        kwargs = {"var_list": [shadow]} if var_list == "given" else {}
        optimizer.minimize(lambda: compute(shadow, ids), **kwargs)
        assert int(params.size()) == size
    # d(sum)/d(row) = 1 for each key, one SGD step of 1.0: 0.1 - 1.
    np.testing.assert_allclose(params.lookup(tf.range(6, dtype=tf.int64)), np.full((6, 2), -0.9),
                               rtol=1e-6)


def test_checkpoint_clears_the_kept_rows_and_restores_the_table(tmp_path):
    """TFRA's test_save_and_restore_with_trace: saving clears the shadow's buffer (shape
    (0, dim)); the restored table serves the saved rows."""
    module = tf.Module()
    module.params = _params("sv_ckpt")
    module.shadow = de.shadow_ops.ShadowVariable(module.params, name="sv_ckpt_shadow")
    keys = tf.constant([1, 2, 3], tf.int64)
    rows = [[1., 1.], [2., 2.], [3., 3.]]
    np.testing.assert_array_equal(de.shadow_ops.embedding_lookup(module.shadow, keys), rows)
    np.testing.assert_array_equal(module.shadow.read_value(False), rows)
    path = de.train.DECheckpoint(module).save(str(tmp_path / "model"))
    assert module.shadow.read_value(False).shape == (0, 2)
    assert module.shadow.ids.numpy().tolist() == []
    fresh = tf.Module()
    fresh.params = de.Variable(dim=2, name="sv_ckpt_restored", initializer=0.1)
    fresh.shadow = de.shadow_ops.ShadowVariable(fresh.params, name="sv_ckpt_shadow")
    de.train.DECheckpoint(fresh).restore(path).assert_consumed()
    assert int(fresh.shadow.size()) == 3
    assert fresh.shadow.read_value(False).shape == (0, 2)
    np.testing.assert_array_equal(de.shadow_ops.embedding_lookup(fresh.shadow, keys), rows)


def test_two_shadows_of_one_name_each_take_their_own_lookups():
    """A model built twice over one Variable (get_variable's store) makes a second shadow of the
    same name: lookups through the first must still record into and train the first."""
    params = _params("sv_twice")
    first = de.shadow_ops.ShadowVariable(params, name="sv_twice_shadow")
    second = de.shadow_ops.ShadowVariable(params, name="sv_twice_shadow")
    ids = tf.constant([1, 3], tf.int64)
    np.testing.assert_array_equal(de.shadow_ops.embedding_lookup(first, ids),
                                  [[1., 1.], [3., 3.]])
    assert first.ids.numpy().tolist() == [1, 3]
    assert second.ids.numpy().tolist() == []
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.5))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(de.embedding_lookup(first, ids))
    grads = tape.gradient(loss, [first])
    assert grads[0] is not None  # the gradient reaches the shadow looked up through
    opt.apply_gradients(zip(grads, [first]))
    np.testing.assert_allclose(params.lookup(ids), [[0.5, 0.5], [2.5, 2.5]])
    np.testing.assert_allclose(first.read_value(False), [[0.5, 0.5], [2.5, 2.5]])

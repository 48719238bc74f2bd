"""The lookup family against TensorFlow's own dense-table functions on the same rows."""


import keras
import numpy as np
import pytest
import tensorflow as tf

import dualemb.tf as de

DIM = 3
KEYS = np.array([-5, 0, 3, 8, 2**33, 17], np.int64)
_n = [0]


@pytest.fixture
def table():
    """A Variable holding KEYS and the dense matrix with the same rows (row i <-> KEYS[i])."""
    _n[0] += 1
    rng = np.random.default_rng(_n[0])
    rows = rng.normal(0, 1, (len(KEYS), DIM)).astype(np.float32)
    var = de.Variable(dim=DIM, name=f"lookup_{_n[0]}", devices=["/CPU:0"] * 2)
    var.upsert(KEYS, rows)
    index = {int(k): i for i, k in enumerate(KEYS)}
    return var, rows, np.vectorize(index.__getitem__)


def test_embedding_lookup_any_shape(table):
    var, rows, to_index = table
    ids = np.array([[[3, 3], [0, -5]], [[17, 2**33], [8, 8]]], np.int64)
    out = de.embedding_lookup(var, ids, name="a")
    assert out.shape == ids.shape + (DIM,)
    np.testing.assert_array_equal(out.numpy(), rows[to_index(ids)])
    np.testing.assert_array_equal(de.embedding_lookup_unique(var, ids).numpy(), out.numpy())
    np.testing.assert_array_equal(var.embedding_lookup(ids, name="m").numpy(), out.numpy())
    assert int(var.size()) == len(KEYS)


def test_ragged_ids(table):
    var, rows, to_index = table
    ids = tf.ragged.constant([[3, 0], [], [17]], dtype=tf.int64)
    for fn in (de.embedding_lookup, de.embedding_lookup_unique):
        out = fn(var, ids)
        assert isinstance(out, tf.RaggedTensor)
        np.testing.assert_array_equal(out.flat_values.numpy(), rows[to_index([3, 0, 17])])
        np.testing.assert_array_equal(out.row_lengths().numpy(), [2, 0, 1])


@pytest.mark.parametrize("fn", [de.embedding_lookup, de.embedding_lookup_unique])
def test_max_norm_on_every_path(table, fn):
    var, rows, to_index = table
    ids = np.array([3, 0, 3], np.int64)
    out = fn(var, ids, max_norm=0.5).numpy()
    np.testing.assert_allclose(out, tf.clip_by_norm(rows[to_index(ids)], 0.5, axes=[1]).numpy(),
                               rtol=1e-6)
    assert np.all(np.linalg.norm(out, axis=1) <= 0.5 + 1e-6)


def test_return_trainable_inside_tf_function(table):
    var, _, _ = table

    @tf.function
    def f(ids):
        emb, trainable = de.embedding_lookup(var, ids, name="in_fn", return_trainable=True)
        return emb

    f(tf.constant([3], tf.int64))
    assert isinstance(var.get_trainable_by_name("in_fn"), de.TrainableWrapper)


def _sparse(ids_rows, weights_rows=None):
    indices, values, weights = [], [], []
    for r, row in enumerate(ids_rows):
        for c, k in enumerate(row):
            indices.append([r, c])
            values.append(k)
            if weights_rows is not None:
                weights.append(weights_rows[r][c])
    shape = [len(ids_rows), max(len(r) for r in ids_rows)]
    sp_ids = tf.SparseTensor(np.array(indices, np.int64).reshape(-1, 2),
                             np.array(values, np.int64), shape)
    sp_w = None if weights_rows is None else tf.SparseTensor(
        np.array(indices, np.int64).reshape(-1, 2), np.array(weights, np.float32), shape)
    return sp_ids, sp_w


IDS = [[3, 0, 3], [17], [], [8, 2**33, -5, 8]]
WEIGHTS = [[1.0, 2.0, 0.5], [3.0], [], [1.0, -1.0, 2.0, 0.25]]


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
def test_embedding_lookup_sparse_matches_tf(table, combiner, weighted):
    var, rows, to_index = table
    sp_ids, sp_w = _sparse(IDS, WEIGHTS if weighted else None)
    out = de.embedding_lookup_sparse(var, sp_ids, sp_w, combiner=combiner).numpy()
    dense_ids = tf.SparseTensor(sp_ids.indices, to_index(sp_ids.values.numpy()),
                                sp_ids.dense_shape)
    ref = tf.nn.embedding_lookup_sparse(tf.constant(rows), dense_ids, sp_w,
                                        combiner=combiner).numpy()
    assert out.shape == (len(IDS), DIM)
    # TF's reference leaves rows without ids out when they are last; compare the rows it has.
    np.testing.assert_allclose(out[:len(ref)][[0, 1, 3]], ref[[0, 1, 3]], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out[2], np.zeros(DIM))
    ragged_ids = tf.ragged.constant(IDS, dtype=tf.int64)
    ragged_w = tf.ragged.constant(WEIGHTS, dtype=tf.float32) if weighted else None
    np.testing.assert_allclose(
        de.embedding_lookup_sparse(var, ragged_ids, ragged_w, combiner=combiner).numpy(), out,
        rtol=1e-6)


def test_embedding_lookup_sparse_max_norm(table):
    var, rows, to_index = table
    sp_ids, _ = _sparse([[3, 0]])
    out = de.embedding_lookup_sparse(var, sp_ids, None, combiner="sum", max_norm=0.1).numpy()
    ref = tf.clip_by_norm(rows[to_index([3, 0])], 0.1, axes=[1]).numpy().sum(0)
    np.testing.assert_allclose(out[0], ref, rtol=1e-6)


def test_safe_embedding_lookup_sparse(table):
    var, rows, to_index = table
    ids = [[3, -5], [], [0, 17], [8]]
    weights = [[1.0, 2.0], [], [0.0, 1.0], [-1.0]]
    sp_ids, sp_w = _sparse(ids, weights)
    out = de.safe_embedding_lookup_sparse(var, sp_ids, sp_w, combiner="mean").numpy()
    # negative id -5 is valid; weight 0 and -1 are pruned (combiner != sum); rows left empty
    # get zeros.
    expected = np.stack([
        (rows[to_index(3)] * 1 + rows[to_index(-5)] * 2) / 3,
        np.zeros(DIM),
        rows[to_index(17)],
        np.zeros(DIM),
    ])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    with_default = de.safe_embedding_lookup_sparse(var, sp_ids, sp_w, combiner="mean",
                                                   default_id=17).numpy()
    np.testing.assert_allclose(with_default[[1, 3]], rows[to_index([17, 17])], rtol=1e-6)
    summed = de.safe_embedding_lookup_sparse(var, sp_ids, sp_w, combiner="sum").numpy()
    np.testing.assert_allclose(summed[3], -rows[to_index(8)], rtol=1e-6)  # kept for "sum"


def test_safe_embedding_lookup_sparse_rank3(table):
    var, rows, to_index = table
    sp = tf.SparseTensor([[0, 0, 0], [0, 1, 0], [0, 1, 1], [1, 0, 0]],
                         np.array([3, 0, 17, -5], np.int64), [2, 2, 2])
    out = de.safe_embedding_lookup_sparse(var, sp, None, combiner="sum").numpy()
    assert out.shape == (2, 2, DIM)
    np.testing.assert_allclose(out[0, 1], rows[to_index(0)] + rows[to_index(17)], rtol=1e-6)
    np.testing.assert_array_equal(out[1, 1], np.zeros(DIM))


def test_safe_embedding_lookup_sparse_refuses_other_dtypes(table):
    """As TFRA: ids of another dtype than key_dtype, and weights of another dtype than
    value_dtype, raise TypeError (no silent cast)."""
    var, _, _ = table
    ids32 = tf.SparseTensor([[0, 0]], np.array([3], np.int32), [1, 1])
    with pytest.raises(TypeError, match="int32"):
        de.safe_embedding_lookup_sparse(var, ids32, None)
    ids = tf.SparseTensor([[0, 0]], np.array([3], np.int64), [1, 1])
    w64 = tf.SparseTensor([[0, 0]], np.array([2.0], np.float64), [1, 1])
    with pytest.raises(TypeError, match="float64"):
        de.safe_embedding_lookup_sparse(var, ids, w64)


def test_lookups_never_insert_even_under_a_tape():
    var = de.Variable(dim=2, name="no_insert", initializer=keras.initializers.RandomNormal(seed=1))
    with tf.GradientTape():
        de.embedding_lookup(var, tf.constant([1, 2, 3], tf.int64), name="x")
        de.embedding_lookup_unique(var, tf.constant([4, 4], tf.int64), name="x")
        sp, _ = _sparse([[5, 6]])
        de.embedding_lookup_sparse(var, sp, None, name="x")
        de.safe_embedding_lookup_sparse(var, sp, None, name="x")
    assert int(var.size()) == 0


def test_inference_mode_has_no_gradient_route():
    var = de.Variable(dim=2, name="inference_route")
    try:
        de.enable_inference_mode()
        assert de.get_model_mode() == de.ModelMode.INFERENCE
        with tf.GradientTape() as tape:
            emb, trainable = de.embedding_lookup(var, tf.constant([1], tf.int64), name="i",
                                                 return_trainable=True)
            loss = tf.reduce_sum(emb)
        assert tape.gradient(loss, trainable) is None
    finally:
        de.enable_train_mode()
    assert de.get_model_mode() == de.ModelMode.TRAIN == "train"


def test_gradient_is_keyed_indexed_slices():
    var = de.Variable(dim=2, name="grad_slices")
    with tf.GradientTape() as tape:
        emb, trainable = de.embedding_lookup_unique(var, tf.constant([[7, 9], [7, 7]], tf.int64),
                                                    name="g", return_trainable=True)
        loss = tf.reduce_sum(emb * tf.constant([[[1.0], [2.0]], [[3.0], [4.0]]]))
    grad = tape.gradient(loss, trainable)
    assert isinstance(grad, tf.IndexedSlices)
    dense = {}
    for k, g in zip(grad.indices.numpy(), grad.values.numpy()):
        dense[int(k)] = dense.get(int(k), 0) + g
    np.testing.assert_allclose(dense[7], [8.0, 8.0])
    np.testing.assert_allclose(dense[9], [2.0, 2.0])


def test_gradient_of_a_lookup_inside_tf_function_taken_outside():
    """The tape outside, the lookup in a tf.function (TFRA's shadow tests train this way): the
    backward function must capture the keys (it failed with "Node ... belong to a different
    graph?"). The gradient equals d(mean)/d(row) = 1/(n*dim) per occurrence, summed per key."""
    var = de.Variable(dim=2, name="grad_through_fn", initializer=0.1)
    anchor = var.trainable_wrapper("fn_anchor")

    @tf.function
    def loss_fn(ids):
        return tf.reduce_mean(de.embedding_lookup(var, ids, name="fn_anchor"))

    with tf.GradientTape() as tape:
        loss = loss_fn(tf.constant([4, 9, 4], tf.int64))
    grad = tape.gradient(loss, anchor)
    assert grad.indices.numpy().tolist() == [4, 9, 4]
    np.testing.assert_allclose(grad.values, np.full((3, 2), 1 / 6), rtol=1e-6)

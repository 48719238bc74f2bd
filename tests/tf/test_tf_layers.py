"""de.keras.layers: Embedding / BasicEmbedding, SquashedEmbedding, FieldWiseEmbedding, in eager
mode, tf.function, GradientTape loops and model.fit / evaluate / predict."""


import keras
import numpy as np
import pytest
import tensorflow as tf

import dualemb.tf as de

_n = [0]


def _name(prefix):
    _n[0] += 1
    return f"{prefix}_{_n[0]}"


def test_embedding_output_and_params():
    layer = de.keras.layers.Embedding(4, name=_name("emb"))
    assert de.keras.layers.BasicEmbedding is de.keras.layers.Embedding
    assert layer.supports_jit is False
    ids = tf.constant([[1, 2, 1], [5, 6, 7]], tf.int64)
    out = layer(ids)
    assert out.shape == (2, 3, 4)
    np.testing.assert_array_equal(out.numpy(), layer.params.lookup(ids).numpy())
    assert int(layer.params.size()) == 0
    assert layer.params.name == f"{layer.name}-parameter"
    # default initializer: RandomNormal(stddev=0.05)
    rows = layer.params.lookup(np.arange(4000, dtype=np.int64)).numpy()
    assert abs(rows.std() - 0.05) < 0.003
    assert layer.count_params() == 0 and len(layer.trainable_weights) == 1
    no_unique = de.keras.layers.Embedding(4, name=_name("emb"), with_unique=False,
                                          initializer=keras.initializers.RandomNormal(seed=1))
    same = de.keras.layers.Embedding(4, name=_name("emb"),
                                     initializer=keras.initializers.RandomNormal(seed=1))
    np.testing.assert_array_equal(no_unique(ids).numpy(), same(ids).numpy())


def test_int32_ids_widen_and_float_ids_fail():
    layer = de.keras.layers.Embedding(2, name=_name("emb"), initializer=1.0)
    np.testing.assert_array_equal(layer(tf.constant([1], tf.int32)).numpy(), [[1, 1]])
    with pytest.raises(TypeError, match="dtype='int64'"):
        layer(tf.constant([1.0]))


def test_ragged_input():
    layer = de.keras.layers.Embedding(3, name=_name("emb"), initializer=2.0)
    out = layer(tf.ragged.constant([[1, 2], [3]], dtype=tf.int64))
    assert isinstance(out, tf.RaggedTensor) and out.flat_values.shape == (3, 3)


@pytest.mark.parametrize("combiner", ["sum", "mean", "max", "min"])
def test_squashed_embedding(combiner):
    layer = de.keras.layers.SquashedEmbedding(3, combiner=combiner, name=_name("sq"),
                                              initializer=keras.initializers.RandomNormal(seed=3))
    ids = tf.constant([[[1, 2], [3, 4]], [[5, 6], [7, 8]]], tf.int64)
    rows = layer.params.lookup(ids).numpy()
    reduce = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[combiner]
    np.testing.assert_allclose(layer(ids).numpy(), reduce(rows, axis=(1, 2)), rtol=1e-6)
    assert layer.compute_output_shape((None, 2, 2)) == (None, 3)
    # 1-D ids are one example (TFRA): pooled over all of them -> [dim].
    one = np.array([1, 2, 5, 2], np.int64)
    np.testing.assert_allclose(layer(tf.constant(one)).numpy(),
                               reduce(layer.params.lookup(one).numpy(), axis=0), rtol=1e-6)
    assert layer.compute_output_shape((4,)) == (3,)


def test_layer_with_a_function_initializer_rebuilds_from_its_config():
    """A plain function (here a lambda, which Keras will not serialize safely) is called once
    when the table is made (TFRA's rule); the layer's config records the resulting row, so a
    rebuilt layer gives missing keys the same row."""
    layer = de.keras.layers.Embedding(3, initializer=lambda shape: np.array([3.0, -1.0, 0.5]),
                                      name=_name("fn"))
    ids = tf.constant([[5, 2**40]], tf.int64)
    np.testing.assert_array_equal(layer(ids).numpy(), [[[3.0, -1.0, 0.5]] * 2])
    config = layer.get_config()
    config["name"] = _name("fn_rebuilt")
    rebuilt = de.keras.layers.Embedding.from_config(config)
    np.testing.assert_array_equal(rebuilt(ids).numpy(), layer(ids).numpy())
    assert rebuilt.params.initializer_spec == layer.params.initializer_spec


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_field_wise_embedding(combiner):
    layer = de.keras.layers.FieldWiseEmbedding(2, nslots=3, combiner=combiner, name=_name("fw"),
                                               initializer=keras.initializers.RandomNormal(seed=4))
    ids = np.array([[0, 3, 4, 5], [1, 1, 7, 2]], np.int64)
    out = layer(tf.constant(ids)).numpy()
    assert out.shape == (2, 3, 2)
    rows = layer.params.lookup(ids).numpy()
    for b in range(2):
        for s in range(3):
            sel = rows[b][ids[b] % 3 == s]
            if combiner == "sum":
                ref = sel.sum(0) if len(sel) else np.zeros(2)
            elif combiner == "mean":
                ref = sel.mean(0) if len(sel) else np.zeros(2)
            else:
                ref = sel.sum(0) / np.sqrt(len(sel)) if len(sel) else np.zeros(2)
            np.testing.assert_allclose(out[b, s], ref, rtol=1e-5, atol=1e-7)
    custom = de.keras.layers.FieldWiseEmbedding(2, nslots=2, slot_map_fn=lambda x: x // 100,
                                                name=_name("fw"), initializer=1.0)
    np.testing.assert_allclose(custom(tf.constant([[1, 2, 150]], tf.int64)).numpy(),
                               [[[2, 2], [1, 1]]])
    with pytest.raises(NotImplementedError):
        layer(tf.zeros([1, 1, 1], tf.int64))


def test_get_config_from_config_roundtrip():
    layer = de.keras.layers.Embedding(
        5, name=_name("cfg"), initializer=keras.initializers.TruncatedNormal(stddev=0.1, seed=9),
        with_unique=False, max_norm=2.0, restrict_policy=de.FrequencyRestrictPolicy,
        kv_creator=de.HkvHashTableCreator(config=de.HkvHashTableConfig(max_capacity=1000)))
    config = layer.get_config()
    clone = de.keras.layers.Embedding.from_config(config)
    assert clone.get_config() == config
    assert clone.embedding_size == 5 and clone.max_norm == 2.0 and not clone.with_unique
    assert isinstance(clone.params.restrict_policy, de.FrequencyRestrictPolicy)
    ids = tf.constant([1, 2], tf.int64)
    np.testing.assert_array_equal(clone(ids).numpy(), layer(ids).numpy())  # same seed
    assert clone.params.tables[0].table_id != layer.params.tables[0].table_id
    fw = de.keras.layers.FieldWiseEmbedding(3, 4, name=_name("cfg"))
    assert de.keras.layers.FieldWiseEmbedding.from_config(fw.get_config()).nslots == 4
    sq = de.keras.layers.SquashedEmbedding(3, combiner="mean", name=_name("cfg"))
    assert de.keras.layers.SquashedEmbedding.from_config(sq.get_config()).combiner == "mean"


def test_functional_model_config_roundtrip():
    inp = keras.Input((2,), dtype="int64")
    out = keras.layers.Dense(1)(keras.layers.Flatten()(
        de.keras.layers.Embedding(3, name=_name("model_emb"))(inp)))
    model = keras.Model(inp, out)
    clone = keras.Model.from_config(model.get_config())
    assert isinstance(clone.layers[1], de.keras.layers.Embedding)


def _model(dim=4, width=2, name=None):
    inp = keras.Input((width,), dtype="int64")
    emb = de.keras.layers.Embedding(dim, name=name or _name("fit_emb"))
    x = keras.layers.Flatten()(emb(inp))
    x = keras.layers.Dense(8, activation="relu")(x)
    model = keras.Model(inp, keras.layers.Dense(1)(x))
    return model, emb


def test_growth_after_each_fit_equals_distinct_ids_seen():
    model, emb = _model()
    model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.01)), "mse")
    rng = np.random.default_rng(0)
    seen = set()
    for round_ in range(4):
        ids = rng.integers(round_ * 1000, round_ * 1000 + 300, (64, 2)).astype(np.int64)
        model.fit(ids, rng.normal(size=(64, 1)), batch_size=16, epochs=1, verbose=0)
        seen.update(ids.ravel().tolist())
        assert int(emb.params.size()) == len(seen)
    # evaluate / predict never insert
    model.evaluate(ids + 10**6, rng.normal(size=(64, 1)), verbose=0)
    model.predict(ids + 2 * 10**6, verbose=0)
    assert int(emb.params.size()) == len(seen)
    assert model.jit_compile is False


def test_inference_mode_model_never_writes():
    de.enable_inference_mode()
    try:
        model, emb = _model()
        model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)), "mse")
        ids = np.arange(20, dtype=np.int64).reshape(10, 2)
        model.predict(ids, verbose=0)
        model.fit(ids, np.ones((10, 1)), verbose=0)  # dense layers train, the table does not
        assert int(emb.params.size()) == 0
    finally:
        de.enable_train_mode()


@pytest.mark.parametrize("use_function", [False, True])
def test_custom_gradient_tape_loop(use_function):
    model, emb = _model(dim=2, width=3)
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adagrad(0.5))

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    if use_function:
        step = tf.function(step)
    x = tf.constant([[1, 2, 2], [3, 1, 4]], tf.int64)
    y = tf.constant([[1.0], [0.0]])
    losses = [float(step(x, y)) for _ in range(20)]
    assert losses[-1] < losses[0]
    assert int(emb.params.size()) == 4
    assert int(opt.iterations) == 20
    assert emb.params.optimizer_spec["name"] == "adagrad"


def test_two_layers_share_nothing_and_shared_layer_sums():
    """A layer called twice in one model (shared embedding) gets one fused update per step with
    both calls' gradients summed."""
    layer = de.keras.layers.Embedding(1, name=_name("shared"), initializer=0.0)
    a = keras.Input((1,), dtype="int64")
    b = keras.Input((1,), dtype="int64")
    out = keras.layers.Add()([layer(a), layer(b)])
    model = keras.Model([a, b], keras.layers.Flatten()(out))
    model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(1.0)),
                  lambda y_true, y_pred: tf.reduce_sum(y_pred))
    model.train_on_batch([np.array([[5]]), np.array([[5]])], np.zeros((1, 1)))
    # d(sum)/d(row 5) = 2 (used twice): one SGD step of lr 1 -> -2
    np.testing.assert_allclose(layer.params.lookup([5]).numpy(), [[-2.0]])


def test_fit_run_eagerly_matches_compiled():
    results = []
    for eager in (False, True):
        inp = keras.Input((2,), dtype="int64")
        emb = de.keras.layers.Embedding(3, name=_name("eager"),
                                        initializer=keras.initializers.RandomNormal(seed=8))
        head = keras.layers.Dense(1, kernel_initializer="ones")
        model = keras.Model(inp, head(keras.layers.Flatten()(emb(inp))))
        model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05)), "mse",
                      run_eagerly=eager)
        ids = np.array([[1, 2], [2, 3], [3, 3], [9, 1]], np.int64)
        history = model.fit(ids, np.ones((4, 1)), batch_size=2, epochs=3, verbose=0,
                            shuffle=False)
        results.append((history.history["loss"], emb.params.lookup([1, 2, 3, 9]).numpy()))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-5)
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-5, atol=1e-7)

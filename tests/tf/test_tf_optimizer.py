"""DynamicEmbeddingOptimizer: wrapping, the gradient route, and what a step writes."""


import keras
import numpy as np
import pytest
import tensorflow as tf

import dualemb.tf as de

_n = [0]


def _var(**kw):
    _n[0] += 1
    kw.setdefault("name", f"opt_var_{_n[0]}")
    return de.Variable(**kw)


def _step(opt, var, keys, weights=None, name="t"):
    keys = tf.constant(keys, tf.int64)
    with tf.GradientTape() as tape:
        emb, trainable = de.embedding_lookup(var, keys, name=name, return_trainable=True)
        w = tf.ones_like(emb) if weights is None else tf.constant(weights, tf.float32)
        loss = tf.reduce_sum(emb * w)
    opt.apply_gradients(zip(tape.gradient(loss, [trainable]), [trainable]))


def test_wraps_without_changing_the_optimizer_given():
    adam = keras.optimizers.Adam(0.1, beta_1=0.8)
    wrapped = de.DynamicEmbeddingOptimizer(adam)
    assert wrapped is not adam and wrapped.inner_optimizer is adam
    assert type(adam) is keras.optimizers.Adam  # its class is not swapped
    assert isinstance(wrapped, keras.optimizers.Optimizer)
    assert de.DynamicEmbeddingOptimizer(wrapped) is wrapped
    assert wrapped.beta_1 == 0.8  # hyper-parameters read through the wrapper
    assert wrapped.iterations is adam.iterations


def test_serialization_roundtrip_keeps_the_wrapper():
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.RMSprop(0.01, momentum=0.3))
    config = keras.optimizers.serialize(opt)
    assert config["registered_name"] == "dualemb>DynamicEmbeddingOptimizerWrapper"
    back = keras.optimizers.deserialize(config)
    assert type(back) is type(opt) and back.momentum == 0.3
    assert type(back.inner_optimizer) is keras.optimizers.RMSprop


@pytest.mark.parametrize("bad", [
    "adam", keras.optimizers.Adam, keras.optimizers.Lamb(), keras.optimizers.Adafactor(),
    tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), None])
def test_unsupported_optimizers_say_which_are_supported(bad):
    with pytest.raises(TypeError, match="keras.optimizers.Adam"):
        de.DynamicEmbeddingOptimizer(bad)


def test_unsupported_options():
    with pytest.raises(NotImplementedError, match="synchronous"):
        de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(), synchronous=True)
    with pytest.raises(NotImplementedError, match="gradient_accumulation_steps"):
        de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(gradient_accumulation_steps=2))


def test_duplicate_ids_have_their_gradients_summed():
    var = _var(dim=2)
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(1.0))
    _step(opt, var, [5, 5, 6], weights=[[1.0, 1.0], [2.0, 3.0], [1.0, 1.0]])
    np.testing.assert_allclose(var.lookup([5, 6]).numpy(), [[-3.0, -4.0], [-1.0, -1.0]])


def test_a_step_inserts_exactly_the_keys_it_updated():
    var = _var(dim=2, initializer=keras.initializers.RandomNormal(seed=2))
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1))
    with tf.GradientTape() as tape:
        emb, trainable = de.embedding_lookup(var, tf.constant([1, 2, 2], tf.int64), name="a",
                                             return_trainable=True)
        other = var.lookup(tf.constant([3, 4], tf.int64))  # a plain read: no gradient route
        loss = tf.reduce_sum(emb) + tf.reduce_sum(other)
    opt.apply_gradients(zip(tape.gradient(loss, [trainable]), [trainable]))
    keys, _ = var.export()
    assert sorted(keys.numpy().tolist()) == [1, 2]
    # with its slots
    slot_keys, slot_values = var.get_slot_variables()[0].export()
    assert sorted(slot_keys.numpy().tolist()) == [1, 2]
    assert np.all(slot_values.numpy() != 0)


def test_iterations_and_schedule_drive_the_fused_step():
    var = _var(dim=1)
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay([1], [1.0, 0.25])
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(schedule))
    _step(opt, var, [1])  # iterations 0 -> lr 1.0
    _step(opt, var, [1])  # iterations 1 -> lr 1.0 (boundary is inclusive)
    _step(opt, var, [1])  # iterations 2 -> lr 0.25
    np.testing.assert_allclose(var.lookup([1]).numpy(), [[-2.25]])
    assert int(opt.iterations) == 3


def test_sharded_variable_trains_like_one_shard():
    one = _var(dim=3, initializer=keras.initializers.RandomNormal(seed=5))
    three = _var(dim=3, initializer=keras.initializers.RandomNormal(seed=5),
                 devices=["/CPU:0"] * 3)
    opt1 = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1))
    opt3 = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1))
    for keys in ([1, 2, 3, 4, 4], [-3, 2, 9], [1, 1, 1]):
        _step(opt1, one, keys)
        _step(opt3, three, keys)
    keys = np.array([1, 2, 3, 4, -3, 9], np.int64)
    np.testing.assert_array_equal(one.lookup(keys).numpy(), three.lookup(keys).numpy())
    assert int(three.size()) == 6


def test_one_variable_one_fused_optimizer():
    var = _var(dim=2)
    adam = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1))
    _step(adam, var, [1])
    before = var.lookup([1]).numpy()
    with pytest.raises(ValueError, match="already trained by another optimizer"):
        _step(de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)), var, [1])
    np.testing.assert_array_equal(var.lookup([1]).numpy(), before)
    assert var.optimizer_spec["name"] == "adam"
    del adam  # once the first optimizer is gone, another may take over (slots restart)
    import gc
    gc.collect()
    _step(de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)), var, [1])
    assert var.optimizer_spec["name"] == "sgd"


def test_dense_only_and_embedding_only_updates():
    dense = keras.Variable(np.ones(2, np.float32))
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.5))
    opt.apply_gradients([(tf.ones(2), dense)])
    np.testing.assert_allclose(dense.numpy(), [0.5, 0.5])
    var = _var(dim=1)
    _step(opt, var, [3])
    assert int(opt.iterations) == 2
    np.testing.assert_allclose(var.lookup([3]).numpy(), [[-0.5]])


def test_weight_decay_exclusion_is_honored():
    var = _var(dim=1, initializer=1.0)
    opt = keras.optimizers.SGD(0.1, weight_decay=0.5)
    trainable = var.trainable_wrapper("t")
    opt.exclude_from_weight_decay(var_list=[trainable])
    opt = de.DynamicEmbeddingOptimizer(opt)
    _step(opt, var, [1])
    np.testing.assert_allclose(var.lookup([1]).numpy(), [[0.9]])  # no decay, just -lr*g


def test_options_set_on_the_wrapper_reach_the_wrapped_optimizer():
    var = _var(dim=1, initializer=1.0)
    trainable = var.trainable_wrapper("t")
    sgd = keras.optimizers.SGD(0.1)
    opt = de.DynamicEmbeddingOptimizer(sgd)
    opt.weight_decay = 0.5
    opt.exclude_from_weight_decay(var_list=[trainable])
    assert sgd.weight_decay == 0.5 and opt.clipnorm is None
    _step(opt, var, [1])
    np.testing.assert_allclose(var.lookup([1]).numpy(), [[0.9]])  # excluded: no decay
    other = _var(dim=1, initializer=1.0)
    _step(opt, other, [1])
    np.testing.assert_allclose(other.lookup([1]).numpy(), [[1.0 - 1.0 * 0.5 * 0.1 - 0.1]])


def test_plain_keras_optimizer_cannot_apply_embedding_gradients():
    var = _var(dim=2)
    for opt in (keras.optimizers.SGD(0.1), keras.optimizers.Adam(0.1)):
        with pytest.raises(TypeError, match="DynamicEmbeddingOptimizer"):
            _step(opt, var, [1])
    assert int(var.size()) == 0

    @tf.function
    def step(keys):
        with tf.GradientTape() as tape:
            emb, trainable = de.embedding_lookup(var, keys, name="t", return_trainable=True)
            loss = tf.reduce_sum(emb)
        keras.optimizers.SGD(0.1).apply_gradients(zip(tape.gradient(loss, [trainable]),
                                                      [trainable]))

    with pytest.raises(TypeError, match="DynamicEmbeddingOptimizer"):
        step(tf.constant([1], tf.int64))

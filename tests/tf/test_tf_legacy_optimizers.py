"""DynamicEmbeddingOptimizer around tf_keras (Keras 2) and tf.compat.v1.train optimizers, in
custom training loops: training a dynamic embedding equals the same optimizer training a dense
tf.Variable that holds the touched rows (every key occurs in every batch, so the dense
optimizer's update of all rows and the core's update of the batch's rows coincide), and the dense
weights beside it train as without the wrapper."""

import numpy as np
import pytest
import tensorflow as tf

import keras
import dualemb.tf as de

tf_keras = pytest.importorskip("tf_keras", reason="tf-keras (the test extra) is not installed")

KEYS = np.array([3, 7, 11], np.int64)
# Duplicate ids: the core sums their gradients, as the dense variable's gradient does.
BATCHES = [np.array([3, 7, 3, 11, 7, 3]), np.array([11, 3, 7, 7, 7, 11]),
           np.array([7, 11, 3, 3, 11, 3])]
V1 = tf.compat.v1.train


def _loss(rows, w):
    return tf.reduce_sum(tf.tanh(tf.matmul(rows, w)) * tf.range(1.0, 7.0)[:, None])


def _variable(name="v"):
    return de.Variable(dim=4, name=name,
                       initializer=keras.initializers.RandomNormal(stddev=0.5, seed=3))


def _dense_weight():
    return tf.Variable(np.linspace(-1, 1, 8).reshape(4, 2).astype(np.float32))


def _train_dynamic(optimizer, with_dense=True, wrap_step=lambda f: f):
    var, w = _variable(), _dense_weight()
    optimizer = de.DynamicEmbeddingOptimizer(optimizer)

    def step(ids):
        with tf.GradientTape() as tape:
            rows, anchor = de.embedding_lookup(var, ids, return_trainable=True)
            loss = _loss(rows, w)
        variables = [anchor, w] if with_dense else [anchor]
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

    step = wrap_step(step)
    for ids in BATCHES:
        step(tf.constant(ids))
    return var.lookup(KEYS).numpy(), w.numpy(), optimizer


def _train_dense(optimizer, with_dense=True):
    table, w = tf.Variable(_variable().lookup(KEYS)), _dense_weight()
    for ids in BATCHES:
        with tf.GradientTape() as tape:
            loss = _loss(tf.gather(table, np.searchsorted(KEYS, ids)), w)
        variables = [table, w] if with_dense else [table]
        # Dense gradients: the reference updates the rows as one dense variable.
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]
        optimizer.apply_gradients(zip(grads, variables))
    return table.numpy(), w.numpy()


OPTIMIZERS = {
    "v1_sgd": lambda: V1.GradientDescentOptimizer(0.1),
    "v1_sgd_callable_lr": lambda: V1.GradientDescentOptimizer(lambda: 0.05),
    "v1_adam": lambda: V1.AdamOptimizer(0.1),
    "v1_adam_args": lambda: V1.AdamOptimizer(0.05, beta1=0.8, beta2=0.99, epsilon=1e-4),
    "v1_adagrad": lambda: V1.AdagradOptimizer(0.1, initial_accumulator_value=0.3),
    "k2_sgd": lambda: tf_keras.optimizers.SGD(0.1),
    "k2_sgd_nesterov": lambda: tf_keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    "k2_adam": lambda: tf_keras.optimizers.Adam(0.1),
    "k2_adam_amsgrad": lambda: tf_keras.optimizers.Adam(0.1, amsgrad=True),
    "k2_adam_schedule": lambda: tf_keras.optimizers.Adam(
        tf_keras.optimizers.schedules.ExponentialDecay(0.1, 1, 0.5)),
    "k2_adamw": lambda: tf_keras.optimizers.AdamW(0.1, weight_decay=0.1),
    "k2_sgd_weight_decay": lambda: tf_keras.optimizers.SGD(0.1, weight_decay=0.2),
    "k2_adagrad": lambda: tf_keras.optimizers.Adagrad(0.1),
    "k2_adamax": lambda: tf_keras.optimizers.Adamax(0.1),
    "k2_nadam": lambda: tf_keras.optimizers.Nadam(0.1),
    "k2_rmsprop": lambda: tf_keras.optimizers.RMSprop(0.1, momentum=0.5, centered=True),
    "k2_adadelta": lambda: tf_keras.optimizers.Adadelta(1.0),
    "k2_ftrl": lambda: tf_keras.optimizers.Ftrl(0.1, l1_regularization_strength=0.01),
    "k2_lion": lambda: tf_keras.optimizers.Lion(0.05),
    "k2_legacy_sgd": lambda: tf_keras.optimizers.legacy.SGD(0.1, momentum=0.9),
    "k2_legacy_adam": lambda: tf_keras.optimizers.legacy.Adam(0.1),
    "k2_legacy_adam_amsgrad_decay": lambda: tf_keras.optimizers.legacy.Adam(
        0.1, amsgrad=True, decay=0.5),
    "k2_legacy_adamax": lambda: tf_keras.optimizers.legacy.Adamax(0.1),
    "k2_legacy_adadelta": lambda: tf_keras.optimizers.legacy.Adadelta(1.0),
    "k2_legacy_ftrl": lambda: tf_keras.optimizers.legacy.Ftrl(
        0.1, l1_regularization_strength=0.01, l2_regularization_strength=0.1, beta=0.5),
    "k2_legacy_rmsprop_momentum_centered": lambda: tf_keras.optimizers.legacy.RMSprop(
        0.05, momentum=0.5, centered=True),
    # Legacy optimizers whose formula differs from Keras 3's (the core's epsilon_in_sqrt=false,
    # schedule_decay). A large epsilon makes its place (in or outside the square root) show
    # beyond the tolerance.
    "k2_legacy_adagrad": lambda: tf_keras.optimizers.legacy.Adagrad(0.1),
    "k2_legacy_adagrad_args": lambda: tf_keras.optimizers.legacy.Adagrad(
        0.1, initial_accumulator_value=0.3, epsilon=0.1, decay=0.5),
    "k2_legacy_rmsprop": lambda: tf_keras.optimizers.legacy.RMSprop(0.05, epsilon=0.1),
    "k2_legacy_rmsprop_centered": lambda: tf_keras.optimizers.legacy.RMSprop(
        0.05, rho=0.8, epsilon=0.1, centered=True),
    "k2_legacy_rmsprop_momentum_eps": lambda: tf_keras.optimizers.legacy.RMSprop(
        0.05, momentum=0.5, epsilon=0.1),
    "k2_legacy_nadam": lambda: tf_keras.optimizers.legacy.Nadam(0.1),
    "k2_legacy_nadam_args": lambda: tf_keras.optimizers.legacy.Nadam(
        0.05, beta_1=0.8, beta_2=0.99, epsilon=0.1, schedule_decay=0.5),
    # TF's own old Keras copy, which TFRA's tests use.
    "tf_python_keras_adam": lambda: _tf_python_keras().adam.Adam(0.1),
    "tf_python_keras_adagrad": lambda: _tf_python_keras().adagrad.Adagrad(0.1, epsilon=0.1),
    "tf_python_keras_nadam": lambda: _tf_python_keras().nadam.Nadam(0.1),
    "tf_python_keras_rmsprop": lambda: _tf_python_keras().rmsprop.RMSprop(0.05, epsilon=0.1),
}


def _tf_python_keras():
    from tensorflow.python.keras import optimizer_v2  # noqa: PLC0415

    return optimizer_v2


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_equals_the_optimizer_on_a_dense_variable(name):
    rows, w, _ = _train_dynamic(OPTIMIZERS[name]())
    want_rows, want_w = _train_dense(OPTIMIZERS[name]())
    np.testing.assert_allclose(rows, want_rows, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(w, want_w, rtol=2e-5, atol=2e-6)
    assert not np.allclose(rows, _variable().lookup(KEYS).numpy())  # it trained


@pytest.mark.parametrize("name", ["v1_adam", "k2_adam", "k2_legacy_adam", "k2_legacy_nadam"])
def test_embedding_only_steps_are_counted(name):
    """With no dense gradient the wrapper counts the step itself (tf_keras skips an empty
    step): Adam's bias correction then follows the dense reference's step."""
    rows, _, optimizer = _train_dynamic(OPTIMIZERS[name](), with_dense=False)
    want_rows, _ = _train_dense(OPTIMIZERS[name](), with_dense=False)
    np.testing.assert_allclose(rows, want_rows, rtol=2e-5, atol=2e-6)
    if not name.startswith("v1"):
        assert int(optimizer.iterations.numpy()) == len(BATCHES)


@pytest.mark.parametrize("name", ["v1_adam", "k2_adam", "k2_legacy_adam", "k2_adam_schedule",
                                  "k2_legacy_nadam", "k2_legacy_adagrad_args"])
def test_inside_tf_function(name):
    rows, w, _ = _train_dynamic(OPTIMIZERS[name](), wrap_step=tf.function)
    want_rows, want_w = _train_dense(OPTIMIZERS[name]())
    np.testing.assert_allclose(rows, want_rows, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(w, want_w, rtol=2e-5, atol=2e-6)


# The core's slot names -> the legacy optimizer's, for the optimizers whose formula differs.
LEGACY_SLOTS = {
    "adagrad": {"accumulator": "accumulator"},
    "rmsprop": {"velocity": "rms", "momentum": "momentum", "average_gradient": "mg"},
    "nadam": {"momentum": "m", "velocity": "v"},
}


@pytest.mark.parametrize("name", sorted(
    n for n in OPTIMIZERS if n.startswith(("k2_legacy_", "tf_python_keras_"))
    and any(family in n for family in LEGACY_SLOTS)))
def test_legacy_slots_equal_the_optimizer_slots_on_a_dense_variable(name):
    """The rows' slots (accumulators, moments) equal the legacy optimizer's slots of the dense
    rows, slot by slot."""
    var, w = _variable(), _dense_weight()
    optimizer = de.DynamicEmbeddingOptimizer(OPTIMIZERS[name]())
    table, w_ref = tf.Variable(_variable().lookup(KEYS)), _dense_weight()
    reference = OPTIMIZERS[name]()
    for ids in BATCHES:
        with tf.GradientTape() as tape:
            rows, anchor = de.embedding_lookup(var, tf.constant(ids), return_trainable=True)
            loss = _loss(rows, w)
        optimizer.apply_gradients(zip(tape.gradient(loss, [anchor, w]), [anchor, w]))
        with tf.GradientTape() as tape:
            loss = _loss(tf.gather(table, np.searchsorted(KEYS, ids)), w_ref)
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, [table, w_ref])]
        reference.apply_gradients(zip(grads, [table, w_ref]))
    family = next(f for f in LEGACY_SLOTS if f in name)
    slots = var.get_slot_variables(optimizer)
    assert sorted(reference.get_slot_names()) == sorted(
        LEGACY_SLOTS[family][s.slot_name] for s in slots)
    for slot in slots:
        want = reference.get_slot(table, LEGACY_SLOTS[family][slot.slot_name]).numpy()
        np.testing.assert_allclose(slot.lookup(KEYS).numpy(), want, rtol=2e-5, atol=2e-6,
                                   err_msg=slot.slot_name)


@pytest.mark.parametrize("name", ["k2_legacy_nadam", "tf_python_keras_nadam"])
def test_legacy_nadam_momentum_cache_follows_embedding_only_steps(name):
    """Legacy Nadam multiplies its momentum_cache by the step's schedule factor in every
    apply_gradients. A step with embedding gradients only (the dense weight has none) must
    advance it too, or the dense weight's later steps would use the cache of another step: the
    reference trains the dense table in every step and the weight in some."""
    dense_steps = [True, False, False, True]
    batches = BATCHES + BATCHES[:1]
    var, w = _variable(), _dense_weight()
    optimizer = de.DynamicEmbeddingOptimizer(OPTIMIZERS[name]())
    table, w_ref = tf.Variable(_variable().lookup(KEYS)), _dense_weight()
    reference = OPTIMIZERS[name]()
    for ids, with_dense in zip(batches, dense_steps):
        with tf.GradientTape() as tape:
            rows, anchor = de.embedding_lookup(var, tf.constant(ids), return_trainable=True)
            loss = _loss(rows, w)
        variables = [anchor, w] if with_dense else [anchor]
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        with tf.GradientTape() as tape:
            loss = _loss(tf.gather(table, np.searchsorted(KEYS, ids)), w_ref)
        variables = [table, w_ref] if with_dense else [table]
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]
        reference.apply_gradients(zip(grads, variables))
    np.testing.assert_allclose(var.lookup(KEYS).numpy(), table.numpy(), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(w.numpy(), w_ref.numpy(), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(optimizer._m_cache.numpy(), reference._m_cache.numpy(),
                               rtol=1e-6)


@pytest.mark.parametrize("name", ["v1_adam", "k2_adam", "k2_legacy_adam"])
def test_minimize(name):
    """``minimize(loss_fn, var_list)`` with the Keras 3 anchor a lookup returns in var_list."""
    var, w = _variable(), _dense_weight()
    optimizer = de.DynamicEmbeddingOptimizer(OPTIMIZERS[name]())
    ids = tf.constant(BATCHES[0])
    _, anchor = de.embedding_lookup(var, ids, return_trainable=True)
    for i, ids in enumerate(BATCHES):
        # var_list as a list, or as a callable (tf_keras accepts both; TF1 a list only)
        var_list = [anchor, w] if i % 2 or name.startswith("v1") else (lambda: [anchor, w])
        optimizer.minimize(lambda: _loss(de.embedding_lookup(var, tf.constant(ids)), w),
                           var_list=var_list)
    want_rows, want_w = _train_dense(OPTIMIZERS[name]())
    np.testing.assert_allclose(var.lookup(KEYS).numpy(), want_rows, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(w.numpy(), want_w, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", ["v1_adam", "k2_legacy_adam", "tf_python_keras_adam"])
def test_minimize_with_a_var_list_the_loss_fills(name):
    """TFRA's pattern: ``var_list`` is an empty list that the loss function fills with the
    lookup's trainable. TF1 and legacy Keras read the list after running the loss; a copy taken
    before would be empty and the step would silently train nothing."""
    var, w = _variable(), _dense_weight()
    optimizer = de.DynamicEmbeddingOptimizer(OPTIMIZERS[name]())
    for ids in BATCHES:
        var_list = []

        def loss_fn(ids=ids, var_list=var_list):
            rows, anchor = de.embedding_lookup(var, tf.constant(ids), return_trainable=True)
            var_list[:] = [anchor, w]
            return _loss(rows, w)

        optimizer.minimize(loss_fn, var_list=var_list)
    want_rows, want_w = _train_dense(OPTIMIZERS[name]())
    np.testing.assert_allclose(var.lookup(KEYS).numpy(), want_rows, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(w.numpy(), want_w, rtol=2e-5, atol=2e-6)


def test_wrapping_returns_the_same_optimizer_and_keeps_its_name_and_config():
    adam = tf_keras.optimizers.Adam(0.1, beta_1=0.8)
    wrapped = de.DynamicEmbeddingOptimizer(adam)
    assert wrapped is adam and isinstance(adam, tf_keras.optimizers.Adam)
    assert type(adam).__name__ == "Adam" and adam.get_config()["beta_1"] == pytest.approx(0.8)
    assert de.DynamicEmbeddingOptimizer(adam) is adam  # wrapping twice changes nothing
    # Only that instance: another Adam is untouched.
    assert type(tf_keras.optimizers.Adam(0.1)) is not type(adam)


@pytest.mark.parametrize("make, match", [
    (lambda: V1.MomentumOptimizer(0.1, 0.9), "MomentumOptimizer"),
    (lambda: V1.RMSPropOptimizer(0.1), "RMSPropOptimizer"),
])
def test_optimizers_without_an_exact_fused_equivalent_are_refused(make, match):
    optimizer = make()
    with pytest.raises(TypeError, match=match):
        de.DynamicEmbeddingOptimizer(optimizer)
    assert "DynamicEmbedding" not in type(optimizer).__qualname__ and not hasattr(
        optimizer, "_dualemb_api")


@pytest.mark.parametrize("option", [{"clipnorm": 1.0}, {"clipvalue": 0.5},
                                    {"global_clipnorm": 1.0}])
def test_gradient_clipping_of_tf_keras_optimizers_is_refused(option):
    with pytest.raises(NotImplementedError, match=next(iter(option))):
        de.DynamicEmbeddingOptimizer(tf_keras.optimizers.Adam(0.1, **option))


def test_plain_tf1_optimizer_given_an_embedding_gradient_raises():
    """Without the wrapper the key-indexed gradient cannot be applied: an error, table intact."""
    var = _variable()
    with tf.GradientTape() as tape:
        rows, anchor = de.embedding_lookup(var, tf.constant(BATCHES[0]), return_trainable=True)
        loss = tf.reduce_sum(rows)
    with pytest.raises(Exception):
        V1.GradientDescentOptimizer(0.1).apply_gradients(
            [(tape.gradient(loss, anchor), anchor)])
    assert int(var.size()) == 0

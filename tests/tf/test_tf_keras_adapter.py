"""dualemb/tf/keras_adapter.py pinned against the installed Keras 3, tf_keras and TensorFlow: every
private attribute it reads (its ``PINNED`` table) exists on a real instance and means what the
adapter says, checked against the framework's public API or a hand-computed value. A framework
upgrade that renames or changes one fails here, in one place."""

import inspect

import numpy as np
import pytest
import tensorflow as tf

import keras
from dualemb.tf import keras_adapter as adapter

tf_keras = pytest.importorskip("tf_keras", reason="tf-keras (the test extra) is not installed")


def _has_all(obj, kind):
    missing = [name for name in adapter.PINNED[kind] if not hasattr(obj, name)]
    assert not missing, f"{type(obj).__module__}.{type(obj).__name__} lacks {missing}"


def test_keras3_optimizer():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    opt = keras.optimizers.Adam(schedule, clipnorm=1.0, weight_decay=0.1)
    kernel, bias = keras.Variable(np.ones(2, np.float32), name="kernel"), keras.Variable(
        np.ones(2, np.float32), name="bias")
    opt.exclude_from_weight_decay(var_names=["bias"])
    opt.build([kernel, bias])
    _has_all(opt, "keras3_optimizer")
    assert adapter.step_counter(opt) is opt.iterations
    assert adapter.learning_rate_setting(opt) is schedule
    assert float(adapter.current_learning_rate(opt)) == pytest.approx(0.1)
    adapter.step_counter(opt).assign_add(2)
    assert float(adapter.current_learning_rate(opt)) == pytest.approx(0.025)  # 0.1 * 0.5**2
    np.testing.assert_allclose(adapter.clip_by_norm(opt, tf.constant([3.0, 4.0])), [0.6, 0.8],
                               rtol=1e-6)
    clipped = adapter.clip_gradients(opt, [tf.constant([3.0, 4.0])])
    np.testing.assert_allclose(clipped[0], [0.6, 0.8], rtol=1e-6)
    assert adapter.uses_weight_decay(opt, kernel) and not adapter.uses_weight_decay(opt, bias)
    assert list(adapter.built_trainable_variables(opt)) == [kernel, bias]

    by_value = keras.optimizers.SGD(0.1, clipvalue=0.5)
    by_value.build([kernel])
    np.testing.assert_allclose(adapter.clip_gradients(by_value, [tf.constant([3.0, -0.25])])[0],
                               [0.5, -0.25])


def test_keras3_layer():
    inner = keras.layers.Dense(3, name="inner")
    model = keras.Sequential([keras.Input((2,)), inner,
                              keras.layers.BatchNormalization(name="norm")])
    _has_all(inner, "keras3_layer")
    assert [v.path for v in adapter.layer_own_variables(inner)] == [v.path for v in inner.weights]
    norm = model.get_layer("norm")
    own = adapter.layer_own_variables(norm)
    assert own[:len(norm.trainable_weights)] == norm.trainable_weights  # trainable first
    assert {v.path for v in own} == {v.path for v in norm.weights}
    # Recursive: a nested model's layers too (InputLayers are layers of the models).
    outer = keras.Sequential([keras.Input((2,)), model], name="outer")
    names = [layer.name for layer in adapter.sublayers(outer)
             if not isinstance(layer, keras.layers.InputLayer)]
    assert sorted(names) == sorted([model.name, "inner", "norm"])


def test_tf_keras_optimizer():
    opt = tf_keras.optimizers.Adam(0.25, weight_decay=0.1)
    opt.exclude_from_weight_decay(var_names=["bias"])
    _has_all(opt, "tf_keras_optimizer")
    assert float(adapter.learning_rate_setting(opt)) == 0.25
    assert list(adapter.tf_keras_weight_decay_excluded_names(opt)) == ["bias"]
    assert not adapter.uses_weight_decay(opt, tf.Variable(1.0, name="bias"))
    assert adapter.uses_weight_decay(opt, tf.Variable(1.0, name="kernel"))
    assert list(adapter.tf_keras_weight_decay_excluded_names(tf_keras.optimizers.SGD())) == []


def test_tf_keras_legacy_optimizers():
    legacy = tf_keras.optimizers.legacy
    rms = legacy.RMSprop(0.5, momentum=0.5, decay=0.25)
    _has_all(rms, "tf_keras_legacy_optimizer")
    _has_all(rms, "tf_keras_legacy_rmsprop")
    assert adapter.legacy_has_momentum(rms)
    assert not adapter.legacy_has_momentum(legacy.RMSprop(0.5))
    assert adapter.legacy_initial_decay(rms) == 0.25
    assert float(adapter.legacy_hyper(rms, "learning_rate", tf.float32)) == 0.5
    var = tf.Variable([1.0])
    for _ in range(2):
        rms.apply_gradients([(tf.constant([1.0]), var)])
    # OptimizerV2's decay: lr / (1 + decay * iterations), at iterations == 2.
    assert float(adapter.legacy_decayed_learning_rate(rms, tf.float32)) == pytest.approx(
        0.5 / 1.5)
    ftrl = legacy.Ftrl(0.1, initial_accumulator_value=0.3)
    assert getattr(ftrl, "initial_accumulator_value", None) is None  # why the private read
    assert adapter.legacy_private_hyper(ftrl, "initial_accumulator_value") == 0.3

    nadam = legacy.Nadam(0.1, beta_1=0.9)
    _has_all(nadam, "tf_keras_legacy_optimizer")
    assert adapter.legacy_nadam_momentum_cache(nadam) is None  # made by the first step
    nadam.apply_gradients([(tf.constant([1.0]), tf.Variable([1.0]))])
    _has_all(nadam, "tf_keras_legacy_nadam")
    # The product of the schedule's factors after step 1: beta_1 * (1 - 0.5 * 0.96**(0.004*1)).
    assert float(adapter.legacy_nadam_momentum_cache(nadam)) == pytest.approx(
        0.9 * (1 - 0.5 * 0.96 ** 0.004), rel=1e-6)


def test_tf_v1_optimizers():
    adam = tf.compat.v1.train.AdamOptimizer(lambda: 0.5, beta1=0.8, beta2=0.7, epsilon=0.01)
    _has_all(adam, "tf_v1_optimizer")
    _has_all(adam, "tf_v1_adam")
    assert [adapter.tf_v1_value(adam, a) for a in ("_lr", "_beta1", "_beta2", "_epsilon")] == [
        0.5, 0.8, 0.7, 0.01]
    adagrad = tf.compat.v1.train.AdagradOptimizer(0.2, initial_accumulator_value=0.4)
    _has_all(adagrad, "tf_v1_adagrad")
    assert adapter.tf_v1_value(adagrad, "_learning_rate") == 0.2
    assert adapter.tf_v1_value(adagrad, "_initial_accumulator_value") == 0.4
    sgd = tf.compat.v1.train.GradientDescentOptimizer(lambda: 0.3)
    _has_all(sgd, "tf_v1_optimizer")
    _has_all(sgd, "tf_v1_sgd")
    assert adapter.tf_v1_value(sgd, "_learning_rate") == 0.3


def test_parameter_server_strategy_attributes():
    # A live ParameterServerStrategy needs a cluster (tests/tf/distribute/test_tf_distribute_ps.py runs one);
    # here its source pins that the constructor still sets both attributes the adapter reads.
    source = inspect.getsource(tf.distribute.experimental.ParameterServerStrategy)
    for name in adapter.PINNED["parameter_server_strategy"]:
        assert f"self.{name} =" in source, name
    assert not adapter.is_parameter_server_strategy(tf.distribute.get_strategy())
    assert not adapter.is_parameter_server_strategy(tf.distribute.OneDeviceStrategy("/cpu:0"))


def test_mirrored_strategy_communication_timeout():
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0"])
    _has_all(mirrored.extended, "mirrored_strategy_extended")
    assert adapter.communication_timeout(mirrored) == 0.0  # no timeout given
    # A MultiWorkerMirroredStrategy configures collectives for the whole process, so its
    # constructor is pinned by its source: it keeps the options it was given there.
    from tensorflow.python.distribute import collective_all_reduce_strategy as mwms
    source = inspect.getsource(mwms.CollectiveAllReduceExtended)
    assert "self._communication_options = communication_options" in source

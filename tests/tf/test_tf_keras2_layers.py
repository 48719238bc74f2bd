"""The dynamic embedding layers in tf_keras (Keras 2) models: ``dualemb.tf.keras.layers.keras2``
directly, and ``de.keras.layers`` under ``TF_USE_LEGACY_KERAS=1`` (in a subprocess, so the
variable does not leak); ``model.fit`` against the same model with a dense embedding."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras
import dualemb.tf as de

tf_keras = pytest.importorskip("tf_keras", reason="tf-keras (the test extra) is not installed")
from dualemb.tf.keras.layers import keras2  # noqa: E402  (needs tf_keras)

sys.path.insert(0, os.path.dirname(__file__))
import keras2_fit_check  # noqa: E402

TOL = dict(rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("make_optimizer", [
    lambda: tf_keras.optimizers.Adam(0.1),
    lambda: tf_keras.optimizers.SGD(0.1, momentum=0.5, nesterov=True),
    lambda: tf_keras.optimizers.Adagrad(0.2),
    lambda: tf_keras.optimizers.legacy.Adam(0.1),
    # legacy optimizers whose formula is not Keras 3's (epsilon outside the root, Nadam's
    # momentum schedule); a large epsilon makes its place matter
    lambda: tf_keras.optimizers.legacy.Adagrad(0.2, epsilon=0.1),
    lambda: tf_keras.optimizers.legacy.RMSprop(0.05, epsilon=0.1),
    lambda: tf_keras.optimizers.legacy.Nadam(0.1),
], ids=["adam", "sgd_nesterov", "adagrad", "legacy_adam", "legacy_adagrad", "legacy_rmsprop",
        "legacy_nadam"])
def test_fit_equals_a_dense_embedding(make_optimizer):
    rows, kernel, moved = keras2_fit_check.fit_difference(keras2, make_optimizer)
    assert rows < 2e-6 and kernel < 2e-6
    assert moved > 0.05  # it trained


def test_under_TF_USE_LEGACY_KERAS_de_keras_layers_are_tf_keras_layers():
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    script = os.path.join(os.path.dirname(__file__), "keras2_fit_check.py")
    out = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT "):])
    assert result["tf_keras_is_tf_keras"] and result["layer_is_tf_keras"]
    for name in ("adam", "sgd"):
        rows, kernel, moved = result[name]
        assert rows < 2e-6 and kernel < 2e-6 and moved > 0.05, (name, result[name])


def test_keras_3_stays_the_default():
    assert os.environ.get("TF_USE_LEGACY_KERAS") is None
    assert isinstance(de.keras.layers.Embedding(2, name="k3_probe"), keras.layers.Layer)
    assert tf.keras.layers.Layer is not tf_keras.layers.Layer


IDS = np.array([[5, 9, 5, 2], [7, 2, 2, 11]], np.int64)


@pytest.mark.parametrize("kind, kwargs", [
    ("Embedding", {}),
    ("SquashedEmbedding", {"combiner": "mean"}),
    ("FieldWiseEmbedding", {"nslots": 3, "combiner": "sqrtn"}),
])
def test_tf_keras_layers_give_what_the_keras_3_layers_give(kind, kwargs):
    """Same table rows (tf_keras' RandomNormal maps to the same per-key initializer as Keras 3's),
    same outputs: numpy pooling of the table rows is checked for the Keras 3 layers in
    tests/tf/test_tf_layers.py."""
    k2 = getattr(keras2, kind)(3, name=f"same_{kind}", **kwargs,
                               initializer=tf_keras.initializers.RandomNormal(0.1, 0.3, seed=5))
    k3 = getattr(de.keras.layers, kind)(3, name=f"same_{kind}", **kwargs,
                                        initializer=keras.initializers.RandomNormal(0.1, 0.3,
                                                                                    seed=5))
    np.testing.assert_array_equal(k2(IDS).numpy(), k3(IDS).numpy())
    rows = k2.params.lookup(IDS).numpy()
    assert rows.std() > 0.1  # really random rows


def test_anchor_is_a_tracked_tf_keras_weight_and_the_table_is_checkpointed(tmp_path):
    layer = keras2.Embedding(4, name="ckpt", initializer=0.0)
    model = keras2_fit_check._model(layer, np.ones((4, 1), np.float32))
    assert layer.shadow in model.trainable_weights and tuple(layer.shadow.shape) == (0, 4)
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(tf_keras.optimizers.Adam(0.1)),
                  loss="mse")
    keys = keras2_fit_check.KEYS
    model.fit(keys[keras2_fit_check.POSITIONS], keras2_fit_check.LABELS, epochs=2, verbose=0)
    trained = layer.params.lookup(keys).numpy()
    assert np.abs(trained).max() > 0.01
    model.save_weights(str(tmp_path / "w"))
    layer.params.clear()
    assert int(layer.params.size()) == 0
    model.load_weights(str(tmp_path / "w"))
    np.testing.assert_array_equal(layer.params.lookup(keys).numpy(), trained)


def test_plain_tf_keras_optimizer_refuses_the_embedding_gradient():
    """Without DynamicEmbeddingOptimizer the key-indexed gradient is an error, never a silent
    no-op; the table is unchanged."""
    layer = keras2.Embedding(4, name="plain", initializer=0.5)
    model = keras2_fit_check._model(layer, np.ones((4, 1), np.float32))
    model.compile(optimizer=tf_keras.optimizers.SGD(0.1), loss="mse")
    keys = keras2_fit_check.KEYS
    with pytest.raises(Exception, match="indices|out of bounds|not in"):
        model.fit(keys[keras2_fit_check.POSITIONS], keras2_fit_check.LABELS, epochs=1,
                  verbose=0)
    assert int(layer.params.size()) == 0


@pytest.mark.parametrize("kind, args", [("RandomNormal", (0.1, 0.3, 5)),
                                        ("TruncatedNormal", (0.0, 0.5, 6)),
                                        ("RandomUniform", (-0.2, 0.4, 7)),
                                        ("Constant", (0.25,)), ("Ones", ()), ("Zeros", ())])
def test_keras_2_initializers_give_the_keras_3_rows(kind, args):
    """tf_keras' and TF's old tensorflow.python.keras initializers map to the same per-key
    initializer as Keras 3's."""
    from tensorflow.python.keras.initializers import initializers_v2  # noqa: PLC0415

    ids = tf.constant([3, 10**12, -4], tf.int64)
    want = de.Variable(dim=3, name=f"init_{kind}",
                       initializer=getattr(keras.initializers, kind)(*args)).lookup(ids).numpy()
    for module in (tf_keras.initializers, initializers_v2):
        got = de.Variable(dim=3, name=f"init_{kind}",
                          initializer=getattr(module, kind)(*args)).lookup(ids).numpy()
        np.testing.assert_array_equal(got, want)

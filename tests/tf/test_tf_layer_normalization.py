"""de.keras.layers.LayerNormalization (TFRA's dynamic layer normalization), Keras 3 and tf_keras:
numpy reference, equality with Keras' own LayerNormalization, dynamic and ragged inputs."""

import numpy as np
import pytest
import tensorflow as tf

import keras
import dualemb.tf as de

tf_keras = pytest.importorskip("tf_keras", reason="tf-keras (the test extra) is not installed")
from dualemb.tf.keras.layers import keras2  # noqa: E402

X = np.random.RandomState(0).randn(2, 5, 10).astype(np.float32)


def _numpy_layer_norm(x, axes, epsilon, gamma=None, beta=None):
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    out = (x - mean) / np.sqrt(var + epsilon)
    shape = [1] * x.ndim
    for a in axes:
        shape[a] = x.shape[a]
    if gamma is not None:
        out = out * gamma.reshape(shape)
    if beta is not None:
        out = out + beta.reshape(shape)
    return out


# (de layer class, its Keras' LayerNormalization, its Keras)
KERASES = {
    "keras3": (lambda **k: de.keras.layers.LayerNormalization(**k), keras.layers.LayerNormalization,
               keras),
    "tf_keras": (lambda **k: keras2.LayerNormalization(**k), tf_keras.layers.LayerNormalization,
                 tf_keras),
}


@pytest.mark.parametrize("which", sorted(KERASES))
def test_dynamic_shape_input_against_numpy(which):
    make, _, k = KERASES[which]
    inp = k.Input(shape=(None, 10), dtype="float32")
    layer = make()
    model = k.Model(inp, layer(inp))
    out = model.predict(X, verbose=0)
    np.testing.assert_allclose(out, _numpy_layer_norm(X, (2,), 1e-3), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("which", sorted(KERASES))
@pytest.mark.parametrize("kwargs", [{}, {"axis": [1, 2]}, {"axis": 1, "epsilon": 1e-5},
                                    {"center": False}, {"scale": False},
                                    {"axis": -2, "center": False, "scale": False}])
def test_equals_keras_layer_normalization(which, kwargs):
    make, keras_cls, _ = KERASES[which]
    ours, theirs = make(**kwargs), keras_cls(**kwargs)
    ours.build(X.shape)
    theirs.build(X.shape)
    rng = np.random.RandomState(1)
    weights = [rng.randn(*w.shape).astype(np.float32) for w in theirs.get_weights()]
    ours.set_weights(weights)
    theirs.set_weights(weights)
    got = ours(tf.constant(X)).numpy()
    np.testing.assert_allclose(got, theirs(tf.constant(X)).numpy(), rtol=1e-5, atol=1e-5)
    axes = tuple(sorted(a % 3 for a in np.atleast_1d(kwargs.get("axis", -1))))
    named = dict(zip([w.name.split("/")[-1].split(":")[0] for w in ours.weights], weights))
    np.testing.assert_allclose(
        got, _numpy_layer_norm(X, axes, kwargs.get("epsilon", 1e-3), named.get("gamma"),
                               named.get("beta")), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("which", sorted(KERASES))
def test_ragged_input_normalizes_each_row(which):
    make, _, _ = KERASES[which]
    rows = [np.arange(6, dtype=np.float32).reshape(2, 3) ** 2, np.array([[0.0, 1.0, 5.0]])]
    ragged = tf.ragged.constant([r.tolist() for r in rows], ragged_rank=1)
    out = make()(ragged)
    assert isinstance(out, tf.RaggedTensor)
    for got, row in zip(out.to_list(), rows):
        np.testing.assert_allclose(np.array(got), _numpy_layer_norm(row, (1,), 1e-3),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("which", sorted(KERASES))
def test_ragged_axis_cannot_be_normalized(which):
    make, _, _ = KERASES[which]
    ragged = tf.ragged.constant([[1.0, 2.0, 3.0], [4.0]])
    layer = make(axis=-1)
    with pytest.raises(ValueError, match="ragged or dynamic"):
        layer(ragged)
    built = make(axis=-1)
    built(tf.zeros([2, 3]))  # built for 3 columns: a ragged last axis is still refused
    with pytest.raises(ValueError, match="ragged dimension"):
        built(ragged)


@pytest.mark.parametrize("which", sorted(KERASES))
def test_fit_trains_as_keras_layer_normalization(which):
    """TFRA's training test, against the Keras layer: the same model with either layer trains to
    the same weights, and gamma / beta move."""
    make, keras_cls, k = KERASES[which]
    rng = np.random.RandomState(0)
    features = rng.randn(100, 10).astype(np.float32)
    labels = (features.sum(1) + rng.randn(100) * 0.5).astype(np.float32).reshape(-1, 1)

    def train(norm):
        inp = k.Input(shape=(10,))
        dense = k.layers.Dense(1, kernel_initializer=k.initializers.Constant(0.1))
        model = k.Model(inp, dense(norm(inp)))
        model.compile(optimizer=k.optimizers.SGD(0.05), loss="mse")
        model.fit(features, labels, epochs=3, batch_size=10, shuffle=False, verbose=0)
        return [w.numpy() for w in norm.weights] + [w.numpy() for w in dense.weights]

    ours, theirs = train(make()), train(keras_cls())
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert np.abs(ours[0] - 1.0).max() > 1e-3 and np.abs(ours[1]).max() > 1e-3


def test_config_round_trip():
    layer = de.keras.layers.LayerNormalization(axis=[1, 2], epsilon=1e-4, center=False)
    again = type(layer).from_config(layer.get_config())
    assert isinstance(again, de.keras.layers.LayerNormalization)
    assert again.axis == [1, 2] and again.epsilon == 1e-4 and again.center is False

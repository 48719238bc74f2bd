"""model.fit of a small tf_keras model with a dynamic embedding layer against the same model with a
dense embedding over the keys' positions (the reference). Imported by
tests/tf/test_tf_keras2_layers.py, and run as a script under TF_USE_LEGACY_KERAS=1 by it (prints one
JSON line), so the environment variable never leaks into the test process."""

import json
import sys

import numpy as np
import tensorflow as tf
import tf_keras

import dualemb.tf as de

# Big keys (no vocabulary); every key occurs in the one batch of every step.
KEYS = np.array([10**12 + 7, 3, 10**9 + 1, 42, 5], np.int64)
POSITIONS = np.array([[0, 1, 2], [3, 4, 0], [1, 1, 3], [2, 4, 4]], np.int64)
LABELS = np.array([[1.0], [0.0], [0.5], [-1.0]], np.float32)
DIM = 4


class _DenseGradients:
    """Reference optimizer mixin: the embedding's IndexedSlices as one dense gradient."""

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        pairs = [(tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g, v)
                 for g, v in grads_and_vars]
        return super().apply_gradients(pairs, *args, **kwargs)


def _model(embedding, dense_init):
    inp = tf_keras.Input(shape=(3,), dtype=tf.int64)
    x = tf_keras.layers.Lambda(lambda e: tf.reduce_sum(tf.tanh(e), axis=1))(embedding(inp))
    out = tf_keras.layers.Dense(1, kernel_initializer=tf_keras.initializers.Constant(dense_init))(x)
    return tf_keras.Model(inp, out)


def fit_difference(layer_module, make_optimizer, epochs=4):
    """(max |rows - reference rows|, max |dense kernel - reference|, how far the rows moved)."""
    dense_init = np.linspace(-1, 1, DIM).reshape(DIM, 1).astype(np.float32)
    layer = layer_module.Embedding(
        DIM, initializer=tf_keras.initializers.RandomNormal(stddev=0.5, seed=7), name="emb")
    model = _model(layer, dense_init)
    start = layer.params.lookup(KEYS).numpy()
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(make_optimizer()), loss="mse")
    model.fit(KEYS[POSITIONS], LABELS, batch_size=len(LABELS), epochs=epochs, shuffle=False,
              verbose=0)

    dense_layer = tf_keras.layers.Embedding(
        len(KEYS), DIM, embeddings_initializer=tf_keras.initializers.Constant(start))
    reference = _model(dense_layer, dense_init)
    optimizer = make_optimizer()
    optimizer.__class__ = type("Dense" + type(optimizer).__name__,
                               (_DenseGradients, type(optimizer)), {})
    reference.compile(optimizer=optimizer, loss="mse")
    reference.fit(POSITIONS, LABELS, batch_size=len(LABELS), epochs=epochs, shuffle=False,
                  verbose=0)
    rows = layer.params.lookup(KEYS).numpy()
    want = dense_layer.get_weights()[0]
    kernel = model.layers[-1].get_weights()[0]
    want_kernel = reference.layers[-1].get_weights()[0]
    return (float(np.abs(rows - want).max()), float(np.abs(kernel - want_kernel).max()),
            float(np.abs(rows - start).max()))


if __name__ == "__main__":  # under TF_USE_LEGACY_KERAS=1: the layers and optimizers of tf.keras
    result = {
        "layer_is_tf_keras": isinstance(de.keras.layers.Embedding(2, name="probe"),
                                        tf_keras.layers.Layer),
        "tf_keras_is_tf_keras": tf.keras.layers.Layer is tf_keras.layers.Layer,
        "adam": fit_difference(de.keras.layers, lambda: tf.keras.optimizers.Adam(0.1)),
        "sgd": fit_difference(de.keras.layers,
                              lambda: tf.keras.optimizers.SGD(0.1, momentum=0.5)),
    }
    print("RESULT " + json.dumps(result))
    sys.exit(0)

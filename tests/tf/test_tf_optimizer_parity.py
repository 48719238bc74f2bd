"""Parity of dynamic embeddings with a dense keras.layers.Embedding, for every optimizer that
DynamicEmbeddingOptimizer wraps (Keras 3, model.fit's train function on the TF backend).

Both models start from the same rows and the same Dense weights; every batch holds every
preloaded id, with duplicates, so the dense update of the whole matrix and the sparse update of
the batch's rows coincide. After 10 steps the losses and the rows must agree to float32
tolerance, and a preloaded row that never occurs in a batch is left untouched by dualemb.

The dense reference gets the embedding's gradient as a dense tensor (duplicates summed), i.e. it
trains a dense variable on its true gradient. Fed the IndexedSlices of ``ops.take`` directly, Keras
applies nonlinear optimizer math per occurrence (Adam's second moment gets the sum of the squared
per-occurrence gradients instead of the square of their sum); dualemb sums duplicates first.
"""

import keras
import numpy as np
import pytest

import dualemb.tf as de
from dense_reference import dense_reference

DIM = 4
KEYS = np.array([3, 10, 42, 7, 2**40 + 5, -9], np.int64)  # preloaded and in every batch
UNUSED_KEY = np.int64(123456)                              # preloaded, never in a batch
STEPS = 10
BATCH = 4
WIDTH = 3

OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.05),
    "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "sgd_nesterov": lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adam_amsgrad": lambda: keras.optimizers.Adam(0.01, amsgrad=True),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "adamax": lambda: keras.optimizers.Adamax(0.01),
    "nadam": lambda: keras.optimizers.Nadam(0.01),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
    "rmsprop_centered_momentum": lambda: keras.optimizers.RMSprop(0.01, momentum=0.5,
                                                                  centered=True),
    "ftrl": lambda: keras.optimizers.Ftrl(0.1, l1_regularization_strength=0.001,
                                          l2_regularization_strength=0.01),
    "adadelta": lambda: keras.optimizers.Adadelta(1.0),
    "lion": lambda: keras.optimizers.Lion(0.001),
    "adam_schedule": lambda: keras.optimizers.Adam(
        keras.optimizers.schedules.ExponentialDecay(0.02, decay_steps=3, decay_rate=0.5)),
    "sgd_clipnorm": lambda: keras.optimizers.SGD(0.05, clipnorm=0.1),
    "adam_clipvalue": lambda: keras.optimizers.Adam(0.01, clipvalue=0.01),
    "sgd_weight_decay": lambda: keras.optimizers.SGD(0.05, weight_decay=0.1),
    "adagrad_weight_decay": lambda: keras.optimizers.Adagrad(0.1, weight_decay=0.1),
    "adam_weight_decay": lambda: keras.optimizers.Adam(0.01, weight_decay=0.1),
    "rmsprop_weight_decay": lambda: keras.optimizers.RMSprop(0.01, weight_decay=0.1),
    "adam_global_clipnorm": lambda: keras.optimizers.Adam(0.01, global_clipnorm=0.05),
    "sgd_loss_scale": lambda: keras.optimizers.SGD(0.05, loss_scale_factor=64.0),
    "ftrl_shrinkage_beta": lambda: keras.optimizers.Ftrl(
        0.1, l2_shrinkage_regularization_strength=0.01, beta=0.5, learning_rate_power=-0.7),
    "lion_weight_decay": lambda: keras.optimizers.Lion(0.001, weight_decay=0.5),
}


def _batches(rng):
    """STEPS batches of [BATCH, WIDTH] ids holding every key of KEYS, with duplicates."""
    out = []
    for _ in range(STEPS):
        ids = np.concatenate([KEYS, rng.choice(KEYS, BATCH * WIDTH - len(KEYS))])
        rng.shuffle(ids)
        out.append(ids.reshape(BATCH, WIDTH))
    return out


def _models(optimizer_fn, rows, unused_row, kernel, bias):
    index = {int(k): i for i, k in enumerate(KEYS)}
    index[int(UNUSED_KEY)] = len(KEYS)

    dense_in = keras.Input((WIDTH,), dtype="int64")
    dense_emb = keras.layers.Embedding(len(KEYS) + 1, DIM)
    x = keras.layers.Flatten()(dense_emb(dense_in))
    head = keras.layers.Dense(1)
    dense = keras.Model(dense_in, head(x))
    dense_emb.embeddings.assign(np.concatenate([rows, unused_row[None]]))
    head.kernel.assign(kernel)
    head.bias.assign(bias)
    dense.compile(dense_reference(optimizer_fn()), "mse")

    de_in = keras.Input((WIDTH,), dtype="int64")
    de_emb = de.keras.layers.Embedding(DIM, name="parity_emb")
    y = keras.layers.Flatten()(de_emb(de_in))
    de_head = keras.layers.Dense(1)
    dyn = keras.Model(de_in, de_head(y))
    de_emb.params.upsert(np.concatenate([KEYS, [UNUSED_KEY]]),
                         np.concatenate([rows, unused_row[None]]))
    de_head.kernel.assign(kernel)
    de_head.bias.assign(bias)
    dyn.compile(de.DynamicEmbeddingOptimizer(optimizer_fn()), "mse")
    to_index = np.vectorize(index.__getitem__)
    return dense, dyn, de_emb, dense_emb, to_index


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_parity_with_dense_embedding(name):
    rng = np.random.default_rng(7)
    rows = rng.normal(0, 0.5, (len(KEYS), DIM)).astype(np.float32)
    unused_row = rng.normal(0, 0.5, DIM).astype(np.float32)
    kernel = rng.normal(0, 0.5, (WIDTH * DIM, 1)).astype(np.float32)
    bias = np.zeros(1, np.float32)
    dense, dyn, de_emb, dense_emb, to_index = _models(OPTIMIZERS[name], rows, unused_row,
                                                      kernel, bias)
    for ids in _batches(rng):
        target = rng.normal(0, 1, (BATCH, 1)).astype(np.float32)
        loss_dense = dense.train_on_batch(to_index(ids), target)
        loss_de = dyn.train_on_batch(ids, target)
        np.testing.assert_allclose(loss_de, loss_dense, rtol=2e-5, atol=1e-6, err_msg=name)

    trained = dense_emb.embeddings.numpy()
    got = de_emb.params.lookup(KEYS).numpy()
    np.testing.assert_allclose(got, trained[:len(KEYS)], rtol=2e-5, atol=2e-6, err_msg=name)
    np.testing.assert_allclose(dyn.layers[-1].kernel.numpy(), dense.layers[-1].kernel.numpy(),
                               rtol=2e-5, atol=2e-6)
    # The unused row is untouched (and was never re-inserted or given slots by a lookup).
    np.testing.assert_array_equal(de_emb.params.lookup([UNUSED_KEY]).numpy()[0], unused_row)
    assert int(de_emb.params.size()) == len(KEYS) + 1
    assert dyn.optimizer.iterations.numpy() == STEPS


def test_fit_matches_train_on_batch_and_dense():
    """model.fit over 10 batches (one epoch, no shuffle) gives the same rows as the dense model."""
    rng = np.random.default_rng(3)
    rows = rng.normal(0, 0.5, (len(KEYS), DIM)).astype(np.float32)
    unused_row = rng.normal(0, 0.5, DIM).astype(np.float32)
    kernel = rng.normal(0, 0.5, (WIDTH * DIM, 1)).astype(np.float32)
    dense, dyn, de_emb, dense_emb, to_index = _models(lambda: keras.optimizers.Adam(0.01), rows,
                                                      unused_row, kernel, np.zeros(1, np.float32))
    ids = np.concatenate(_batches(rng))
    target = rng.normal(0, 1, (len(ids), 1)).astype(np.float32)
    h_dense = dense.fit(to_index(ids), target, batch_size=BATCH, shuffle=False, verbose=0)
    h_de = dyn.fit(ids, target, batch_size=BATCH, shuffle=False, verbose=0)
    np.testing.assert_allclose(h_de.history["loss"], h_dense.history["loss"], rtol=2e-5)
    np.testing.assert_allclose(de_emb.params.lookup(KEYS).numpy(),
                               dense_emb.embeddings.numpy()[:len(KEYS)], rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(dyn.evaluate(ids, target, verbose=0),
                               dense.evaluate(to_index(ids), target, verbose=0), rtol=2e-5)
    np.testing.assert_allclose(dyn.predict(ids, verbose=0), dense.predict(to_index(ids), verbose=0),
                               rtol=2e-5, atol=1e-6)

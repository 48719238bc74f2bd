"""The TensorFlow rows of ``bench_multi_table.py``: a Keras 3 model with one dynamic embedding
layer per feature, trained with one op per table in the optimizer step (``per_table``:
``DynamicEmbeddingOptimizer(..., multi_table=False)``) and with one multi-table op for all
(``multi_table``), by a custom ``tf.function`` step (``mode="loop"``) or by ``model.fit``
(``mode="fit"``). Imported by ``bench_multi_table.py`` only when TF rows are asked for, so that
the JAX rows run without TensorFlow."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import dualemb.tf as de  # noqa: E402

NAMES = ("per_table", "multi_table")


def versions() -> dict:
    return {"tensorflow": tf.__version__, "keras": keras.__version__}


def _model(features, dim, num_dense, hidden, tag):
    ids = keras.Input((features,), dtype="int64")
    dense = keras.Input((num_dense,), dtype="float32")
    cols = [de.keras.layers.Embedding(
        dim, name=f"bench_{tag}_{f}",
        initializer=keras.initializers.RandomNormal(stddev=0.05, seed=f + 1))(ids[:, f])
        for f in range(features)]
    x = keras.layers.Concatenate()(cols + [dense])
    for width in hidden:
        x = keras.layers.Dense(width, activation="relu")(x)
    return keras.Model([ids, dense], keras.layers.Dense(1)(x))


def bench(m, batches, steps, rounds, mode, rounds_fn, hidden, lr) -> dict:
    """{name: row, "speedup": ...} for ``mode`` "loop" or "fit" (rows as ``rounds_fn`` makes)."""
    features, dim, batch = m["features"], m["dim"], m["batch"]
    num_dense = batches[0][1].shape[1]
    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)
    state = {}
    for name in NAMES:
        model = _model(features, dim, num_dense, hidden, f"{mode}_{name}")
        opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(lr),
                                           multi_table=name == "multi_table")
        if mode == "fit":
            model.compile(opt, loss_fn)
            state[name] = model
            continue

        @tf.function
        def step(ids, dense, labels, model=model, opt=opt):
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model([ids, dense], training=True))
            variables = model.trainable_variables
            opt.apply(tape.gradient(loss, variables), variables)
            return loss

        state[name] = step
    tensors = [tuple(tf.constant(a) for a in b) for b in batches]

    def run(name, n, offset):
        if mode == "fit":  # numpy batches: concatenating them is cheap beside the fit
            picked = [batches[(offset + k) % len(batches)] for k in range(n)]
            ids, dense, labels = (np.concatenate([p[i] for p in picked]) for i in range(3))
            state[name].fit([ids, dense], labels, batch_size=batch, epochs=1, shuffle=False,
                            verbose=0)
            return
        loss = None
        for k in range(n):
            ids, dense, labels = tensors[(offset + k) % len(tensors)]
            loss = state[name](ids, dense, labels)
        loss.numpy()  # wait for the last step

    for name in NAMES:
        run(name, 2, 0)  # trace and compile
    return rounds_fn(run, list(NAMES), steps, rounds, batch)

"""The TensorFlow rows of ``bench_multi_table.py``: one dynamic embedding table per feature, the
rows concatenated with the dense features into a Keras MLP, ``DynamicEmbeddingOptimizer(Adam)``.

* ``mode="loop"``: a custom ``tf.function`` step over ``de.Variable`` s: ``per_table`` looks each
  Variable up with ``de.embedding_lookup`` and steps each table with its own op
  (``multi_table=False``); ``multi_table`` looks them all up with one
  ``de.embedding_lookup_many`` and steps them with one multi-table op.
* ``mode="fit"``: ``model.fit`` of a model with one ``de.keras.layers.Embedding`` per feature
  (lookups one op per layer in both rows), the optimizer's step per table or in one op.

Imported by ``bench_multi_table.py`` only when TF rows are asked for, so that the JAX rows run
without TensorFlow."""

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


def _initializer(f):
    return keras.initializers.RandomNormal(stddev=0.05, seed=f + 1)


def _mlp(num_inputs, hidden):
    x = inputs = keras.Input((num_inputs,), dtype="float32")
    for width in hidden:
        x = keras.layers.Dense(width, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(1)(x))


def _layer_model(features, dim, num_dense, hidden, tag):
    ids = keras.Input((features,), dtype="int64")
    dense = keras.Input((num_dense,), dtype="float32")
    cols = [de.keras.layers.Embedding(dim, name=f"bench_{tag}_{f}",
                                      initializer=_initializer(f))(ids[:, f])
            for f in range(features)]
    x = keras.layers.Concatenate()(cols + [dense])
    return keras.Model([ids, dense], _mlp(features * dim + num_dense, hidden)(x))


def _loop_step(features, dim, num_dense, hidden, tag, multi, opt, loss_fn):
    """A tf.function training step over ``features`` Variables and a dense MLP."""
    variables = [de.Variable(dim=dim, name=f"bench_{tag}_{f}", initializer=_initializer(f))
                 for f in range(features)]
    mlp = _mlp(features * dim + num_dense, hidden)

    @tf.function(autograph=False)
    def step(ids, dense, labels):
        cols = tf.unstack(ids, axis=1)
        with tf.GradientTape() as tape:
            if multi:
                looked = de.embedding_lookup_many(variables, cols, return_trainable=True)
            else:
                looked = [de.embedding_lookup(v, c, return_trainable=True)
                          for v, c in zip(variables, cols)]
            x = tf.concat([r for r, _ in looked] + [dense], axis=1)
            loss = loss_fn(labels, mlp(x, training=True))
        train = [w for _, w in looked] + mlp.trainable_variables
        opt.apply(tape.gradient(loss, train), train)
        return loss

    step.variables_ = variables  # keeps the tables alive with the step
    return step


def _dense_floor(m, batches, steps, rounds, rounds_fn, hidden, lr, loss_fn) -> dict:
    """The TF step's floor: the MLP and its Adam on a fixed rows input, no tables."""
    features, dim, batch = m["features"], m["dim"], m["batch"]
    num_dense = batches[0][1].shape[1]
    mlp = _mlp(features * dim + num_dense, hidden)
    opt = keras.optimizers.Adam(lr)
    rows = tf.constant(np.random.default_rng(1).standard_normal((batch, features * dim)),
                       tf.float32)

    @tf.function(autograph=False)
    def step(dense, labels):
        with tf.GradientTape() as tape:
            x = tf.concat([rows, dense], axis=1)
            loss = loss_fn(labels, mlp(x, training=True))
        opt.apply(tape.gradient(loss, mlp.trainable_variables), mlp.trainable_variables)
        return loss

    tensors = [(tf.constant(d), tf.constant(y)) for _, d, y in batches]

    def run(name, n, offset):
        loss = None
        for k in range(n):
            loss = step(*tensors[(offset + k) % len(tensors)])
        loss.numpy()

    run("dense", 2, 0)  # trace
    return rounds_fn(run, ["dense"], steps, rounds, batch)


def bench(m, batches, steps, rounds, mode, rounds_fn, hidden, lr) -> dict:
    """{name: row, "speedup": ...} for ``mode`` "loop" or "fit" (rows as ``rounds_fn`` makes);
    mode "dense": the floor without tables ({"dense": row})."""
    features, dim, batch = m["features"], m["dim"], m["batch"]
    num_dense = batches[0][1].shape[1]
    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)
    if mode == "dense":
        return _dense_floor(m, batches, steps, rounds, rounds_fn, hidden, lr, loss_fn)
    state = {}
    for name in NAMES:
        multi = name == "multi_table"
        opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(lr), multi_table=multi)
        if mode == "fit":
            model = _layer_model(features, dim, num_dense, hidden, f"fit_{name}")
            model.compile(opt, loss_fn)
            state[name] = model
        else:
            state[name] = _loop_step(features, dim, num_dense, hidden, f"loop_{name}", multi,
                                     opt, loss_fn)
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

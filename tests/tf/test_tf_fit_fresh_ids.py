"""Keras ``fit`` over fresh ids keeps every id (issue 24, item 6: "one id missing after fit").

The loop of the report: a functional model Embedding -> Dense(8, relu) -> pooling -> Dense(1),
Adagrad, fits of 10 x i new ids for i = 1..9, on fresh tables. After every fit the Variable's
``size()`` and its exported keys must be exactly the ids fed (450 after the 9 fits; 280 after 7,
the count of the report), and so must the keys of the optimizer's slot view: TFRA's slot tables
hold every key the optimizer stepped. What the report saw (279 of 280) was the slot view
leaving out an id whose embedding row met only dead ReLUs (all 8 pre-activations <= 0): its
gradient was exactly zero at every step, so its Adagrad accumulator never moved, and the view
then listed only rows whose slots differ from the initial slots. The core now marks stepped rows
(tests/tf/test_tf_slot_view_stepped.py builds such a row on purpose; tools/stress_fit_fresh_ids.py
repeats this loop many times). The test also checks that an id whose row never moved keeps
Adagrad's initial accumulator 0.1 (reference: its initial row, drawn by the same seeded
initializer in a second Variable where it is absent).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import dualemb.tf as de  # noqa: E402


def fits_over_fresh_ids(seq: int, batch: int, dim: int, seed: int, name: str):
    """The report's loop: yields (fit number, the Embedding layer, the ids fed so far) after each
    of the 9 fits (also run many times by tools/stress_fit_fresh_ids.py)."""
    init = keras.initializers.RandomNormal(stddev=0.5, seed=seed)
    layer = de.keras.layers.Embedding(dim, initializer=init, name=name)
    inputs = keras.Input((seq,), dtype="int64")
    hidden = keras.layers.Dense(8, activation="relu")(layer(inputs))
    pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    model = keras.Model(inputs, keras.layers.Dense(1)(pooled))
    model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.Adagrad(0.05)), "mse")
    rng = np.random.default_rng([seed, seq])
    fed, next_id = set(), int(rng.integers(0, 1 << 40))
    for i in range(1, 10):
        ids = np.arange(next_id, next_id + 10 * i, dtype=np.int64)
        next_id += 10 * i
        x = ids[:len(ids) // seq * seq].reshape(-1, seq)  # the batch boundary falls mid-fit
        fed.update(x.ravel().tolist())
        model.fit(x, rng.normal(size=(len(x), 1)).astype("float32"), batch_size=batch,
                  epochs=1, shuffle=True, verbose=0)
        yield i, layer, fed


@pytest.mark.timeout(900)
@pytest.mark.parametrize("seq, batch, dim", [(1, 32, 4), (5, 16, 16)])
def test_fit_over_fresh_ids_keeps_every_id(seq, batch, dim):
    for i, layer, fed in fits_over_fresh_ids(seq, batch, dim, 11, f"fresh_{seq}_{dim}"):
        keys = layer.params.export()[0].numpy()
        assert int(layer.params.size()) == len(fed), f"fit {i}"
        assert len(keys) == len(set(keys.tolist())) and set(keys.tolist()) == fed, f"fit {i}"

    init = keras.initializers.RandomNormal(stddev=0.5, seed=11)
    keys = np.array(sorted(fed), np.int64)
    rows = layer.params.lookup(keys).numpy()
    fresh = de.Variable(dim=dim, initializer=init, name=f"fresh_{seq}_{dim}_initial")
    initial = fresh.lookup(keys).numpy()  # absent there: the initializer's rows of these keys
    unmoved = {int(k) for k, r, r0 in zip(keys, rows, initial) if np.array_equal(r, r0)}
    accumulator = layer.params.get_slot_variables()[0]
    shown = accumulator.export()[0].numpy().tolist()
    assert len(shown) == len(set(shown)) and set(shown) == fed  # every stepped id, once
    assert int(accumulator.size()) == len(fed)
    if unmoved:  # a row that never moved had only zero gradients: its accumulator is initial
        np.testing.assert_array_equal(
            accumulator.lookup(tf.constant(sorted(unmoved), tf.int64)).numpy(),
            np.full([len(unmoved), dim], np.float32(0.1)))

"""A Keras model's optimizer step updates its embedding tables with one multi-table op
(``dualemb/tf/optimizers/multi_table.py``), with the same tables bit for bit as one op per table.

The model: three ``de.keras.layers.Embedding`` layers (one of them sharded over two tables, one
with weight decay off where the others decay, so their fused optimizers differ) over the columns
of one int64 input, concatenated into a Dense head, trained by ``fit`` with a wrapped Adam. It is
trained twice from the same start, grouping on and off (``multi_table=False``, and the
``DUALEMB_TF_MULTI_TABLE=0`` switch); every table's rows, slots, stepped flags, update counts and
the dense head must be equal bit for bit, and the tables must have moved from their initial rows.
A spy on ``ops.apply_gradients_many`` shows which path each run traced. (Bad input in one table:
tests/tf/test_tf_multi_table_ops.py.)
"""

import keras
import numpy as np
import tensorflow as tf

import dualemb.tf as de
from dualemb.tf import ops
from dualemb.tf.optimizers import multi_table

DIMS = (4, 4, 6)
BATCH = 8
STEPS = 3


def _model(tag):
    inputs = keras.Input((len(DIMS),), dtype="int64")
    layers = [de.keras.layers.Embedding(
        dim, name=f"mt_{tag}_{i}", devices=["/CPU:0", "/CPU:0"] if i == 1 else None,
        initializer=keras.initializers.RandomNormal(stddev=0.3, seed=i + 1))
        for i, dim in enumerate(DIMS)]
    cols = [layer(inputs[:, i]) for i, layer in enumerate(layers)]
    head = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed=5))
    model = keras.Model(inputs, head(keras.layers.Concatenate()(cols)))
    return model, layers, head


def _data():
    rng = np.random.default_rng(2)
    x = rng.integers(0, 30, size=(BATCH * STEPS, len(DIMS))).astype(np.int64)
    x[:, 1] += 1 << 40  # ids beyond int32
    y = rng.normal(size=(len(x), 1)).astype(np.float32)
    return x, y


def _tables(variables):
    """Per shard of every Variable: its rows, slots and metadata sorted by key (numpy)."""
    out = []
    for params in variables:
        for shard in params.router.shards:
            e = ops.export_table(shard.resource, params.key_dtype, params.dim)
            e = {k: v.numpy() for k, v in e.items()}
            order = np.argsort(e["keys"])
            out.append({k: v[order] for k, v in e.items()})
    return out


def _train(tag, monkeypatch, multi=True):
    calls = []
    real = ops.apply_gradients_many

    def spy(tables, *args, **kwargs):
        calls.append(len(tables))
        return real(tables, *args, **kwargs)

    monkeypatch.setattr(ops, "apply_gradients_many", spy)
    model, layers, head = _model(tag)
    adam = keras.optimizers.AdamW(0.02, weight_decay=0.01)
    adam.exclude_from_weight_decay(var_names=[f"mt_{tag}_2"])
    model.compile(de.DynamicEmbeddingOptimizer(adam, multi_table=multi), "mse")
    x, y = _data()
    initial = _tables([layer.params for layer in layers])
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    monkeypatch.setattr(ops, "apply_gradients_many", real)
    return _tables([layer.params for layer in layers]), initial, head.get_weights(), calls


def _assert_equal(a, b):
    assert len(a) == len(b) == 4  # 3 layers, one of them over 2 tables
    for ta, tb in zip(a, b):
        assert ta.keys() == tb.keys()
        for k in ta:
            np.testing.assert_array_equal(ta[k], tb[k], err_msg=k)


def test_fit_gives_the_same_tables_with_and_without_multi_table_ops(monkeypatch):
    grouped, initial, head_g, calls_g = _train("on", monkeypatch)
    single, _, head_s, calls_s = _train("off", monkeypatch, multi=False)
    # Every trace of the step (Keras may trace it more than once) put all 4 tables in one op.
    assert calls_g and set(calls_g) == {4} and calls_s == []
    _assert_equal(grouped, single)
    for w, v in zip(head_g, head_s):
        np.testing.assert_array_equal(w, v)
    # Training moved the tables: rows and slots exist and differ from a fresh table's rows.
    assert all(len(t["keys"]) > 0 and t["stepped"].all() for t in grouped)
    assert not any(np.array_equal(g["values"], i["values"]) for g, i in zip(grouped, initial)
                   if len(i["keys"]))


def test_environment_switch_turns_grouping_off(monkeypatch):
    monkeypatch.setenv(multi_table.ENV_SWITCH, "0")
    off, _, _, calls = _train("env", monkeypatch)
    assert calls == []
    monkeypatch.delenv(multi_table.ENV_SWITCH)
    grouped, _, _, calls = _train("env_on", monkeypatch)
    assert calls and set(calls) == {4}
    _assert_equal(off, grouped)



def _train_tf1(monkeypatch, grouping):
    """Two Variables trained by a wrapped ``tf.compat.v1.train.AdamOptimizer`` in a
    ``tf.function`` loop (the tf_keras / TF1 wrapper groups tables the same way); only the
    environment switch turns grouping off there. Returns (tables, apply_gradients_many calls)."""
    monkeypatch.setenv(multi_table.ENV_SWITCH, "1" if grouping else "0")
    calls = []
    real = ops.apply_gradients_many
    monkeypatch.setattr(ops, "apply_gradients_many",
                        lambda tables, *a, **k: calls.append(len(tables)) or real(tables, *a, **k))
    variables = [de.Variable(dim=3, name=f"mt_tf1_{grouping}_{i}",
                             initializer=keras.initializers.RandomNormal(stddev=0.5, seed=i))
                 for i in range(2)]
    optimizer = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.05))

    @tf.function(autograph=False)  # converting dualemb's Python costs seconds a trace
    def step(ids):
        with tf.GradientTape() as tape:
            looked = [de.embedding_lookup(v, ids + i, return_trainable=True)
                      for i, v in enumerate(variables)]
            loss = tf.add_n([tf.reduce_sum(tf.sin(rows)) for rows, _ in looked])
        anchors = [a for _, a in looked]
        optimizer.apply_gradients(zip(tape.gradient(loss, anchors), anchors))

    for ids in ([1, 2, 2, 5], [5, 9, 1, 1], [2, 2, 2, 7]):
        step(tf.constant(ids, tf.int64))
    monkeypatch.setattr(ops, "apply_gradients_many", real)
    return _tables(variables), calls


def test_tf1_optimizer_groups_tables_with_the_same_result(monkeypatch):
    grouped, calls_g = _train_tf1(monkeypatch, True)
    single, calls_s = _train_tf1(monkeypatch, False)
    assert calls_g and set(calls_g) == {2} and calls_s == []
    assert len(grouped) == len(single) == 2
    for ta, tb in zip(grouped, single):
        assert len(ta["keys"]) == 5 and ta["stepped"].all()  # ids {1, 2, 5, 7, 9} (+ i)
        for k in ta:
            np.testing.assert_array_equal(ta[k], tb[k], err_msg=k)

"""Keras habits that copy weights with get_weights/set_weights include the tables: a model put
back with set_weights predicts exactly as it did, and EarlyStopping(restore_best_weights=True)
restores the tables of the best epoch along with the dense weights."""

import keras
import numpy as np
import pytest

import dualemb.tf as de


def _model(name, optimizer=True):
    ids = keras.Input((3,), dtype="int64")
    emb = de.keras.layers.Embedding(4, initializer=keras.initializers.RandomNormal(0, 0.1, seed=1),
                                    name=name)
    out = keras.layers.Dense(1, kernel_initializer="ones")(keras.layers.Flatten()(emb(ids)))
    model = keras.Model(ids, out)
    if optimizer:
        model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05)), "mse")
    return model, emb


def _data(seed, n=256):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 50, (n, 3)).astype(np.int64)
    return x, (x.sum(1) % 7).astype("float32")


def _table(emb):
    out = [s for s in (de_export(t) for t in emb.params.tables)]
    keys = np.concatenate([o["keys"] for o in out])
    order = np.argsort(keys)
    return {k: np.concatenate([o[k] for o in out])[order] for k in out[0]}


def de_export(shard):
    from dualemb.core import Table
    return Table.attach(shard.table_id).export()


def test_set_weights_restores_rows_slots_and_erases_new_keys():
    model, emb = _model("kw_emb")
    x, y = _data(0)
    model.fit(x[:128], y[:128], batch_size=32, epochs=1, verbose=0)
    saved = model.get_weights()
    before_pred = model.predict(x, verbose=0)
    before = _table(emb)
    x2 = x + 100  # new keys too
    model.fit(np.concatenate([x, x2]), np.concatenate([y, y]), batch_size=32, epochs=1, verbose=0)
    assert emb.params.size() > len(before["keys"])
    model.set_weights(saved)
    after = _table(emb)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    np.testing.assert_array_equal(model.predict(x, verbose=0), before_pred)


def test_set_weights_from_plain_arrays_refuses_loudly():
    model, emb = _model("kw_plain")
    x, y = _data(1)
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    before = _table(emb)
    plain = [np.array(w) for w in model.get_weights()]  # np.array drops the table copy
    with pytest.raises(ValueError, match="kw_plain"):
        model.set_weights(plain)
    after = _table(emb)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])


def test_early_stopping_restores_the_best_epochs_tables():
    model, emb = _model("kw_es")
    x, y = _data(2)
    xv, yv = _data(3, 128)
    # mode="max" on a decreasing loss makes the first epoch the best one, deterministically.
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", mode="max", patience=1,
                                         restore_best_weights=True)
    hist = model.fit(x, y, validation_data=(xv, yv), batch_size=32, epochs=5, callbacks=[stop],
                     verbose=0)
    assert len(hist.history["val_loss"]) == 2  # stopped after the second epoch
    best = hist.history["val_loss"][0]
    last = hist.history["val_loss"][1]
    assert abs(best - last) > 1e-3
    got = model.evaluate(xv, yv, batch_size=32, verbose=0)
    np.testing.assert_allclose(got, best, rtol=1e-6)

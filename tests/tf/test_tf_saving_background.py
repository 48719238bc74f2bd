"""de.save(..., blocking=False) and de.keras.callbacks.CommonFormatCheckpoint: the checkpoint
holds the model's tables (rows, slots, counts), dense weights and step as of the call while
``fit`` goes on. Reference: the tables' own exports and the weights read at that moment."""

import threading

import keras
import numpy as np
import pytest

import dualemb.tf as de
from dualemb.core import Table
from dualemb.core import checkpoint as core_ckpt
from dualemb.core.checkpoint import _write
from dualemb.tf import saving


def make_model():
    user = keras.Input((3,), dtype="int64", name="user")
    e = de.keras.layers.Embedding(4, name="user_emb", devices=["/CPU:0"] * 2,
                                  initializer=keras.initializers.RandomNormal(stddev=0.1, seed=1))
    out = keras.layers.Dense(1, name="out")(keras.layers.Flatten()(e(user)))
    model = keras.Model(user, out)
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    return model


def data(seed=0, n=64):
    rng = np.random.default_rng(seed)
    return (rng.integers(-50, 200, size=(n, 3)).astype(np.int64),
            rng.normal(size=(n, 1)).astype(np.float32))


def tables_of(model):
    out = {}
    for t in model.get_layer("user_emb").params.tables:
        e = Table.attach(t.table_id).export()
        for j, k in enumerate(e["keys"].tolist()):
            out[k] = (e["values"][j].tolist(), e["slots"][j].tolist(), int(e["update_count"][j]))
    return out


def saved_tables(path):
    ck = core_ckpt.load(path)
    (t,) = ck.tables.values()
    e = t.export()
    return {k: (e["values"][j].tolist(), e["slots"][j].tolist(), int(e["update_count"][j]))
            for j, k in enumerate(e["keys"].tolist())}, ck


def test_de_save_in_background_holds_the_state_of_the_call(tmp_path, monkeypatch):
    model = make_model()
    x, y = data()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    before = tables_of(model)
    dense = {w.path: w.numpy().copy() for w in model.weights}
    gate = threading.Event()
    real = _write._export_page
    monkeypatch.setattr(_write, "_export_page",
                        lambda t, o, n: (gate.wait(30), real(t, o, n))[1])
    h = saving.save(model, tmp_path / "ck", blocking=False)
    assert isinstance(h, core_ckpt.SaveHandle)
    x2, y2 = data(seed=1)
    model.fit(x2, y2, batch_size=16, epochs=1, verbose=0, shuffle=False)  # goes on meanwhile
    assert not h.done() and tables_of(model) != before
    gate.set()
    h.wait(60)
    got, ck = saved_tables(tmp_path / "ck")
    assert got == before and len(got) > 50
    assert set(ck.steps.values()) == {4}
    saved_dense = core_ckpt.load_dense(tmp_path / "ck")
    model_dense = {k[len("model/"):]: v for k, v in saved_dense.items() if k.startswith("model/")}
    assert "out/kernel" in model_dense
    for p, v in model_dense.items():
        np.testing.assert_array_equal(v, dense[p])
    # and it loads back into a model that then trains like the original did
    fresh = make_model()
    saving.load(fresh, tmp_path / "ck")
    assert tables_of(fresh) == before


def test_keras_callback_saves_in_background_each_n_batches(tmp_path):
    model = make_model()
    x, y = data(n=64)
    seen = {}

    class Record(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.step = 0

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1
            if self.step % 2 == 0:
                seen[self.step] = tables_of(self.model)

    cb = de.keras.callbacks.CommonFormatCheckpoint(str(tmp_path / "step-{step}"), save_freq=2,
                                                   blocking=False)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False, callbacks=[Record(), cb])
    assert cb.handle is not None and cb.handle.done()  # on_train_end waited for it
    assert sorted(seen) == [2, 4]
    for step, tables in seen.items():
        got, ck = saved_tables(tmp_path / f"step-{step}")
        assert got == tables
        assert set(ck.steps.values()) == {step}


def test_bad_callback_arguments():
    with pytest.raises(ValueError, match="save_freq"):
        de.keras.callbacks.CommonFormatCheckpoint("p", save_freq=0)
    with pytest.raises(TypeError, match="blocking"):
        de.keras.callbacks.CommonFormatCheckpoint("p", blocking=None)

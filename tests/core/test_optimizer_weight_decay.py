"""Keras 3's decoupled ``weight_decay``, a hyper-parameter of every core optimizer (flavor=keras).

Keras applies it to every optimizer the same way, before the update step
(``BaseOptimizer._apply_weight_decay``: ``w = w - w * weight_decay * lr``). A dualemb table given
``{"name": X, "flavor": "keras", "weight_decay": wd}`` must train its rows exactly as
``keras.optimizers.X(weight_decay=wd)`` trains a dense ``keras.Variable`` of the same rows, slots
included. Every trained row appears in every batch (with duplicate ids, summed by the core), so
the dense decay of the whole variable and the sparse decay of the batch's rows agree; a row
outside the batches is never decayed (the sparse semantics).
"""

from __future__ import annotations

import os
import platform

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest

from dualemb.core import Table

DIM = 7
TRAINED = np.array([3, 14, 15, 65, 92], np.int64)  # sorted: _dense_grad searches it
UNTOUCHED = np.int64(35)
STEPS = 10
LRS = [0.05, 0.1, 0.08, 0.02, 0.12, 0.07, 0.05, 0.03, 0.09, 0.04]
EXACT_ON = platform.machine().lower() in ("x86_64", "amd64")

# (id, core name, keras class, extra hyper-parameters, bit-exact): Ftrl's pow differs from TF's
# by an ulp (test_optimizers.py's docstring), so it is compared with a tolerance.
CASES = [
    ("sgd", "sgd", "SGD", {}, True),
    ("sgd-momentum", "sgd", "SGD", {"momentum": 0.9}, True),
    ("adagrad", "adagrad", "Adagrad", {}, True),
    ("rmsprop", "rmsprop", "RMSprop", {}, True),
    ("rmsprop-centered-momentum", "rmsprop", "RMSprop", {"centered": True, "momentum": 0.5},
     True),
    ("adam", "adam", "Adam", {}, True),
    ("adam-amsgrad", "adam", "Adam", {"amsgrad": True}, True),
    ("adamax", "adamax", "Adamax", {}, True),
    ("nadam", "nadam", "Nadam", {}, True),
    ("adadelta", "adadelta", "Adadelta", {}, True),
    ("lion", "lion", "Lion", {}, True),
    ("ftrl", "ftrl", "Ftrl", {}, False),
]


def _keras():
    pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the Keras references need KERAS_BACKEND=tensorflow (set before keras import)")
    return keras


def _batches(seed):
    rng = np.random.RandomState(seed)
    for _ in range(STEPS):
        ids = np.concatenate([TRAINED, rng.choice(TRAINED, 6)])
        rng.shuffle(ids)
        yield ids, (rng.randn(len(ids), DIM) * 0.5).astype(np.float32)


def _dense_grad(ids, grads):
    dense = np.zeros((len(TRAINED), DIM), np.float32)
    np.add.at(dense, np.searchsorted(TRAINED, ids), grads)
    return dense


def _rows_and_slots(table, keys):
    out = table.export()
    pos = {int(k): i for i, k in enumerate(out["keys"])}
    idx = np.array([pos[int(k)] for k in keys])
    return out["values"][idx], out["slots"][idx]


def _same(actual, desired, exact, what):
    np.testing.assert_allclose(actual, desired, rtol=1e-5, atol=1e-6, err_msg=what)
    if exact and EXACT_ON:
        np.testing.assert_array_equal(actual.view(np.int32), np.asarray(desired).view(np.int32),
                                      err_msg=f"{what}: not bit for bit")


@pytest.mark.parametrize("wd", [0.1, 0.004])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_weight_decay_equals_keras(case, wd):
    keras = _keras()
    import tensorflow as tf

    name, core_name, cls, hyper, exact = case
    rng = np.random.RandomState(7)
    init = rng.randn(len(TRAINED) + 1, DIM).astype(np.float32)
    table = Table(dim=DIM, initializer="zeros",
                  optimizer={"name": core_name, "flavor": "keras", "weight_decay": wd, **hyper})
    try:
        table.insert_or_assign(np.append(TRAINED, UNTOUCHED), init)
        _, untouched_slots = _rows_and_slots(table, [UNTOUCHED])
        with tf.device("/CPU:0"):
            var = keras.Variable(init[:-1].copy(), dtype="float32", name="emb")
            opt = getattr(keras.optimizers, cls)(learning_rate=LRS[0], weight_decay=wd, **hyper)
            for t, (ids, grads) in enumerate(_batches(len(name))):
                opt.learning_rate = LRS[t]
                opt.apply_gradients([(_dense_grad(ids, grads), var)])
                table.apply_gradients(ids, grads, lr=LRS[t], step=t + 1)
                rows, slots = _rows_and_slots(table, TRAINED)
                _same(rows, np.asarray(var), exact, f"{name} rows after step {t + 1}")
                ref = {v.name[len("emb_"):]: np.asarray(v) for v in opt.variables
                       if v.name.startswith("emb_")}
                assert table.slot_names == list(ref)
                for s, slot in enumerate(table.slot_names):
                    if name == "ftrl" and slot == "linear":
                        np.testing.assert_allclose(slots[:, s], ref[slot],
                                                   atol=1e-5 * float(np.abs(ref[slot]).max()))
                    else:
                        _same(slots[:, s], ref[slot], exact, f"{name} slot {slot} step {t + 1}")
        rows, slots = _rows_and_slots(table, [UNTOUCHED])
        assert np.array_equal(rows[0].view(np.int32), init[-1].view(np.int32))
        assert np.array_equal(slots.view(np.int32), untouched_slots.view(np.int32))
    finally:
        table.destroy()


def test_weight_decay_changes_the_result():
    """The decay is really applied: the same training without it ends elsewhere."""
    ends = []
    for hyper in ({}, {"weight_decay": 0.5}):
        t = Table(dim=DIM, initializer={"initializer": "constant", "value": 1.0},
                  optimizer={"name": "adagrad", "flavor": "keras", **hyper})
        try:
            t.apply_gradients(TRAINED, np.ones((len(TRAINED), DIM), np.float32), lr=0.1, step=1)
            ends.append(t.find(TRAINED)[0])
        finally:
            t.destroy()
    # adagrad from w = 1, a = 0.1 + 1: w - 0.1/sqrt(1.1 + 1e-7); decayed first: w = 1 - 0.05.
    expected = np.float32(1.0) - np.float32(0.1) / np.sqrt(np.float32(1.1) + np.float32(1e-7))
    np.testing.assert_allclose(ends[0], expected, rtol=1e-6)
    np.testing.assert_allclose(ends[1] - ends[0], -0.05, rtol=1e-5)


def test_weight_decay_described_only_when_given():
    t = Table(dim=2, optimizer={"name": "sgd", "flavor": "keras"})
    try:
        assert "weight_decay" not in t.describe()[1]
    finally:
        t.destroy()
    t = Table(dim=2, optimizer={"name": "sgd", "flavor": "keras", "weight_decay": 0.25})
    try:
        spec = t.describe()[1]
        assert spec["weight_decay"] == 0.25
        again = Table(dim=2, optimizer=spec)
        try:
            assert again.describe()[1] == spec
        finally:
            again.destroy()
    finally:
        t.destroy()


@pytest.mark.parametrize("spec", [
    {"name": "sgd", "flavor": "keras", "weight_decay": -0.1},
    {"name": "lion", "flavor": "keras", "weight_decay": "x"},
    # Optax flavors keep optax's own definitions: weight_decay only where optax has it.
    {"name": "sgd", "flavor": "optax", "weight_decay": 0.1},
    {"name": "adam", "flavor": "optax", "weight_decay": 0.1},
])
def test_bad_or_foreign_weight_decay_is_refused(spec):
    with pytest.raises(ValueError, match="weight_decay"):
        Table(dim=2, optimizer=spec)

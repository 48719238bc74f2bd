"""Saving Keras 3 models with dynamic-embedding layers: ``model.save_weights`` /
``load_weights`` (.weights.h5), ``model.save`` + ``keras.models.load_model`` (.keras),
``tf.train.Checkpoint`` of model and optimizer, ``de.save`` / ``de.load`` (common format), and
SavedModel export served from a fresh Python process.

Each test trains a model with two DE layers (2 shards and 1 shard) and dense layers under
``DynamicEmbeddingOptimizer(Adam)``, so tables hold trained rows and non-trivial Adam slots, then
checks the exact table contents (keys -> rows, slots, update counts), the dense weights and the
optimizer's iteration count after a restore into a model whose state was scrambled or that is
brand new. A restore that merged instead of replacing, lost slots or the step, would fail; so
would continuing training diverge if the slots were wrong.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import dualemb.tf as de
from dualemb.core import Table
from dualemb.core import checkpoint as core_ckpt
from dualemb.tf import saving
from dualemb.tf.trainable import is_trainable_wrapper
import _paths

ROOT = str(_paths.ROOT)
LAYERS = {"Embedding": de.keras.layers.Embedding,
          "SquashedEmbedding": de.keras.layers.SquashedEmbedding}


def _layers_registered():
    return keras.saving.get_registered_name(de.keras.layers.Embedding) != "Embedding"


def make_model(shards=(2, 1), user_dim=4, lr=0.01):
    user = keras.Input((3,), dtype="int64", name="user")
    item = keras.Input((2,), dtype="int64", name="item")
    e1 = de.keras.layers.Embedding(
        user_dim, name="user_emb", devices=["/CPU:0"] * shards[0],
        initializer=keras.initializers.RandomNormal(stddev=0.1, seed=1))
    e2 = de.keras.layers.SquashedEmbedding(
        3, name="item_emb", devices=["/CPU:0"] * shards[1], combiner="mean",
        initializer=keras.initializers.RandomUniform(-0.1, 0.1, seed=2))
    x = keras.layers.Concatenate()([keras.layers.Flatten()(e1(user)), e2(item)])
    x = keras.layers.Dense(8, activation="relu", name="hidden")(x)
    out = keras.layers.Dense(1, name="out")(x)
    model = keras.Model({"user": user, "item": item}, out)
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(lr)), loss="mse")
    return model


def data(seed=0, n=64):
    rng = np.random.default_rng(seed)
    x = {"user": rng.integers(-50, 200, size=(n, 3)).astype(np.int64),
         "item": rng.integers(0, 80, size=(n, 2)).astype(np.int64)}
    y = rng.normal(size=(n, 1)).astype(np.float32)
    return x, y


def trained_model(**kwargs):
    model = make_model(**kwargs)
    x, y = data()
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
    return model


def de_vars(model):
    return {name: model.get_layer(name).params for name in ("user_emb", "item_emb")}


def table_contents(var, with_shard=False):
    out = {}
    for i, t in enumerate(var.tables):
        e = Table.attach(t.table_id).export()
        for j, k in enumerate(e["keys"].tolist()):
            row = (e["values"][j].tolist(), e["slots"][j].tolist(), int(e["update_count"][j]))
            out[k] = row + ((i,) if with_shard else ())
    return out


def state(model):
    """Everything a restore must bring back."""
    return {
        "tables": {n: table_contents(v) for n, v in de_vars(model).items()},
        "dense": {w.path: w.numpy().tolist() for w in model.weights},
        "iterations": int(model.optimizer.iterations.numpy()),
    }


def scramble(model):
    for var in de_vars(model).values():
        var.clear()
        var.upsert(tf.constant([987654321], tf.int64), tf.fill([1, var.dim], 3.0))
    for w in model.weights:
        if not is_trainable_wrapper(w):  # anchors refuse plain values (tests/tf/test_tf_keras_weights.py)
            w.assign(tf.zeros_like(w))
    model.optimizer.iterations.assign(0)


def assert_trained_state(s):
    """The snapshot is not trivial: many keys, non-zero slots, dense weights, steps."""
    assert s["iterations"] == 8
    for table in s["tables"].values():
        assert len(table) > 50
        moved = sum(any(x != 0 for x in slots[1]) for _, slots, _ in table.values())
        assert moved > 0.9 * len(table)  # Adam's second moments (a key may get zero gradient)


def continue_training(model):
    x, y = data(seed=1, n=16)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    return state(model)


# ---- Keras .weights.h5 --------------------------------------------------------------------------

def test_save_weights_round_trip(tmp_path):
    model = trained_model()
    before = state(model)
    assert_trained_state(before)
    x, _ = data()
    pred = model.predict(x, verbose=0)
    path = str(tmp_path / "model.weights.h5")
    model.save_weights(path)
    scramble(model)
    assert state(model) != before
    model.load_weights(path)
    assert state(model) == before
    np.testing.assert_array_equal(model.predict(x, verbose=0), pred)


def test_save_weights_store_layout(tmp_path):
    import h5py

    model = trained_model()
    path = str(tmp_path / "model.weights.h5")
    model.save_weights(path)
    names = []
    with h5py.File(path) as f:
        f.visit(names.append)
        group = f["layers/embedding/vars"]
        assert sorted(group) == ["0", "dualemb.0.keys", "dualemb.0.last_update", "dualemb.0.meta",
                                 "dualemb.0.slots", "dualemb.0.stepped", "dualemb.0.update_count",
                                 "dualemb.0.values"]
        n = len(table_contents(model.get_layer("user_emb").params))
        assert group["dualemb.0.stepped"].shape == (n,)  # the rows the optimizer stepped
        assert group["dualemb.0.values"].shape == (n, 4)
        assert group["dualemb.0.slots"].shape == (n, 2, 4)
        meta = json.loads(bytes(group["dualemb.0.meta"][()]).decode())
        assert meta["name"] == "user_emb-parameter" and meta["num_shards"] == 2


def test_load_weights_into_other_shard_counts(tmp_path):
    model = trained_model(shards=(2, 1))
    before = state(model)
    x, _ = data()
    pred = model.predict(x, verbose=0)
    path = str(tmp_path / "model.weights.h5")
    model.save_weights(path)
    other = make_model(shards=(3, 2))
    # As with any Keras model, a fresh optimizer must be built to receive its saved variables.
    other.optimizer.build(other.trainable_variables)
    other.load_weights(path)
    assert state(other) == before
    for var in de_vars(other).values():  # every key sits in its partitioner's shard
        c = table_contents(var, with_shard=True)
        keys = np.array(sorted(c), np.int64)
        sid = var.partition_fn(tf.constant(keys), var.shard_num).numpy()
        assert [c[k][3] for k in keys.tolist()] == sid.tolist()
    np.testing.assert_array_equal(other.predict(x, verbose=0), pred)


def test_load_weights_of_other_dim_is_refused(tmp_path):
    model = trained_model()
    path = str(tmp_path / "model.weights.h5")
    model.save_weights(path)
    other = make_model(user_dim=5)
    var = other.get_layer("user_emb").params
    var.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 5]))
    unchanged = table_contents(var)
    with pytest.raises(ValueError, match="dim mismatch"):
        other.load_weights(path)
    assert table_contents(var) == unchanged


# ---- .keras ------------------------------------------------------------------------------------

def test_keras_file_round_trip_and_training_continues(tmp_path):
    model = trained_model()
    before = state(model)
    x, _ = data()
    pred = model.predict(x, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path, custom_objects=LAYERS)
    for name, var in de_vars(loaded).items():  # new tables, not the saved model's
        assert var.tables[0].table_id != de_vars(model)[name].tables[0].table_id
    assert state(loaded) == before
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), pred)
    # The restored slots and step drive the next Adam step exactly as the original's.
    assert continue_training(loaded) == continue_training(model)


@pytest.mark.skipif(not _layers_registered(), reason="the dualemb Keras layers are not "
                    "registered with keras.saving.register_keras_serializable yet")
def test_keras_file_loads_without_custom_objects(tmp_path):
    """After `import dualemb.tf`, load_model needs no custom_objects (the layers and wrapped
    optimizers are registered with Keras)."""
    model = trained_model()
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert state(loaded) == state(model)


# ---- tf.train.Checkpoint of a Keras model ----------------------------------------------------------

def test_tf_checkpoint_of_model_and_optimizer(tmp_path):
    model = trained_model()
    before = state(model)
    ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    manager = tf.train.CheckpointManager(ckpt, str(tmp_path / "ckpts"), max_to_keep=3)
    manager.save()
    fresh = make_model(shards=(1, 3))
    status = tf.train.Checkpoint(model=fresh, optimizer=fresh.optimizer).restore(
        manager.latest_checkpoint)
    status.assert_existing_objects_matched()
    assert state(fresh) == before
    assert continue_training(fresh) == continue_training(model)
    # Scramble and restore in place.
    scramble(model)
    ckpt.restore(manager.latest_checkpoint)
    assert state(model)["tables"] == before["tables"]


# ---- the common format -------------------------------------------------------------------------

def test_de_save_load_model(tmp_path):
    model = trained_model()
    before = state(model)
    saving.save(model, tmp_path / "common")
    manifest = core_ckpt.read_manifest(tmp_path / "common")
    assert sorted(t["name"] for t in manifest["tables"]) == ["item_emb-parameter",
                                                            "user_emb-parameter"]
    assert {t["step"] for t in manifest["tables"]} == {8}
    dense = core_ckpt.load_dense(tmp_path / "common")
    assert any(k.startswith("optimizer/") for k in dense)
    fresh = make_model(shards=(3, 1))
    saving.load(fresh, tmp_path / "common")
    assert state(fresh) == before
    assert continue_training(fresh) == continue_training(model)


def test_find_variables_of_model_layer_and_module():
    model = make_model()
    found = saving.find_variables(model)
    assert sorted(found) == ["item_emb-parameter", "user_emb-parameter"]
    assert saving.find_variables(model.get_layer("user_emb")) == {
        "user_emb-parameter": model.get_layer("user_emb").params}
    module = tf.Module()
    module.m = model
    assert sorted(saving.find_variables(module)) == sorted(found)


# ---- SavedModel, served from a fresh process -------------------------------------------------------

_SERVE = r"""
import sys, numpy as np, tensorflow as tf
import dualemb.tf  # registers the dualemb ops
path, inputs, out = sys.argv[1:4]
x = dict(np.load(inputs))
loaded = tf.saved_model.load(path)
res = {}
if hasattr(loaded, "predict"):
    res["pred"] = loaded.predict(tf.constant(x["user"]), tf.constant(x["item"])).numpy()
    res["user_rows"] = loaded.user_rows(tf.constant(x["user"])).numpy()
    res["sig"] = list(loaded.signatures["serving_default"](
        user=tf.constant(x["user"]), item=tf.constant(x["item"])).values())[0].numpy()
else:
    res["pred"] = loaded.serve({"user": tf.constant(x["user"]), "item": tf.constant(x["item"])}).numpy()
np.savez(out, **res)
"""


def serve_in_fresh_process(tmp_path, path, x):
    np.savez(tmp_path / "inputs.npz", **x)
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    out = tmp_path / "served.npz"
    r = subprocess.run([sys.executable, "-c", _SERVE, str(path), str(tmp_path / "inputs.npz"),
                        str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    return dict(np.load(out))


@pytest.fixture
def train_then_infer():
    """Trains a model, then switches dualemb to inference mode (restored afterwards)."""
    model = trained_model()
    de.enable_inference_mode()
    yield model
    de.enable_train_mode()


def test_saved_model_serves_in_fresh_process(tmp_path, train_then_infer):
    model = train_then_infer
    x, _ = data(seed=3, n=32)
    x["user"][:, 0] = np.array(sorted(table_contents(de_vars(model)["user_emb"])))[:32]
    emb = model.get_layer("user_emb")

    module = tf.Module()
    module.model = model

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int64),
                                  tf.TensorSpec([None, 2], tf.int64)])
    def predict(user, item):
        return model({"user": user, "item": item}, training=False)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int64)])
    def user_rows(user):
        return emb(user)

    module.predict, module.user_rows = predict, user_rows
    path = tmp_path / "saved_model"
    tf.saved_model.save(module, str(path), signatures={"serving_default": predict})

    # The SavedModel's checkpoint carries the rows, slots and metadata.
    shapes = dict(tf.train.list_variables(str(path / "variables" / "variables")))
    n_user = len(table_contents(emb.params))
    slot_shapes = sorted(v for k, v in shapes.items() if k.endswith("/slots"))
    assert slot_shapes == sorted([[n_user, 2, 4],
                                  [len(table_contents(de_vars(model)["item_emb"])), 2, 3]])

    served = serve_in_fresh_process(tmp_path, path, x)
    pred = predict(tf.constant(x["user"]), tf.constant(x["item"])).numpy()
    rows = user_rows(tf.constant(x["user"])).numpy()
    np.testing.assert_array_equal(served["pred"], pred)
    np.testing.assert_array_equal(served["sig"], pred)
    np.testing.assert_array_equal(served["user_rows"], rows)
    # The trained rows were served, not the initializer's (the keys exist and have moved).
    initial = Table.attach(emb.params.tables[0].table_id).initial_values(x["user"][:, 0])
    assert not np.allclose(rows[:, 0], initial)


def test_keras_export_serves_in_fresh_process(tmp_path, train_then_infer):
    model = train_then_infer
    x, _ = data(seed=4, n=32)
    path = tmp_path / "exported"
    model.export(str(path), verbose=False)
    served = serve_in_fresh_process(tmp_path, path, x)
    np.testing.assert_array_equal(served["pred"], model.predict(x, verbose=0))

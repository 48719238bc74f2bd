"""String-keyed dynamic embeddings (``key_dtype=tf.string``) through every saving path of
docs/tf_saving.md: Keras weight files and ``.keras`` archives, ``get_weights``/``set_weights``,
SavedModel served from a fresh process, ``de.save``/``de.load`` (in another process and another
shard count) and ``save_to_file_system``/``load_from_file_system``.

The reference is a dict ``key bytes -> (row, slots, update count)`` read from the tables right
after training (before any save), and for lookups ``key bytes -> row``. Keys include the empty
string, embedded and trailing NULs, non-UTF-8 bytes and long keys, which a store that went
through C strings or text would corrupt.
"""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import dualemb.tf as de
from dualemb.core import Table
from dualemb.core.checkpoint import CheckpointError
import _paths

ROOT = str(_paths.ROOT)
VOCAB = [b"", b"a\x00", b"\x00b", "\u00e9".encode(), "\u65e5\u672c".encode(), b"\xff\xfe",
         b"url://x/" * 30] + [f"user{i}".encode() for i in range(40)]
ABSENT = [b"never", b"a", b"a\x00\x00"]  # "a" and "a\0\0" differ from the key "a\0"


def _ids(seed, n):
    rng = np.random.default_rng(seed)
    return np.array([[VOCAB[i] for i in row] for row in rng.integers(0, len(VOCAB), (n, 2))],
                    dtype=object)


def make_model(shards=2, name="str_emb", key_dtype=tf.string):
    ids = keras.Input((2,), dtype=key_dtype.name, name="ids")
    emb = de.keras.layers.Embedding(
        3, key_dtype=key_dtype, devices=["/CPU:0"] * shards, name=name,
        initializer=keras.initializers.RandomNormal(stddev=0.1, seed=1))
    out = keras.layers.Dense(1, name="out")(keras.layers.Flatten()(emb(ids)))
    model = keras.Model(ids, out)
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    return model


def fit(model, seed=0, n=64):
    y = np.random.default_rng(seed + 100).normal(size=(n, 1)).astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices((tf.constant(_ids(seed, n)), y)).batch(16)
    model.fit(ds, epochs=2, verbose=0)


def trained_model(shards=2):
    model = make_model(shards)
    fit(model)
    return model


def table_contents(var, with_shard=False):
    """key (bytes for a string variable) -> (row, slots, update count[, shard index]) over
    every shard."""
    out = {}
    for i, t in enumerate(var.tables):
        e = Table.attach(t.table_id).export()
        strings = tf.as_dtype(var.key_dtype) == tf.string
        assert (e["keys"].dtype == object) == strings
        for j, k in enumerate(e["keys"].tolist()):
            assert isinstance(k, bytes if strings else int) and k not in out
            row = (e["values"][j].tolist(), e["slots"][j].tolist(), int(e["update_count"][j]))
            out[k] = row + ((i,) if with_shard else ())
    return out


def assert_routed_like_tfra(var):
    """Each key lives in the shard tf.strings.to_hash_bucket_fast names (TFRA's partitioner)."""
    n = len(var.tables)
    for k, v in table_contents(var, with_shard=True).items():
        assert v[3] == int(tf.strings.to_hash_bucket_fast([k], n)[0]), k


def params(model):
    return model.get_layer("str_emb").params


def scramble(model):
    var = params(model)
    var.clear()
    var.upsert(tf.constant([b"junk"]), tf.fill([1, var.dim], 3.0))


def assert_trained(contents):
    # Many keys, trained by Adam (non-zero second moments), so a restore that dropped slots or
    # rows would show.
    assert len(contents) > 30
    assert sum(any(x != 0 for x in slots[1]) for _, slots, _ in contents.values()) > 25


# ---- Keras files --------------------------------------------------------------------------------

@pytest.mark.parametrize("shards_after", [2, 1, 3])
def test_save_weights_round_trip(tmp_path, shards_after):
    model = trained_model()
    before = table_contents(params(model))
    assert_trained(before)
    dense = [w.numpy() for w in model.get_layer("out").weights]
    path = str(tmp_path / "m.weights.h5")
    model.save_weights(path)
    if shards_after == 2:
        target = model
        scramble(target)
    else:
        target = make_model(shards_after)
        target.optimizer.build(target.trainable_variables)
    target.load_weights(path)
    assert table_contents(params(target)) == before
    assert_routed_like_tfra(params(target))
    for w, want in zip(target.get_layer("out").weights, dense):
        np.testing.assert_array_equal(w.numpy(), want)
    keys = VOCAB + ABSENT
    rows = params(target).lookup(tf.constant(keys, tf.string)).numpy()
    initial = Table.attach(params(target).tables[0].table_id).initial_values(keys)
    for k, row, init in zip(keys, rows, initial):
        want = before[k][0] if k in before else init
        np.testing.assert_array_equal(row, np.asarray(want, np.float32), err_msg=repr(k))


def test_keras_file_round_trip_and_predictions(tmp_path):
    model = trained_model()
    before = table_contents(params(model))
    x = tf.constant(_ids(7, 32))
    pred = model.predict(x, verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert params(loaded).key_dtype == tf.string
    assert table_contents(params(loaded)) == before
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), pred)
    # Training continues identically from the restored rows and Adam slots.
    fit(model, seed=3)
    fit(loaded, seed=3)
    assert table_contents(params(loaded)) == table_contents(params(model))


def test_load_weights_of_int_keys_into_string_layer_is_refused(tmp_path):
    ints = make_model(key_dtype=tf.int64)
    ints.fit(np.arange(32, dtype=np.int64).reshape(16, 2), np.zeros((16, 1), np.float32),
             verbose=0)
    path = str(tmp_path / "ints.weights.h5")
    ints.save_weights(path)
    model = trained_model()
    model.optimizer.build(model.trainable_variables)
    before = table_contents(params(model))
    with pytest.raises(ValueError, match="key dtype") as err:
        model.load_weights(path)
    assert "'int64'" in str(err.value) and "'string'" in str(err.value)
    assert table_contents(params(model)) == before
    # And the other way round.
    model.save_weights(str(tmp_path / "str.weights.h5"))
    ints_before = table_contents(ints.get_layer("str_emb").params)
    with pytest.raises(ValueError, match="key dtype"):
        ints.load_weights(str(tmp_path / "str.weights.h5"))
    assert table_contents(ints.get_layer("str_emb").params) == ints_before


def test_get_weights_set_weights_restores_string_tables():
    model = trained_model()
    before = table_contents(params(model))
    weights = model.get_weights()
    fit(model, seed=5)  # moves rows and adds no key outside VOCAB
    params(model).upsert(tf.constant([b"added\x00"]), tf.ones([1, 3]))
    assert table_contents(params(model)) != before
    model.set_weights(weights)
    assert table_contents(params(model)) == before


# ---- SavedModel in a fresh process --------------------------------------------------------------

_SERVE = r"""
import sys, numpy as np, tensorflow as tf
import dualemb.tf  # registers the dualemb ops
path, keys_file, out = sys.argv[1:4]
keys = tf.io.parse_tensor(tf.io.read_file(keys_file), tf.string)
loaded = tf.saved_model.load(path)
np.savez(out, rows=loaded.lookup(keys).numpy(), size=loaded.size().numpy(),
         pred=loaded.predict(tf.reshape(keys, [-1, 2])).numpy())
"""


def _write_keys(path, keys):
    # A serialized TensorProto keeps every key's exact bytes (np.save would need pickling).
    tf.io.write_file(str(path), tf.io.serialize_tensor(tf.constant(keys, tf.string)))


def _fresh_process(script, *args):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    r = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]


def test_saved_model_serves_strings_in_fresh_process(tmp_path):
    model = trained_model()
    var = params(model)
    before = table_contents(var)
    de.enable_inference_mode()
    try:
        module = tf.Module()
        module.model = model
        module.lookup = tf.function(lambda k: var.lookup(k),
                                    input_signature=[tf.TensorSpec([None], tf.string)])
        module.size = tf.function(lambda: var.size(), input_signature=[])
        module.predict = tf.function(lambda x: model(x, training=False),
                                     input_signature=[tf.TensorSpec([None, 2], tf.string)])
        tf.saved_model.save(module, str(tmp_path / "sm"))
        keys = VOCAB + ABSENT[:1]  # an even count, so they also make [n, 2] model inputs
        _write_keys(tmp_path / "keys.pb", keys)
        _fresh_process(_SERVE, tmp_path / "sm", tmp_path / "keys.pb", tmp_path / "out.npz")
        out = np.load(tmp_path / "out.npz")
        initial = Table.attach(var.tables[0].table_id).initial_values(keys)
        for k, row, init in zip(keys, out["rows"], initial):
            want = before[k][0] if k in before else init
            np.testing.assert_array_equal(row, np.asarray(want, np.float32), err_msg=repr(k))
        assert int(out["size"]) == len(before)
        x = tf.reshape(tf.constant(keys, tf.string), [-1, 2])
        np.testing.assert_array_equal(out["pred"], model(x, training=False).numpy())
    finally:
        de.enable_train_mode()


_SERVE_EXPORT = r"""
import sys, numpy as np, tensorflow as tf
import dualemb.tf  # registers the dualemb ops
path, keys_file, out = sys.argv[1:4]
keys = tf.io.parse_tensor(tf.io.read_file(keys_file), tf.string)
loaded = tf.saved_model.load(path)  # kept alive: it owns the tables the function reads
np.save(out, loaded.serve(tf.reshape(keys, [-1, 2])).numpy())
"""


def test_keras_export_serves_strings_in_fresh_process(tmp_path):
    model = trained_model()
    keys = VOCAB + ABSENT[:1]
    x = tf.reshape(tf.constant(keys, tf.string), [-1, 2])
    de.enable_inference_mode()
    try:
        model.export(str(tmp_path / "exported"), verbose=False)
        want = model(x, training=False).numpy()
    finally:
        de.enable_train_mode()
    _write_keys(tmp_path / "keys.pb", keys)
    _fresh_process(_SERVE_EXPORT, tmp_path / "exported", tmp_path / "keys.pb",
                   tmp_path / "out.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), want)


# ---- the common checkpoint format ---------------------------------------------------------------

_LOAD_COMMON = r"""
import sys, numpy as np, tensorflow as tf
import dualemb.tf as de
path, keys_file, shards, out = sys.argv[1:5]
var = de.Variable(key_dtype=tf.string, dim=3, devices=["/CPU:0"] * int(shards),
                  name="str_emb-parameter")
de.load(var, path)
keys = tf.io.parse_tensor(tf.io.read_file(keys_file), tf.string)
rows, exists = var.lookup(keys, return_exists=True)
np.savez(out, rows=rows.numpy(), exists=exists.numpy(), size=var.size().numpy())
"""


@pytest.mark.parametrize("shards_after", [1, 3])
def test_de_save_loads_in_another_process_and_shard_count(tmp_path, shards_after):
    model = trained_model()
    before = table_contents(params(model))
    de.save(model, tmp_path / "common", step=8)
    keys = VOCAB + ABSENT
    _write_keys(tmp_path / "keys.pb", keys)
    _fresh_process(_LOAD_COMMON, tmp_path / "common", tmp_path / "keys.pb", shards_after,
                   tmp_path / "out.npz")
    out = np.load(tmp_path / "out.npz")
    assert int(out["size"]) == len(before)
    for k, row, exists in zip(keys, out["rows"], out["exists"]):
        assert bool(exists) == (k in before), k
        if k in before:
            np.testing.assert_array_equal(row, np.asarray(before[k][0], np.float32))
    # In this process: into another shard count, slots and counts included, routed like TFRA.
    other = make_model(shards_after)
    de.load(other, tmp_path / "common")
    assert table_contents(params(other)) == before
    assert_routed_like_tfra(params(other))


def test_de_load_of_int_keys_into_string_variable_is_refused(tmp_path):
    ints = de.Variable(dim=3, name="v")
    ints.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 3]))
    de.save(ints, tmp_path / "ints")
    strings = de.Variable(key_dtype=tf.string, dim=3, name="v")
    strings.upsert(tf.constant([b"k\x00"]), tf.ones([1, 3]))
    with pytest.raises(CheckpointError, match="key dtype"):
        de.load(strings, tmp_path / "ints")
    assert table_contents(strings) == {b"k\x00": ([1.0] * 3, [], 1)}


@pytest.mark.parametrize("shards_after", [1, 3])
def test_file_system_round_trip(tmp_path, shards_after):
    model = trained_model()
    var = params(model)
    before = table_contents(var)
    var.save_to_file_system(str(tmp_path / "fs"))
    other = de.Variable(key_dtype=tf.string, dim=3, devices=["/CPU:0"] * shards_after,
                        name=var.name)
    other.upsert(tf.constant([b"junk"]), tf.ones([1, 3]))
    other.load_from_file_system(str(tmp_path / "fs"))
    assert table_contents(other) == before
    assert_routed_like_tfra(other)

"""de.Variable(key_dtype=tf.string): lookups, writes, export, sharding by TFRA's string
partitioner, and Keras training, against a dict reference and a dense tf.Variable."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import dualemb.tf as de

KEYS = ["a", "", "é", "x\x00y", "日本", "long" * 40]


def _as_bytes(k):
    return k.encode() if isinstance(k, str) else k


@pytest.mark.parametrize("devices", [None, ["/CPU:0", "/CPU:0"]])
def test_variable_operations_match_a_dict(devices):
    v = de.Variable(key_dtype=tf.string, dim=2, initializer=0.5, devices=devices,
                    name=f"strvar_{0 if devices is None else len(devices)}")
    keys = tf.constant(KEYS)
    np.testing.assert_array_equal(v.lookup(keys).numpy(), np.full((len(KEYS), 2), 0.5))
    assert int(v.size()) == 0  # lookups do not insert
    vals = np.arange(len(KEYS) * 2, dtype=np.float32).reshape(-1, 2)
    v.upsert(keys, vals)
    ref = {_as_bytes(k): vals[i] for i, k in enumerate(KEYS)}
    v.remove(tf.constant(["a", "never"]))
    del ref[b"a"]
    got, exists = v.lookup(keys, return_exists=True)
    for i, k in enumerate(KEYS):
        b = _as_bytes(k)
        assert bool(exists[i]) == (b in ref)
        np.testing.assert_array_equal(got[i].numpy(), ref.get(b, [0.5, 0.5]))
    ek, ev = v.export()
    assert sorted(ek.numpy().tolist()) == sorted(ref)
    for k, row in zip(ek.numpy().tolist(), ev.numpy()):
        np.testing.assert_array_equal(row, ref[k])
    assert int(v.size()) == len(ref)
    # Python str/bytes lists are keys too; integers are refused.
    np.testing.assert_array_equal(v.lookup(["é"]).numpy(), [ref["é".encode()]])
    with pytest.raises(TypeError):
        v.lookup(tf.constant([1], tf.int64))
    if devices:
        # Each key lives in the shard tf.strings.to_hash_bucket_fast names (TFRA's partitioner).
        from dualemb.tf import ops
        seen = 0
        for j, t in enumerate(v._tables):
            shard_keys = ops.export_table(t.resource, tf.string, 2)["keys"]
            want = tf.strings.to_hash_bucket_fast(shard_keys, 2).numpy()
            assert (want == j).all()
            seen += len(want)
        assert seen == len(ref)


def test_keras_embedding_trains_like_a_dense_variable():
    vocab = ["u1", "u2", "ü3", "", "u5"]
    index = {k: i for i, k in enumerate(vocab)}
    init = keras.initializers.Zeros()
    layer = de.keras.layers.Embedding(3, key_dtype=tf.string, initializer=init, name="str_emb")
    dense_table = tf.Variable(np.zeros((len(vocab), 3), np.float32))
    opt = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1))
    w = np.array([1.0, -2.0, 0.5], np.float32)
    rng = np.random.default_rng(0)
    for _ in range(5):
        batch = [vocab[i] for i in rng.integers(0, len(vocab), 8)]
        ids = tf.constant(batch)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(ids) * w)
        grads = tape.gradient(loss, layer.trainable_weights)
        opt.apply_gradients(zip(grads, layer.trainable_weights))
        # Reference: the same step on a dense table indexed by a dict.
        with tf.GradientTape() as tape:
            rows = tf.gather(dense_table, [index[k] for k in batch])
            ref_loss = tf.reduce_sum(rows * w)
        g = tape.gradient(ref_loss, dense_table)
        dense_table.assign_sub(0.1 * tf.convert_to_tensor(g))
    got = layer.params.lookup(tf.constant(vocab)).numpy()
    np.testing.assert_allclose(got, dense_table.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("shards", [1, 2])
def test_slot_lookup_of_string_keys_equals_int64_keys(shards):
    """Issue 24: SlotVariable.lookup failed on string keys (tf.argsort has no string kernel).
    Reference: an int64-keyed Variable trained with the same Adam on the same batches, key
    "id:<i>" standing for i (a constant initializer, so both start from the same rows); every
    slot row of the string Variable equals the int64 one's, absent keys get the initial slot.
    The frequency status lookup, which had the same sort, is checked the same way."""
    devices = ["/CPU:0"] * shards
    tables = {dtype: de.Variable(key_dtype=dtype, dim=3, initializer=0.25, devices=devices,
                                 name=f"slot_{dtype.name}_{shards}",
                                 restrict_policy=de.FrequencyRestrictPolicy)
              for dtype in (tf.string, tf.int64)}
    as_key = {tf.string: lambda ids: tf.constant([b"id:%d" % i for i in ids]),
              tf.int64: lambda ids: tf.constant(ids, tf.int64)}
    rng = np.random.default_rng(3)
    batches = [rng.integers(0, 12, 7).tolist() for _ in range(6)]
    weights = rng.normal(size=(7, 3)).astype(np.float32)
    for dtype, var in tables.items():
        opt = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1))
        for ids in batches:
            with tf.GradientTape() as tape:
                emb, trainable = de.embedding_lookup(var, as_key[dtype](ids), name="t",
                                                     return_trainable=True)
                loss = tf.reduce_sum(tf.square(emb) * weights)
            opt.apply_gradients(zip(tape.gradient(loss, [trainable]), [trainable]))
    queried = [[5, 99, 0], [11, 3, 42]]  # 99, 42: never trained
    flat = sum(queried, [])
    slots = {dtype: var.get_slot_variables() for dtype, var in tables.items()}
    assert [s.slot_name for s in slots[tf.string]] == ["momentum", "velocity"]
    for by_string, by_int in zip(slots[tf.string], slots[tf.int64]):
        got = by_string.lookup(tf.reshape(as_key[tf.string](flat), [2, 3])).numpy()
        want = by_int.lookup(tf.constant(queried, tf.int64)).numpy()
        assert got.shape == (2, 3, 3)
        np.testing.assert_array_equal(got, want)
        assert not np.all(want == 0)  # trained slots, not only initial ones
        np.testing.assert_array_equal(want[0, 1], np.zeros(3))  # Adam's initial slot
    status = {dtype: var.restrict_policy.status for dtype, var in tables.items()}
    np.testing.assert_array_equal(status[tf.string].lookup(as_key[tf.string](flat)).numpy(),
                                  status[tf.int64].lookup(tf.constant(flat, tf.int64)).numpy())


def test_tf_checkpoint_round_trip_across_shard_counts(tmp_path):
    v = de.Variable(key_dtype=tf.string, dim=2, initializer=0.0, name="ck_src",
                    devices=["/CPU:0", "/CPU:0"])
    keys = tf.constant(["a", "b\x00", "é"])
    vals = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    v.upsert(keys, vals)
    path = tf.train.Checkpoint(v=v).save(str(tmp_path / "ck"))
    w = de.Variable(key_dtype=tf.string, dim=2, initializer=0.0, name="ck_dst")
    tf.train.Checkpoint(v=w).restore(path)
    np.testing.assert_array_equal(w.lookup(keys).numpy(), vals.numpy())
    assert int(w.size()) == 3

    @tf.function
    def lookup(k):
        return w.lookup(k)

    np.testing.assert_array_equal(lookup(tf.constant(["é", "zz"])).numpy(), [[5, 6], [0, 0]])
    ints = de.Variable(dim=2, name="ck_int")
    with pytest.raises(tf.errors.InvalidArgumentError, match="string"):
        tf.train.Checkpoint(v=ints).restore(path).assert_consumed()
    assert int(ints.size()) == 0


def test_all_to_all_embedding_refuses_string_keys():
    # TF's collective all-to-all moves numeric tensors only; a string all-to-all layer is refused
    # when made, not at its first lookup. Two logical CPUs must be set before TF starts: a
    # subprocess, bounded in time.
    import subprocess
    import sys

    code = """
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import dualemb.tf as de
with tf.distribute.MirroredStrategy(["/CPU:0", "/CPU:1"]).scope():
    try:
        de.keras.layers.Embedding(2, key_dtype=tf.string, all_to_all=True)
    except ValueError as e:
        print("REFUSED:", e)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "REFUSED:" in proc.stdout and "key_dtype=tf.string" in proc.stdout, proc.stdout

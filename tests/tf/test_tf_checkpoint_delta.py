"""de.save(var, path, base=...) writes a delta that de.load follows into another shard count; the
reference is a dict of the rows written (numpy)."""
import numpy as np
import tensorflow as tf

import dualemb.tf as de
from dualemb.core import checkpoint as core_ckpt


def _rows(var):
    keys, values = var.export()
    keys = keys.numpy()
    order = np.argsort(keys)
    return keys[order], values.numpy()[order]


def test_delta_loads_into_three_shards(tmp_path):
    var = de.Variable(dim=3, devices=["/CPU:0"] * 2, name="emb")
    ref = {}

    def upsert(keys, values):
        var.upsert(tf.constant(keys, tf.int64), tf.constant(values, tf.float32))
        ref.update({k: v for k, v in zip(keys, np.asarray(values, np.float32))})

    upsert(list(range(20)), np.arange(60).reshape(20, 3))
    de.save(var, tmp_path / "full")
    upsert([3, 25], [[9, 9, 9], [1, 2, 3]])
    var.remove(tf.constant([4, 5], tf.int64))
    for k in (4, 5):
        ref.pop(k)
    de.save(var, tmp_path / "d1", base=tmp_path / "full")
    m = core_ckpt.read_manifest(tmp_path / "d1")
    assert m["version"] == 3 and m["tables"][0]["rows"] == 2
    assert m["tables"][0]["tombstones"]["rows"] == 2
    other = de.Variable(dim=3, devices=["/CPU:0"] * 3, name="emb")
    de.load(other, tmp_path / "d1")
    keys, values = _rows(other)
    assert keys.tolist() == sorted(ref)
    np.testing.assert_array_equal(values, np.stack([ref[k] for k in sorted(ref)]))

"""de.Variable.capture_evicted / take_evicted hand over the keys removed from its tables by a
restrict (and capacity evictions, the same core path), checked against the keys written and the
keys left."""
import numpy as np
import tensorflow as tf

import dualemb.tf as de
from dualemb.core import Table


def test_variable_hands_over_evicted_keys():
    var = de.Variable(dim=2, devices=["/CPU:0"] * 2, name="ev")
    var.capture_evicted(rows=True)
    var.upsert(tf.constant(np.arange(20), tf.int64),
               tf.constant(np.arange(40, dtype=np.float32).reshape(20, 2)))
    for shard in var._tables:  # what a restrict policy or a capacity limit does per shard
        Table.attach(shard.table_id).restrict(3)
    ev = var.take_evicted()
    keys, _ = var.export()
    left = set(keys.numpy().tolist())
    assert len(left) == 6 and len(ev["keys"]) == 14
    assert left.isdisjoint(ev["keys"].tolist()) and left | set(ev["keys"].tolist()) == set(range(20))
    for k, row in zip(ev["keys"].tolist(), ev["values"]):
        np.testing.assert_array_equal(row, [2 * k, 2 * k + 1])
    assert len(var.take_evicted()["keys"]) == 0

"""Every TF write that can evict reports it the same way: the write ops and Variable.upsert /
accum return the count (summed over shards), find_or_insert too, and every eviction — the fused
optimizer steps' included — is counted in Variable.evicted_total(). Checked against the keys
that really left the tables."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import dualemb.tf as de
from dualemb.tf import ops


def _bounded(name, capacity, shards=1, dim=2):
    return de.Variable(dim=dim, name=name, devices=["/CPU:0"] * shards,
                       kv_creator=de.HkvHashTableCreator(config=de.HkvHashTableConfig(
                           max_capacity=capacity, evict_strategy=de.HkvEvictStrategy.LRU)))


def _per_shard_capacity(var):
    from dualemb.core import Table
    return [Table.attach(s.table_id).describe()[0]["capacity"] for s in var.tables]


@pytest.mark.parametrize("shards", [1, 3])
def test_upsert_and_accum_return_the_evicted_count(shards):
    var = _bounded(f"ev_upsert_{shards}", 12, shards)
    caps = _per_shard_capacity(var)
    keys = np.arange(40, dtype=np.int64)
    n = int(var.upsert(keys, np.ones((40, 2), np.float32)))
    size = int(var.size())
    assert size == sum(caps)          # every shard filled to its capacity
    assert n == 40 - size             # the count is exactly the keys that left
    more = np.arange(100, 130, dtype=np.int64)
    m = int(var.accum(more, np.zeros((30, 2), np.float32), np.ones((30, 2), np.float32),
                      np.zeros(30, bool)))
    assert m == 30                    # tables were full: each insert evicted one key
    assert int(var.size()) == size
    assert var.evicted_total() == n + m


def test_find_or_insert_op_returns_the_evicted_count():
    var = _bounded("ev_foi", 5)
    rows, exists, evicted = ops.find_or_insert(var.tables[0].resource,
                                               tf.range(9, dtype=tf.int64), 2)
    assert rows.shape == (9, 2) and not exists.numpy().any()
    assert int(evicted) == 4 and int(var.size()) == 5
    _, _, none = ops.find_or_insert(var.tables[0].resource, tf.constant([100], tf.int64), 2)
    assert int(none) == 1
    assert var.evicted_total() == 5
    values, exists = ops.find(var.tables[0].resource, tf.constant([100], tf.int64), 2)
    assert bool(exists.numpy()[0])


def test_optimizer_steps_are_counted_in_evicted_total():
    ids = keras.Input((2,), dtype="int64")
    emb = de.keras.layers.Embedding(
        2, name="ev_opt", kv_creator=de.HkvHashTableCreator(config=de.HkvHashTableConfig(
            max_capacity=16, evict_strategy=de.HkvEvictStrategy.LRU)))
    model = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(emb(ids))))
    model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1)), "mse")
    x = np.arange(200, dtype=np.int64).reshape(100, 2)  # 200 distinct ids through capacity 16
    model.fit(x, np.ones(100, np.float32), batch_size=10, epochs=1, verbose=0, shuffle=False)
    size = int(emb.params.size())
    assert size == 16
    assert emb.params.evicted_total() == 200 - size

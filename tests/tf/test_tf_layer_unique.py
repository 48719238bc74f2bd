"""``with_unique=True`` (TFRA's default) on a table in this process' memory reads duplicate ids
directly instead of ``tf.unique`` + ``tf.gather``; where a read is a round trip (Redis, a shard on
another task) or would not give the same bits (``max_norm``) it keeps the unique pass.

Reading per occurrence must change nothing: the forward rows, and after several Adam steps with
many duplicate ids the rows, the optimizer slots and the dense weights, bit for bit, against the
unique pass; and both agree with a dense ``keras.layers.Embedding`` trained on its true (dense)
gradient by the same Keras optimizer, to float tolerance.
"""

import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import dualemb.tf as de
from dense_reference import dense_reference
from dualemb.core import Table
from dualemb.core.spec import from_spec, to_spec
from dualemb.tf.keras.layers import embedding_logic

DIM = 4
KEYS = np.array([3, 10, 42, 7, 2**40 + 5, -9], np.int64)
STEPS = 6
BATCH = 8
WIDTH = 5
_counter = [0]


def _name(prefix):
    _counter[0] += 1
    return f"{prefix}_{_counter[0]}"


def _op_types(layer, ids):
    fn = tf.function(lambda x: layer(x))
    graph = fn.get_concrete_function(tf.TensorSpec(ids.shape, tf.int64)).graph
    return {op.type for op in graph.get_operations()}


def test_in_memory_table_reads_duplicates_without_unique():
    ids = tf.constant([[1, 2, 1], [2, 2, 7]], tf.int64)
    init = keras.initializers.RandomNormal(seed=4)
    plain = de.keras.layers.Embedding(DIM, name=_name("plain"), initializer=init)
    assert plain.with_unique and not plain._unique_pays()
    assert "Unique" not in _op_types(plain, ids)
    forced = de.keras.layers.Embedding(DIM, name=_name("forced"), initializer=init)
    forced._unique_pays = lambda: True  # this instance only: the unique pass as before
    assert "Unique" in _op_types(forced, ids)
    np.testing.assert_array_equal(plain(ids).numpy(), forced(ids).numpy())
    np.testing.assert_array_equal(plain(ids).numpy()[0, 0], plain(ids).numpy()[0, 2])


def test_unique_kept_for_max_norm_and_remote_or_redis_tables(monkeypatch):
    ids = tf.constant([1, 2, 1], tf.int64)
    clipped = de.keras.layers.Embedding(DIM, name=_name("clip"), max_norm=0.5)
    assert clipped._unique_pays() and "Unique" in _op_types(clipped, ids)
    off = de.keras.layers.Embedding(DIM, name=_name("off"), with_unique=False, max_norm=0.5)
    assert not off._unique_pays()

    shard = de.keras.layers.Embedding(DIM, name=_name("local")).params.tables[0]
    assert embedding_logic._in_process_memory(shard)
    redis = types.SimpleNamespace(config=to_spec({**from_spec(shard.config), "backend": "redis"}),
                                  table_id=shard.table_id)
    assert not embedding_logic._in_process_memory(redis)
    # A table id this process' core does not hold: a shard on a parameter server.
    remote = types.SimpleNamespace(config=shard.config, table_id=shard.table_id ^ (1 << 61))
    assert not embedding_logic._in_process_memory(remote)
    monkeypatch.setattr(embedding_logic, "_in_process_memory", lambda shard: False)
    far = de.keras.layers.Embedding(DIM, name=_name("remote"))
    assert far._unique_pays() and "Unique" in _op_types(far, ids)


def _batches(rng, new_ids):
    """STEPS batches of [BATCH, WIDTH] ids: every key of KEYS, many duplicates, and (with
    ``new_ids``) ids never seen before, which the step inserts."""
    out = []
    for s in range(STEPS):
        extra = [1000 + s, 2000 + s] if new_ids else []
        ids = np.concatenate([KEYS, extra, rng.choice(KEYS, BATCH * WIDTH - len(KEYS) - len(extra))])
        rng.shuffle(ids)
        out.append(ids.reshape(BATCH, WIDTH))
    return out


def _de_model(kernel, unique: bool, layer_cls=de.keras.layers.Embedding):
    inp = keras.Input((WIDTH,), dtype="int64")
    emb = layer_cls(DIM, name=_name("exact"),
                    initializer=keras.initializers.RandomNormal(stddev=0.5, seed=11))
    if unique:
        emb._unique_pays = lambda: True
    x = keras.layers.Flatten()(emb(inp)) if layer_cls is de.keras.layers.Embedding else emb(inp)
    head = keras.layers.Dense(1)
    model = keras.Model(inp, head(x))
    head.kernel.assign(kernel[:head.kernel.shape[0]])
    head.bias.assign(np.zeros(1, np.float32))
    model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.02)), "mse")
    return model, emb


def _table_state(emb):
    page = Table.attach(emb.params.tables[0].table_id).export()
    order = np.argsort(page["keys"])
    return {k: page[k][order] for k in ("keys", "values", "slots", "update_count")}


@pytest.mark.parametrize("layer_cls", [de.keras.layers.Embedding,
                                       de.keras.layers.SquashedEmbedding])
def test_training_is_bit_identical_to_the_unique_pass(layer_cls):
    rng = np.random.default_rng(5)
    kernel = rng.normal(0, 0.5, (WIDTH * DIM, 1)).astype(np.float32)
    batches = _batches(rng, new_ids=True)
    targets = [rng.normal(0, 1, (BATCH, 1)).astype(np.float32) for _ in batches]
    direct, emb_d = _de_model(kernel, unique=False, layer_cls=layer_cls)
    unique, emb_u = _de_model(kernel, unique=True, layer_cls=layer_cls)
    assert not emb_d._unique_pays()
    for ids, target in zip(batches, targets):
        np.testing.assert_array_equal(direct.train_on_batch(ids, target),
                                      unique.train_on_batch(ids, target))
    # ... and model.fit's multi-batch train function
    ids = np.concatenate(batches)
    target = np.concatenate(targets)
    h_d = direct.fit(ids, target, batch_size=BATCH, shuffle=False, verbose=0)
    h_u = unique.fit(ids, target, batch_size=BATCH, shuffle=False, verbose=0)
    assert h_d.history["loss"] == h_u.history["loss"]
    got, want = _table_state(emb_d), _table_state(emb_u)
    assert len(got["keys"]) == len(KEYS) + 2 * STEPS
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert got["slots"].shape[1] == 2  # Adam's m and v
    np.testing.assert_array_equal(direct.layers[-1].kernel.numpy(),
                                  unique.layers[-1].kernel.numpy())


def test_training_matches_a_dense_embedding():
    rng = np.random.default_rng(9)
    kernel = rng.normal(0, 0.5, (WIDTH * DIM, 1)).astype(np.float32)
    direct, emb = _de_model(kernel, unique=False)
    rows = emb.params.lookup(KEYS).numpy()  # the initial rows the dense model starts from
    inp = keras.Input((WIDTH,), dtype="int64")
    dense_emb = keras.layers.Embedding(len(KEYS), DIM)
    head = keras.layers.Dense(1)
    dense = keras.Model(inp, head(keras.layers.Flatten()(dense_emb(inp))))
    dense_emb.embeddings.assign(rows)
    head.kernel.assign(kernel)
    head.bias.assign(np.zeros(1, np.float32))
    dense.compile(dense_reference(keras.optimizers.Adam(0.02)), "mse")
    to_index = np.vectorize({int(k): i for i, k in enumerate(KEYS)}.__getitem__)
    for ids in _batches(rng, new_ids=False):
        target = rng.normal(0, 1, (BATCH, 1)).astype(np.float32)
        np.testing.assert_allclose(direct.train_on_batch(ids, target),
                                   dense.train_on_batch(to_index(ids), target), rtol=2e-5)
    np.testing.assert_allclose(emb.params.lookup(KEYS).numpy(), dense_emb.embeddings.numpy(),
                               rtol=2e-5, atol=2e-6)

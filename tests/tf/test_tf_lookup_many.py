"""``de.embedding_lookup_many`` against one ``de.embedding_lookup`` per Variable: the same rows
bit for bit (eager and in ``tf.function``), the Variables that can share a ``DualembFindMany``
reading through one (a spy counts them), the others (sharded, ragged ids, a lone key dtype)
through their own lookup, and training through it gives the same tables (rows, slots, update
counts) as training through the per-Variable lookups."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import dualemb.tf as de
from dualemb.tf import ops

# (key dtype, value dtype, dim, devices): the two int64 ones share an op, the two int32 ones
# another; the sharded one reads through its own lookup.
SPECS = [(tf.int64, tf.float32, 4, None), (tf.int64, tf.float16, 3, None),
         (tf.int64, tf.float32, 4, ["/CPU:0", "/CPU:0"]), (tf.int32, tf.float32, 2, None),
         (tf.int32, tf.float32, 3, None)]


def _variables(tag):
    return [de.Variable(key_dtype=kd, value_dtype=vd, dim=dim, devices=devices,
                        name=f"lm_{tag}_{i}",
                        initializer=keras.initializers.RandomNormal(stddev=0.5, seed=i + 1))
            for i, (kd, vd, dim, devices) in enumerate(SPECS)]


def _ids(step=0):
    rng = np.random.default_rng(step)
    out = []
    for kd, _, _, _ in SPECS:
        x = rng.integers(0, 12, size=(3, 4))
        x[0, :2] = x[1, 0]  # duplicates
        out.append(tf.constant(x, kd))
    return out


@pytest.fixture
def find_many_calls(monkeypatch):
    calls = []
    real = ops.find_many

    def spy(tables, *args, **kwargs):
        calls.append(len(tables))
        return real(tables, *args, **kwargs)

    monkeypatch.setattr(ops, "find_many", spy)
    return calls


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_rows_equal_one_lookup_per_variable(mode, find_many_calls):
    variables = _variables(mode)
    for v in variables:  # some keys exist, others read as their initializer row
        v.upsert(tf.constant([1, 2, 3], v.key_dtype), tf.fill([3, v.dim], tf.constant(0.25, v.value_dtype)))
    ids = _ids()
    ids[0] = tf.ragged.constant([[1, 2], [3], [4, 5, 6]], tf.int64)  # ragged: its own lookup

    def many():
        return de.embedding_lookup_many(variables, ids)

    def per():
        return [de.embedding_lookup(v, x) for v, x in zip(variables, ids)]

    if mode == "function":  # autograph off: converting dualemb's Python costs seconds a trace
        many, per = tf.function(many, autograph=False), tf.function(per, autograph=False)
    got, expected = many(), per()
    # Each trace read the int32 pair in one op; the float16 Variable is alone in the int64 group.
    assert find_many_calls and set(find_many_calls) == {2}
    for g, e, v in zip(got, expected, variables):
        if isinstance(e, tf.RaggedTensor):
            g, e = g.flat_values, e.flat_values
        assert g.dtype == v.value_dtype and g.shape == e.shape
        np.testing.assert_array_equal(g.numpy(), e.numpy())


def _state(v):
    out = []
    for shard in v.router.shards:
        e = ops.export_table(shard.resource, v.key_dtype, v.dim, v.value_dtype)
        e = {k: t.numpy() for k, t in e.items()}
        order = np.argsort(e["keys"])
        out.append({k: t[order] for k, t in e.items()})
    return out


def _train(tag, lookup):
    variables = _variables(tag)
    optimizer = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05))

    @tf.function(autograph=False)
    def step(ids):
        with tf.GradientTape() as tape:
            looked = lookup(variables, ids)
            loss = tf.add_n([tf.reduce_sum(tf.sin(tf.cast(r, tf.float32))) for r, _ in looked])
        wrappers = [w for _, w in looked]
        optimizer.apply(tape.gradient(loss, wrappers), wrappers)

    for s in range(3):
        step(_ids(s))
    return [_state(v) for v in variables]


def test_training_through_it_equals_training_through_per_variable_lookups(find_many_calls):
    many = _train("train_many", lambda vs, ids: de.embedding_lookup_many(
        vs, ids, return_trainable=True))
    per = _train("train_per", lambda vs, ids: [
        de.embedding_lookup(v, x, return_trainable=True) for v, x in zip(vs, ids)])
    assert find_many_calls and set(find_many_calls) == {2}
    for a, b in zip(many, per):
        for sa, sb in zip(a, b):
            assert len(sa["keys"]) > 0 and sa["stepped"].all()
            for k in sa:
                np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)


def test_mismatched_arguments_are_refused():
    variables = _variables("bad")[:2]
    with pytest.raises(ValueError, match="2 Variables but 1 id tensors"):
        de.embedding_lookup_many(variables, _ids()[:1])
    with pytest.raises(ValueError, match="one name and one max_norm per Variable"):
        de.embedding_lookup_many(variables, _ids()[:2], name=["a"])
    with pytest.raises(TypeError, match="ids have dtype int32"):
        de.embedding_lookup_many(variables, [_ids()[0], tf.constant([1], tf.int32)])

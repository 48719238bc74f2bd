"""``Variable.accum`` and ``Variable.upsert`` against a numpy model of TFRA's rules, bit for bit:
keys of rank 0, 1 and 2, one and three shards, eagerly and in ``tf.function`` (with and without
static shapes), every value dtype (integers wrapping), and old rows holding NaN, inf and -0.0
where ``exists`` is False (the delta must then be the new row itself, not ``new - old * 0``).
TF computes the deltas with its arithmetic for the dtype; numpy (and
ml_dtypes for bfloat16) compute 16-bit float differences and sums the same way, in float32 then
rounded."""


import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import dualemb.tf as de

DIM = 3
_counter = [0]


def _var(value_dtype, shards):
    _counter[0] += 1
    return de.Variable(key_dtype=tf.int64, value_dtype=value_dtype, dim=DIM,
                       devices=["/CPU:0"] * shards, name=f"accum_exact_{_counter[0]}",
                       initializer=0)


def _accum_reference(table: dict, keys, old, new, exists):
    """TFRA's accum on a dict: delta = new - old where exists else new; absent & !exists ->
    insert delta; present & exists -> += delta; anything else ignored."""
    dtype = new.dtype
    for k, o, n, e in zip(keys.reshape(-1), old.reshape(-1, DIM), new.reshape(-1, DIM),
                          exists.reshape(-1)):
        k = int(k)
        with np.errstate(over="ignore", invalid="ignore"):
            delta = (n - o).astype(dtype) if e else n
            if k in table and e:
                table[k] = (table[k] + delta).astype(dtype)
            elif k not in table and not e:
                table[k] = delta.copy()


def _contents(var):
    keys, values = var.export()
    order = np.argsort(keys.numpy())
    return dict(zip(keys.numpy()[order].tolist(), values.numpy()[order]))


def _assert_same(var, table):
    got = _contents(var)
    assert sorted(got) == sorted(table)
    for k in table:
        # Bit patterns: NaN and -0.0 compared exactly.
        np.testing.assert_array_equal(got[k].view(np.uint8), table[k].view(np.uint8),
                                      err_msg=f"key {k}")


_INTS = {np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.int64)}


def _batch(rng, dtype, shape):
    keys = rng.integers(0, 12, shape).astype(np.int64)
    if np.dtype(dtype) not in _INTS:
        old = rng.normal(0, 1, shape + (DIM,)).astype(dtype)
        new = rng.normal(0, 1, shape + (DIM,)).astype(dtype)
        new.reshape(-1)[:: 5] = -0.0
        specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dtype)
        old.reshape(-1)[:: 3] = rng.choice(specials, old.reshape(-1)[:: 3].shape)
    else:
        info = np.iinfo(dtype)
        old = rng.integers(info.min, info.max, shape + (DIM,), dtype=dtype, endpoint=True)
        new = rng.integers(info.min, info.max, shape + (DIM,), dtype=dtype, endpoint=True)
    exists = rng.random(shape) < 0.5
    return keys, old, new, exists


_EVERY_OTHER_DTYPE = [np.float16, ml_dtypes.bfloat16, np.float64, np.int8, np.int64]


@pytest.mark.parametrize("mode,shards,dtype,shape", [
    (mode, shards, dtype, shape)
    for mode in ["eager", "function", "function_unknown_shapes"] for shards in [1, 3]
    for dtype in [np.float32, np.int32] for shape in [(), (7,), (3, 4)]
] + [(mode, shards, dtype, (3, 4))
     for mode in ["eager", "function"] for shards in [1, 3] for dtype in _EVERY_OTHER_DTYPE])
def test_accum_and_upsert_match_numpy(shape, dtype, shards, mode):
    rng = np.random.default_rng(len(shape) * 10 + shards)
    var = _var(tf.as_dtype(dtype), shards)
    table = {}
    accum, upsert = var.accum, var.upsert
    if mode == "function":
        accum, upsert = tf.function(var.accum), tf.function(var.upsert)
    elif mode == "function_unknown_shapes":
        kspec = tf.TensorSpec(None, tf.int64)
        vspec = tf.TensorSpec(None, tf.as_dtype(dtype))
        accum = tf.function(var.accum, input_signature=[kspec, vspec, vspec,
                                                        tf.TensorSpec(None, tf.bool)])
        upsert = tf.function(var.upsert, input_signature=[kspec, vspec])
    seed_keys = np.arange(0, 12, 2, dtype=np.int64)
    seed_rows = np.arange(len(seed_keys) * DIM).reshape(-1, DIM).astype(dtype)
    upsert(tf.constant(seed_keys), tf.constant(seed_rows))
    table.update({int(k): r for k, r in zip(seed_keys, seed_rows)})
    for _ in range(4):
        keys, old, new, exists = _batch(rng, dtype, shape)
        accum(tf.constant(keys), tf.constant(old), tf.constant(new), tf.constant(exists))
        _accum_reference(table, keys, old, new, exists)
        _assert_same(var, table)
    keys, _, new, _ = _batch(rng, dtype, shape)
    upsert(tf.constant(keys), tf.constant(new))
    for k, row in zip(keys.reshape(-1), new.reshape(-1, DIM)):
        table[int(k)] = row  # the last of duplicate keys wins
    _assert_same(var, table)


@pytest.mark.parametrize("shards", [1, 3])
def test_mismatched_shapes_raise_and_leave_the_table(shards):
    var = _var(tf.float32, shards)
    var.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, DIM]))
    before = _contents(var)
    spec = tf.TensorSpec(None, tf.float32)
    accum = tf.function(var.accum, input_signature=[tf.TensorSpec(None, tf.int64), spec, spec,
                                                    tf.TensorSpec(None, tf.bool)])
    keys = tf.constant([1, 2, 3, 4], tf.int64)
    rows = tf.ones([2, 2 * DIM])  # as many elements as keys.shape + [dim], grouped otherwise
    with pytest.raises(tf.errors.InvalidArgumentError):
        accum(keys, rows, rows, tf.constant([True, True, False, False]))
    with pytest.raises(tf.errors.InvalidArgumentError):
        accum(keys, tf.ones([4, DIM]), tf.ones([4, DIM]), tf.constant([True, False]))
    with pytest.raises(ValueError, match=r"keys.shape \+ \[dim\]"):
        var.upsert(keys, tf.ones([4, DIM + 1]))
    with pytest.raises(TypeError, match="dtype"):
        var.upsert(keys, tf.ones([4, DIM], tf.float64))
    after = _contents(var)
    assert sorted(after) == sorted(before)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_accum_with_string_keys_matches_numpy(dtype):
    # String keys take the C ABI's other route (deltas computed, then the string layer's accum).
    _counter[0] += 1
    var = de.Variable(key_dtype=tf.string, value_dtype=tf.as_dtype(dtype), dim=DIM,
                      name=f"accum_exact_str_{_counter[0]}", initializer=0)
    rng = np.random.default_rng(7)
    table = {}
    seed_keys = np.arange(0, 12, 2, dtype=np.int64)
    seed_rows = np.arange(len(seed_keys) * DIM).reshape(-1, DIM).astype(dtype)
    var.upsert(tf.constant([b"k%d" % k for k in seed_keys]), tf.constant(seed_rows))
    table.update({int(k): r for k, r in zip(seed_keys, seed_rows)})
    for _ in range(4):
        keys, old, new, exists = _batch(rng, dtype, (9,))
        var.accum(tf.constant([b"k%d" % k for k in keys]), tf.constant(old), tf.constant(new),
                  tf.constant(exists))
        _accum_reference(table, keys, old, new, exists)
    got_keys, got_rows = var.export()
    got = {int(k.decode()[1:]): r for k, r in zip(got_keys.numpy(), got_rows.numpy())}
    assert sorted(got) == sorted(table)
    for k in table:
        np.testing.assert_array_equal(got[k].view(np.uint8), table[k].view(np.uint8))

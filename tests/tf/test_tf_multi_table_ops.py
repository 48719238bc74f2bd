"""The multi-table ops (``ops.find_many``, ``find_or_insert_many``, ``apply_gradients_many``)
against the per-table ops, bit for bit: rows, existence, optimizer slots, stepped flags, update
counts and clocks of every table after a few steps, eagerly and inside ``tf.function``. The SGD
table is also checked against numpy (initial rows minus lr times the summed gradients), so the
comparison does not rest on the per-table ops alone. Bad input in one table raises an error
naming that table and changes no table."""

import numpy as np
import pytest
import tensorflow as tf

from dualemb.tf import ops

LR = 0.05
# Three tables unlike each other: dims, value dtypes and optimizers differ.
TABLES = [
    dict(dim=4, value_dtype=tf.float32, optimizer='{"name": "adam", "flavor": "keras"}'),
    dict(dim=3, value_dtype=tf.float16, optimizer='{"name": "adagrad", "flavor": "keras"}'),
    dict(dim=5, value_dtype=tf.float32, optimizer='{"name": "sgd", "flavor": "keras"}'),
]
SGD_TABLE = 2


def _config(dim, value_dtype, key_dtype="int64", seed=7):
    return ('{"dim": %d, "key_dtype": "%s", "value_dtype": "%s", "initializer": "normal", '
            '"mean": 0, "stddev": 0.1, "seed": %d}' % (dim, key_dtype, value_dtype.name, seed))


def _make(key_dtype="int64", optimizers=True):
    return [ops.table_handle(_config(t["dim"], t["value_dtype"], key_dtype, seed=7 + i),
                             t["optimizer"] if optimizers else "")
            for i, t in enumerate(TABLES)]


def _batches(key_dtype=tf.int64, steps=3):
    """Per step, per table: (keys with duplicates and new ids, float32 gradients)."""
    rng = np.random.default_rng(3)
    out = []
    for _ in range(steps):
        step = []
        for t in TABLES:
            keys = rng.integers(-20, 40, size=11)
            keys[:3] = keys[3]  # duplicates: their gradients are summed
            grads = rng.normal(0, 1, (len(keys), t["dim"])).astype(np.float32)
            if key_dtype == tf.string:
                keys = tf.constant([b"k%d" % k for k in keys])
            else:
                keys = tf.constant(keys, key_dtype)
            step.append((keys, tf.constant(grads)))
        out.append(step)
    return out


def _state(handle, spec, key_dtype=tf.int64):
    """Every row of a table with its slots and metadata, sorted by key (numpy)."""
    e = ops.export_table(handle, key_dtype, spec["dim"], spec["value_dtype"])
    e = {k: v.numpy() for k, v in e.items()}
    order = np.argsort(e["keys"])
    out = {k: v[order] for k, v in e.items()}
    out["clock"] = int(ops.get_clock(handle))
    return out


def _assert_same_tables(a, b, key_dtype=tf.int64):
    for ha, hb, spec in zip(a, b, TABLES):
        sa, sb = _state(ha, spec, key_dtype), _state(hb, spec, key_dtype)
        assert sa.keys() == sb.keys()
        for k in sa:
            np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)


def _per_table_step(handles, batch, step):
    for h, (k, g) in zip(handles, batch):
        ops.apply_gradients(h, k, g, LR, step)


def _many_step(handles, batch, step):
    ops.apply_gradients_many(handles, [k for k, _ in batch], [g for _, g in batch], LR, step)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("key_dtype", [tf.int64, tf.string], ids=["int64", "string"])
def test_apply_gradients_many_equals_per_table_ops(mode, key_dtype):
    kd = "string" if key_dtype == tf.string else "int64"
    per, many = _make(kd), _make(kd)
    batches = _batches(key_dtype)
    per_fn, many_fn = _per_table_step, _many_step
    if mode == "function":
        per_fn, many_fn = tf.function(per_fn), tf.function(many_fn)
    # The SGD table's independent reference: its rows before training, minus lr * gradients.
    sgd_keys = tf.concat([b[SGD_TABLE][0] for b in batches], 0)
    sgd_grads = np.concatenate([b[SGD_TABLE][1].numpy() for b in batches])
    rows0 = ops.find(per[SGD_TABLE], sgd_keys, TABLES[SGD_TABLE]["dim"])[0].numpy()
    for step, batch in enumerate(batches, start=1):
        per_fn(per, batch, tf.constant(step, tf.int64))
        many_fn(many, batch, tf.constant(step, tf.int64))
    _assert_same_tables(per, many, key_dtype)

    expected = {}
    for key, row, grad in zip(sgd_keys.numpy(), rows0, sgd_grads):
        expected[key] = expected.get(key, row) - np.float32(LR) * grad
    got, _ = ops.find(many[SGD_TABLE], tf.constant(np.array(list(expected))), TABLES[SGD_TABLE]["dim"])
    np.testing.assert_allclose(got.numpy(), np.stack(list(expected.values())), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_find_many_and_find_or_insert_many_equal_per_table_ops(mode):
    per, many = _make(), _make()
    batch = _batches(steps=1)[0]
    dims = [t["dim"] for t in TABLES]
    dtypes = [t["value_dtype"] for t in TABLES]
    keys = [k for k, _ in batch]
    # Some keys exist before the lookups (so `exists` has both values).
    for handles in (per, many):
        _per_table_step(handles, [(k[:4], g[:4]) for k, g in batch], 1)

    def per_fn(insert):
        lookup = ops.find_or_insert if insert else ops.find
        return [lookup(h, k, d, vd) for h, k, d, vd in zip(per, keys, dims, dtypes)]

    def many_fn(insert):
        return ops.find_many(many, keys, dims, dtypes, insert_missing=insert)

    if mode == "function":
        per_fn, many_fn = tf.function(per_fn), tf.function(many_fn)
    for insert in (False, True):
        expected, got = per_fn(insert), many_fn(insert)
        for e, g, d, dt in zip(expected, got, dims, dtypes):
            assert g[0].dtype == dt and g[0].shape == (len(keys[0]), d)
            for x, y in zip(e, g):
                np.testing.assert_array_equal(x.numpy(), y.numpy())
        assert any(not g[1].numpy().all() and g[1].numpy().any() for g in got)
        _assert_same_tables(per, many)  # find inserted nothing; find_or_insert the same rows


def _snapshot(handles):
    return [_state(h, s) for h, s in zip(handles, TABLES)]


def _assert_unchanged(handles, before):
    for h, spec, b in zip(handles, TABLES, before):
        now = _state(h, spec)
        for k in b:
            np.testing.assert_array_equal(now[k], b[k], err_msg=k)


def test_bad_gradients_in_one_table_change_no_table():
    handles = _make()
    batch = _batches(steps=1)[0]
    _many_step(handles, batch, 1)
    before = _snapshot(handles)
    keys = [k for k, _ in batch]
    grads = [g for _, g in batch]
    grads[1] = grads[1][:, :2]  # the wrong dim
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"table 1 of 3: gradients have shape \[11,2\]"):
        ops.apply_gradients_many(handles, keys, grads, LR, 2)
    _assert_unchanged(handles, before)


def test_a_table_without_optimizer_changes_no_table_and_is_named():
    # The core finds this one (the op cannot see the optimizer): the error still names the
    # op's position, also when an empty table before it is left out of the core call.
    handles = _make()
    handles[2] = ops.table_handle(_config(TABLES[2]["dim"], tf.float32))
    batch = _batches(steps=1)[0]
    before = _snapshot(handles)
    keys = [tf.zeros([0], tf.int64)] + [k for k, _ in batch[1:]]
    grads = [tf.zeros([0, TABLES[0]["dim"]])] + [g for _, g in batch[1:]]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"table 2 of 3 \(id \d+\): .*no optimizer"):
        ops.apply_gradients_many(handles, keys, grads, LR, 1)
    _assert_unchanged(handles, before)


def test_wrong_key_dtype_step_or_dim_in_one_table_is_refused():
    handles = _make()
    handles[1] = ops.table_handle(_config(TABLES[1]["dim"], tf.float16, "int32"),
                                  TABLES[1]["optimizer"])
    batch = _batches(steps=1)[0]
    before = _snapshot(handles[:1])
    keys = [k for k, _ in batch]
    grads = [g for _, g in batch]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"table 1 of 3: .*keys have dtype int64 but the table's key dtype "
                             r"is int32"):
        ops.apply_gradients_many(handles, keys, grads, LR, 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"step must be >= 1"):
        ops.apply_gradients_many(handles[:1], keys[:1], grads[:1], LR, 0)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"table 0 of 1: the op was built for dim 5 but the table has dim 4"):
        ops.find_many(handles[:1], keys[:1], [5])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"table 0 of 1: .*values have dtype half but the table's value "
                             r"dtype is float32"):
        ops.find_or_insert_many(handles[:1], keys[:1], [4], [tf.float16])
    with pytest.raises(ValueError, match=r"3 tables but 2 gradient tensors"):
        ops.apply_gradients_many(handles, keys, grads[:2], LR, 1)
    _assert_unchanged(handles[:1], before)

"""The TF ops on batches large enough for the core to split them over threads, eagerly and inside
tf.function, where the kernel hands its helper tasks to TensorFlow's executor (csrc/tf/common.h,
ScopedRunnerHelpers) instead of the core's pool. Checked against numpy references; also several
such ops running at once in one graph (they share the executor's threads), and the dims a kernel
caches per table (dim, key dtype) staying right while the slot count changes."""


import numpy as np
import pytest
import tensorflow as tf

from dualemb.core import Table
from dualemb.tf import ops

DIM = 8
N = 50_000  # well above the core's parallel threshold (2,048 keys)
SGD = '{"name": "sgd"}'


def _config(dim=DIM):
    return f'{{"dim": {dim}, "key_dtype": "int64"}}'


def _batch(seed, n=N, distinct=None):
    """Keys with duplicates (drawn from `distinct` values) and float32 rows."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, distinct or n // 2, n).astype(np.int64) * 1_000_003 + 11
    return keys, rng.standard_normal((n, DIM)).astype(np.float32)


def _last_write_wins(keys, values):
    ref = {}
    for k, v in zip(keys.tolist(), values):
        ref[k] = v
    return ref


def _run(fn, graph, *args):
    return tf.function(fn)(*args) if graph else fn(*args)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_upsert_then_find_matches_a_dict(graph):
    handle = ops.table_handle(_config())
    keys, values = _batch(1)
    _run(lambda k, v: ops.insert_or_assign(handle, k, v), graph, tf.constant(keys),
         tf.constant(values))
    ref = _last_write_wins(keys, values)
    probe = np.array(list(ref) + [-5, -7], np.int64)
    rows, exists = _run(lambda k: ops.find(handle, k, DIM), graph, tf.constant(probe))
    np.testing.assert_array_equal(exists.numpy(), [True] * len(ref) + [False, False])
    np.testing.assert_array_equal(rows.numpy()[:len(ref)], np.stack(list(ref.values())))
    np.testing.assert_array_equal(rows.numpy()[len(ref):], 0)
    assert int(ops.table_size(handle)) == len(ref)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_sgd_step_sums_duplicate_gradients(graph):
    handle = ops.table_handle(_config(), SGD)
    keys, grads = _batch(2)
    start = np.random.default_rng(3).standard_normal((N, DIM)).astype(np.float32)
    base = _last_write_wins(keys, start)
    uniq = np.array(list(base), np.int64)
    ops.insert_or_assign(handle, tf.constant(uniq), tf.constant(np.stack(list(base.values()))))
    lr = 0.5
    _run(lambda k, g: ops.apply_gradients(handle, k, g, lr, 1), graph, tf.constant(keys),
         tf.constant(grads))
    total = {k: np.zeros(DIM, np.float64) for k in base}
    for k, g in zip(keys.tolist(), grads):
        total[k] += g
    want = np.stack([base[k] - lr * total[k] for k in uniq.tolist()])
    got = ops.find(handle, tf.constant(uniq), DIM)[0].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_accum_follows_tfras_rule(graph):
    handle = ops.table_handle(_config())
    present = np.arange(0, 2 * N, 2, dtype=np.int64)  # even keys present
    start = np.ones((len(present), DIM), np.float32)
    ops.insert_or_assign(handle, tf.constant(present), tf.constant(start))
    rng = np.random.default_rng(4)
    keys = rng.permutation(2 * N)[:N].astype(np.int64)  # distinct: the rule is per key
    deltas = rng.standard_normal((N, DIM)).astype(np.float32)
    exists = rng.random(N) < 0.5
    _run(lambda k, d, e: ops.accum(handle, k, d, e), graph, tf.constant(keys),
         tf.constant(deltas), tf.constant(exists))
    ref = {k: start[0].copy() for k in present.tolist()}
    for k, d, e in zip(keys.tolist(), deltas, exists):
        if k in ref and e:
            ref[k] = ref[k] + d
        elif k not in ref and not e:
            ref[k] = d
    probe = np.array(sorted(ref), np.int64)
    got = ops.find(handle, tf.constant(probe), DIM)[0].numpy()
    np.testing.assert_allclose(got, np.stack([ref[k] for k in probe.tolist()]), rtol=1e-6)
    assert int(ops.table_size(handle)) == len(ref)


def test_many_large_ops_at_once_in_one_graph():
    """Independent ops of one tf.function run concurrently on the executor's threads, each
    handing helper tasks to the same threads: all finish, each with its own right rows."""
    handles = [ops.table_handle(_config()) for _ in range(6)]
    batches = [_batch(10 + i) for i in range(len(handles))]

    @tf.function
    def upsert_all(ks, vs):
        return [ops.insert_or_assign(h, k, v) for h, k, v in zip(handles, ks, vs)]

    upsert_all([tf.constant(k) for k, _ in batches], [tf.constant(v) for _, v in batches])
    for h, (k, v) in zip(handles, batches):
        ref = _last_write_wins(k, v)
        probe = np.array(list(ref), np.int64)
        np.testing.assert_array_equal(ops.find(h, tf.constant(probe), DIM)[0].numpy(),
                                      np.stack(list(ref.values())))


def test_cached_dims_follow_slot_count_changes():
    """The kernels remember a table's dim and key dtype; the slot count, which attaching an
    optimizer changes, is still read fresh by export and import."""
    handle = ops.table_handle(_config())
    keys, values = _batch(5, n=3000, distinct=3000)
    fn = tf.function(lambda k, v: ops.insert_or_assign(handle, k, v))
    fn(tf.constant(keys), tf.constant(values))  # dims now cached by the kernels
    ops.set_optimizer(handle, '{"name": "adam", "flavor": "keras"}')
    out = ops.export_table(handle, dim=DIM)
    assert out["slots"].shape == (int(ops.table_size(handle)), 2, DIM)
    ops.import_table(handle, out["keys"], out["values"], out["slots"], clear=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="slots have shape"):
        ops.import_table(handle, out["keys"], out["values"],
                         tf.zeros([len(out["keys"]), 1, DIM]))
    # A wrong dim is still refused by the cached check, naming the expected shape.
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"expected keys.shape \+ \[dim\]"):
        fn(tf.constant(keys[:5]), tf.zeros([5, DIM + 1]))


def test_op_on_destroyed_table_still_raises_after_dims_were_cached():
    handle = ops.table_handle(_config())
    tid = int(ops.table_id(handle))
    ops.insert_or_assign(handle, tf.constant([1], tf.int64), tf.ones([1, DIM]))  # caches dims
    Table.attach(tid).destroy()
    with pytest.raises(tf.errors.InvalidArgumentError, match="unknown table"):
        ops.find(handle, tf.constant([1], tf.int64), DIM)

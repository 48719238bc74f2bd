"""The dualemb TensorFlow ops (dualemb/tf/ops.py over dualemb/tf/_ops.so)."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from dualemb._native import native_dir
from dualemb.core import Table
from dualemb.tf import _load, ops

CONFIG = ('{"dim": 4, "key_dtype": "int64", "initializer": "normal", "mean": 0, "stddev": 0.1, '
          '"seed": 5}')
ADAM = '{"name": "adam", "flavor": "keras"}'


def _table(config=CONFIG, optimizer=""):
    return ops.table_handle(config, optimizer)


def test_build_info_matches_running_tensorflow():
    tf_version, core_version = ops.build_info()
    assert tf_version == tf.__version__
    assert core_version


def test_handle_is_shared_with_core_by_id():
    handle = _table()
    assert handle.dtype == tf.resource
    tid = int(ops.table_id(handle))
    table = Table.attach(tid)  # the pybind view of the same table
    table.insert_or_assign([7], np.full((1, 4), 2.0, np.float32))
    values, exists = ops.find(handle, tf.constant([7, 8], tf.int64), 4)
    np.testing.assert_array_equal(values.numpy()[0], [2, 2, 2, 2])
    np.testing.assert_array_equal(exists.numpy(), [True, False])
    np.testing.assert_array_equal(values.numpy()[1], table.initial_values([8])[0])
    # A second handle attached by id sees the same rows.
    other = ops.attach_table(tid)
    assert int(ops.table_id(other)) == tid
    np.testing.assert_array_equal(ops.find(other, tf.constant([7], tf.int64), 4)[0].numpy(),
                                  [[2, 2, 2, 2]])
    assert int(ops.table_id(_table())) != tid  # every handle op makes a fresh table


def test_table_lives_while_any_handle_does():
    handle = _table()
    tid = int(ops.table_id(handle))
    other = ops.attach_table(tid)
    del handle
    assert Table.attach(tid).dim == 4  # `other` still owns it
    del other
    with pytest.raises(KeyError, match="unknown table id"):
        Table.attach(tid)
    with pytest.raises(tf.errors.InvalidArgumentError, match="unknown table id"):
        ops.attach_table(tid)


def test_handle_op_rejects_bad_config_and_optimizer():
    with pytest.raises(tf.errors.InvalidArgumentError, match="dim"):
        ops.table_handle('{"key_dtype": "int64"}')
    with pytest.raises(tf.errors.InvalidArgumentError, match="optimizer"):
        ops.table_handle(CONFIG, '{"name": "nonsense", "flavor": "keras"}')


def test_find_does_not_insert_and_find_or_insert_does():
    tid = _table()
    keys = tf.constant([[1, 2], [3, 4]], tf.int64)
    values, exists = ops.find(tid, keys, 4)
    assert values.shape == (2, 2, 4) and exists.shape == (2, 2)
    assert int(ops.table_size(tid)) == 0
    values2, exists2, evicted = ops.find_or_insert(tid, keys, 4)
    assert int(evicted) == 0  # no capacity limit
    np.testing.assert_array_equal(values.numpy(), values2.numpy())
    assert not exists2.numpy().any()
    assert int(ops.table_size(tid)) == 4
    _, exists3 = ops.find(tid, keys, 4)
    assert exists3.numpy().all()


def test_insert_accum_erase_clear():
    tid = _table('{"dim": 2, "key_dtype": "int32"}')
    keys = tf.constant([1, 2], tf.int32)
    ops.insert_or_assign(tid, keys, tf.constant([[1.0, 1.0], [2.0, 2.0]]))
    # accum: present & exists -> add; absent & !exists -> insert; others ignored.
    ops.accum(tid, tf.constant([1, 3, 4, 2], tf.int32),
              tf.constant([[10.0, 10.0], [5.0, 5.0], [6.0, 6.0], [7.0, 7.0]]),
              tf.constant([True, False, True, False]))
    values, exists = ops.find(tid, tf.constant([1, 2, 3, 4], tf.int32), 2)
    np.testing.assert_array_equal(values.numpy()[:3], [[11, 11], [2, 2], [5, 5]])
    np.testing.assert_array_equal(exists.numpy(), [True, True, True, False])
    ops.erase(tid, tf.constant([1, 99], tf.int32))
    assert int(ops.table_size(tid)) == 2
    ops.clear_table(tid)
    assert int(ops.table_size(tid)) == 0


def test_apply_gradients_sums_duplicates_and_inserts():
    tid = _table('{"dim": 2, "key_dtype": "int64"}', '{"name": "sgd", "flavor": "keras"}')
    ops.apply_gradients(tid, tf.constant([5, 5, 6], tf.int64),
                        tf.constant([[1.0, 2.0], [3.0, 4.0], [1.0, 1.0]]), 0.5, 1)
    values, exists = ops.find(tid, tf.constant([5, 6], tf.int64), 2)
    np.testing.assert_allclose(values.numpy(), [[-2.0, -3.0], [-0.5, -0.5]])
    assert exists.numpy().all()


def test_export_import_paged_with_slots_and_metadata():
    src = _table(CONFIG, ADAM)
    keys = tf.range(100, dtype=tf.int64)
    ops.apply_gradients(src, keys, tf.ones([100, 4]), 0.01, 1)
    ops.apply_gradients(src, keys[:10], tf.ones([10, 4]), 0.01, 2)
    full = ops.export_table(src, tf.int64, 4)
    assert full["keys"].shape == (100,) and full["slots"].shape == (100, 2, 4)
    pages = [ops.export_table(src, tf.int64, 4, offset=o, limit=30) for o in range(0, 100, 30)]
    for field in full:
        np.testing.assert_array_equal(np.concatenate([p[field].numpy() for p in pages]),
                                      full[field].numpy())
    dst = _table(CONFIG, ADAM)
    ops.insert_or_assign(dst, tf.constant([1000], tf.int64), tf.zeros([1, 4]))
    ops.import_table(dst, full["keys"], full["values"], full["slots"], full["last_update"],
                     full["update_count"], clear=True)
    back = ops.export_table(dst, tf.int64, 4)
    order_a = np.argsort(full["keys"].numpy())
    order_b = np.argsort(back["keys"].numpy())
    for field in full:
        np.testing.assert_array_equal(back[field].numpy()[order_b], full[field].numpy()[order_a])
    assert int(ops.table_size(dst)) == 100  # clear=True replaced the old key
    described = json.loads(ops.describe(dst).numpy().decode())
    assert described["optimizer"]["name"] == "adam"


@pytest.mark.parametrize("held,imported", [(3000, 3000), (3000, 700), (700, 3000), (3000, 0)])
def test_import_clear_equals_clear_then_import(held, imported):
    """clear=True (one core call that refills the table's own memory) leaves the table exactly as
    a separate clear followed by an import does: the same rows in the same export order, slots,
    metadata, clock and memory held; for fewer, as many and more rows than the table held."""
    rng = np.random.default_rng(held + imported)
    src = _table(CONFIG, ADAM)
    keys = tf.constant(rng.choice(1 << 40, imported, replace=False), tf.int64)
    if imported:
        ops.apply_gradients(src, keys, tf.constant(rng.normal(size=(imported, 4)), tf.float32),
                            0.01, 1)
    saved = ops.export_table(src, tf.int64, 4)
    tables = []
    for one_call in (True, False):
        dst = _table(CONFIG, ADAM)
        ops.insert_or_assign(dst, tf.constant(rng.choice(1 << 40, held, replace=False), tf.int64),
                             tf.ones([held, 4]))
        if not one_call:
            ops.clear_table(dst)
        ops.import_table(dst, saved["keys"], saved["values"], saved["slots"],
                         saved["last_update"], saved["update_count"], clear=one_call,
                         stepped=saved["stepped"])
        tables.append(dst)
    replaced, reference = (ops.export_table(t, tf.int64, 4) for t in tables)
    for field in saved:  # export order included: rows sit where the reference put them
        np.testing.assert_array_equal(replaced[field].numpy(), reference[field].numpy())
    np.testing.assert_array_equal(np.sort(replaced["keys"].numpy()), np.sort(keys.numpy()))
    core = [Table.attach(int(ops.table_id(t))) for t in tables]
    assert core[0].clock == core[1].clock
    assert core[0].memory_bytes() == core[1].memory_bytes()


def test_import_without_slots_or_metadata():
    tid = _table(CONFIG, ADAM)
    ops.import_table(tid, tf.constant([1, 2], tf.int64), tf.ones([2, 4]))
    page = ops.export_table(tid, tf.int64, 4)
    np.testing.assert_array_equal(page["slots"].numpy(), np.zeros((2, 2, 4)))


def test_restrict_by_frequency():
    tid = _table('{"dim": 1, "key_dtype": "int64"}', '{"name": "sgd", "flavor": "keras"}')
    for step, keys in enumerate([[1, 2, 3], [1, 2], [1]], start=1):
        ops.apply_gradients(tid, tf.constant(keys, tf.int64), tf.ones([len(keys), 1]), 0.1, step)
    # update counts: key 1 -> 3, key 2 -> 2, key 3 -> 1
    removed = ops.restrict(tid, 2, "frequency")
    assert int(removed) == 1
    _, exists = ops.find(tid, tf.constant([1, 2, 3], tf.int64), 1)
    np.testing.assert_array_equal(exists.numpy(), [True, True, False])


def test_clock_roundtrip():
    tid = _table()
    ops.set_clock(tid, 41)
    assert int(ops.get_clock(tid)) == 41


def test_errors_name_the_problem_and_leave_table_unchanged():
    tid = _table()
    ops.insert_or_assign(tid, tf.constant([1], tf.int64), tf.ones([1, 4]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="key dtype is int64"):
        ops.find(tid, tf.constant([1], tf.int32), 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="dim 5"):
        ops.find(tid, tf.constant([1], tf.int64), 5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="shape"):
        ops.insert_or_assign(tid, tf.constant([2, 3], tf.int64), tf.ones([2, 5]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="unknown table"):
        ops.attach_table(123456789)
    with pytest.raises((tf.errors.InvalidArgumentError, TypeError, ValueError)):
        ops.table_size(tf.constant(123456789, tf.int64))  # an id is not a handle
    with pytest.raises(tf.errors.InvalidArgumentError, match="optimizer"):
        ops.set_optimizer(tid, '{"name": "nonsense", "flavor": "keras"}')
    with pytest.raises(tf.errors.InvalidArgumentError, match="slots"):
        ops.import_table(tid, tf.constant([5], tf.int64), tf.ones([1, 4]), tf.ones([1, 3, 4]))
    assert int(ops.table_size(tid)) == 1
    values, _ = ops.find(tid, tf.constant([1], tf.int64), 4)
    np.testing.assert_array_equal(values.numpy(), np.ones((1, 4)))


def test_ops_are_stateful_and_ordered_in_functions():
    tid = _table('{"dim": 2, "key_dtype": "int64"}')

    @tf.function
    def rounds(keys):
        out = []
        for i in range(10):
            ops.insert_or_assign(tid, keys, tf.fill([tf.size(keys), 2], float(i)))
            out.append(ops.find(tid, keys, 2)[0])
            ops.erase(tid, keys)
            out.append(ops.find(tid, keys, 2)[1])
        return out

    out = rounds(tf.constant([4, 5], tf.int64))
    for i in range(10):
        np.testing.assert_array_equal(out[2 * i].numpy(), np.full((2, 2), float(i)))
        assert not out[2 * i + 1].numpy().any()
    from tensorflow.python.framework import op_def_registry
    # Every op that touches a table is stateful; only the pure ones below are not.
    pure = {"DualembRowsWithKeyGradient", "DualembBuildInfo"}
    assert pure < set(ops.OP_NAMES)
    for name in ops.OP_NAMES:
        assert op_def_registry.get(name).is_stateful == (name not in pure), name


def test_version_check_message():
    with pytest.raises(ImportError, match=r"(?s)built against TensorFlow 1\.2\.3.*pip install"):
        _load.check_version("1.2.3", tf.__version__)
    _load.check_version(tf.__version__, tf.__version__)


def test_mismatched_library_version_fails_at_import(tmp_path):
    """A copy of the build whose recorded TF version differs: import dualemb.tf says how to
    rebuild instead of crashing."""
    native = native_dir()
    fake = tmp_path / "dualemb"
    (fake / "tf").mkdir(parents=True)
    for name in os.listdir(native):
        path = os.path.join(native, name)
        if os.path.isfile(path):
            os.symlink(path, fake / name)
    os.symlink(os.path.join(native, "tf", "_ops.so"), fake / "tf" / "_ops.so")
    (fake / "tf" / "_ops_tf_version.txt").write_text("2.0.0\n")
    code = textwrap.dedent("""
        try:
            import dualemb.tf
        except ImportError as e:
            print("IMPORT ERROR:", e)
    """)
    env = dict(os.environ, DUALEMB_NATIVE_DIR=str(fake))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert "IMPORT ERROR" in out.stdout, out.stderr[-2000:]
    assert "built against TensorFlow 2.0.0" in out.stdout
    assert "pip install" in out.stdout

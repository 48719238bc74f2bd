"""Until dualemb.jax is wired to value dtypes, its ops pass float32 row buffers: a core table of
another value dtype must be refused at every door (attach by id, loading a checkpoint), never
read or written as float32. dualemb.tf is wired (its ops carry the value dtype)."""

import numpy as np
import pytest

from dualemb.core import Table, checkpoint


@pytest.fixture
def half_table():
    t = Table(dim=4, value_dtype="float16")
    t.insert_or_assign([1, 2], np.ones((2, 4), np.float16))
    yield t
    t.destroy()


def test_jax_attach_refuses_non_float32(half_table):
    dej = pytest.importorskip("dualemb.jax")
    with pytest.raises(TypeError, match="stores float16 values; dualemb.jax tables hold float32"):
        dej.attach(half_table.id)


def test_jax_load_refuses_non_float32_checkpoint(tmp_path, half_table):
    dej = pytest.importorskip("dualemb.jax")
    path = str(tmp_path / "ck")
    checkpoint.save(path, {"emb": half_table})
    with pytest.raises(checkpoint.CheckpointError, match="stores float16 values"):
        dej.load(path)
    # The core loader reads it, in its dtype.
    got = checkpoint.load(path).tables["emb"]
    assert got.value_dtype == np.float16 and got.size() == 2
    got.destroy()


def test_tf_attach_reads_a_table_in_its_own_dtype(half_table):
    """dualemb.tf is wired to value dtypes: attach works for a float16 table, rows come back in
    float16, and an op built for float32 rows is refused (never a float32 read of half data)."""
    tf = pytest.importorskip("tensorflow")
    from dualemb.tf import ops

    handle = ops.attach_table(half_table.id)
    rows, exists = ops.find(handle, tf.constant([1, 3], tf.int64), 4, tf.float16)
    assert rows.dtype == tf.float16 and exists.numpy().tolist() == [True, False]
    np.testing.assert_array_equal(rows.numpy()[0], np.ones(4, np.float16))
    with pytest.raises(tf.errors.InvalidArgumentError, match="value dtype is float16"):
        ops.find(handle, tf.constant([1], tf.int64), 4)
    del handle

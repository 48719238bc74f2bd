"""A core table of another value dtype, reached from TensorFlow by id: read in its own dtype,
and an op built for another dtype is refused (never a reinterpretation of its bytes). (JAX:
tests/jax/test_jax_value_dtypes.py.)"""

import numpy as np
import pytest

from dualemb.core import Table


@pytest.fixture
def half_table():
    t = Table(dim=4, value_dtype="float16")
    t.insert_or_assign([1, 2], np.ones((2, 4), np.float16))
    yield t
    t.destroy()


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

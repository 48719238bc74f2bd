"""Until dualemb.tf is wired to value dtypes, its ops pass float32 row buffers: a core table of
another value dtype must be refused at every door (attach by id, loading a checkpoint), never
read or written as float32. (dualemb.jax supports every value dtype: tests/test_jax_value_dtypes.py.)"""

import numpy as np
import pytest

from dualemb.core import Table


@pytest.fixture
def half_table():
    t = Table(dim=4, value_dtype="float16")
    t.insert_or_assign([1, 2], np.ones((2, 4), np.float16))
    yield t
    t.destroy()


def test_tf_attach_refuses_non_float32(half_table):
    pytest.importorskip("tensorflow")
    from dualemb.tf import ops

    with pytest.raises(Exception, match="not float32"):
        ops.attach_table(half_table.id)
    # A float32 table attaches (the guard is not a blanket refusal).
    f32 = Table(dim=4)
    handle = ops.attach_table(f32.id)
    assert int(ops.table_id(handle)) == f32.id
    del handle
    f32.destroy()

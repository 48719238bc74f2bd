"""Until dualemb.tf and dualemb.jax are wired to value dtypes, their ops pass float32 row
buffers: a core table of another value dtype must be refused at every door (attach by id,
loading a checkpoint), never read or written as float32."""

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

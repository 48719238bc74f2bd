"""Same-process sharing: one core table seen from dualemb.core and dualemb.jax by id."""

import jax
import numpy as np
import pytest

import dualemb.jax as dej
from dualemb.core import optimizers as core_opts
from dualemb.core.table import Table as CoreTable

DIM = 6
IDS = np.array([4, 2**45 + 1, -9], np.int64)


def test_core_table_used_from_jax():
    core = CoreTable(DIM, initializer=0.5,
                     optimizer=core_opts.make("adam", flavor="optax", b1=0.9, b2=0.999,
                                              eps=1e-8))
    core.insert_or_assign(IDS, np.arange(3 * DIM, dtype=np.float32).reshape(3, DIM))
    core.apply_gradients(IDS, np.ones((3, DIM), np.float32), lr=0.1, step=1)

    t = dej.attach(core.id, learning_rate=0.1, step=1)
    assert t.dim == DIM and t.optimizer.name == "adam"
    np.testing.assert_array_equal(dej.lookup(t, IDS), core.find(IDS)[0])
    t = jax.jit(dej.apply_gradients)(t, dej.ids(IDS), np.ones((3, DIM), np.float32))
    assert int(t.step) == 2

    # The same two steps on a second core table, all through dualemb.core:
    ref = CoreTable(DIM, initializer=0.5, optimizer=core.optimizer)
    ref.insert_or_assign(IDS, np.arange(3 * DIM, dtype=np.float32).reshape(3, DIM))
    ref.apply_gradients(IDS, np.ones((3, DIM), np.float32), lr=0.1, step=1)
    ref.apply_gradients(IDS, np.ones((3, DIM), np.float32), lr=0.1, step=2)
    np.testing.assert_array_equal(t.core().find(IDS)[0], ref.find(IDS)[0])
    # Slots too: the core's export shows the same optimizer state.
    a = {k: v for k, v in zip(core.export()["keys"], core.export()["slots"])}
    b = {k: v for k, v in zip(ref.export()["keys"], ref.export()["slots"])}
    for k in IDS:
        np.testing.assert_array_equal(a[k], b[k])
    core.destroy()
    ref.destroy()


def test_jax_table_used_from_core():
    t = dej.create(DIM, initializer=dej.initializers.normal(0, 1, seed=4),
                   optimizer=dej.optimizers.sgd(1.0))
    t = jax.jit(dej.insert)(t, dej.ids(IDS), np.ones((3, DIM), np.float32))
    core = CoreTable.attach(dej.block(t).id)
    np.testing.assert_array_equal(core.find(IDS)[0], np.ones((3, DIM)))
    core.insert_or_assign(IDS[:1], np.full((1, DIM), 7.0, np.float32))
    np.testing.assert_array_equal(dej.lookup(t, IDS[:1]), np.full((1, DIM), 7.0))
    # A missing id reads the same initializer row on both sides.
    np.testing.assert_array_equal(dej.lookup(t, [99]), core.find([99])[0])
    dej.destroy(t)


def test_attach_needs_a_learning_rate_for_a_core_optimizer():
    core = CoreTable(DIM, optimizer=core_opts.make("sgd", flavor="optax"))
    with pytest.raises(ValueError, match="learning_rate"):
        dej.attach(core.id)
    t = dej.attach(core.id, optimizer=dej.optimizers.adagrad(0.1))  # replaces the optimizer
    assert core.optimizer["name"] == "adagrad"
    assert t.optimizer.name == "adagrad"
    with pytest.raises(KeyError, match="unknown table id"):
        dej.attach(1234567)
    core.destroy()


def test_tf_table_used_from_jax_and_back():
    tf = pytest.importorskip("tensorflow")
    try:
        from dualemb.tf import _load
        _load.load_ops()
    except ImportError as e:
        pytest.skip(f"dualemb.tf's op library is not built here: {e}")
    import dualemb.tf as de

    var = de.get_variable("shared_with_jax", dim=DIM, initializer=0.25)
    var.upsert(tf.constant(IDS), tf.ones((3, DIM)))
    t = dej.attach(var.tables[0].table_id)
    np.testing.assert_array_equal(dej.lookup(t, IDS), np.ones((3, DIM)))
    t = jax.jit(dej.insert)(t, dej.ids(IDS[:1]), np.full((1, DIM), 3.0, np.float32))
    dej.block(t)  # a host-side reader (TF) must wait for the jitted write
    np.testing.assert_array_equal(var.lookup(tf.constant(IDS[:1])).numpy(),
                                  np.full((1, DIM), 3.0))

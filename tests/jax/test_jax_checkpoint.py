"""dualemb.jax save/load in the common format, and the Orbax integration."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dualemb.jax as dej
from dualemb.core import checkpoint as core_ckpt
from dualemb.core.table import Table as CoreTable

DIM = 4
IDS = np.array([1, 2**40 + 9, -77, 12345], np.int64)


def _trained(opt, steps=3, dim=DIM):
    t = dej.create(dim, initializer=dej.initializers.normal(0, 0.1, seed=1), optimizer=opt)
    g = np.random.RandomState(0).randn(steps, len(IDS), dim).astype(np.float32)
    f = jax.jit(dej.apply_gradients)
    for i in range(steps):
        t = f(t, dej.ids(IDS), g[i])
    return t, g


def _rows_and_slots(t):
    page = t.core().export()
    order = np.argsort(page["keys"])
    return page["keys"][order], page["values"][order], page["slots"][order]


def _continue(t, g):
    return jax.jit(dej.apply_gradients)(t, dej.ids(IDS), g)


def test_save_load_restores_rows_slots_optimizer_and_step(tmp_path):
    t, g = _trained(dej.optimizers.adam(0.01, b1=0.8))
    dej.save(t, tmp_path / "ck")
    manifest = core_ckpt.read_manifest(tmp_path / "ck")
    assert manifest["tables"][0]["step"] == 3
    loaded = dej.load(tmp_path / "ck")
    assert loaded.id != t.id and int(loaded.step) == 3
    assert loaded.optimizer == t.optimizer
    for a, b in zip(_rows_and_slots(t), _rows_and_slots(loaded)):
        np.testing.assert_array_equal(a, b)
    # Training continues identically (bias correction uses the restored step).
    a, b = _continue(t, g[0]), _continue(loaded, g[0])
    np.testing.assert_array_equal(dej.lookup(a, IDS), dej.lookup(b, IDS))
    dej.destroy(a)
    dej.destroy(b)


def test_schedule_needs_learning_rate_at_load(tmp_path):
    sched = optax.linear_schedule(0.1, 0.01, 10)
    t, g = _trained(dej.optimizers.sgd(sched, momentum=0.9))
    dej.save(t, tmp_path / "ck")
    with pytest.raises(ValueError, match="learning_rate"):
        dej.load(tmp_path / "ck")
    loaded = dej.load(tmp_path / "ck", learning_rate=sched)
    a, b = _continue(t, g[0]), _continue(loaded, g[0])
    np.testing.assert_array_equal(dej.lookup(a, IDS), dej.lookup(b, IDS))


def test_load_into_live_table_keeps_id(tmp_path):
    t, g = _trained(dej.optimizers.adagrad(0.1))
    dej.save(t, tmp_path / "ck")
    saved = _rows_and_slots(t)
    t2 = _continue(t, g[1])  # train on; then roll back
    restored = dej.load(tmp_path / "ck", into=t2)
    assert restored.id == t.id and int(restored.step) == 3
    for a, b in zip(saved, _rows_and_slots(restored)):
        np.testing.assert_array_equal(a, b)


def test_checkpoint_of_other_dim_refused_table_unchanged(tmp_path):
    t, _ = _trained(dej.optimizers.sgd(0.1), dim=DIM + 2)
    dej.save(t, tmp_path / "ck")
    live, _ = _trained(dej.optimizers.sgd(0.1))
    before = _rows_and_slots(live)
    with pytest.raises(core_ckpt.CheckpointError, match="dim"):
        dej.load(tmp_path / "ck", into=live)
    for a, b in zip(before, _rows_and_slots(live)):
        np.testing.assert_array_equal(a, b)
    # Key dtype too.
    t32 = dej.create(DIM, key_dtype="int32")
    t32 = dej.insert(t32, np.array([1, 2], np.int32), np.ones((2, DIM), np.float32))
    dej.save(t32, tmp_path / "ck32")
    with pytest.raises(core_ckpt.CheckpointError, match="key dtype"):
        dej.load(tmp_path / "ck32", into=live)
    for a, b in zip(before, _rows_and_slots(live)):
        np.testing.assert_array_equal(a, b)


def test_several_tables_and_generic_optimizer(tmp_path):
    tx = optax.chain(optax.clip(1.0), optax.scale_by_adam(), optax.scale(-0.01))
    a, g = _trained(tx)
    b, _ = _trained(dej.optimizers.lion(1e-3))
    dej.save({"a": a, "b": b}, tmp_path / "ck", dense={"w": np.arange(3.0)},
             metadata={"epoch": 2})
    assert sorted(dej.checkpoint.table_names(tmp_path / "ck")) == ["a", "b"]
    with pytest.raises(ValueError, match="name="):
        dej.load(tmp_path / "ck")
    with pytest.raises(ValueError, match="Optax transformation"):
        dej.load(tmp_path / "ck", "a")
    a2 = dej.load(tmp_path / "ck", "a", optimizer=tx)
    b2 = dej.load(tmp_path / "ck", "b")
    assert [int(x) for x in jax.tree_util.tree_leaves(a2.opt_state)] == [3]  # adam count
    x, y = _continue(a, g[0]), _continue(a2, g[0])
    np.testing.assert_allclose(dej.lookup(x, IDS), dej.lookup(y, IDS), rtol=1e-6)
    np.testing.assert_array_equal(dej.lookup(b2, IDS), dej.lookup(b, IDS))
    assert core_ckpt.load_dense(tmp_path / "ck")["w"].tolist() == [0.0, 1.0, 2.0]


def test_orbax_checkpoint_manager_saves_tables_beside_dense_params(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    from dualemb.jax import orbax as deo

    t, g = _trained(dej.optimizers.adam(0.01))
    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
    with ocp.CheckpointManager(tmp_path / "orbax") as mngr:
        mngr.save(3, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                             tables=deo.TablesSave({"emb": t})))
        mngr.wait_until_finished()
    saved = _rows_and_slots(t)
    t2 = _continue(t, g[0])  # keep training, then restore step 3

    with ocp.CheckpointManager(tmp_path / "orbax") as mngr:
        assert mngr.latest_step() == 3
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, params)
        restored = mngr.restore(3, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract), tables=deo.TablesRestore({"emb": t2})))
    np.testing.assert_array_equal(restored.params["w"], params["w"])
    emb = restored.tables["emb"]
    assert emb.id == t.id and int(emb.step) == 3 and emb.optimizer == t.optimizer
    for a, b in zip(saved, _rows_and_slots(emb)):
        np.testing.assert_array_equal(a, b)

    # Without targets (e.g. a fresh process): new tables from the checkpoint.
    with ocp.CheckpointManager(tmp_path / "orbax") as mngr:
        fresh = mngr.restore(3, args=ocp.args.Composite(tables=deo.TablesRestore()))
    for a, b in zip(saved, _rows_and_slots(fresh.tables["emb"])):
        np.testing.assert_array_equal(a, b)
    # The item is a plain dualemb checkpoint too.
    assert dej.checkpoint.table_names(tmp_path / "orbax" / "3" / "tables" / "dualemb") == ["emb"]


def test_checkpoint_written_by_core_with_keras_optimizer_continues_in_jax(tmp_path):
    """As a TF-trained table would be: Keras-flavored Adam, step in the manifest, no JAX
    metadata (so the learning rate must be given)."""
    from dualemb.core import optimizers as core_opts
    spec = core_opts.make("adam", flavor="keras", beta_1=0.9, beta_2=0.999, epsilon=1e-7)
    tf_like = CoreTable(DIM, initializer=dej.initializers.normal(0, 0.1, seed=2), optimizer=spec)
    g = np.random.RandomState(3).randn(len(IDS), DIM).astype(np.float32)
    for step in range(1, 6):
        tf_like.apply_gradients(IDS, g, lr=0.01, step=step)
    core_ckpt.save(tmp_path / "ck", {"emb": tf_like}, steps={"emb": 5})
    with pytest.raises(ValueError, match="learning_rate"):
        dej.load(tmp_path / "ck")
    t = dej.load(tmp_path / "ck", learning_rate=0.01)
    assert t.optimizer.flavor == "keras" and int(t.step) == 5
    t = _continue(t, g)
    tf_like.apply_gradients(IDS, g, lr=0.01, step=6)
    np.testing.assert_array_equal(t.core().find(IDS)[0], tf_like.find(IDS)[0])

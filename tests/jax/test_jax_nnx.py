"""Flax NNX: the Embed module and its training helpers."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import dualemb.jax as dej
from dualemb.jax import nnx as denn

DIM = 8


class Model(nnx.Module):
    def __init__(self, rngs, shared=False):
        init = dej.initializers.normal(0.0, 0.1, seed=0)
        self.user = denn.Embed(DIM, initializer=init, optimizer=dej.optimizers.sgd(0.5))
        self.item = self.user if shared else denn.Embed(
            DIM, initializer=init, optimizer=dej.optimizers.adagrad(0.1))
        self.out = nnx.Linear(2 * DIM, 1, rngs=rngs)

    def __call__(self, users, items):
        x = jnp.concatenate([self.user(users).sum(-2), self.item(items).sum(-2)], -1)
        return self.out(jnp.tanh(x)).squeeze(-1)


def _loss(model, users, items, y):
    return jnp.mean((model(users, items) - y) ** 2)


def _data(seed=0, n=16):
    rs = np.random.RandomState(seed)
    users = rs.randint(0, 10, size=(n, 2)).astype(np.int64) * (2**40) + 3
    items = rs.randint(0, 10, size=(n, 3)).astype(np.int64)
    y = rs.rand(n).astype(np.float32)
    return dej.ids(users), dej.ids(items), y


def test_row_gradients_match_the_functional_path():
    model = Model(nnx.Rngs(0))
    users, items, y = _data()
    (loss, grads, emb) = nnx.jit(
        lambda m, u, i, y: denn.value_and_grad(_loss)(m, u, i, y))(model, users, items, y)
    ut, it = model.user.table.get_value(), model.item.table.get_value()
    ru, ri = dej.lookup(ut, users), dej.lookup(it, items)

    def f(out, ru, ri):
        x = jnp.concatenate([ru.sum(-2), ri.sum(-2)], -1)
        return jnp.mean((out(jnp.tanh(x)).squeeze(-1) - y) ** 2)

    g_u, g_i = jax.grad(f, argnums=(1, 2))(model.out, ru, ri)
    np.testing.assert_allclose(float(loss), float(f(model.out, ru, ri)), rtol=1e-6)
    (u_ids, u_g), = emb["user"]
    (i_ids, i_g), = emb["item"]
    np.testing.assert_allclose(u_g, g_u, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(i_g, g_i, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(u_ids.numpy(), users.numpy())
    assert set(grads["out"]) == {"kernel", "bias"}


def test_end_to_end_training_reduces_the_loss():
    model = Model(nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    def train_step(model, opt, users, items, y):
        loss, grads, emb = denn.value_and_grad(_loss)(model, users, items, y)
        opt.update(model, grads)
        denn.apply_gradients(model, emb)
        return loss

    users, items, y = _data()
    losses = [float(train_step(model, opt, users, items, y)) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]
    assert int(model.user.table.get_value().step) == 30
    assert int(dej.size(model.item.table.get_value())) == len(np.unique(items.numpy()))


def test_shared_embed_gets_one_combined_update():
    model = Model(nnx.Rngs(0), shared=True)
    users, items, y = _data()
    before_rows = np.asarray(dej.lookup(model.user.table.get_value(), users))

    @nnx.jit
    def step(model, users, items, y):
        loss, grads, emb = denn.value_and_grad(_loss)(model, users, items, y)
        denn.apply_gradients(model, emb)
        return emb

    emb = step(model, users, items, y)
    (calls,) = emb.values()  # one table, called twice
    assert len(calls) == 2
    t = model.user.table.get_value()
    assert int(t.step) == 1
    # Same as one sgd step on the concatenated batch.
    ids = np.concatenate([e[0].numpy().reshape(-1) for e in calls])
    g = np.concatenate([np.asarray(e[1]).reshape(-1, DIM) for e in calls])
    total = {}
    for k, gg in zip(ids, g):
        total[k] = total.get(k, 0) + gg
    k0 = users.numpy()[0, 0]
    np.testing.assert_allclose(dej.lookup(t, [k0])[0], before_rows[0, 0] - 0.5 * total[k0],
                               rtol=1e-5, atol=1e-6)


def test_plain_calls_are_lookups_and_model_splits():
    model = Model(nnx.Rngs(0))
    users, items, _ = _data()
    out = nnx.jit(lambda m, u, i: m(u, i))(model, users, items)
    assert out.shape == (16,)
    assert int(dej.size(model.user.table.get_value())) == 0  # lookups do not insert
    graphdef, state = nnx.split(model)
    again = nnx.merge(graphdef, state)
    np.testing.assert_array_equal(again(users, items), out)


def test_embed_wraps_existing_table_and_checks_dim():
    t = dej.create(DIM)
    e = denn.Embed(DIM, table=t)
    assert e.table.get_value().id == t.id
    with pytest.raises(ValueError, match="dim"):
        denn.Embed(DIM + 1, table=t)


# ---- habits that used to skip the tables silently (issue 9, item 10) ---------------------------

def _rows(model, users, items):
    return (np.asarray(dej.lookup(model.user.table.get_value(), users)),
            np.asarray(dej.lookup(model.item.table.get_value(), items)))


def _trained_model(steps=3):
    model = Model(nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    def train_step(model, opt, users, items, y):
        loss, grads, emb = denn.value_and_grad(_loss)(model, users, items, y)
        opt.update(model, grads)
        denn.apply_gradients(model, emb)
        return loss

    users, items, y = _data()
    for _ in range(steps):
        train_step(model, opt, users, items, y)
    return model, opt


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_plain_nnx_value_and_grad_raises_and_leaves_tables_untouched(jit):
    model, opt = _trained_model()
    users, items, y = _data()
    before = _rows(model, users, items)
    kernel = np.asarray(model.out.kernel[...])

    def step(model, opt, users, items, y):
        loss, grads = nnx.value_and_grad(_loss)(model, users, items, y)
        opt.update(model, grads)
        return loss

    with pytest.raises(TypeError, match=r"dualemb\.jax\.nnx\.value_and_grad"):
        (nnx.jit(step) if jit else step)(model, opt, users, items, y)
    with pytest.raises(TypeError, match=r"dualemb\.jax\.nnx\.value_and_grad"):
        nnx.grad(_loss)(model, users, items, y)
    after = _rows(model, users, items)
    np.testing.assert_array_equal(after[0], before[0])
    np.testing.assert_array_equal(after[1], before[1])
    np.testing.assert_array_equal(model.out.kernel[...], kernel)


def test_dualemb_value_and_grad_still_gives_zero_guard_gradients_and_trains_tables():
    model, _ = _trained_model()
    users, items, y = _data()
    before = _rows(model, users, items)
    _, grads, emb = denn.value_and_grad(_loss)(model, users, items, y)
    assert float(grads["user"]["dualemb_grad_guard"][...]) == 0.0
    denn.apply_gradients(model, emb)
    assert not np.allclose(_rows(model, users, items)[0], before[0])
    # Inference (no differentiation) is a plain lookup.
    np.testing.assert_array_equal(model.user(users), dej.lookup(model.user.table.get_value(),
                                                                users))


def test_standard_orbax_save_of_nnx_state_refuses_instead_of_saving_no_rows(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    model, _ = _trained_model()
    with ocp.StandardCheckpointer() as ck:
        with pytest.raises(ValueError, match=r"dualemb\.jax\.orbax\.TablesSave"):
            ck.save(tmp_path / "state", nnx.state(model))
        with pytest.raises(ValueError, match=r"dualemb\.jax\.orbax\.TablesSave"):
            ck.save(tmp_path / "pure", nnx.to_pure_dict(nnx.state(model)))
        with pytest.raises(ValueError, match=r"dualemb\.jax\.orbax\.TablesSave"):
            ck.save(tmp_path / "dict", {"t": model.user.table.get_value()})
        # A restore whose target holds the tables is refused the same way.
        dense = nnx.state(model, nnx.Not(denn.EmbeddingTable))
        ck.save(tmp_path / "dense", dense)
        ck.wait_until_finished()
        with pytest.raises(ValueError, match=r"dualemb\.jax\.orbax\.TablesSave"):
            ck.restore(tmp_path / "dense", nnx.state(Model(nnx.Rngs(1))))
    # Key paths still print (the keys are only unknown to Orbax).
    paths = [jax.tree_util.keystr(p) for p, _ in
             jax.tree_util.tree_leaves_with_path(model.user.table.get_value())]
    assert paths[:3] == [".handle", ".version", ".step"]
    assert all(p.split("[")[0] in (".handle", ".version", ".step", ".opt_code", ".slot_tables")
               for p in paths), paths


def test_documented_orbax_recipe_restores_a_fresh_model(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    from dualemb.jax import orbax as deo

    model, _ = _trained_model()
    users, items, y = _data()
    expected = np.asarray(model(users, items))

    def dense(m):
        return nnx.state(m, nnx.Not(denn.EmbeddingTable))

    with ocp.CheckpointManager(tmp_path / "ck") as mngr:
        mngr.save(3, args=ocp.args.Composite(state=ocp.args.StandardSave(dense(model)),
                                             tables=deo.TablesSave(denn.tables(model))))
        mngr.wait_until_finished()
    fresh = Model(nnx.Rngs(7))
    assert not np.allclose(fresh(users, items), expected)
    with ocp.CheckpointManager(tmp_path / "ck") as mngr:
        restored = mngr.restore(3, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(dense(fresh)),
            tables=deo.TablesRestore(denn.tables(fresh))))
    nnx.update(fresh, restored.state)
    denn.set_tables(fresh, restored.tables)
    np.testing.assert_allclose(fresh(users, items), expected, rtol=1e-6, atol=1e-7)
    for a, b in zip(_rows(fresh, users, items), _rows(model, users, items)):
        np.testing.assert_array_equal(a, b)
    assert int(fresh.user.table.get_value().step) == 3
    assert fresh.user.table.get_value().id != model.user.table.get_value().id
    with pytest.raises(KeyError, match="no Embed"):
        denn.set_tables(fresh, {"nope": fresh.user.table.get_value()})

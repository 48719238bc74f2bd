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

"""Flax linen: dej.linen.Embed trained with dej.linen.value_and_grad / apply_gradients equals a
dense jnp embedding matrix trained by the same Optax optimizer.

Every batch holds every id (plus duplicates), so the table's sparse (lazy) update and the dense
matrix's update agree; the dense reference gathers rows from the matrix by position.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dualemb.jax as dej
from dualemb.jax import linen as deln

DIM, V, STEPS, LR = 4, 5, 6, 0.05
KEYS = np.array([7, 2**40 + 1, -9, 123, 2**35], np.int64)


class Model(nn.Module):
    optimizer: object = None

    @nn.compact
    def __call__(self, ids):
        emb = deln.Embed(DIM, initializer=dej.initializers.normal(0.0, 0.3, seed=3),
                         optimizer=self.optimizer, name="user")
        x = jnp.tanh(emb(ids).sum(-2))
        return nn.Dense(1, kernel_init=nn.initializers.normal(0.5))(x).squeeze(-1)


def _batches(seed=0):
    rs = np.random.RandomState(seed)
    out = []
    for _ in range(STEPS):
        pos = np.concatenate([rs.permutation(V), rs.randint(0, V, size=3)])
        rs.shuffle(pos)
        pos = pos.reshape(-1, 2)  # [4, 2]: every id at least once
        out.append((pos, rs.rand(pos.shape[0]).astype(np.float32)))
    return out


def _train_linen(model, tx):
    ids0 = dej.ids(KEYS[_batches()[0][0]])
    variables = model.init(jax.random.key(0), ids0)
    params, tables = variables["params"], variables["dualemb"]
    init_params = params
    init_rows = np.asarray(dej.lookup(deln.tables(tables)["user"], KEYS))
    opt_state = tx.init(params)

    @jax.jit
    def step(params, tables, opt_state, ids, y):
        def loss_fn(params):
            pred = model.apply({"params": params, "dualemb": tables}, ids)
            return jnp.mean((pred - y) ** 2)
        loss, grads, emb_grads = deln.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, deln.apply_gradients(tables, emb_grads), opt_state, loss

    losses = []
    for pos, y in _batches():
        params, tables, opt_state, loss = step(params, tables, opt_state, dej.ids(KEYS[pos]), y)
        losses.append(float(loss))
    assert step._cache_size() == 1
    return init_params, init_rows, params, tables, losses


def _train_dense(init_params, init_rows, tx):
    """The same model with a dense [V, DIM] matrix in place of the table, all trained by tx."""
    dense = {"emb": jnp.asarray(init_rows), "Dense_0": init_params["Dense_0"]}
    opt_state = tx.init(dense)

    def forward(p, pos):
        x = jnp.tanh(p["emb"][pos].sum(-2))
        return (x @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"]).squeeze(-1)

    @jax.jit
    def step(p, opt_state, pos, y):
        loss, g = jax.value_and_grad(lambda p: jnp.mean((forward(p, pos) - y) ** 2))(p)
        updates, opt_state = tx.update(g, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss

    losses = []
    for pos, y in _batches():
        dense, opt_state, loss = step(dense, opt_state, jnp.asarray(pos), y)
        losses.append(float(loss))
    return dense, losses


@pytest.mark.parametrize("name", ["sgd", "adam", "adagrad"])
def test_linen_training_equals_a_dense_matrix_trained_by_the_same_optax_optimizer(name):
    model = Model(optimizer=getattr(dej.optimizers, name)(LR))
    init_params, init_rows, params, tables, losses = _train_linen(model, getattr(optax, name)(LR))
    dense, dense_losses = _train_dense(init_params, init_rows, getattr(optax, name)(LR))
    table = deln.tables(tables)["user"]
    assert int(table.step) == STEPS
    trained = np.asarray(dej.lookup(table, KEYS))
    assert not np.allclose(trained, init_rows)
    np.testing.assert_allclose(trained, dense["emb"], rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(params["Dense_0"]["kernel"], dense["Dense_0"]["kernel"],
                               rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(losses, dense_losses, rtol=2e-5, atol=2e-6)
    assert float(params["user"]["dualemb_grad_guard"]) == 0.0
    dej.destroy(table)


class TiedModel(nn.Module):
    """A table used twice: the input rows and the tied output embedding (attend)."""

    @nn.compact
    def __call__(self, ids, candidates):
        emb = deln.Embed(DIM, initializer=dej.initializers.normal(0.0, 0.3, seed=5),
                         optimizer=dej.optimizers.sgd(LR), name="item")
        return emb.attend(emb(ids).sum(-2), candidates)  # [batch, n candidates]


def test_attend_over_candidates_is_a_tied_output_embedding_trained_with_one_combined_step():
    model = TiedModel()
    cands = dej.ids(KEYS[:3])
    batches = _batches(seed=1)
    variables = model.init(jax.random.key(0), dej.ids(KEYS[batches[0][0]]), cands)
    tables = variables["dualemb"]
    emb = jnp.asarray(dej.lookup(deln.tables(tables)["item"], KEYS))

    def loss_of(logits, y):
        return jnp.mean((logits[:, 0] - y) ** 2)

    @jax.jit
    def step(tables, ids, y):
        loss, _, emb_grads = deln.value_and_grad(
            lambda p: loss_of(model.apply({"params": p, "dualemb": tables}, ids, cands), y))(
            variables["params"])
        assert len(emb_grads["item"]) == 2  # __call__ and attend: one combined update
        return deln.apply_gradients(tables, emb_grads)

    for pos, y in batches:
        tables = step(tables, dej.ids(KEYS[pos]), y)
        g = jax.grad(lambda e: loss_of(e[pos].sum(-2) @ e[:3].T, y))(emb)
        emb = emb - LR * g
    table = deln.tables(tables)["item"]
    assert int(table.step) == STEPS
    np.testing.assert_allclose(dej.lookup(table, KEYS), emb, rtol=2e-5, atol=2e-6)
    dej.destroy(table)


def test_attend_without_candidates_raises_and_says_why():
    model = TiedModel()
    with pytest.raises(TypeError, match="no vocabulary"):
        model.init(jax.random.key(0), dej.ids(KEYS[:2]), None)


def test_plain_jax_grad_raises_instead_of_leaving_the_table_untrained():
    model = Model(optimizer=dej.optimizers.sgd(LR))
    ids = dej.ids(KEYS[_batches()[0][0]])
    variables = model.init(jax.random.key(0), ids)
    table = deln.tables(variables)["user"]
    before = np.asarray(dej.lookup(table, KEYS))

    def loss_fn(params):
        return jnp.mean(model.apply({"params": params, "dualemb": variables["dualemb"]}, ids))

    with pytest.raises(TypeError, match=r"dualemb\.jax\.linen\.value_and_grad"):
        jax.grad(loss_fn)(variables["params"])
    with pytest.raises(TypeError, match=r"dualemb\.jax\.linen\.value_and_grad"):
        jax.jit(jax.value_and_grad(loss_fn))(variables["params"])
    np.testing.assert_array_equal(dej.lookup(table, KEYS), before)
    # Inference is a plain lookup, and inserts nothing.
    out = model.apply(variables, ids)
    assert out.shape == (ids.shape[0],) and int(dej.size(table)) == 0
    dej.destroy(table)


def test_existing_table_tables_and_set_tables():
    t = dej.create(DIM, optimizer=dej.optimizers.sgd(LR))
    ids = dej.ids(KEYS[:2])
    variables = deln.Embed(DIM, table=t).init(jax.random.key(0), ids)
    assert list(deln.tables(variables)) == [""] and deln.tables(variables)[""].id == t.id
    with pytest.raises(ValueError, match="dim"):
        deln.Embed(DIM + 1, table=t).init(jax.random.key(0), ids)
    other = dej.create(DIM)
    swapped = deln.set_tables(variables["dualemb"], {"": other})
    assert deln.tables(swapped)[""].id == other.id
    with pytest.raises(KeyError, match="no Embed table"):
        deln.set_tables(variables["dualemb"], {"nope": other})
    wrong = dej.create(DIM + 1)
    with pytest.raises(ValueError, match="cannot take"):
        deln.set_tables(variables["dualemb"], {"": wrong})
    with pytest.raises(KeyError, match="no Embed table"):
        deln.apply_gradients(variables["dualemb"], {"nope": [(ids, jnp.zeros((2, DIM)))]})
    for x in (t, other, wrong):
        dej.destroy(x)


def test_the_linen_example_trains_keeps_the_best_checkpoint_and_restores_it(tmp_path):
    # The example asserts that the kept best step is the lowest eval loss and that restoring it
    # into new tables gives that loss again.
    import subprocess
    import sys
    from pathlib import Path
    example = Path(__file__).resolve().parents[2] / "examples" / "jax_linen_train.py"
    out = subprocess.run([sys.executable, str(example), "--steps", "100", "--batch", "128",
                          "--ckpt", str(tmp_path / "ck")], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "best checkpoint (step" in out.stdout and "kept steps [50, 100]" in out.stdout

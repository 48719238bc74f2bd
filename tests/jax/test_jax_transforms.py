"""dualemb.jax under jit, grad, vmap, lax.scan / fori_loop, and several tables per step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dualemb.jax as dej

DIM = 4
VOCAB = np.array([3, 2**40 + 1, 17, -5, 2**50], np.int64)


def _table(lr=0.1, dim=DIM, seed=0):
    return dej.create(dim, initializer=dej.initializers.uniform(-0.5, 0.5, seed=seed),
                      optimizer=dej.optimizers.sgd(lr))


def _batches(steps=6, batch=(3, 4), seed=0):
    rs = np.random.RandomState(seed)
    idx = rs.randint(0, len(VOCAB), size=(steps,) + batch)
    return VOCAB[idx], rs.randn(steps, batch[0]).astype(np.float32)


def _loss(params, rows, y):
    pred = jnp.tanh(rows.sum(axis=-2) @ params["w"]).squeeze(-1)
    return jnp.mean((pred - y) ** 2)


def _params():
    return {"w": jnp.linspace(-1.0, 1.0, DIM).reshape(DIM, 1)}


def test_grad_gives_per_row_grads_and_duplicates_sum_like_dense():
    t = _table(lr=0.5)
    ids, y = _batches(1)
    ids, y = ids[0], y[0]
    assert len(np.unique(ids)) < ids.size  # duplicates present
    dense = np.asarray(dej.lookup(t, VOCAB))  # the same rows, as a dense matrix
    pos = np.searchsorted(np.sort(VOCAB), ids)
    order = np.argsort(VOCAB)
    index = order[pos]

    rows = dej.lookup(t, ids)
    g_rows = jax.grad(_loss, argnums=1)(_params(), rows, y)
    assert g_rows.shape == ids.shape + (DIM,)
    t = dej.apply_gradients(t, ids, g_rows)

    g_dense = jax.grad(lambda e: _loss(_params(), e[index], y))(jnp.asarray(dense))
    np.testing.assert_allclose(dej.lookup(t, VOCAB), dense - 0.5 * np.asarray(g_dense),
                               rtol=1e-5, atol=1e-6)
    dej.destroy(t)


def test_grad_through_a_function_that_takes_the_table():
    """A table inside the pytree given to plain jax.grad (no allow_int) is fine: it gets zero
    cotangents, and the rows' gradient flows to the other parameters. Regression: the table's
    int32 leaves made jax.grad raise."""
    t = _table()
    ids = dej.ids(VOCAB[:3])

    def f(state):
        rows = dej.lookup(state["table"], ids)
        found, _ = dej.find(state["table"], ids)  # any read of the table, not only lookup
        return jnp.sum(rows * state["scale"]) + 0.0 * jnp.sum(found)

    params = {"table": t, "scale": jnp.float32(2.0)}
    for grad in (jax.grad(f), jax.jit(jax.grad(f))):
        g = grad(params)
        np.testing.assert_allclose(g["scale"], jnp.sum(dej.lookup(t, ids)), rtol=1e-6)
        assert all(np.all(np.asarray(leaf) == 0)
                   for leaf in jax.tree_util.tree_leaves(g["table"]))
    # The usual update of the whole pytree leaves the table as it was, and usable.
    new = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, g)
    assert new["table"].id == t.id
    np.testing.assert_array_equal(dej.lookup(new["table"], ids), dej.lookup(t, ids))
    dej.destroy(t)


def test_grad_with_a_generic_optimizer_table_in_the_pytree():
    """The generic path's integer state (Optax's count) is a table leaf too: it must not make
    jax.grad raise either."""
    optax = pytest.importorskip("optax")
    t = dej.create(DIM, optimizer=optax.adam(0.1))
    ids = dej.ids(VOCAB[:3])
    t = dej.apply_gradients(t, ids, np.ones((3, DIM), np.float32))
    g = jax.grad(lambda s: jnp.sum(dej.lookup(s["t"], ids) * s["w"]))(
        {"t": t, "w": jnp.float32(1.0)})
    assert all(np.all(np.asarray(leaf) == 0) for leaf in jax.tree_util.tree_leaves(g["t"]))
    assert int(t.opt_state[0]) == 1 and t.opt_state[0].dtype == jnp.int32  # Optax's count
    dej.destroy(t)


def test_weight_decay_on_a_pytree_holding_the_table_is_refused():
    """An optimizer that changes zero-gradient leaves (weight decay) corrupts the table's
    handle and step count: the next call refuses them instead of reading another table or
    training with a wrong step."""
    optax = pytest.importorskip("optax")
    t = dej.apply_gradients(_table(), dej.ids(VOCAB[:3]), np.ones((3, DIM), np.float32))
    params = {"table": t, "w": jnp.ones((DIM,))}
    tx = optax.adamw(0.1, weight_decay=0.5)
    grads = jax.tree_util.tree_map(jnp.zeros_like, params)
    updates, _ = tx.update(grads, tx.init(params), params)
    bad = optax.apply_updates(params, updates)["table"]
    with pytest.raises(ValueError, match="corrupted table handle"):
        dej.lookup(bad, VOCAB[:1])
    with pytest.raises(Exception, match="corrupted table handle"):
        jax.block_until_ready(jax.jit(dej.lookup)(bad, dej.ids(VOCAB[:1])))
    # Only the step corrupted: apply_gradients refuses it, the table is unchanged.
    before = np.asarray(dej.lookup(t, VOCAB[:3]))
    bad_step = jax.tree_util.tree_unflatten(
        jax.tree_util.tree_structure(t),
        [leaf * 0.75 if i == 2 else leaf
         for i, leaf in enumerate(jax.tree_util.tree_leaves(t))])
    with pytest.raises(Exception, match="corrupted step count"):
        jax.block_until_ready(jax.jit(dej.apply_gradients)(
            bad_step, dej.ids(VOCAB[:3]), np.ones((3, DIM), np.float32)).version)
    np.testing.assert_array_equal(dej.lookup(t, VOCAB[:3]), before)
    dej.destroy(t)


def test_vmap_lookup_find_and_grad():
    t = _table()
    ids, y = _batches(1, batch=(5, 3))
    ids, y = ids[0], y[0]
    batched = jax.vmap(lambda i: dej.lookup(t, i))(dej.ids(ids))
    np.testing.assert_array_equal(batched, dej.lookup(t, ids))
    rows, exists = jax.jit(jax.vmap(lambda i: dej.find(t, i)))(dej.ids(ids))
    assert rows.shape == (5, 3, DIM) and exists.shape == (5, 3)

    per_example = jax.vmap(
        lambda i, yy: jax.grad(lambda r: _loss(_params(), r[None], yy[None]))(dej.lookup(t, i))
    )(dej.ids(ids), y)
    assert per_example.shape == (5, 3, DIM)
    dej.destroy(t)


def test_vmap_apply_gradients_is_one_update_of_the_whole_batch():
    """Under vmap the whole batch goes to the core in one call (duplicates summed)."""
    t1, t2 = _table(seed=1), _table(seed=1)
    ids, _ = _batches(1, batch=(4, 3))
    ids = ids[0]
    g = np.random.RandomState(2).randn(4, 3, DIM).astype(np.float32)
    t1 = dej.apply_gradients(t1, ids, g)
    version = jax.vmap(lambda i, gg: dej.apply_gradients(t2, i, gg).version)(dej.ids(ids), g)
    jax.block_until_ready(version)
    np.testing.assert_allclose(t2.core().find(VOCAB)[0], t1.core().find(VOCAB)[0], rtol=1e-6)
    dej.destroy(t1)
    dej.destroy(t2)


def _train_python_loop(t, params, ids, y, lr=0.05):
    step = jax.jit(_train_step)
    losses = []
    for i in range(len(ids)):
        t, params, loss = step(t, params, dej.ids(ids[i]), y[i], lr)
        losses.append(loss)
    return t, params, jnp.stack(losses)


def _train_step(t, params, ids, y, lr=0.05):
    rows = dej.lookup(t, ids)
    loss, (gp, gr) = jax.value_and_grad(_loss, argnums=(0, 1))(params, rows, y)
    t = dej.apply_gradients(t, ids, gr)
    params = jax.tree_util.tree_map(lambda p, g: p - lr * g, params, gp)
    return t, params, loss


def test_scan_and_fori_loop_training_match_a_python_loop():
    ids, y = _batches(8)
    ref_t, ref_p, ref_losses = _train_python_loop(_table(seed=5), _params(), ids, y)
    ref_rows = np.asarray(dej.lookup(ref_t, VOCAB))

    @jax.jit
    def scan_train(t, params, ids, y):
        def body(carry, batch):
            t, params = carry
            t, params, loss = _train_step(t, params, batch[0], batch[1])
            return (t, params), loss
        (t, params), losses = jax.lax.scan(body, (t, params), (ids, y))
        return t, params, losses

    t, p, losses = scan_train(_table(seed=5), _params(), dej.ids(ids), y)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    np.testing.assert_allclose(dej.lookup(t, VOCAB), ref_rows, rtol=1e-6)
    assert int(t.step) == 8

    @jax.jit
    def fori_train(t, params, ids, y):
        def body(i, carry):
            t, params = carry
            t, params, _ = _train_step(t, params, jax.tree_util.tree_map(lambda a: a[i], ids),
                                       y[i])
            return t, params
        return jax.lax.fori_loop(0, ids.shape[0], body, (t, params))

    t2, p2 = fori_train(_table(seed=5), _params(), dej.ids(ids), y)
    np.testing.assert_allclose(dej.lookup(t2, VOCAB), ref_rows, rtol=1e-6)
    np.testing.assert_allclose(p2["w"], ref_p["w"], rtol=1e-6)
    for tt in (ref_t, t, t2):
        dej.destroy(tt)


def test_several_tables_in_one_jitted_step():
    users = dej.create(8, initializer=dej.initializers.normal(0, 0.1, seed=1),
                       optimizer=dej.optimizers.adam(1e-2))
    items = dej.create(8, key_dtype="int32", initializer=dej.initializers.normal(0, 0.1, seed=2),
                       optimizer=dej.optimizers.adagrad(0.1))
    u = dej.ids(np.array([2**41, 7, 2**41, 9]))
    i = jnp.asarray([1, 2, 3, 1], jnp.int32)

    @jax.jit
    def step(users, items, u, i):
        ru, ri = dej.lookup(users, u), dej.lookup(items, i)
        loss_fn = lambda a, b: jnp.mean((jnp.sum(a * b, -1) - 1.0) ** 2)
        gu, gi = jax.grad(loss_fn, argnums=(0, 1))(ru, ri)
        return (dej.apply_gradients(users, u, gu), dej.apply_gradients(items, i, gi),
                loss_fn(ru, ri))

    losses = []
    for _ in range(20):
        users, items, loss = step(users, items, u, i)
        losses.append(float(loss))
    assert losses[-1] < losses[0]
    assert int(users.step) == 20 and int(items.step) == 20
    assert int(dej.size(users)) == 3 and int(dej.size(items)) == 3
    dej.destroy(users)
    dej.destroy(items)


def test_jit_does_not_retrace_per_step():
    t = _table()
    traces = []

    @jax.jit
    def f(t, ids):
        traces.append(1)
        return dej.apply_gradients(t, ids, jnp.ones(ids.shape + (DIM,)))

    for _ in range(5):
        t = f(t, dej.ids(VOCAB))
    assert len(traces) == 1
    dej.destroy(t)

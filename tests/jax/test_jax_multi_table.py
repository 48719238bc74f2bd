"""dualemb.jax's multi-table calls (lookup_many, find_many, find_or_insert_many,
apply_gradients_many: one FFI call for every table) against the per-table calls on twin tables,
bit for bit (rows, optimizer slots, metadata, steps), on the FFI and on the host-callback path;
and dualemb.jax.nnx's grouped lookups and optimizer step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dualemb.jax as dej
from dualemb.jax import _ffi

ADAM = dict(b1=0.9, b2=0.999, eps=1e-8)
# name: (dim, value dtype, optimizer)
SPECS = {"user": (8, "float32", lambda: dej.optimizers.adam(0.01, **ADAM)),
         "item": (3, "float32", lambda: dej.optimizers.adagrad(0.1)),
         "half": (4, "float16", lambda: dej.optimizers.adam(0.02, **ADAM))}


@pytest.fixture(params=["ffi", "host_callback"])
def path(request, monkeypatch):
    """Both lowerings of every call (the host-callback twin is chosen when a call is traced)."""
    if request.param == "ffi" and jax.default_backend() != "cpu":
        pytest.skip("the host tables' native FFI handlers are registered for the CPU platform "
                    f"only; on the {jax.default_backend()!r} backend host tables use callbacks")
    monkeypatch.setattr(_ffi, "_FORCED", "1" if request.param == "host_callback" else "0")
    jax.clear_caches()  # the lowering is chosen at trace time: trace again
    yield request.param
    jax.clear_caches()


def _make():
    return {k: dej.create(d, value_dtype=vd, optimizer=opt(),
                          initializer=dej.initializers.normal(0.0, 0.1, seed=i + 1))
            for i, (k, (d, vd, opt)) in enumerate(SPECS.items())}


@pytest.fixture
def twins():
    a, b = _make(), _make()
    yield a, b
    for t in list(a.values()) + list(b.values()):
        dej.destroy(t)


def _state(t):
    e = t.core().export()
    order = np.argsort(e["keys"], kind="stable")
    return {k: v[order] for k, v in e.items()}, t.core().clock


def _assert_same_tables(a: dict, b: dict):
    for k in a:
        (ea, ca), (eb, cb) = _state(a[k]), _state(b[k])
        for f in ea:
            np.testing.assert_array_equal(ea[f].view(np.uint8), eb[f].view(np.uint8),
                                          err_msg=f"{k}/{f}")
        assert ca == cb
        assert int(a[k].step) == int(b[k].step)


def _batch(step):
    """Ids with duplicates and ids never seen before; a different shape per table."""
    rng = np.random.default_rng(step)
    shapes = {"user": (6, 2), "item": (9,), "half": (5,)}
    ids = {k: rng.integers(0, 8, s).astype(np.int64) for k, s in shapes.items()}
    ids["item"][-1] = 10**12 + step  # new, and beyond int32
    return {k: dej.ids(v) for k, v in ids.items()}


def _loss(rows):
    return sum(jnp.sum(jnp.sin(r.astype(jnp.float32)) * (i + 1))
               for i, r in enumerate(jax.tree_util.tree_leaves(rows)))


@jax.jit
def _step_many(tables, ids):
    rows = dej.lookup_many(tables, ids)
    loss, g = jax.value_and_grad(_loss)(rows)
    return dej.apply_gradients_many(tables, ids, g), rows, loss


@jax.jit
def _step_single(tables, ids):
    rows = {k: dej.lookup(t, ids[k]) for k, t in tables.items()}
    loss, g = jax.value_and_grad(_loss)(rows)
    return {k: dej.apply_gradients(t, ids[k], g[k]) for k, t in tables.items()}, rows, loss


def test_training_step_equals_per_table_calls(twins, path):
    many, single = twins
    text = _step_many.lower(many, _batch(0)).as_text()
    assert ("dualemb_apply_gradients_many" in text) == (path == "ffi")
    for step in range(3):
        ids = _batch(step)
        many, rows_m, loss_m = _step_many(many, ids)
        single, rows_s, loss_s = _step_single(single, ids)
        for k in rows_m:
            assert rows_m[k].dtype == rows_s[k].dtype and rows_m[k].shape == rows_s[k].shape
            np.testing.assert_array_equal(np.asarray(rows_m[k]), np.asarray(rows_s[k]))
        assert float(loss_m) == float(loss_s)
    _assert_same_tables(many, single)
    assert {int(t.step) for t in many.values()} == {3}
    # A write's result orders later reads: the next lookup sees the last update.
    ids = _batch(0)
    got = dej.lookup_many(many, ids)
    for k, t in single.items():
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(dej.lookup(t, ids[k])))


def test_find_and_find_or_insert_equal_per_table(twins, path):
    many, single = twins
    ids = _batch(5)
    rows, exists = jax.jit(dej.find_many)(many, ids)
    for k, t in single.items():
        r, e = dej.find(t, ids[k])
        np.testing.assert_array_equal(np.asarray(rows[k]), np.asarray(r))
        np.testing.assert_array_equal(np.asarray(exists[k]), np.asarray(e))
    rows, exists, many2 = jax.jit(dej.find_or_insert_many)(many, ids)
    for k, t in single.items():
        r, e, single[k] = dej.find_or_insert(t, ids[k])
        np.testing.assert_array_equal(np.asarray(rows[k]), np.asarray(r))
        np.testing.assert_array_equal(np.asarray(exists[k]), np.asarray(e))
        assert not np.asarray(exists[k]).any()  # new tables (a repeat in one batch is new too)
    _assert_same_tables(many2, single)
    _, exists, _ = dej.find_or_insert_many(many2, ids)
    assert all(np.asarray(e).all() for e in exists.values())


def test_structures_lists_and_generic_optimizers():
    import optax
    fused = dej.create(2, optimizer=dej.optimizers.sgd(0.5))
    generic = dej.create(2, optimizer=optax.sgd(0.5))
    ref = [dej.create(2, optimizer=dej.optimizers.sgd(0.5)), dej.create(2, optimizer=optax.sgd(0.5))]
    try:
        ids = [np.array([1, 2, 1], np.int64), np.array([4], np.int64)]
        grads = [jnp.ones((3, 2)), jnp.full((1, 2), 2.0)]
        out = dej.apply_gradients_many([fused, generic], ids, grads)
        assert isinstance(out, list) and len(out) == 2
        ref = [dej.apply_gradients(t, i, g) for t, i, g in zip(ref, ids, grads)]
        for a, b in zip(out, ref):
            np.testing.assert_array_equal(np.asarray(dej.lookup(a, np.arange(6))),
                                          np.asarray(dej.lookup(b, np.arange(6))))
        # An independent reference: SGD from the zero initializer, duplicates summed.
        np.testing.assert_array_equal(np.asarray(dej.lookup(out[0], np.array([1, 2]))),
                                      [[-1.0, -1.0], [-0.5, -0.5]])
        assert dej.lookup_many([], []) == []
    finally:
        for t in [fused, generic] + ref:
            dej.destroy(t)


def test_bad_input_in_one_table_changes_no_table(twins, path):
    many, _ = twins
    many, _, _ = _step_many(many, _batch(0))
    before = {k: _state(t) for k, t in many.items()}
    ids = _batch(1)
    grads = {k: jnp.ones(ids[k].shape + (SPECS[k][0],)) for k in many}
    bad = dict(grads, half=jnp.ones((4, 4)))
    with pytest.raises(ValueError, match="shape"):
        dej.apply_gradients_many(many, ids, bad)
    with pytest.raises(ValueError, match="structure"):
        dej.apply_gradients_many(many, ids, list(grads.values()))
    with pytest.raises(ValueError, match="appears twice"):
        dej.apply_gradients_many([many["user"], many["user"]], [ids["user"]] * 2,
                                 [grads["user"]] * 2)
    # Inside jit the repeat is found when the call runs.
    with pytest.raises(Exception, match="appears twice"):
        jax.block_until_ready(jax.jit(dej.apply_gradients_many)(
            [many["user"], many["user"]], [ids["user"]] * 2, [grads["user"]] * 2))
    # A destroyed table among live ones: the call fails when it runs, naming it; no table
    # changes.
    gone = dej.create(3, optimizer=dej.optimizers.sgd(0.1))
    dej.destroy(gone)
    with pytest.raises(Exception, match=r"table 3 of 4.*unknown table id"):
        out = jax.jit(dej.apply_gradients_many)(
            dict(many, zz=gone), dict(ids, zz=ids["item"]),
            dict(grads, zz=jnp.ones(ids["item"].shape + (3,))))
        jax.block_until_ready([t.version for t in out.values()])
    for k, t in many.items():
        after = _state(t)
        for f in before[k][0]:
            np.testing.assert_array_equal(after[0][f].view(np.uint8),
                                          before[k][0][f].view(np.uint8))
        assert after[1] == before[k][1]


def test_nnx_grouped_lookups_and_step_equal_per_module():
    import optax
    from flax import nnx

    class Model(nnx.Module):
        def __init__(self, grouped):
            self.grouped = grouped
            self.a = dej.nnx.Embed(4, optimizer=dej.optimizers.adam(0.05),
                                   initializer=dej.initializers.normal(0.0, 0.1, seed=1))
            self.b = dej.nnx.Embed(2, optimizer=dej.optimizers.adagrad(0.1),
                                   initializer=dej.initializers.normal(0.0, 0.1, seed=2))
            self.out = nnx.Linear(6, 1, rngs=nnx.Rngs(0))

        def __call__(self, ids):
            cols = [ids[:, 0], ids[:, 1]]
            if self.grouped:
                rows = dej.nnx.lookup_many([self.a, self.b], cols)
            else:
                rows = [self.a(cols[0]), self.b(cols[1])]
            return self.out(jnp.concatenate(rows, axis=1))

    def train(grouped):
        model = Model(grouped)
        opt = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)

        @nnx.jit
        def step(model, opt, ids, y):
            loss_fn = lambda m: jnp.mean((m(ids)[:, 0] - y) ** 2)
            loss, grads, emb_grads = dej.nnx.value_and_grad(loss_fn)(model)
            opt.update(model, grads)
            dej.nnx.apply_gradients(model, emb_grads)
            return loss

        rng = np.random.default_rng(0)
        losses = [float(step(model, opt, dej.ids(rng.integers(0, 6, (8, 2))),
                             jnp.asarray(rng.standard_normal(8), jnp.float32)))
                  for _ in range(3)]
        return model, losses

    m1, l1 = train(True)
    m2, l2 = train(False)
    try:
        assert l1 == l2
        for name in ("a", "b"):
            t1, t2 = getattr(m1, name).table.get_value(), getattr(m2, name).table.get_value()
            assert int(t1.step) == int(t2.step) == 3
            e1, e2 = t1.core().export(), t2.core().export()
            o1, o2 = np.argsort(e1["keys"]), np.argsort(e2["keys"])
            for f in ("keys", "values", "slots"):
                np.testing.assert_array_equal(e1[f][o1], e2[f][o2])
        # Plain nnx.grad through grouped lookups still refuses (the tables would not train).
        with pytest.raises(TypeError, match="value_and_grad"):
            nnx.grad(lambda m: jnp.sum(m(dej.ids(np.zeros((2, 2), np.int64)))))(m1)
    finally:
        for m in (m1, m2):
            dej.destroy(m.a.table.get_value())
            dej.destroy(m.b.table.get_value())

"""Table writes without a JAX effect (dualemb/jax/_write_primitive.py): kept, run once, and a
training step that jit dispatches on its fast path.

The references: the same write whose result is kept (rows and optimizer slots read from the
core), and the rows the core gives for the same gradients called directly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dualemb.jax as dej

DIM = 4
KEYS = np.arange(1, 9, dtype=np.int64)


@pytest.fixture(autouse=True)
def _cpu():
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def _table():
    return dej.create(DIM, optimizer=dej.optimizers.adam(0.1),
                      initializer=dej.initializers.normal(0.0, 0.1, seed=5))


def _grads(seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal((KEYS.size, DIM)),
                       jnp.float32)


def _state(t):
    """Rows of KEYS, and every exported column (keys, values, slots, last_update,
    update_count, stepped) sorted by key."""
    rows, exists = t.core().find(KEYS)
    ex = t.core().export()
    order = np.argsort(ex["keys"])
    return rows, exists, {name: np.asarray(col)[order] for name, col in ex.items()}


@pytest.mark.parametrize("write", ["apply_gradients", "insert", "find_or_insert"])
def test_a_write_whose_result_is_dropped_still_runs_once(write):
    # Inside jit a write's result may go unused (the table lives in the core, and the caller
    # returns something else): the write must still run, exactly once, as where it is kept.
    kept, dropped = _table(), _table()
    ids, g = dej.ids(KEYS), _grads()

    def call(t):
        if write == "apply_gradients":
            return dej.apply_gradients(t, ids, g)
        if write == "insert":
            return dej.insert(t, ids, g)
        return dej.find_or_insert(t, ids)[2]

    kept = jax.jit(call)(kept)
    jax.block_until_ready(kept.version)
    out = jax.jit(lambda t: (call(t), jnp.sum(g))[1])(dropped)
    jax.block_until_ready(out)
    rows_k, exists_k, export_k = _state(kept)
    rows_d, exists_d, export_d = _state(dropped)
    assert exists_d.all() and exists_k.all()
    np.testing.assert_array_equal(rows_d, rows_k)
    assert export_d.keys() == export_k.keys()
    for name in export_k:  # slots and update counts too: one write, not two
        np.testing.assert_array_equal(export_d[name], export_k[name], err_msg=name)
    dej.destroy(kept)
    dej.destroy(dropped)


def test_a_training_step_has_no_jax_effect_and_trains_as_the_core():
    # No effect in the step's jaxpr: jit keeps its C++ dispatch path. The rows it trains equal,
    # bit for bit, the core's own optimizer step on the same gradients (steps 1, 2, 3).
    t, ref = _table(), _table()
    ids, g = dej.ids(KEYS), _grads(1)

    def step(t, ids, g):
        rows = dej.lookup(t, ids)
        return dej.apply_gradients(t, ids, g + 0 * rows)

    assert jax.make_jaxpr(step)(t, ids, g).effects == set()
    jit_step = jax.jit(step)
    for n in range(1, 4):
        t = jit_step(t, ids, g)
        ref.core().apply_gradients(KEYS, np.asarray(g), 0.1, n)
    jax.block_until_ready(t.version)
    rows, _, export = _state(t)
    rows_ref, _, export_ref = _state(ref)
    np.testing.assert_array_equal(rows, rows_ref)
    np.testing.assert_array_equal(export["slots"], export_ref["slots"])
    dej.destroy(t)
    dej.destroy(ref)


def test_rematerialising_a_write_is_refused_with_a_clear_error():
    t = _table()
    ids = dej.ids(KEYS)

    def loss(w):
        rows, _, _ = dej.find_or_insert(t, ids)
        return jnp.sum(rows * w)

    with pytest.raises(NotImplementedError, match="cannot be rematerialised"):
        jax.grad(jax.checkpoint(loss))(jnp.ones((KEYS.size, DIM), jnp.float32))
    dej.destroy(t)

"""The generic path: any Optax transformation on a dynamic table."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dualemb.jax as dej
from test_jax_optimizers import DIM, KEYS, STEPS, _batches, _train_dense, _train_table

LR = 0.02


def _chain():
    # Not fused by the core: clipping, then Adam's scaling, then a learning-rate schedule.
    return optax.chain(optax.clip(1.0), optax.scale_by_adam(b1=0.8),
                       optax.scale_by_schedule(lambda c: -LR / (1.0 + 0.1 * c)))


@pytest.mark.parametrize("make", [_chain, lambda: optax.adam(LR),
                                  lambda: optax.chain(optax.add_decayed_weights(0.1),
                                                      optax.sgd(LR, momentum=0.9))])
def test_generic_path_matches_dense_optax(make):
    init, trained = _train_table(make())
    expected = _train_dense(make(), init)
    assert not np.allclose(trained, init)
    np.testing.assert_allclose(trained, expected, rtol=2e-5, atol=2e-6)


def test_generic_path_equals_fused_for_adam():
    _, generic = _train_table(optax.adam(LR))
    _, fused = _train_table(dej.optimizers.adam(LR))
    np.testing.assert_allclose(generic, fused, rtol=2e-5, atol=2e-6)


def test_generic_state_scalars_live_in_the_table_and_rows_are_sparse():
    t = dej.create(DIM, optimizer=_chain())
    assert t.optimizer.tx is not None and len(t.slot_tables) == 2  # mu, nu
    counts = [l for l in jax.tree_util.tree_leaves(t.opt_state)]
    assert all(np.asarray(c) == 0 for c in counts)
    g = np.ones((3, DIM), np.float32)
    t = jax.jit(dej.apply_gradients)(t, dej.ids([5, 5, 6]), g)
    assert int(t.step) == 1 and all(int(c) == 1 for c in jax.tree_util.tree_leaves(t.opt_state))
    assert int(dej.size(t)) == 2
    untouched = dej.lookup(t, [7])
    np.testing.assert_array_equal(untouched, np.zeros((1, DIM)))
    t = dej.erase(t, [5])
    assert int(dej.size(t)) == 1
    dej.destroy(t)


def _matrix_state_tx():
    def init(params):
        return {"m": jnp.zeros((params.shape[-1], params.shape[-1]))}

    def update(updates, state, params=None):
        return updates, state

    return optax.GradientTransformation(init, update)


def _param_copy_tx():
    # State that starts as a copy of the parameters (like schedule-free's z): a new row's state
    # would be unknown.
    return optax.GradientTransformation(lambda p: {"z": p}, lambda u, s, p=None: (u, s))


def test_transformations_the_generic_path_cannot_carry():
    with pytest.raises(TypeError, match="neither a per-row float leaf"):
        dej.create(DIM, optimizer=_matrix_state_tx())
    with pytest.raises(TypeError, match="depends on the parameters"):
        dej.create(DIM, optimizer=_param_copy_tx())
    with pytest.raises(TypeError, match="GradientTransformation"):
        dej.create(DIM, optimizer=object())


def test_transformation_needing_other_params_fails_clearly_and_leaves_table_unchanged():
    # lookahead wants LookaheadParams(fast, slow); the generic path hands it plain rows.
    t = dej.create(DIM, optimizer=optax.lookahead(optax.sgd(0.1), 5, 0.5))
    t = dej.insert(t, [1], np.ones((1, DIM), np.float32))
    with pytest.raises(TypeError, match="generic optimizer path cannot run"):
        dej.apply_gradients(t, [1, 2], np.ones((2, DIM), np.float32))
    np.testing.assert_array_equal(dej.lookup(t, [1]), np.ones((1, DIM)))
    assert int(dej.size(t)) == 1  # id 2 was not inserted
    assert int(t.step) == 0
    dej.destroy(t)

"""The generic path: any Optax transformation on a dynamic table."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dualemb.jax as dej
from test_jax_optimizers import DIM, KEYS, _train_dense, _train_table

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


# ---- duplicate ids and transformations that look across rows (issue 9, item 8) ----------------
#
# "Equal to dense Optax" (see dualemb.jax.generic): a step updates exactly the batch's distinct
# rows, as Optax would update the matrix made of those rows (gradient: the per-id sum); rows and
# state rows outside the batch are unchanged, scalar state (count) advances every step. So with
# every row in every batch the table equals a dense matrix trained by Optax, and with partial
# batches it equals Optax run on the touched rows' submatrix each step.

def _cross_row_cases():
    return {
        "lamb": lambda: optax.lamb(0.01),
        "decay_clip_sgd": lambda: optax.chain(optax.add_decayed_weights(0.1),
                                              optax.clip_by_global_norm(0.5), optax.sgd(0.1)),
        "adam": lambda: optax.adam(0.01),
        "clip_adam": lambda: optax.chain(optax.clip_by_global_norm(0.5), optax.adam(0.01)),
        # Adam's updates (state carried from earlier steps) enter the global norm.
        "adam_clip": lambda: optax.chain(optax.scale_by_adam(), optax.clip_by_global_norm(0.05),
                                         optax.scale(-0.01)),
        "lars": lambda: optax.lars(0.1),
    }


CROSS_ROW = _cross_row_cases()
NK = len(KEYS)


def _dup_batches(rows_per_step, duplicates, seed=1, steps=6):
    """(row indices, per-position gradients) per step: ``rows_per_step`` distinct rows among the
    first NK-1 (the last row is never touched) or all NK, plus ``duplicates`` repeated ones."""
    rs = np.random.RandomState(seed)
    out = []
    for _ in range(steps):
        pool = NK if rows_per_step == NK else NK - 1
        idx = rs.permutation(pool)[:rows_per_step]
        idx = np.concatenate([idx, rs.choice(idx, size=duplicates)])
        rs.shuffle(idx)
        out.append((idx, rs.randn(len(idx), DIM).astype(np.float32)))
    return out


def _train_generic(tx, batches):
    t = dej.create(DIM, initializer=dej.initializers.normal(0.0, 0.5, seed=7), optimizer=tx)
    init = np.asarray(dej.lookup(t, KEYS))
    step = jax.jit(dej.apply_gradients)
    for idx, g in batches:
        t = step(t, dej.ids(KEYS[idx]), g)
    return t, init


def _train_reference(tx, init, batches):
    """Optax on the submatrix of each batch's distinct rows (summed gradients), scattered back
    into a dense matrix and a dense state; scalar state as Optax keeps it."""
    params = jnp.asarray(init)
    state = tx.init(params)
    is_row = lambda leaf: jnp.ndim(leaf) == 2  # noqa: E731
    for idx, g in batches:
        rows = np.unique(idx)
        dense_g = jax.ops.segment_sum(jnp.asarray(g), jnp.asarray(idx), num_segments=NK)
        sub = jax.tree_util.tree_map(lambda l: l[rows] if is_row(l) else l, state)
        updates, sub = tx.update(dense_g[rows], sub, params[rows])
        params = params.at[rows].add(updates)
        state = jax.tree_util.tree_map(lambda full, s: full.at[rows].set(s) if is_row(full)
                                       else s, state, sub)
    return np.asarray(params), state


def _row_state(t, keys):
    """The generic path's per-row state leaves for ``keys`` (from its companion tables)."""
    from dualemb.core.table import Table as CoreTable
    return [CoreTable.attach(tid).find(keys)[0] for tid in t.slot_ids]


@pytest.mark.parametrize("duplicates", [0, 5], ids=["distinct", "duplicates"])
@pytest.mark.parametrize("name", sorted(CROSS_ROW))
def test_every_row_every_step_equals_dense_optax(name, duplicates):
    batches = _dup_batches(NK, duplicates)
    t, init = _train_generic(CROSS_ROW[name](), batches)
    trained = np.asarray(dej.lookup(t, KEYS))
    dense, _ = _train_reference(CROSS_ROW[name](), init, batches)
    # With every row in every batch the reference is plain dense Optax on the whole matrix.
    tx = CROSS_ROW[name]()
    params, state = jnp.asarray(init), tx.init(jnp.asarray(init))
    for idx, g in batches:
        u, state = tx.update(jax.ops.segment_sum(jnp.asarray(g), jnp.asarray(idx), NK), state,
                             params)
        params = params + u
    np.testing.assert_allclose(dense, params, rtol=1e-6, atol=1e-7)
    assert not np.allclose(trained, init)
    np.testing.assert_allclose(trained, params, rtol=2e-5, atol=2e-6)
    dej.destroy(t)


@pytest.mark.parametrize("duplicates", [0, 4], ids=["distinct", "duplicates"])
@pytest.mark.parametrize("name", sorted(CROSS_ROW))
def test_partial_batches_equal_optax_on_the_touched_rows(name, duplicates):
    batches = _dup_batches(3, duplicates)
    t, init = _train_generic(CROSS_ROW[name](), batches)
    expected, ref_state = _train_reference(CROSS_ROW[name](), init, batches)
    trained = np.asarray(dej.lookup(t, KEYS))
    np.testing.assert_allclose(trained, expected, rtol=2e-5, atol=2e-6)
    # The last row was never in a batch: its initializer row, not inserted.
    np.testing.assert_array_equal(trained[-1], init[-1])
    assert int(dej.size(t)) == NK - 1
    # State rows of the touched ids equal the reference's; scalars (count) as Optax's.
    touched = KEYS[:-1]
    ref_rows = [np.asarray(l)[:-1] for l in jax.tree_util.tree_leaves(ref_state)
                if np.ndim(l) == 2]
    for got, want in zip(_row_state(t, touched), ref_rows):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    ref_scalars = [np.asarray(l) for l in jax.tree_util.tree_leaves(ref_state) if np.ndim(l) == 0]
    for got, want in zip(jax.tree_util.tree_leaves(t.opt_state), ref_scalars):
        np.testing.assert_array_equal(np.asarray(got), want)
    dej.destroy(t)


def test_global_norm_clipping_with_partial_batches_equals_dense_optax_on_the_whole_matrix():
    # Rows outside the batch have a zero dense gradient: they add nothing to the global norm,
    # and plain SGD leaves them where they are, so here the whole dense matrix is the reference.
    make = lambda: optax.chain(optax.clip_by_global_norm(0.5), optax.sgd(0.1))  # noqa: E731
    batches = _dup_batches(3, 4)
    t, init = _train_generic(make(), batches)
    tx = make()
    params, state = jnp.asarray(init), tx.init(jnp.asarray(init))
    for idx, g in batches:
        u, state = tx.update(jax.ops.segment_sum(jnp.asarray(g), jnp.asarray(idx), NK), state,
                             params)
        params = params + u
    np.testing.assert_allclose(dej.lookup(t, KEYS), params, rtol=2e-5, atol=2e-6)
    dej.destroy(t)


def test_duplicates_in_one_step_equal_their_summed_gradient_as_distinct_ids():
    # The same distinct ids, once with duplicate positions and once pre-summed: same result.
    ids = np.array([0, 1, 2, 0, 0, 1])
    g = np.random.RandomState(3).randn(len(ids), DIM).astype(np.float32)
    summed = np.asarray(jax.ops.segment_sum(g, ids, 3))
    for name in ("lamb", "decay_clip_sgd", "adam_clip"):
        a, _ = _train_generic(CROSS_ROW[name](), [(ids, g)])
        b, _ = _train_generic(CROSS_ROW[name](), [(np.arange(3), summed)])
        np.testing.assert_allclose(dej.lookup(a, KEYS), dej.lookup(b, KEYS), rtol=1e-6,
                                   atol=1e-7, err_msg=name)
        dej.destroy(a)
        dej.destroy(b)


@pytest.mark.parametrize("tx", [optax.chain(optax.clip_by_block_rms(0.1), optax.sgd(0.1)),
                                optax.chain(optax.scale_by_param_block_rms(), optax.sgd(0.1))],
                         ids=["clip_by_block_rms", "scale_by_param_block_rms"])
def test_transformations_depending_on_the_row_count_are_refused(tx):
    # A mean over the whole leaf would change with the padding of a batch with duplicates.
    with pytest.raises(TypeError, match="depend on how many rows"):
        dej.create(DIM, optimizer=tx)

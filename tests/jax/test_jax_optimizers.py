"""Fused optimizers: rows trained through dualemb equal a dense jnp array trained by Optax.

Each step's batch holds every row (in shuffled order) plus duplicates, so the dense gradient is
the per-id sum of the per-position gradients; 10 steps; float32 tolerance.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dualemb.jax as dej
from dualemb.jax import optimizers as O

V, DIM, STEPS = 6, 5, 10
KEYS = np.array([11, 2**40 + 7, -3, 2**33, 5, 123456789], np.int64)
SCHEDULE = optax.exponential_decay(0.05, transition_steps=3, decay_rate=0.5)

CASES = {
    "sgd": (O.sgd(0.1), optax.sgd(0.1)),
    "sgd_momentum": (O.sgd(0.1, momentum=0.9), optax.sgd(0.1, momentum=0.9)),
    "sgd_nesterov": (O.sgd(0.1, momentum=0.9, nesterov=True),
                     optax.sgd(0.1, momentum=0.9, nesterov=True)),
    "sgd_schedule": (O.sgd(SCHEDULE, momentum=0.5), optax.sgd(SCHEDULE, momentum=0.5)),
    "adagrad": (O.adagrad(0.1), optax.adagrad(0.1)),
    "adam": (O.adam(0.01), optax.adam(0.01)),
    "adam_schedule": (O.adam(SCHEDULE, b1=0.8, b2=0.99, eps=1e-6, eps_root=1e-8),
                      optax.adam(SCHEDULE, b1=0.8, b2=0.99, eps=1e-6, eps_root=1e-8)),
    "adam_nesterov": (O.adam(0.01, nesterov=True), optax.adam(0.01, nesterov=True)),
    "amsgrad": (O.amsgrad(0.01), optax.amsgrad(0.01)),
    "adamw": (O.adamw(0.01, weight_decay=0.1), optax.adamw(0.01, weight_decay=0.1)),
    "adamax": (O.adamax(0.01), optax.adamax(0.01)),
    "nadam": (O.nadam(0.01), optax.nadam(0.01)),
    "rmsprop": (O.rmsprop(0.01), optax.rmsprop(0.01)),
    "rmsprop_centered": (O.rmsprop(0.01, centered=True, initial_scale=0.1),
                         optax.rmsprop(0.01, centered=True, initial_scale=0.1)),
    "rmsprop_momentum": (O.rmsprop(0.01, momentum=0.9, nesterov=True, eps_in_sqrt=False,
                                   bias_correction=True),
                         optax.rmsprop(0.01, momentum=0.9, nesterov=True, eps_in_sqrt=False,
                                       bias_correction=True)),
    "adadelta": (O.adadelta(1.0), optax.adadelta(1.0)),
    "adadelta_wd": (O.adadelta(0.5, rho=0.8, weight_decay=0.01),
                    optax.adadelta(0.5, rho=0.8, weight_decay=0.01)),
    "lion": (O.lion(1e-3), optax.lion(1e-3)),
    "lion_schedule": (O.lion(SCHEDULE, b1=0.8, weight_decay=0.0),
                      optax.lion(SCHEDULE, b1=0.8, weight_decay=0.0)),
}


def _batches(seed=0):
    rs = np.random.RandomState(seed)
    out = []
    for _ in range(STEPS):
        idx = np.concatenate([rs.permutation(V), rs.randint(0, V, size=4)])
        rs.shuffle(idx)
        grads = rs.randn(len(idx), DIM).astype(np.float32)
        out.append((idx, grads))
    return out


def _dense_grads(idx, grads):
    return jax.ops.segment_sum(jnp.asarray(grads), jnp.asarray(idx), num_segments=V)


def _train_table(opt):
    t = dej.create(DIM, initializer=dej.initializers.normal(0.0, 0.5, seed=7), optimizer=opt)
    init = np.asarray(dej.lookup(t, KEYS))
    step = jax.jit(dej.apply_gradients)
    for idx, grads in _batches():
        t = step(t, dej.ids(KEYS[idx]), grads)
    out = np.asarray(dej.lookup(t, KEYS))
    assert int(t.step) == STEPS
    dej.destroy(t)
    return init, out


def _train_dense(tx, init):
    params = jnp.asarray(init)
    state = tx.init(params)

    @jax.jit
    def step(params, state, g):
        updates, state = tx.update(g, state, params)
        return optax.apply_updates(params, updates), state

    for idx, grads in _batches():
        params, state = step(params, state, _dense_grads(idx, grads))
    return np.asarray(params)


@pytest.mark.parametrize("name", sorted(CASES))
def test_parity_with_optax(name):
    ours, theirs = CASES[name]
    init, trained = _train_table(ours)
    expected = _train_dense(theirs, init)
    assert not np.allclose(trained, init)
    np.testing.assert_allclose(trained, expected, rtol=2e-5, atol=2e-6)


def _keras_ftrl_dense(init, lr=0.1, power=-0.5, init_acc=0.1, l1=0.01, l2=0.02, l2s=0.0,
                      beta=0.0):
    """keras.optimizers.Ftrl's update (Keras 3 source), on a dense float32 array."""
    w = jnp.asarray(init)
    acc = jnp.full_like(w, init_acc)
    lin = jnp.zeros_like(w)
    f = jnp.float32
    lr, power, l1, l2, l2s, beta = map(f, (lr, power, l1, l2, l2s, beta))
    for idx, grads in _batches():
        g = _dense_grads(idx, grads)
        l2_reg = l2 + beta / (f(2.0) * lr)
        g2 = g + (f(2.0) * l2s) * w
        new_acc = acc + g * g
        lin = lin + g2 - (jnp.power(new_acc, -power) - jnp.power(acc, -power)) / lr * w
        quad = jnp.power(new_acc, -power) / lr + f(2.0) * l2_reg
        w = (jnp.clip(lin, -l1, l1) - lin) / quad
        acc = new_acc
    return np.asarray(w)


def test_ftrl_matches_keras_definition():
    opt = O.ftrl(0.1, l1_regularization_strength=0.01, l2_regularization_strength=0.02)
    init, trained = _train_table(opt)
    np.testing.assert_allclose(trained, _keras_ftrl_dense(init), rtol=2e-5, atol=2e-6)


def test_step_count_and_schedule_are_carried_in_the_table():
    t = dej.create(DIM, optimizer=O.sgd(lambda count: 1.0 / (count + 1.0)))
    g = np.ones((1, DIM), np.float32)
    rows = []
    for _ in range(3):
        t = jax.jit(dej.apply_gradients)(t, dej.ids([1]), g)
        rows.append(float(dej.lookup(t, np.array([1]))[0, 0]))
    # lr = 1, 1/2, 1/3 on steps 0, 1, 2 (Optax evaluates the schedule on the pre-update count).
    np.testing.assert_allclose(rows, [-1.0, -1.5, -1.5 - 1 / 3], rtol=1e-6)
    assert int(t.step) == 3
    dej.destroy(t)


def test_keras_flavor_matches_the_core_table_trained_the_keras_way():
    """dej.optimizers.keras runs Keras' definition: the same step as dualemb.core with
    flavor=keras (what dualemb.tf uses), bit for bit."""
    from dualemb.core import Table

    ids = np.array([3, 5, 3, 9], np.int64)
    grads = np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)
    opt = O.keras("adam", 0.01, beta_1=0.8)
    assert opt.spec == {"name": "adam", "flavor": "keras", "beta_1": 0.8}
    t = dej.create(4, initializer=dej.initializers.constant(0.5), optimizer=opt)
    t = dej.apply_gradients(t, dej.ids(ids), jnp.asarray(grads))
    ref = Table(dim=4, initializer=0.5, optimizer={"name": "adam", "flavor": "keras", "beta_1": 0.8})
    ref.apply_gradients(ids, grads, lr=0.01, step=1)
    np.testing.assert_array_equal(np.asarray(dej.lookup(t, dej.ids(ids))), ref.find(ids)[0])

"""Keras 3 optimizers as Optax transformations, for the dense parameters of a model that
continues training across frameworks (a table's own optimizer is :mod:`dualemb.jax.optimizers`).

:func:`keras_adam` computes ``keras.optimizers.Adam`` exactly; :mod:`dualemb.interop` moves its
state to and from the common checkpoint's names (``adam_state_to_dict``,
``dict_to_adam_state``) and re-exports it as ``dualemb.interop.keras_adam``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from dualemb.jax import _ffi

__all__ = ["KerasAdamState", "keras_adam"]


class KerasAdamState(NamedTuple):
    """State of :func:`keras_adam`: ``count`` (int32, updates made, Keras' ``iterations``) and the
    moments ``m``, ``v`` (pytrees like the parameters; Keras' ``momentum`` and ``velocity``)."""

    count: Any
    m: Any
    v: Any


def keras_adam(learning_rate=0.001, beta_1: float = 0.9, beta_2: float = 0.999,
               epsilon: float = 1e-7, *, exact: bool = True):
    """``keras.optimizers.Adam`` (Keras 3, ``amsgrad=False``) as an Optax transformation.

    Per update, with ``t = count + 1`` (float32) and ``lr`` the learning rate (a number, or an
    Optax schedule called with ``count``)::

        alpha = lr * sqrt(1 - beta_2**t) / (1 - beta_1**t)
        m += (g - m) * (1 - beta_1)
        v += (g*g - v) * (1 - beta_2)
        update = -(m * alpha) / (sqrt(v) + epsilon)         # optax.apply_updates adds it

    These are Keras' float32 operations in Keras' order. Keras (on TensorFlow) runs each of them
    as a separate kernel, while XLA fuses them into one loop and contracts ``m + x * c`` into a
    fused multiply-add, which rounds once instead of twice (XLA's CPU backend always allows the
    contraction, and drops ``optimization_barrier`` before fusing). With ``exact=True`` (the
    default) the per-element arithmetic therefore runs in dualemb's own XLA custom call
    (``csrc/jax/ffi_dense.cc``: the core's Keras-Adam math, compiled without contraction; a host
    callback on platforms without the native handler), also under ``jit``, and a parameter
    trained with this and ``optax.apply_updates`` follows Keras' float32 path bit for bit
    (tests/interop/test_interop.py checks it over hundreds of steps). Until 2026-11-28 that
    path was a ``jax.pure_callback`` into numpy: 4-5 ms of the demo's 7 ms dense step on 2 CPU
    cores. With ``exact=False`` the update is fused by XLA, equal to
    Keras within a few float32 ulps per step. Note Keras' ``epsilon`` (1e-7, added to ``sqrt(v)``
    without bias correction) differs from ``optax.adam``'s ``eps``.
    """
    omb1 = 1.0 - beta_1  # Keras computes these in Python, then casts to float32
    omb2 = 1.0 - beta_2

    def init(params):
        zeros = lambda p: jnp.zeros(jnp.shape(p), jnp.float32)  # noqa: E731
        return KerasAdamState(jnp.zeros((), jnp.int32), jax.tree_util.tree_map(zeros, params),
                              jax.tree_util.tree_map(zeros, params))

    def exact_math(alpha, gs, ms, vs):
        hyper = jnp.stack([alpha, jnp.float32(omb1), jnp.float32(omb2), jnp.float32(epsilon)])
        outs = [_ffi.dense_keras_adam(hyper, g.astype(jnp.float32), m, v)
                for g, m, v in zip(gs, ms, vs)]
        return [o[0] for o in outs], [o[1] for o in outs], [o[2] for o in outs]

    def device_math(alpha, gs, ms, vs):
        f32 = jnp.float32
        ms = [m + (g.astype(f32) - m) * f32(omb1) for g, m in zip(gs, ms)]
        vs = [v + (jnp.square(g.astype(f32)) - v) * f32(omb2) for g, v in zip(gs, vs)]
        us = [-((m * alpha) / (jnp.sqrt(v) + f32(epsilon))) for m, v in zip(ms, vs)]
        return us, ms, vs

    def update(grads, state, params=None):
        del params
        f32 = jnp.float32
        lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
        lr = jnp.asarray(lr, f32)
        local_step = (state.count + 1).astype(f32)
        b1p = jnp.power(f32(beta_1), local_step)
        b2p = jnp.power(f32(beta_2), local_step)
        alpha = lr * jnp.sqrt(f32(1) - b2p) / (f32(1) - b1p)
        gs, treedef = jax.tree_util.tree_flatten(grads)
        ms = treedef.flatten_up_to(state.m)
        vs = treedef.flatten_up_to(state.v)
        us, ms, vs = (exact_math if exact else device_math)(alpha, gs, ms, vs)
        unflat = lambda xs: jax.tree_util.tree_unflatten(treedef, list(xs))  # noqa: E731
        return unflat(us), KerasAdamState(state.count + 1, unflat(ms), unflat(vs))

    return optax.GradientTransformation(init, update)

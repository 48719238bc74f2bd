"""The guard that makes plain ``jax.grad`` through a Flax embedding module fail loudly.

A Flax ``Embed`` (NNX or linen) returns rows looked up in a dynamic table; ``jax.grad`` /
``nnx.grad`` of a loss with respect to the model's parameters would train the dense parameters
and silently leave the table untouched (its rows are not parameters). Each module therefore
owns a zero scalar parameter and passes its rows through :func:`guarded`, the identity on the
rows whose backward rule raises ``TypeError`` naming the front end's own ``value_and_grad``
(which taps the rows instead, so :func:`guarded` is never differentiated there).
"""

from __future__ import annotations

import functools

import jax


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def guarded(rows, guard, message: str):
    """``rows``, unchanged; differentiating through it raises ``TypeError(message)``."""
    del guard
    return rows


def _fwd(rows, guard, message):
    del guard
    return rows, None


def _bwd(message, _, g_rows):
    raise TypeError(message)


guarded.defvjp(_fwd, _bwd)

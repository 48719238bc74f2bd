"""apply_gradients: one optimizer step on the rows of a batch."""

from __future__ import annotations

import jax.numpy as jnp

from dualemb.jax import _ffi, _values
from dualemb.jax import optimizers as _opts
from dualemb.jax.ops import _keys
from dualemb.jax.table import Table


def apply_gradients(table: Table, ids, grads) -> Table:
    """One optimizer step on the rows of ``ids``; returns the next table (``step + 1``).

    ``grads`` are per-position gradients, shape ``ids.shape + (dim,)`` (what ``jax.grad`` gives
    with respect to :func:`~dualemb.jax.lookup`'s rows; any float dtype, widened to float32:
    a float16 or bfloat16 table trains with float32 arithmetic and rounds the result back).
    float64 and integer tables cannot be trained (TypeError). Gradients of duplicate ids are summed
    first; ids not in the table are inserted with their initializer row (and initial optimizer
    state) and then updated; rows not in the batch are untouched (sparse update, as a dense
    Optax update whose gradient is zero there would not be: lazy-Adam semantics).

    Fused optimizers run in the core with learning rate ``schedule(table.step)`` and 1-based
    step ``table.step + 1``, both passed as operands so that schedules work under ``jit``;
    other Optax transformations take the generic path (:mod:`dualemb.jax.generic`).
    """
    _values.check_trainable(table.value_dtype, "apply_gradients")
    opt = table.optimizer
    if opt is None:
        raise ValueError(
            f"{table!r} has no optimizer: create it with optimizer=... (or attach one)")
    keys, shape = _keys(table, ids)
    g = _values.grads_operand(grads, tuple(shape) + (table.dim,))
    if isinstance(opt, _opts.Optimizer):
        lr = opt.learning_rate_for(table)  # injected (in the table) or schedule(step)
        if jnp.shape(lr) != ():
            raise ValueError(f"the learning rate schedule of {opt.name!r} returned shape "
                             f"{jnp.shape(lr)}, expected a scalar")
        version = _ffi.apply_gradients(table.handle, table.version, keys, g, lr,
                                       table.step_code, gpu=table.placement == "gpu")
        return table.replace(version=version, step=table.step + 1)
    from dualemb.jax import generic
    return generic.apply(table, keys, tuple(shape), g)

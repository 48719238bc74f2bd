"""Many tables in one call: the multi-table forms of ``lookup``, ``find``, ``find_or_insert`` and
``apply_gradients``.

A model with one table per sparse feature otherwise makes one custom call per table for each
operation of a step; these make one for all of them, and the core runs the tables in parallel
on its threads. Results equal the per-table calls bit for bit (each table runs its per-table
code: rows, optimizer slots, steps, duplicate ids' gradients summed in batch order).

``tables`` is any pytree of :class:`~dualemb.jax.Table` (a list, a tuple, a dict ``{feature:
table}``, ...); ``ids`` and ``grads`` have the same structure down to the tables (one id array
per table, any shape, any id form of :mod:`dualemb.jax.ids`; dims may differ). Results come
back in that structure::

    rows = dej.lookup_many(tables, ids)                  # {name: ids[name].shape + (dim,)}
    loss, (g_params, g_rows) = jax.value_and_grad(loss_fn, argnums=(0, 1))(params, rows)
    tables = dej.apply_gradients_many(tables, ids, g_rows)

Rules beyond the per-table ones:

* A write names each table at most once (``find_or_insert_many``, ``apply_gradients_many``):
  concatenate a shared table's ids (and gradients) first. Outside ``jit`` a repeat raises
  ``ValueError``; inside, the call fails when it runs.
* Bad input in any table (dtype, shape, an unknown table, no optimizer) fails the call before
  any table changes. A failure while running (out of memory) leaves that table unchanged and
  may leave others updated (dualemb_core.h, "Multi-table calls").
* Tables whose optimizer is a generic Optax transformation (:mod:`dualemb.jax.generic`) are
  stepped by their own per-table path inside ``apply_gradients_many``; the fused ones share one
  call.
* One call orders the group: the reads and writes of every table in it wait for all the
  tables' earlier writes (one token chain for the group).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from dualemb.jax import _ffi, _values
from dualemb.jax import optimizers as _opts
from dualemb.jax.ops import _keys
from dualemb.jax.table import Table

__all__ = ["lookup_many", "find_many", "find_or_insert_many", "apply_gradients_many"]


def _is_table(x) -> bool:
    return isinstance(x, Table)


def _flatten(tables, *per_table, names=()):
    """(table list, treedef, [flat list for each of ``per_table``]); every one of ``per_table``
    must have the tables' structure down to the tables."""
    flat, treedef = jax.tree_util.tree_flatten(tables, is_leaf=_is_table)
    for t in flat:
        if not isinstance(t, Table):
            raise TypeError(f"expected a pytree of dualemb.jax.Table, found a "
                            f"{type(t).__name__} among its leaves")
    out = []
    for what, value in zip(names, per_table):
        try:
            out.append(treedef.flatten_up_to(value))
        except (ValueError, TypeError) as e:
            raise ValueError(f"{what} must have the structure of tables ({treedef}): {e}") \
                from None
    return flat, treedef, out


def _refuse_repeats(tables: list, what: str) -> None:
    """ValueError if a concrete handle names a table twice (traced handles: checked when the
    call runs)."""
    seen = set()
    for t in tables:
        if isinstance(t.handle, jax.core.Tracer):
            continue
        tid = t.id
        if tid in seen:
            raise ValueError(f"{what}: table {tid} appears twice; give each table once "
                             "(concatenate its ids and gradients)")
        seen.add(tid)


# ---- reads ----------------------------------------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _lookup_many(tables: list, keys: list, shapes: tuple):
    rows, _ = _ffi.find_many([t.handle for t in tables], [t.version for t in tables], keys,
                             list(shapes), [t.dim for t in tables], [t.dtype for t in tables],
                             with_exists=False)
    return rows


def _lookup_many_fwd(tables, keys, shapes):
    return _lookup_many(tables, keys, shapes), None


def _lookup_many_bwd(shapes, _, g):
    return None, None  # as dualemb.jax.lookup: the rows are the leaf, tables and ids get none


_lookup_many.defvjp(_lookup_many_fwd, _lookup_many_bwd)


def _operands(tables: list, ids: list):
    pairs = [_keys(t, i) for t, i in zip(tables, ids)]
    return [k for k, _ in pairs], tuple(tuple(s) for _, s in pairs)


def lookup_many(tables, ids):
    """Rows of each table's ids (``ids.shape + (dim,)`` in its value dtype), in the structure of
    ``tables``: :func:`~dualemb.jax.lookup` on every table in one call. Differentiable like
    ``lookup`` (take the gradient with respect to the rows, give it to
    :func:`apply_gradients_many`)."""
    flat, treedef, (flat_ids,) = _flatten(tables, ids, names=("ids",))
    if not flat:
        return jax.tree_util.tree_unflatten(treedef, [])
    keys, shapes = _operands(flat, flat_ids)
    return jax.tree_util.tree_unflatten(treedef, _lookup_many(flat, keys, shapes))


def find_many(tables, ids):
    """(rows, exists), each in the structure of ``tables``: :func:`~dualemb.jax.find` on every
    table in one call."""
    flat, treedef, (flat_ids,) = _flatten(tables, ids, names=("ids",))
    if not flat:
        return (jax.tree_util.tree_unflatten(treedef, []),) * 2
    keys, shapes = _operands(flat, flat_ids)
    rows, exists = _ffi.find_many([t.handle for t in flat], [t.version for t in flat], keys,
                                  list(shapes), [t.dim for t in flat], [t.dtype for t in flat])
    return (jax.tree_util.tree_unflatten(treedef, rows),
            jax.tree_util.tree_unflatten(treedef, exists))


# ---- writes ---------------------------------------------------------------------------------

def find_or_insert_many(tables, ids):
    """(rows, exists, tables), each in the structure of ``tables``:
    :func:`~dualemb.jax.find_or_insert` on every table in one call."""
    flat, treedef, (flat_ids,) = _flatten(tables, ids, names=("ids",))
    if not flat:
        empty = jax.tree_util.tree_unflatten(treedef, [])
        return empty, empty, tables
    _refuse_repeats(flat, "find_or_insert_many")
    keys, shapes = _operands(flat, flat_ids)
    versions, rows, exists = _ffi.find_or_insert_many(
        [t.handle for t in flat], [t.version for t in flat], keys, list(shapes),
        [t.dim for t in flat], [t.dtype for t in flat])
    new = [t.replace(version=versions[i]) for i, t in enumerate(flat)]
    unflat = functools.partial(jax.tree_util.tree_unflatten, treedef)
    return unflat(rows), unflat(exists), unflat(new)


def apply_gradients_many(tables, ids, grads):
    """The next tables (each ``step + 1``), in the structure of ``tables``:
    :func:`~dualemb.jax.apply_gradients` on every table, the fused optimizers in one call.

    ``grads`` are per-position gradients, ``ids.shape + (dim,)`` per table (what ``jax.grad``
    gives with respect to :func:`lookup_many`'s rows)."""
    flat, treedef, (flat_ids, flat_grads) = _flatten(tables, ids, grads, names=("ids", "grads"))
    _refuse_repeats(flat, "apply_gradients_many")
    fused, out = [], list(flat)
    for i, (t, i_ids, g) in enumerate(zip(flat, flat_ids, flat_grads)):
        _values.check_trainable(t.value_dtype, "apply_gradients")
        if t.optimizer is None:
            raise ValueError(
                f"{t!r} has no optimizer: create it with optimizer=... (or attach one)")
        if not isinstance(t.optimizer, _opts.Optimizer):
            from dualemb.jax import train
            out[i] = train.apply_gradients(t, i_ids, g)  # generic Optax path, per table
            continue
        keys, shape = _keys(t, i_ids)
        g = _values.grads_operand(g, tuple(shape) + (t.dim,))
        lr = t.optimizer.learning_rate_for(t)
        if jnp.shape(lr) != ():
            raise ValueError(f"the learning rate schedule of {t.optimizer.name!r} returned "
                             f"shape {jnp.shape(lr)}, expected a scalar")
        fused.append((i, keys, g, lr))
    if fused:
        ts = [flat[i] for i, _, _, _ in fused]
        versions = _ffi.apply_gradients_many(
            [t.handle for t in ts], [t.version for t in ts], [k for _, k, _, _ in fused],
            [g for _, _, g, _ in fused], [lr for _, _, _, lr in fused],
            [t.step_code for t in ts])
        for j, (i, _, _, _) in enumerate(fused):
            out[i] = flat[i].replace(version=versions[j], step=flat[i].step + 1)
    return jax.tree_util.tree_unflatten(treedef, out)

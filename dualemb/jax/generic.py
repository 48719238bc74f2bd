"""The generic optimizer path: any ``optax.GradientTransformation`` on a dynamic table.

For optimizers the core does not fuse (e.g. ``optax.chain(optax.clip(1.0),
optax.scale_by_adam(), optax.scale(-lr))``). The transformation's state for one row,
``tx.init(zeros(dim))``, is split into

* per-row leaves (float, shape ``(dim,)``): kept in companion core tables, one per leaf, with
  the same ids as the table and the leaf's initial value as their initializer;
* scalar leaves (shape ``()``, e.g. ``count``): shared by all rows, carried in the table
  pytree's ``opt_state``, exactly as Optax keeps one count for a dense parameter.

A step (:func:`apply`): the batch's distinct ids are found (one FFI call), their gradients
summed, their rows and state rows read (inserting missing ids, as the fused path does), the
transformation applied to those ``[n, dim]`` arrays with the rows as ``params``, and the new
rows and state written back. With every row in every batch this is exactly Optax on a dense
array. Transformations that look across rows (e.g. ``clip_by_global_norm``) see the batch's
distinct rows only.

A transformation whose state has other leaves (matrices, per-row integers) or whose initial
state depends on the parameters (e.g. lookahead's slow copy) cannot be carried: :meth:`of`
raises ``TypeError`` naming the leaf.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from dualemb.core import initializers as _inits
from dualemb.core.table import Table as CoreTable
from dualemb.jax import _ffi


def _is_transformation(tx) -> bool:
    return callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None))


@dataclasses.dataclass(frozen=True)
class _Layout:
    treedef: object
    kinds: tuple  # per state leaf: "row" or "scalar"
    row_init: tuple  # initial values (np arrays [dim]) of the row leaves
    scalar_init: tuple  # initial values of the scalar leaves


@dataclasses.dataclass(frozen=True)
class GenericOptimizer:
    """An Optax transformation run on a table's rows (see the module docstring)."""

    tx: object

    @classmethod
    def of(cls, tx) -> "GenericOptimizer":
        if isinstance(tx, GenericOptimizer):
            return tx
        if not _is_transformation(tx):
            raise TypeError(
                f"optimizer must be a dualemb.jax.optimizers optimizer or an "
                f"optax.GradientTransformation, got {tx!r}")
        return cls(tx)

    def layout(self, dim: int) -> _Layout:
        return _layout(self.tx, int(dim))

    def bind(self, table, core: CoreTable, step: int = 0):
        """The table handle with this optimizer: creates one companion table per row leaf."""
        lay = self.layout(table.dim)
        created = []
        try:
            for init in lay.row_init:
                created.append(CoreTable(table.dim, key_dtype=table.key_dtype,
                                         initializer=_inits.vector(init)))
        except Exception:
            for t in created:
                t.destroy()
            raise
        scalars = tuple(jnp.asarray(s) for s in lay.scalar_init)
        return table.replace(optimizer=self, slot_tables=tuple(t.id for t in created),
                             opt_state=scalars, step=jnp.asarray(step, jnp.int32))

    def __hash__(self):
        return hash(("generic", id(self.tx)))

    def __eq__(self, other):
        return isinstance(other, GenericOptimizer) and other.tx is self.tx


@functools.lru_cache(maxsize=None)
def _layout_cached(tx, dim: int) -> _Layout:
    return _compute_layout(tx, dim)


def _layout(tx, dim: int) -> _Layout:
    try:
        return _layout_cached(tx, dim)
    except TypeError as e:
        if "unhashable" not in str(e):
            raise
        return _compute_layout(tx, dim)


def _compute_layout(tx, dim: int) -> _Layout:
    with jax.ensure_compile_time_eval():
        zeros = jnp.zeros((dim,), jnp.float32)
        probe = jnp.linspace(-1.5, 2.5, dim, dtype=jnp.float32)
        try:
            s0 = tx.init(zeros)
            s1 = tx.init(probe)
        except Exception as e:
            raise TypeError(f"the generic optimizer path cannot initialize {tx!r}: {e}") from e
    leaves0, treedef = jax.tree_util.tree_flatten(s0)
    leaves1 = jax.tree_util.tree_leaves(s1)
    kinds, row_init, scalar_init = [], [], []
    for i, (a, b) in enumerate(zip(leaves0, leaves1)):
        a_np, b_np = np.asarray(a), np.asarray(b)
        path = f"state leaf {i} (shape {a_np.shape}, dtype {a_np.dtype})"
        if not np.array_equal(a_np, b_np):
            raise TypeError(
                f"the generic optimizer path cannot carry {tx!r}: its {path} depends on the "
                "parameters at init, so a new row's state is unknown")
        if a_np.shape == ():
            kinds.append("scalar")
            scalar_init.append(a_np)
        elif a_np.shape == (dim,) and np.issubdtype(a_np.dtype, np.floating):
            kinds.append("row")
            row_init.append(a_np.astype(np.float32))
        else:
            raise TypeError(
                f"the generic optimizer path cannot carry {tx!r}: its {path} is neither a "
                f"per-row float leaf of shape ({dim},) nor a scalar")
    return _Layout(treedef, tuple(kinds), tuple(row_init), tuple(scalar_init))


def _merge_state(lay: _Layout, rows: list, scalars) -> object:
    it_r, it_s = iter(rows), iter(scalars)
    leaves = [next(it_r) if k == "row" else next(it_s) for k in lay.kinds]
    return jax.tree_util.tree_unflatten(lay.treedef, leaves)


def apply(table, keys, shape, grads):
    """One step of the table's Optax transformation on the rows of ``keys`` (see module doc).
    ``keys`` is the FFI key operand, ``grads`` float32 ``shape + (dim,)``."""
    opt: GenericOptimizer = table.optimizer
    lay = opt.layout(table.dim)
    dim = table.dim
    n = int(np.prod(shape, dtype=np.int64))
    pairs = keys.dtype == jnp.uint32
    flat = keys.reshape((n, 2) if pairs else (n,))
    g = grads.reshape(n, dim)
    _check_update(opt.tx, lay, n, dim, table.opt_state)  # before anything touches the table
    uniq, inverse, count = _ffi.unique(flat, n)
    gsum = jax.ops.segment_sum(g, inverse, num_segments=n)
    valid = jnp.arange(n, dtype=jnp.int32) < count

    v = table.version
    v, rows, _ = _ffi.find_or_insert(table.handle, dim, v, uniq, (n,))
    state_rows = []
    for tid in table.slot_tables:
        v, srows, _ = _ffi.find_or_insert(tid, dim, v, uniq, (n,))
        state_rows.append(srows)
    state = _merge_state(lay, state_rows, table.opt_state)
    updates, new_state = opt.tx.update(gsum, state, rows)
    new_rows = (rows + updates).astype(jnp.float32)

    new_leaves = jax.tree_util.tree_leaves(new_state)
    new_row_leaves = [l for l, k in zip(new_leaves, lay.kinds) if k == "row"]
    new_scalars = tuple(jnp.asarray(l).astype(s.dtype) for l, s, k in
                        zip(new_leaves, jax.tree_util.tree_leaves(state), lay.kinds)
                        if k == "scalar")
    v = _ffi.insert_or_assign(table.handle, v, uniq, new_rows, valid)
    for tid, leaf in zip(table.slot_tables, new_row_leaves):
        v = _ffi.insert_or_assign(tid, v, uniq, jnp.asarray(leaf, jnp.float32), valid)
    return table.replace(version=v, step=table.step + 1, opt_state=new_scalars)


def _check_update(tx, lay: _Layout, n: int, dim: int, scalars) -> None:
    """Traces tx.update abstractly on [n, dim] rows, so a transformation that cannot run on
    rows fails with a clear error before any table is read or written (even eagerly)."""
    rows = jax.ShapeDtypeStruct((n, dim), jnp.float32)
    state = _merge_state(lay, [rows] * sum(k == "row" for k in lay.kinds),
                         [jax.ShapeDtypeStruct(jnp.shape(s), jnp.result_type(s)) for s in scalars])
    try:
        jax.eval_shape(tx.update, rows, state, rows)
    except Exception as e:
        raise TypeError(
            f"the generic optimizer path cannot run {tx!r} on a table's rows (it hands the "
            f"transformation float32 arrays [n, dim] as updates and params, and nothing "
            f"else): {type(e).__name__}: {e}") from e


def erase_state(table, tid: int, keys):
    """Erases ``keys`` from one companion state table (chained on the table's version)."""
    return table.replace(version=_ffi.erase(tid, table.version, keys))

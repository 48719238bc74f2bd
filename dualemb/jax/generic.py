"""The generic optimizer path: any ``optax.GradientTransformation`` on a dynamic table.

For optimizers the core does not fuse (e.g. ``optax.chain(optax.clip(1.0),
optax.scale_by_adam(), optax.scale(-lr))``). The transformation's state for one row,
``tx.init(zeros(dim))``, is split into per-row leaves (float32, float16 or bfloat16, shape
``(dim,)``), kept in companion core tables of the leaf's dtype with the table's ids, and scalar
leaves (e.g. ``count``), carried in the table pytree's ``opt_state``.

A step (:func:`apply`) updates exactly the batch's distinct ids, as ``tx.update`` would update the
dense matrix made of those rows (gradient: the sum over each id's positions), inserting missing
ids; every other row and its state rows are unchanged (lazy updates), and the scalar state
advances once per step. A transformation it cannot carry — state leaves of another shape,
an initial state that depends on the parameters, or a result that depends on the number of rows
(found when the table is created) — is refused with ``TypeError`` naming the leaf or the reason.
Where this differs from dense Optax on the whole table: docs/jax.md, "The generic path".
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
    row_init: tuple  # initial values (np arrays [dim], in their dtypes) of the row leaves
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
                                         value_dtype=init.dtype.name,
                                         initializer=_inits.vector(init.astype(np.float32))))
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
        if jax.dtypes.issubdtype(jnp.result_type(a), jax.dtypes.prng_key):
            raise TypeError(
                f"the generic optimizer path cannot carry {tx!r}: its state leaf {i} is a PRNG "
                "key (random state such as noisy_sgd's), which a table's scalar state cannot "
                "hold")
        a_np, b_np = np.asarray(a), np.asarray(b)
        path = f"state leaf {i} (shape {a_np.shape}, dtype {a_np.dtype})"
        if not np.array_equal(a_np, b_np):
            raise TypeError(
                f"the generic optimizer path cannot carry {tx!r}: its {path} depends on the "
                "parameters at init, so a new row's state is unknown")
        if a_np.shape == ():
            kinds.append("scalar")
            scalar_init.append(a_np)
        elif a_np.shape == (dim,) and a_np.dtype.name in _ROW_DTYPES:
            kinds.append("row")
            row_init.append(a_np)
        else:
            raise TypeError(
                f"the generic optimizer path cannot carry {tx!r}: its {path} is neither a "
                f"per-row float leaf of shape ({dim},) ({', '.join(_ROW_DTYPES)}) nor a scalar")
    lay = _Layout(treedef, tuple(kinds), tuple(row_init), tuple(scalar_init))
    _check_padding_invariant(tx, lay, dim)
    return lay


_ROW_DTYPES = ("float32", "float16", "bfloat16")  # the dtypes a companion state table can hold


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
    # A float16/bfloat16 table's rows are widened to float32 for the transformation and rounded
    # back on the write (as the fused path does in the core); state rows are float32 tables.
    v, rows, _ = _ffi.find_or_insert(table.handle, dim, v, uniq, (n,), dtype=table.dtype,
                                     with_exists=False)
    rows = rows.astype(jnp.float32)
    state_rows = []
    for tid, init in zip(table.slot_tables, lay.row_init):
        v, srows, _ = _ffi.find_or_insert(tid, dim, v, uniq, (n,), dtype=jnp.dtype(init.dtype),
                                          with_exists=False)
        state_rows.append(srows)
    # The deduplicated batch is padded to n rows (uniq repeats the first key there). Padding
    # rows become neutral rows: zero params, zero gradient, initial state. A transformation that
    # looks across rows through sums (global norms, trust ratios) then sees exactly the distinct
    # rows; one whose rows depend on the padding otherwise is refused by _layout.
    rows, gsum, state_rows = _neutral_padding(lay, valid, rows, gsum, state_rows)
    state = _merge_state(lay, state_rows, table.opt_state)
    updates, new_state = opt.tx.update(gsum, state, rows)
    new_rows = (rows + updates).astype(jnp.float32)

    new_leaves = jax.tree_util.tree_leaves(new_state)
    new_row_leaves = [l for l, k in zip(new_leaves, lay.kinds) if k == "row"]
    new_scalars = tuple(jnp.asarray(l).astype(s.dtype) for l, s, k in
                        zip(new_leaves, jax.tree_util.tree_leaves(state), lay.kinds)
                        if k == "scalar")
    v = _ffi.insert_or_assign(table.handle, v, uniq, new_rows.astype(table.dtype), valid)
    for tid, leaf, init in zip(table.slot_tables, new_row_leaves, lay.row_init):
        v = _ffi.insert_or_assign(tid, v, uniq, jnp.asarray(leaf).astype(init.dtype), valid)
    return table.replace(version=v, step=table.step + 1, opt_state=new_scalars)


def _neutral_padding(lay: _Layout, valid, rows, grads, state_rows):
    """rows, grads and state rows with the rows where ``valid`` is false replaced by a neutral
    row: zero params, zero gradient, the transformation's initial state."""
    keep = valid[:, None]
    rows = jnp.where(keep, rows, 0.0)
    grads = jnp.where(keep, grads, 0.0)
    state_rows = [jnp.where(keep, r, jnp.asarray(init)) for r, init in zip(state_rows, lay.row_init)]
    return rows, grads, state_rows


def _check_padding_invariant(tx, lay: _Layout, dim: int) -> None:
    """Raises TypeError when neutral padding rows change what ``tx`` does to the other rows.

    Runs two steps of ``tx.update`` on a few random rows, once alone and once followed by
    neutral rows (:func:`_neutral_padding`), and compares the real rows' updates and state.
    Sums over rows (global norms, trust ratios) pass; means over the whole leaf (e.g.
    ``clip_by_block_rms``) depend on the row count and fail: such a transformation would give
    a batch with duplicate ids a different result than the same distinct ids without
    duplicates. A transformation that cannot run on rows at all is left to
    :func:`_check_update`, which reports it when a step is taken."""
    real, pad = 3, 2
    rs = np.random.RandomState(0)
    params = rs.standard_normal((real, dim)).astype(np.float32)
    grads = [rs.standard_normal((real, dim)).astype(np.float32) for _ in range(2)]
    n_row = sum(k == "row" for k in lay.kinds)

    def run(padded: bool):
        total = real + pad if padded else real
        valid = jnp.arange(total) < real
        p = jnp.zeros((total, dim), jnp.float32).at[:real].set(params)
        srows = [jnp.broadcast_to(jnp.asarray(init), (total, dim)) for init in lay.row_init]
        scalars = [jnp.asarray(s) for s in lay.scalar_init]
        out = []
        for g in grads:
            gp = jnp.zeros((total, dim), jnp.float32).at[:real].set(g)
            p, gp, srows = _neutral_padding(lay, valid, p, gp, srows)
            updates, new_state = tx.update(gp, _merge_state(lay, srows, scalars), p)
            leaves = jax.tree_util.tree_leaves(new_state)
            srows = [jnp.asarray(l).astype(init.dtype) for l, init in
                     zip([l for l, k in zip(leaves, lay.kinds) if k == "row"], lay.row_init)]
            scalars = [l for l, k in zip(leaves, lay.kinds) if k == "scalar"]
            p = (p + updates).astype(jnp.float32)
            out.append([np.asarray(p[:real])] + [np.asarray(r[:real]) for r in srows] +
                       [np.asarray(s) for s in scalars])
        return out

    with jax.ensure_compile_time_eval():
        try:
            alone = run(False)
        except Exception:
            return
        try:
            padded = run(True)
        except Exception as e:
            raise TypeError(f"the generic optimizer path cannot run {tx!r}: it fails on a batch "
                            f"padded with neutral rows: {type(e).__name__}: {e}") from e
    for step, (a_step, p_step) in enumerate(zip(alone, padded)):
        for i, (a, b) in enumerate(zip(a_step, p_step)):
            if a.shape != b.shape or not np.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True):
                what = "rows" if i == 0 else (f"row state leaf {i - 1}" if i <= n_row
                                              else f"scalar state leaf {i - 1 - n_row}")
                raise TypeError(
                    f"the generic optimizer path cannot run {tx!r}: its {what} at step {step} "
                    "depend on how many rows the batch holds beyond the distinct ids (e.g. a "
                    "mean over the whole leaf), so a batch with duplicate ids would be updated "
                    "differently from the same distinct ids without duplicates")


def _check_update(tx, lay: _Layout, n: int, dim: int, scalars) -> None:
    """Traces tx.update abstractly on [n, dim] rows, so a transformation that cannot run on
    rows fails with a clear error before any table is read or written (even eagerly)."""
    rows = jax.ShapeDtypeStruct((n, dim), jnp.float32)
    state = _merge_state(lay, [jax.ShapeDtypeStruct((n, dim), init.dtype) for init in lay.row_init],
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


# ---- injected hyper-parameters (optax.inject_hyperparams) --------------------------------------

class _Leaf:
    """A placeholder for one state leaf, to find where the scalar leaves sit in the state."""

    def __init__(self, index):
        self.index = index


def _injected(table) -> dict:
    """name -> (index of its scalar state leaf, whether a schedule recomputes it every step)
    for the hyper-parameters of every ``optax.inject_hyperparams`` in the table's state."""
    lay = table.optimizer.layout(table.dim)
    n_rows = sum(k == "row" for k in lay.kinds)
    state = _merge_state(lay, [None] * n_rows, [_Leaf(i) for i in range(len(lay.scalar_init))])
    found, scheduled = {}, set()
    for path, leaf in jax.tree_util.tree_flatten_with_path(
            state, is_leaf=lambda x: isinstance(x, _Leaf) or x is None)[0]:
        names = [getattr(k, "name", None) for k in path]
        for j, attr in enumerate(names[:-1]):
            key = getattr(path[j + 1], "key", None)
            if attr == "hyperparams" and isinstance(leaf, _Leaf) and j + 2 == len(path):
                if key in found:
                    raise ValueError(f"the generic optimizer's state injects {key!r} twice: "
                                     "set_hyperparams cannot tell which one is meant")
                found[key] = leaf.index
            elif attr == "hyperparams_states":
                scheduled.add(key)
    return {k: (i, k in scheduled) for k, i in found.items()}


def hyperparams(table) -> dict:
    """The injected hyper-parameters of a table on the generic path (see
    :func:`dualemb.jax.optimizers.hyperparams`)."""
    state = table.opt_state or ()
    return {k: state[i] for k, (i, _) in _injected(table).items()}


def set_hyperparams(table, values: dict):
    """``table`` with new injected hyper-parameter values (see
    :func:`dualemb.jax.optimizers.set_hyperparams`); each keeps its dtype, so a compiled step
    takes the result without recompiling."""
    where = _injected(table)
    unknown = sorted(set(values) - set(where))
    if unknown:
        raise TypeError(f"set_hyperparams: {', '.join(unknown)} is not injected in {table.optimizer.tx!r} "
                        f"(injected: {sorted(where) or 'none'}; wrap the optimizer with "
                        "optax.inject_hyperparams)")
    scheduled = sorted(k for k in values if where[k][1])
    if scheduled:
        raise TypeError(f"set_hyperparams: {', '.join(scheduled)} follows a schedule, which "
                        "recomputes it at every step; inject a number to set it by hand")
    state = list(table.opt_state)
    for k, v in values.items():
        i = where[k][0]
        value = jnp.asarray(v)
        if value.shape != jnp.shape(state[i]):
            raise ValueError(f"{k} must have shape {jnp.shape(state[i])}, got {value.shape}")
        state[i] = value.astype(jnp.result_type(state[i]))
    return table.replace(opt_state=tuple(state))

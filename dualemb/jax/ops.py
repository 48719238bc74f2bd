"""The functional table operations. Reads return values; writes return the next table.

Every function checks its arguments at trace time (dtype, shape, scalar arguments; outside
``jit`` also that the table exists) and raises a clear exception before anything reaches the
core, so bad input leaves the table unchanged. Inside ``jit`` the table's id is a runtime value:
a call on a destroyed or unknown table fails when it runs, with an error naming the id.
``ids`` may have any shape; rows are ``ids.shape + (dim,)``. For what ids may be (int64 in
32-bit mode, ...) see :mod:`dualemb.jax.ids`.

Ordering: a read sees every write whose returned table it was given. A write given a table
*before* a read ran may be scheduled before that read (XLA orders only by data); when a write
must wait for an independent read, thread the read's result into the table with :func:`after`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from dualemb.jax import _ffi, _values, gpu
from dualemb.jax.ids import key_operand
from dualemb.jax.table import Table, check_exists


def _keys(table: Table, ids):
    check_exists(table)
    _values.require_available(table.value_dtype)  # x64 may have been turned off since
    return key_operand(ids, table.key_dtype)


def _rows_arg(table: Table, values, shape, what: str):
    """values in the table's value dtype, [shape + (dim,)], or a clear error (conversion rules:
    :mod:`dualemb.jax._values`)."""
    return _values.rows_operand(table.value_dtype, values, tuple(shape) + (table.dim,), what)


# ---- reads ----------------------------------------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _lookup(table: Table, keys, shape: tuple):
    rows, _ = _ffi.find(table.handle, table.dim, table.version, keys, shape, with_exists=False,
                        dtype=table.dtype, gpu=table.placement == "gpu")
    return rows


def _lookup_fwd(table, keys, shape):
    return _lookup(table, keys, shape), None


def _lookup_bwd(shape, _, g):
    # The table and the ids get no cotangent (zeros: the table's leaves are float32, see
    # dualemb.jax.table; the ids are integers). The rows' cotangent has the rows' dtype
    # (float16 for a float16 table); apply_gradients widens it to float32.
    return None, None


_lookup.defvjp(_lookup_fwd, _lookup_bwd)


def lookup(table: Table, ids) -> jax.Array:
    """Rows of ``ids`` (``ids.shape + (dim,)``, in the table's value dtype); the table is not
    changed.

    Missing ids read as their initializer row and are not inserted (``apply_gradients`` inserts
    them when they are trained). Differentiable: a ``custom_vjp`` treats the rows as a leaf of
    the computation, so ``jax.grad`` taken with respect to the rows gives per-row gradients
    (one per position of ``ids``; ``apply_gradients`` sums those of duplicate ids). The table
    itself gets zero cotangents, so a table inside a pytree given to ``jax.grad`` is fine (its
    leaves are float32 for that reason; ``p - lr * g`` leaves it unchanged). The rows' own
    gradient does not reach the table through ``jax.grad``: take it with respect to the rows
    and pass it to :func:`~dualemb.jax.apply_gradients`.
    """
    keys, shape = _keys(table, ids)
    return _lookup(table, keys, tuple(shape))


def find(table: Table, ids) -> tuple[jax.Array, jax.Array]:
    """(rows, exists): like :func:`lookup`, plus whether each id is in the table."""
    keys, shape = _keys(table, ids)
    return _ffi.find(table.handle, table.dim, table.version, keys, tuple(shape),
                     dtype=table.dtype, gpu=table.placement == "gpu")


def size(table: Table) -> jax.Array:
    """Number of ids in the table (int32 in JAX's 32-bit mode, saturating at 2**31-1)."""
    check_exists(table)
    gpu.refuse(table, "size")
    return _ffi.size(table.handle, table.version)


def export(table: Table, limit: int, offset=0, *, with_slots: bool = False):
    """A page of the table: rows [offset, offset + limit) of its iteration order (stable while
    the table is not written).

    Returns ``(ids, values [limit, dim], count)`` — or with ``with_slots`` ``(ids, values,
    slots [limit, num_slots, dim], count)`` — where only the first ``count`` entries are
    valid (the rest are zeros); values and slots are in the table's value dtype. ``ids`` are
    int64 (x64), int32 (int32 tables), or an :class:`~dualemb.jax.ids.Ids`. ``limit`` (a
    non-negative int) is static; ``offset`` (a
    non-negative int below 2**31) may be traced, and a negative traced offset fails when the
    call runs.
    """
    check_exists(table)
    gpu.refuse(table, "export")
    _values.require_available(table.value_dtype)
    from dualemb.jax.ids import Ids
    limit = _static_count("limit", limit)
    offset = _offset(offset)
    if table.key_dtype == "int32":
        layout = ((limit,), jnp.int32)
    elif jax.config.jax_enable_x64:
        layout = ((limit,), jnp.int64)
    else:
        layout = ((limit, 2), jnp.uint32)
    num_slots = _num_slots(table) if with_slots else 0
    keys, values, slots, count = _ffi.export(table.handle, table.dim, num_slots, table.version,
                                             offset, limit, layout, dtype=table.dtype)
    if layout[1] == jnp.uint32:
        keys = Ids(keys)
    return (keys, values, slots, count) if with_slots else (keys, values, count)


_INT32_MAX = 2**31 - 1


def _static_count(name: str, value) -> int:
    """A non-negative Python/numpy int argument below 2**31, or TypeError/ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a non-negative int, got {value!r}")
    if not 0 <= int(value) <= _INT32_MAX:
        raise ValueError(f"{name} must be in [0, 2**31-1], got {value}")
    return int(value)


def _offset(offset):
    """offset as an int32 operand: a checked Python/numpy int, or an integer JAX scalar."""
    if isinstance(offset, (jax.Array, jax.core.Tracer)):
        if not jnp.issubdtype(offset.dtype, jnp.integer) or jnp.ndim(offset) != 0:
            raise TypeError(f"offset must be an integer scalar, got {offset.dtype}"
                            f"{list(jnp.shape(offset))}")
        if isinstance(offset, jax.core.Tracer):
            return offset.astype(jnp.int32)  # checked by the handler (>= 0)
        offset = int(offset)
    return jnp.asarray(_static_count("offset", offset), jnp.int32)


def _num_slots(table: Table) -> int:
    """Slot rows per key: the core table's count outside jit; inside, the count the handle's
    optimizer creates (the handler checks that it matches the table)."""
    if not isinstance(table.handle, jax.core.Tracer):
        from dualemb.core.table import Table as CoreTable
        return CoreTable.attach(table.id).num_slots
    from dualemb.jax import optimizers as _opts
    opt = table.optimizer
    return _opts.num_slots(opt) if isinstance(opt, _opts.Optimizer) else 0


# ---- writes ---------------------------------------------------------------------------------

def find_or_insert(table: Table, ids) -> tuple[jax.Array, jax.Array, Table]:
    """(rows, exists, table): missing ids are inserted with their initializer row."""
    keys, shape = _keys(table, ids)
    version, rows, exists = _ffi.find_or_insert(table.handle, table.dim, table.version, keys,
                                                tuple(shape), dtype=table.dtype,
                                                gpu=table.placement == "gpu")
    return rows, exists, table.replace(version=version)


def insert(table: Table, ids, rows) -> Table:
    """Writes ``rows`` for ``ids`` (insert or overwrite; the last of duplicate ids wins).
    Optimizer slots of new ids start at their initial values; existing ids keep theirs."""
    gpu.refuse(table, "insert")
    keys, shape = _keys(table, ids)
    values = _rows_arg(table, rows, shape, "rows")
    return table.replace(version=_ffi.insert_or_assign(table.handle, table.version, keys, values))


def accum(table: Table, ids, deltas, exists) -> Table:
    """TFRA's accum, per id: absent and ``exists`` false -> inserted with its delta; present and
    ``exists`` true -> ``row += delta``; otherwise nothing (so a read's ``exists`` guards
    against racing writers)."""
    gpu.refuse(table, "accum")
    keys, shape = _keys(table, ids)
    values = _rows_arg(table, deltas, shape, "deltas")
    exists = jnp.asarray(exists)
    if exists.dtype != jnp.bool_ or tuple(exists.shape) != tuple(shape):
        raise ValueError(f"exists must be a bool array of shape {tuple(shape)}")
    return table.replace(version=_ffi.accum(table.handle, table.version, keys, values, exists))


def erase(table: Table, ids) -> Table:
    """Removes ``ids`` (and their optimizer slots); absent ids are ignored."""
    gpu.refuse(table, "erase")
    keys, _ = _keys(table, ids)
    table = table.replace(version=_ffi.erase(table.handle, table.version, keys))
    for tid in table.slot_tables:  # the generic path's state rows go with them
        from dualemb.jax import generic
        table = generic.erase_state(table, tid, keys)
    return table


def after(table: Table, *values) -> Table:
    """The same table, ordered after ``values`` are computed: a write given the result runs
    after the reads that produced ``values`` (XLA would otherwise be free to run it first)."""
    leaves = [v for v in jax.tree_util.tree_leaves(values) if hasattr(v, "shape")]
    if not leaves:
        return table
    return table.replace(version=_ffi.after(table.version, [jnp.asarray(v) for v in leaves]))

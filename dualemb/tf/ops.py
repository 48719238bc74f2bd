"""Thin Python wrappers over the dualemb TensorFlow ops (``dualemb/tf/_ops.so``).

A table is a TensorFlow resource: ``table_handle`` creates a fresh core table and returns an
anonymous, ref-counted resource handle to it (a scalar ``tf.resource`` tensor), freed when the
last copy of that handle is gone. Every other op is stateful, takes such a handle first
(``TableShard.resource``) and runs on the device the handle names. Keys have the table's key
dtype (int64, int32 or string); rows are shaped ``keys.shape + [dim]`` in the table's value
dtype (``value_dtype`` arguments default to float32, and an op whose dtype differs from the
table's raises); gradients and restrict scores are float32. On bad input an op raises
``tf.errors.InvalidArgumentError`` naming the problem, and the table is left unchanged. The
multi-table forms (``find_many``, ``find_or_insert_many``, ``apply_gradients_many``) equal the
per-table ops bit for bit (docs/tf.md, "Multi-table ops").
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.framework import op_def_registry

from dualemb.tf._load import load_ops

_ops = load_ops()

# The op library's own list of its ops (every REGISTER_OP of csrc/tf/ops.cc): the loaded module
# holds each op's raw form under the op's name (all of them Dualemb*).
OP_NAMES = tuple(sorted(n for n in dir(_ops)
                        if n.startswith("Dualemb") and op_def_registry.get(n) is not None))
# The ops with a gradient, registered where it is defined (dualemb/tf/trainable.py). Every other
# op gets tf.no_gradient: training goes through the fused optimizer, never through a table op.
OPS_WITH_GRADIENT = frozenset({"DualembRowsWithKeyGradient"})

for _name in OP_NAMES:
    if _name in OPS_WITH_GRADIENT:
        continue
    try:
        tf.no_gradient(_name)
    except KeyError:  # already registered (module reloaded)
        pass

RESTRICT_POLICIES = {"recency": 0, "frequency": 1, "custom": 2}


def table_handle(config, optimizer="", session_name: str = ""):
    """A fresh core table as a ref-counted resource handle: ``config`` is the core's config
    string (JSON, ``{"dim": 8, "key_dtype": "int64", ...}``, treated as opaque text); a non-empty
    ``optimizer`` spec string is attached. With ``session_name`` (a SavedModel's own graph, which
    C++ loaders such as TF Serving run), the table is made once in the session's resource manager
    under that name and every run uses it; it is freed when the session closes."""
    return _ops.dualemb_table_handle(config, optimizer, session_name=session_name)


def attach_table(table_id):
    """A resource handle to the existing core table ``table_id`` (made by any front end in this
    process); keeps it alive while it lives."""
    if not isinstance(table_id, (tf.Tensor, tf.Variable)):
        table_id = tf.constant(int(table_id), tf.int64)  # never through int32
    return _ops.dualemb_table_attach(table_id)


def table_id(handle):
    """The core id (int64 scalar) of the table behind ``handle``."""
    return _ops.dualemb_table_id(handle)


def find(table, keys, dim: int, value_dtype=tf.float32):
    """(values [keys.shape + dim] of value_dtype, exists [keys.shape]); missing keys read as
    their initializer row and are not inserted."""
    values, exists, _ = _ops.dualemb_find(table, keys, dim=dim, Tvalue=value_dtype)
    return values, exists


def find_or_insert(table, keys, dim: int, value_dtype=tf.float32):
    """(values, exists, evicted): like find, but missing keys are inserted with their
    initializer row; ``evicted`` is how many keys a capacity limit evicted (as every write
    op returns)."""
    return _ops.dualemb_find(table, keys, dim=dim, insert_missing=True, Tvalue=value_dtype)


def insert_or_assign(table, keys, values):
    """Writes rows (the last of duplicate keys wins). Returns how many keys a capacity evicted."""
    return _ops.dualemb_insert_or_assign(table, keys, values)


def accum(table, keys, deltas, exists):
    """TFRA's accum: absent & !exists -> insert; present & exists -> row += delta; else ignored."""
    return _ops.dualemb_accum(table, keys, deltas, exists)


def accum_rows(table, keys, old_values, new_values, exists):
    """``accum`` with the deltas computed by the core as it adds: ``new - old`` where
    ``exists``, else ``new`` (the dtype's arithmetic; integers wrap)."""
    return _ops.dualemb_accum_rows(table, keys, old_values, new_values, exists)


def erase(table, keys):
    return _ops.dualemb_erase(table, keys)


def clear_table(table):
    return _ops.dualemb_clear(table)


def table_size(table):
    return _ops.dualemb_size(table)


def apply_gradients(table, keys, grads, learning_rate, step):
    """One fused optimizer step (the table's attached optimizer) on the rows of keys; gradients
    of duplicate keys are summed and missing keys inserted first. ``step`` is 1-based."""
    return _ops.dualemb_apply_gradients(table, keys, grads,
                                        tf.cast(learning_rate, tf.float32),
                                        tf.cast(step, tf.int64))


def _many(what: str, tables, *per_table) -> list:
    """``tables`` as a list, checking that each of ``per_table`` has one entry per table."""
    tables = list(tables)
    if not tables:
        raise ValueError(f"{what}: give at least one table")
    for name, values in per_table:
        if len(values) != len(tables):
            raise ValueError(f"{what}: {len(tables)} tables but {len(values)} {name}")
    return tables


def find_many(tables, keys, dims, value_dtypes=None, insert_missing: bool = False):
    """``find`` (or with ``insert_missing`` ``find_or_insert``) on several tables in one op:
    ``[(values, exists)]`` (with ``insert_missing``: ``[(values, exists, evicted)]``), one per
    table, equal to the per-table ops' bit for bit. ``keys[i]`` (one key dtype for all) are
    table i's keys, ``dims[i]`` its dim, ``value_dtypes[i]`` its value dtype (default float32;
    string-valued tables are refused). A bad input in any table raises
    ``InvalidArgumentError`` naming the table ("table i of N") and changes no table."""
    keys, dims = list(keys), [int(d) for d in dims]
    value_dtypes = [tf.float32] * len(dims) if value_dtypes is None else list(value_dtypes)
    tables = _many("find_many", tables, ("key tensors", keys), ("dims", dims),
                   ("value dtypes", value_dtypes))
    values, exists, evicted = _ops.dualemb_find_many(
        tables, keys, dims=dims, insert_missing=insert_missing,
        Tvalues=[tf.as_dtype(d) for d in value_dtypes])
    if insert_missing:
        return list(zip(values, exists, evicted))
    return list(zip(values, exists))


def find_or_insert_many(tables, keys, dims, value_dtypes=None):
    """``find_many`` inserting missing keys: ``[(values, exists, evicted)]``."""
    return find_many(tables, keys, dims, value_dtypes, insert_missing=True)


def apply_gradients_many(tables, keys, grads, learning_rate, step):
    """``apply_gradients`` on several tables in one op, one learning rate and step for all
    (each table steps with its own attached optimizer): table i gets ``keys[i]`` and
    ``grads[i]`` (float32, ``keys[i].shape + [dim]``). Returns the evicted counts, one per
    table. Results equal the per-table ops' bit for bit; a bad input in any table raises
    ``InvalidArgumentError`` naming the table and changes no table."""
    keys, grads = list(keys), list(grads)
    tables = _many("apply_gradients_many", tables, ("key tensors", keys),
                   ("gradient tensors", grads))
    return _ops.dualemb_apply_gradients_many(tables, keys, grads,
                                             tf.cast(learning_rate, tf.float32),
                                             tf.cast(step, tf.int64))


def restrict(table, num_reserved, policy: str = "recency", keys=None, scores=None,
             key_dtype=tf.int64):
    """Keeps the ``num_reserved`` best keys by ``policy`` ("recency", "frequency", or "custom"
    with ``scores`` for ``keys``), erasing the rest with their slots; returns how many."""
    if policy not in RESTRICT_POLICIES:
        raise ValueError(f"unknown restrict policy {policy!r} (recency, frequency, custom)")
    if keys is None:
        keys = tf.zeros([0], key_dtype)
        scores = tf.zeros([0], tf.float32)
    return _ops.dualemb_restrict(table, tf.cast(num_reserved, tf.int64), keys,
                                 tf.cast(scores, tf.float32), policy=RESTRICT_POLICIES[policy])


def export_table(table, key_dtype=tf.int64, dim: int = -1, value_dtype=tf.float32, offset=0,
                 limit=-1) -> dict:
    """Rows ``[offset, offset + limit)`` of the table's iteration order (``limit < 0``: all rows
    from offset): ``{"keys": [n] key_dtype, "values": [n, dim], "slots": [n, num_slots, dim]
    (both value_dtype), "last_update": [n] i64, "update_count": [n] i64, "stepped": [n] bool}``
    (``stepped``: an optimizer step has updated the row since its slots were initialised). The
    order is stable while the table is not modified, so paging with offset/limit is consistent."""
    keys, values, slots, last, count, stepped = _ops.dualemb_export(
        table, tf.cast(offset, tf.int64), tf.cast(limit, tf.int64), Tkey=key_dtype, dim=dim,
        Tvalue=value_dtype)
    return {"keys": keys, "values": values, "slots": slots, "last_update": last,
            "update_count": count, "stepped": stepped}


def import_table(table, keys, values, slots=None, last_update=None, update_count=None,
                 clear: bool = False, stepped=None):
    """Inserts or overwrites rows; returns how many keys a capacity evicted (int64 scalar).
    Values (a tensor: its dtype must be the table's; a Python list becomes float32) and slots
    (``[n, num_slots, dim]`` of the attached optimizer, the values' dtype) go in as they are;
    None slots give new rows the optimizer's initial slots, None metadata is left out.
    ``clear=True`` empties the table first (restore = replace, not merge). ``stepped`` (bool
    [n]) marks the rows an optimizer has stepped; left out, rows given slots count as stepped
    where they differ from the initial slots."""
    keys = tf.convert_to_tensor(keys)
    values = tf.convert_to_tensor(values, None if hasattr(values, "dtype") else tf.float32)
    empty_v = tf.zeros([0], values.dtype)
    empty_i = tf.zeros([0], tf.int64)
    return _ops.dualemb_import(
        table, keys, values,
        empty_v if slots is None else tf.convert_to_tensor(slots, values.dtype),
        empty_i if last_update is None else tf.cast(last_update, tf.int64),
        empty_i if update_count is None else tf.cast(update_count, tf.int64),
        [] if stepped is None else [tf.cast(stepped, tf.bool)],
        clear=clear)


def set_optimizer(table, spec, empty_detaches: bool = True):
    """Attaches the fused optimizer ``spec`` (a spec string); with ``empty_detaches=False`` an
    empty spec leaves the table as it is."""
    return _ops.dualemb_set_optimizer(table, spec, empty_detaches=empty_detaches)


def describe(table):
    """The table's config and optimizer spec strings, joined by ``|``."""
    return _ops.dualemb_describe(table)


def get_clock(table):
    """The table's logical clock (int64 scalar), stamped into ``last_update`` by writes."""
    return _ops.dualemb_get_clock(table)


def set_clock(table, clock):
    return _ops.dualemb_set_clock(table, tf.cast(clock, tf.int64))


def rows_with_key_gradient(anchor, rows, keys):
    """``rows`` unchanged; the gradient registered for it in ``dualemb/tf/trainable.py`` sends
    the rows' gradient to ``anchor`` as IndexedSlices indexed by ``keys``."""
    return _ops.dualemb_rows_with_key_gradient(anchor, rows, keys)


def build_info() -> tuple[str, str]:
    """(TensorFlow version the op library was compiled against, core version)."""
    tf_version, core_version = _ops.dualemb_build_info()
    return tf_version.numpy().decode(), core_version.numpy().decode()

"""Core ``Table`` views of a Variable's shards when some live in another process.

Under ``ParameterServerStrategy`` a shard's table is a resource on a PS task: its handle works
from the chief (every op on it runs on the PS), but the chief's core registry has no table with
that id, so the paths that read or write tables through ``dualemb.core`` (the common checkpoint
format) cannot attach to it. For such a shard, :func:`staged_core_shards` gathers the rows, slots
and metadata through the handle (``export`` op, run on the PS) into a scratch core table of the
same config and optimizer in this process; :func:`write_back` replaces the remote table's contents
with a scratch table's (``import`` op with ``clear``). Local shards are used as they are.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

from dualemb.core.spec import parse_description, to_spec
from dualemb._native import load_extension
from dualemb.core.table import Table
from dualemb.tf import ops

_core = load_extension("_core")  # the core's pybind11 binding (csrc/python)


def is_local(table_id: int) -> bool:
    """Whether this process's core registry holds the table (False for a shard on a PS task)."""
    return bool(_core.exists(int(table_id)))


def describe_shard(shard) -> str:
    """The core's JSON description of a shard, read where the shard lives."""
    tid = int(getattr(shard, "table_id", shard))
    if is_local(tid):
        return _core.describe(tid)
    with tf.init_scope():
        return ops.describe(shard.resource).numpy().decode()


def _scratch_copy(shard, key_dtype: tf.DType, dim: int, value_dtype: tf.DType) -> Table:
    config, opt = parse_description(describe_shard(shard))
    # The scratch copy is in memory: with the shard's Redis backend members it would open the
    # same Redis table from the chief (and destroying it could touch the shared rows).
    config = {k: v for k, v in config.items() if k not in ("backend", "redis")}
    tid = _core.create(0, to_spec(config))
    table = Table.attach(tid)  # caches only the immutable dim and dtypes
    try:
        if opt is not None:
            _core.set_optimizer(tid, to_spec(opt))
        with tf.init_scope():
            page = ops.export_table(shard.resource, key_dtype=key_dtype, dim=dim,
                                    value_dtype=value_dtype)
            page = {k: v.numpy() for k, v in page.items()}
        if len(page["keys"]):
            table.import_rows(page["keys"], page["values"], page["slots"],
                              page["last_update"], page["update_count"], page["stepped"])
    except BaseException:
        table.destroy()
        raise
    return table


@contextlib.contextmanager
def staged_core_shards(var):
    """Yields the variable's shards as core Tables, in shard order: local shards attached, remote
    ones copied into scratch tables (destroyed on exit). Yields (tables, remote) where remote[i]
    says shard i is a scratch copy."""
    kd = tf.as_dtype(var.key_dtype)
    tables, remote = [], []
    try:
        for shard in var.tables:
            tid = int(getattr(shard, "table_id", shard))
            if is_local(tid):
                tables.append(Table.attach(tid, name=str(var.name)))
                remote.append(False)
            else:
                t = _scratch_copy(shard, kd, int(var.dim), tf.as_dtype(var.value_dtype))
                t.name = str(var.name)
                tables.append(t)
                remote.append(True)
        yield tables, remote
    finally:
        for t, r in zip(tables, remote):
            if r:
                t.destroy()


def write_back(var, tables, remote) -> None:
    """Replaces each remote shard's rows (and optimizer) with its scratch table's contents."""
    for shard, table, r in zip(var.tables, tables, remote):
        if not r:
            continue
        _, opt = parse_description(_core.describe(table.id))
        page = table.export()
        with tf.init_scope():
            ops.set_optimizer(shard.resource, "" if opt is None else to_spec(opt),
                              empty_detaches=False)
            ops.import_table(shard.resource, page["keys"], page["values"], page["slots"],
                             page["last_update"], page["update_count"], clear=True,
                             stepped=page["stepped"])

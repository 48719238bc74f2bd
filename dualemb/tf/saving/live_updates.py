"""Live serving updates from TensorFlow: the tables of a ``de.Variable`` — or of one inside a
SavedModel loaded for serving (``tf.saved_model.load``) — follow a directory of checkpoints that
a trainer publishes (``de.save(model, dir/step-N, base=...)`` or
``dualemb.core.checkpoint.Publisher``), through ``dualemb.core.checkpoint.Follower``: new deltas
and full checkpoints are applied in place while the model answers lookups
(docs/online_learning.md).

A loaded SavedModel restores a Variable as a plain trackable object whose ``_tables`` child
lists the shards' resources (fresh tables, owned by the loaded object): their core ids are read
with the ``DualembTableId`` op. Its Python ``partition_fn`` is not in the SavedModel (only the
traced lookups that use it), so a loaded variable of several shards is routed by the default
partitioner (``de.Variable``'s ``default_partition_fn``); pass ``partitioners`` for one that was
built with another.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from dualemb.core import checkpoint as _ckpt
from dualemb.core.table import Table
from dualemb.tf import ops as de_ops
from dualemb.tf.variable import Variable, default_partition_fn


def _tf_partitioner(fn):
    """A core partitioner (numpy keys, shard count -> shard indices) from a TF one."""
    def route(keys, n):
        return np.asarray(fn(tf.constant(keys), n)).astype(np.int64)
    return route


def _shards(name: str, obj) -> tuple[list, object]:
    """(core tables, default partitioner) of a Variable or a loaded SavedModel's variable."""
    if isinstance(obj, Variable):
        ids = [getattr(t, "table_id", None) for t in obj.tables]
        if any(i is None for i in ids):
            raise ValueError(f"table {name!r}: a Variable built in a TF1 graph has no tables in "
                             "this process (its session creates them)")
        return [Table.attach(int(i)) for i in ids], _tf_partitioner(obj.partition_fn)
    resources = getattr(obj, "_tables", None)
    if resources is None or not all(hasattr(r, "resource_handle") for r in resources):
        raise TypeError(f"table {name!r}: expected a de.Variable or the restored variable of a "
                        f"loaded SavedModel (e.g. loaded.model.<...>), got {type(obj).__name__}")
    ids = [int(de_ops.table_id(r.resource_handle)) for r in resources]
    return [Table.attach(i) for i in ids], _tf_partitioner(default_partition_fn)


def follow(directory, tables: Mapping, *, partitioners: Mapping | None = None):
    """A ``dualemb.core.checkpoint.Follower`` keeping ``tables`` (checkpoint table name -> a
    ``de.Variable`` or a loaded SavedModel's variable object) at the newest checkpoint in
    ``directory``; ``poll()``, or ``start(interval)`` / ``stop()``. Lookups (the model's
    signatures, ``embedding_lookup``) go on meanwhile and see each row before or after an
    update, never half-written. ``de.save`` names a model's tables by their Variables' names.
    ``partitioners``: name -> ``fn(keys_tensor, num_shards)`` for variables of several shards
    routed by a custom ``partition_fn`` (a live Variable's own is used by default)."""
    if not isinstance(tables, Mapping) or not tables:
        raise TypeError("tables must be a non-empty mapping name -> de.Variable (or a loaded "
                        "SavedModel's variable)")
    partitioners = dict(partitioners or {})
    core, routes = {}, {}
    for name, obj in tables.items():
        shards, route = _shards(name, obj)
        if name in partitioners:
            route = _tf_partitioner(partitioners[name])
        core[name] = shards if len(shards) > 1 else shards[0]
        routes[name] = route
    return _ckpt.Follower(directory, core, partitioner=routes)

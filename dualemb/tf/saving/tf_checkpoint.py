"""A ``de.Variable`` in TF object checkpoints (``tf.train.Checkpoint``, ``CheckpointManager``)
and SavedModels: the bodies of ``Variable._serialize_to_tensors`` / ``_restore_from_tensors``.

The tensors are those of ``saving.variable_state`` (six per variable, whatever its shard count
and optimizer), built with the dualemb TF ops only, so the same code runs eagerly and in the
functions a SavedModel stores; a SavedModel re-creates its tables (same ids, same config) when it
is loaded in a fresh process after ``import dualemb.tf``. See docs/tf_saving.md.
"""

from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf

from dualemb.core.checkpoint import CheckpointError
from dualemb.tf.saving import variable_state as state

try:
    from tensorflow.python.checkpoint import tensor_callable
except ImportError:  # pragma: no cover - a TF without deferred checkpoint values
    tensor_callable = None


class _LazyExport:
    """Defers the export to the moment TF writes the checkpoint and does it once for all fields.

    TF calls ``_serialize_to_tensors`` also when it only needs the names and dtypes (on every
    restore); returning callables keeps that from copying the whole live table."""

    def __init__(self, var):
        self._var = var
        self._tensors = None
        self._pending = set()

    def get(self, field):
        if not self._pending:
            with tf.device("/cpu:0"):
                self._tensors = state.export_tensors(self._var)
            self._pending = set(self._tensors)
        self._pending.discard(field)
        value = self._tensors[field]
        if not self._pending:
            self._tensors = None
        return value


def serialize_variable(var) -> dict:
    """``Variable._serialize_to_tensors``: {"keys", "values", "slots", "last_update",
    "update_count", "meta"} over all shards. Works eagerly and while tracing (SavedModel).
    A variable made with ``checkpoint=False`` contributes nothing."""
    if not getattr(var, "checkpoint", True):
        return {}
    if not tf.executing_eagerly() or tensor_callable is None:
        tensors = state.export_tensors(var)
        return {f: tensors[f] for f in state.FIELDS + (state.META,)}

    lazy = _LazyExport(var)
    with tf.device("/cpu:0"):
        # The full name (/job:localhost/.../device:CPU:0): with a short one TF would count a
        # second task and move the whole save into a tf.function.
        device = tf.constant(0).device
    dtypes = state.dtypes_of(var)
    return {f: tensor_callable.Callable(lambda f=f: lazy.get(f), dtypes[f], device)
            for f in state.FIELDS + (state.META,)}


def _graph_checks(facts: dict, restored: dict) -> list:
    """Assertions standing in for the eager checks inside a traced restore function."""
    dim = facts["dim"]
    values, meta = restored["values"], restored[state.META]
    return [
        tf.debugging.assert_equal(
            tf.shape(values)[1], dim,
            message=f"dualemb: dim mismatch restoring de.Variable {facts['name']!r} "
                    f"(dim {dim}); the variable was left unchanged"),
        tf.debugging.Assert(
            tf.strings.regex_full_match(
                meta, f'.*"key_dtype": "{facts["key_dtype"]}".*"value_dtype": '
                      f'"{facts["value_dtype"]}".*'),
            [tf.constant(f"dualemb: key/value dtype mismatch restoring de.Variable "
                         f"{facts['name']!r}; the variable was left unchanged"), meta]),
    ]


def restore_variable(var, restored: Mapping) -> tf.Operation | None:
    """``Variable._restore_from_tensors``: replaces the contents of every shard with the saved
    rows, slots and metadata (keys routed by the variable's partitioner), attaching the saved
    optimizer first. Raises CheckpointError (eagerly; an assertion in a traced function) and
    leaves the variable unchanged if the checkpoint does not fit it."""
    where = f"restoring de.Variable {getattr(var, 'name', var)!r}"
    if not getattr(var, "checkpoint", True):
        return None
    missing = [f for f in state.FIELDS + (state.META,) if f not in restored]
    if missing:
        raise CheckpointError(f"{where}: the checkpoint lacks tensors {missing}")
    facts = state.var_facts(var)
    restored = dict(restored)
    if tf.executing_eagerly():
        state.eager_checks(facts, restored, where)
        deps = []
    else:
        deps = _graph_checks(facts, restored)
    return state.import_tensors(var, facts, restored, deps)

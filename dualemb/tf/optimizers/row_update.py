"""The embedding half of one optimizer step, shared by every optimizer front end
(``optimizer.py`` for Keras 3, ``legacy_optimizer.py`` for tf_keras and ``tf.compat.v1``):
gather the key-indexed gradients of each dynamic embedding ``Variable`` and run the core's fused
optimizer on its rows."""

from __future__ import annotations

import tensorflow as tf

from dualemb.tf import ops


class Group:
    """The embedding gradients of one ``Variable`` in one step (from all its anchors)."""

    def __init__(self, params):
        self.params = params
        self.wrappers = []
        self.keys = []
        self.values = []

    def add(self, wrapper, grad):
        if not isinstance(grad, tf.IndexedSlices):
            raise TypeError(
                f"the gradient of dynamic embedding anchor {wrapper._de_name!r} must be the "
                f"IndexedSlices a dualemb lookup produces, got {type(grad).__name__}")
        self.wrappers.append(wrapper)
        self.keys.append(grad.indices)
        self.values.append(tf.cast(grad.values, tf.float32))

    def finish(self):
        self.keys = self.keys[0] if len(self.keys) == 1 else tf.concat(self.keys, 0)
        self.values = self.values[0] if len(self.values) == 1 else tf.concat(self.values, 0)

    def sum_duplicates(self):
        """One row per distinct key, the sum of its per-occurrence gradients (what clipping
        sees; the fused step sums duplicates itself otherwise)."""
        unique, index = tf.unique(self.keys)
        self.values = tf.math.unsorted_segment_sum(self.values, index, tf.size(unique))
        self.keys = unique


def attach(params, spec: dict, owner) -> None:
    """Makes ``spec`` the fused optimizer of ``params``' tables (``owner``: the optimizer)."""
    params.router.attach_optimizer(spec, owner)


def fused_step(group: Group, learning_rate, step) -> None:
    """The core's fused update of ``group``'s rows (duplicates summed, new keys inserted with
    their slots); then the restrict policy's bookkeeping, as TFRA's optimizer does every step."""
    params = group.params

    def step_fn(table_id, keys, grads):
        return ops.apply_gradients(table_id, keys, grads, learning_rate, step)

    params.router.write(step_fn, group.keys, group.values)
    after_step(group)


def after_step(group: Group) -> None:
    """What follows ``group``'s fused update (also when a multi-table op made it,
    ``multi_table.py``): the restrict policy's bookkeeping, as TFRA's optimizer does every step,
    and the refresh of a ShadowVariable's kept rows."""
    params = group.params
    if params.restrict_policy is not None:
        params.restrict_policy.apply_update(group.keys)
    for wrapper in {id(w): w for w in group.wrappers}.values():
        refresh = getattr(wrapper, "_after_update", None)  # a ShadowVariable's kept rows
        if refresh is not None:
            refresh()

"""The embedding half of one optimizer step, shared by both optimizer front ends
(``keras_wrapper.py`` for Keras 3, ``legacy_wrapper.py`` for tf_keras and ``tf.compat.v1``):
gather the key-indexed gradients of each dynamic embedding ``Variable`` (``Group``) and run the
core's fused optimizer on its rows (``fused_steps``).

Several tables in one op. An optimizer step of a model with F embedding tables would run F
``DualembApplyGradients`` ops, each with TF's per-op cost and each alone on its thread.
``fused_steps`` runs the step of every table that can share one op as one
``DualembApplyGradientsMany`` (the core runs the tables in parallel, each with its per-table
code, so rows, slots and step counts are those of the per-table ops bit for bit), and the others
per table. One step has one learning rate and one step number for all its tables; each table
keeps its own fused optimizer. The shards of the Variables in the step share one op when they

- have the same key dtype (the op takes one), and live on the same device (one op reads them
  all);
- are in-memory tables (a Redis table, ``"backend": "redis"``, steps alone: its errors and
  server round trips stay per table);
- belong to a Variable routed by key (no placement: ``distribute/`` decides where a replica's
  rows go), outside a ``tf.distribute`` strategy scope (whose shards may live on other tasks).

``DUALEMB_TF_MULTI_TABLE=0`` in the environment (read when the step is traced) or
``multi_table=False`` on the optimizer gives every table its own op.
"""

from __future__ import annotations

import os

import tensorflow as tf

from dualemb.tf import ops
from dualemb.tf.shard import in_memory

ENV_SWITCH = "DUALEMB_TF_MULTI_TABLE"


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
                f"the gradient of dynamic embedding anchor {wrapper.name!r} (Variable "
                f"{self.params.name!r}) must be the IndexedSlices a dualemb lookup produces, "
                f"got {type(grad).__name__}")
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


def enabled(optimizer_setting: bool = True) -> bool:
    """Whether steps group tables: the optimizer's setting, unless the environment turns it off
    (``DUALEMB_TF_MULTI_TABLE`` = 0, false, no or off)."""
    env = os.environ.get(ENV_SWITCH, "").strip().lower()
    return bool(optimizer_setting) and env not in ("0", "false", "no", "off")


@tf.autograph.experimental.do_not_convert  # Python control flow over Python objects
def fused_steps(groups, learning_rate, step, multi_table: bool = True) -> None:
    """The core's fused update of every group's rows (duplicates summed, new keys inserted with
    their slots; the tables that allow it in one op per device and key dtype: see the module
    docstring), then each group's bookkeeping after its update."""
    grouped = enabled(multi_table) and not tf.distribute.has_strategy()
    candidates = [g for g in groups if _groupable(g)] if grouped and len(groups) > 1 else []
    buckets = {}  # (device, key dtype) -> [(shard, keys, grads)]
    for group in candidates:
        for shard, keys, grads in _shard_calls(group):
            buckets.setdefault((shard.device, group.params.router.key_dtype), []).append(
                (shard, keys, grads))
    for (device, _), calls in buckets.items():
        if len(calls) == 1:
            shard, keys, grads = calls[0]
            ops.apply_gradients(shard.resource, keys, grads, learning_rate, step)
            continue
        with tf.device(device or None):
            ops.apply_gradients_many([s.resource for s, _, _ in calls],
                                     [k for _, k, _ in calls], [g for _, _, g in calls],
                                     learning_rate, step)
    stepped = {id(g) for g in candidates}
    for group in groups:
        if id(group) not in stepped:
            group.params.router.write(
                lambda handle, keys, grads: ops.apply_gradients(handle, keys, grads,
                                                                learning_rate, step),
                group.keys, group.values)
        _after_step(group)


def _groupable(group) -> bool:
    router = group.params.router
    return router.placement is None and all(in_memory(s) for s in router.shards)


def _shard_calls(group) -> list:
    """[(shard, keys, grads)]: the per-shard share of ``group``'s update, as the router routes
    it (``router.write`` calls the op once per shard, in shard order, when not placed)."""
    calls = []

    def record(handle, keys, grads):
        calls.append((keys, grads))

    group.params.router.write(record, group.keys, group.values)
    return list(zip(group.params.router.shards, (k for k, _ in calls), (g for _, g in calls)))


def _after_step(group: Group) -> None:
    """What follows ``group``'s fused update: the restrict policy's bookkeeping, as TFRA's
    optimizer does every step, and the refresh of a ShadowVariable's kept rows."""
    params = group.params
    if params.restrict_policy is not None:
        params.restrict_policy.apply_update(group.keys)
    for wrapper in {id(w): w for w in group.wrappers}.values():
        if getattr(wrapper, "keeps_lookups", False):  # a ShadowVariable
            wrapper.after_update()

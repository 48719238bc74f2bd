"""The fused step of several embedding ``Variable``s as one multi-table op (issue 22).

An optimizer step of a model with F embedding tables would run F ``DualembApplyGradients`` ops,
each with TF's per-op cost and each alone on its thread. ``fused_steps`` runs the step of every
table that can share one op as one ``DualembApplyGradientsMany`` (the core runs the tables in
parallel, each with its per-table code, so rows, slots and step counts are those of the
per-table ops bit for bit), and the others per table.

The grouping rule. One optimizer step has one learning rate and one step number for all its
tables; each table keeps its own fused optimizer (weight decay on some and not others is fine).
The shards of the Variables in the step share one op when they

- have the same key dtype (the op takes one), and live on the same device (where their table
  resource was made: one op reads them all);
- are in-memory tables (a Redis table, ``"backend": "redis"``, steps alone: its errors and
  server round trips stay per table);
- belong to a Variable routed by key (no placement: ``distribute/`` decides where a replica's
  rows go), outside a ``tf.distribute`` strategy scope (whose shards may live on other tasks).

A group of one table, and everything else, takes the per-table op. ``DUALEMB_TF_MULTI_TABLE=0``
in the environment (read when the step is traced) or ``multi_table=False`` on the optimizer
turns grouping off: every table steps alone, as before.
"""

from __future__ import annotations

import os

import tensorflow as tf

from dualemb.tf import ops
from dualemb.tf.optimizers import row_update
from dualemb.tf.shard import in_memory

ENV_SWITCH = "DUALEMB_TF_MULTI_TABLE"


def enabled(optimizer_setting: bool = True) -> bool:
    """Whether steps group tables: the optimizer's setting, unless the environment turns it off
    (``DUALEMB_TF_MULTI_TABLE`` = 0, false, no or off)."""
    env = os.environ.get(ENV_SWITCH, "").strip().lower()
    return bool(optimizer_setting) and env not in ("0", "false", "no", "off")


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


@tf.autograph.experimental.do_not_convert  # Python control flow over Python objects
def fused_steps(groups, learning_rate, step, multi_table: bool = True) -> None:
    """The core's fused update of every group's rows (``row_update.fused_step`` for each, the
    tables that allow it in one op per device and key dtype: see the module docstring), then
    each group's bookkeeping after its update."""
    grouped = enabled(multi_table) and not tf.distribute.has_strategy()
    candidates = [g for g in groups if _groupable(g)] if grouped and len(groups) > 1 else []
    buckets = {}  # (device, key dtype) -> [(shard, keys, grads)]
    for group in candidates:
        for shard, keys, grads in _shard_calls(group):
            device = getattr(shard, "_resource_device", "") or ""
            buckets.setdefault((device, group.params.router.key_dtype), []).append(
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
        if id(group) in stepped:
            row_update.after_step(group)
        else:
            row_update.fused_step(group, learning_rate, step)

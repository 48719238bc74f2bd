"""Embedding lookups where each replica owns one shard, with ids and rows exchanged by TF's
collective all-to-all (``MirroredStrategy`` over local devices, ``MultiWorkerMirroredStrategy``).

Replica ``r`` of ``N`` owns the keys ``shard_of(key, N) == r`` (the one routing function), in the
Variable table it created on its own device (``Variable(devices=strategy.extended.worker_devices)``:
a process holds the shards of its local replicas). A lookup, per replica:

1. deduplicates its ids and buckets them by owner; every bucket is padded to the same capacity
   ``cap`` (the largest bucket of any replica, one all-reduce(max)), since an all-to-all exchanges
   equal-sized chunks: chunk ``j`` of replica ``i`` goes to replica ``j``;
2. all-to-all of the padded ids and of the bucket sizes: each replica receives the ids it owns;
3. the owner reads those rows from its table, with the gradient route to the Variable's anchor
   (``dualemb/tf/trainable.py``) keyed by the ids it owns;
4. all-to-all of the rows back (its gradient is the same all-to-all of the rows' gradients, the
   exchange being its own inverse permutation), and the rows are put back in the ids' order.

So in backpropagation each replica's row gradients travel to the owner, which sees the keys it
owns in its anchor's IndexedSlices (one entry per requesting replica: the fused step sums them),
and ``DynamicEmbeddingOptimizer`` updates only the local table. Bytes moved per lookup and
replica: ``N * cap * (8 + 4 * dim)`` each way (ids + rows), plus the gradient on the way back.

The ops are ``CollectiveAllToAllV2`` / ``CollectiveReduceV2``, keyed by a group key and instance
keys as tf.distribute's own collectives are (``CollectiveAllToAllV3`` instead needs a communicator
resource initialised once per member, which a retraced ``tf.function`` cannot do again). Group and
instance keys are kept apart from the strategy's (which count up from 1); instance keys count per
thread, as the strategy's do, because ``MirroredStrategy`` traces each replica in its own thread
and every replica must give the same collective the same key.
"""

from __future__ import annotations

import threading

import tensorflow as tf
from tensorflow.python.ops import collective_ops

from dualemb.core.routing import shard_of
from dualemb.tf import modes, ops
from dualemb.tf.trainable import attach_gradient

_GROUP_KEY_BASE = 7_340_000
_INSTANCE_KEY_BASE = 5_000_000
_counter = threading.local()


def _next_instance_key() -> int:
    key = getattr(_counter, "value", _INSTANCE_KEY_BASE)
    _counter.value = key + 1
    return key


class Group:
    """The collective group of a strategy's ``num_replicas`` replicas."""

    def __init__(self, num_replicas: int):
        self.size = int(num_replicas)
        self.key = _GROUP_KEY_BASE + self.size

    def all_to_all(self, x):
        """Chunk j of ``x`` (split along axis 0 into ``size`` equal chunks) goes to replica j."""
        return collective_ops.all_to_all_v2(x, self.size, self.key, _next_instance_key())

    def max(self, x):
        return collective_ops.all_reduce_v2(x, self.size, self.key, _next_instance_key(),
                                            merge_op="Max", final_op="Id")

    def exchange_rows(self, rows):
        """``all_to_all`` of float rows whose gradient is the ``all_to_all`` of the gradient."""

        @tf.custom_gradient
        def exchange(x):
            def grad(dy):
                return self.all_to_all(tf.convert_to_tensor(dy))
            return self.all_to_all(x), grad

        return exchange(rows)


def replica_position(strategy=None):
    """(this replica's index in sync, number of replicas) as Python ints, or None outside a
    replica context of a strategy with more than one replica."""
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return None
    ctx = tf.distribute.get_replica_context()
    n = ctx.num_replicas_in_sync
    if n <= 1:
        return None
    rid = tf.get_static_value(ctx.replica_id_in_sync_group)
    if rid is None:
        raise ValueError("all-to-all embedding needs a static replica id (MirroredStrategy or "
                         "MultiWorkerMirroredStrategy)")
    return int(rid), int(n)


def lookup_rows(params, flat_ids, name: str, replica: int, num_replicas: int):
    """Rows [n, dim] float32 of the flat ids of this replica, read from the replicas that own
    them (see the module docstring)."""
    tables = params.tables
    if num_replicas % len(tables):
        raise ValueError(f"Variable {params.name!r} has {len(tables)} local shards, which does "
                         f"not divide the {num_replicas} replicas")
    local = tables[replica % len(tables)]  # replicas are numbered task-major
    group = Group(num_replicas)
    dim = params.dim

    uniq, index = tf.unique(flat_ids)
    dest = tf.cast(shard_of(uniq, num_replicas), tf.int32)
    order = tf.argsort(dest, stable=True)
    sorted_ids = tf.gather(uniq, order)
    sorted_dest = tf.gather(dest, order)
    counts = tf.math.bincount(dest, minlength=num_replicas, maxlength=num_replicas,
                              dtype=tf.int32)
    cap = tf.maximum(group.max(tf.reduce_max(counts)), 1)
    starts = tf.cumsum(counts, exclusive=True)
    slot = sorted_dest * cap + (tf.range(tf.size(sorted_ids)) - tf.gather(starts, sorted_dest))
    send_ids = tf.scatter_nd(slot[:, None], sorted_ids, [num_replicas * cap])
    recv_ids = group.all_to_all(send_ids)
    recv_counts = group.all_to_all(counts)
    within = tf.range(num_replicas * cap) % cap
    valid = within < tf.repeat(recv_counts, cap)
    owned_pos = tf.cast(tf.where(valid), tf.int32)  # [m, 1]
    owned_ids = tf.gather_nd(recv_ids, owned_pos)

    rows, _ = ops.find(local.resource, owned_ids, dim)
    if params.trainable and modes.is_training():
        rows = attach_gradient(params.trainable_wrapper(name), rows, owned_ids)
    recv_rows = tf.scatter_nd(owned_pos, rows, tf.stack([num_replicas * cap, dim]))
    back = group.exchange_rows(recv_rows)
    sorted_rows = tf.gather(back, slot)
    uniq_rows = tf.scatter_nd(order[:, None], sorted_rows, tf.stack([tf.size(uniq), dim]))
    return tf.gather(uniq_rows, index)


def bytes_per_lookup(cap: int, num_replicas: int, dim: int, key_bytes: int = 8) -> int:
    """Bytes one replica sends per lookup (ids + sizes + rows), without the backward pass."""
    return num_replicas * cap * (key_bytes + 4 * dim) + 4 * num_replicas + 4

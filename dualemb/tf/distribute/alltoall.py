"""Embedding lookups where each replica owns one shard, with ids, rows and row gradients
exchanged by TF's collective all-to-all (``MirroredStrategy`` over local devices,
``MultiWorkerMirroredStrategy``), behind ``de.keras.layers.HvdAllToAllEmbedding``.

Contract: replica ``r`` of ``N`` owns the keys ``shard_of(key, N) == r`` (the one routing
function), in the shard its process holds for it. ``lookup_rows`` returns, in each replica, the
rows of its ids, with a gradient route that delivers each row gradient to the owner's anchor
(``IndexedSlices`` over the keys it owns), so ``DynamicEmbeddingOptimizer`` updates each shard on
its owner only. Every replica must call the same lookups in the same order on every step (as
synchronous training does); a replica that skips one leaves the others waiting, bounded by the
strategy's ``CommunicationOptions(timeout_seconds=...)`` when set. ``bytes_per_lookup`` gives
what one replica sends per lookup. The algorithm and why the collectives take an ordering token
and a fresh instance key: docs/scaling_tf.md ("How the exchange works, and what it costs").
"""

from __future__ import annotations

import weakref
import zlib

import tensorflow as tf

from dualemb.core.routing import shard_of
from dualemb.tf import keras_adapter, modes, ops
from dualemb.tf.distribute.replica_shards import replica_position  # noqa: F401 (re-exported)
from dualemb.tf.trainable import attach_gradient

# Group keys of tf.distribute's own collectives count up from 1; ours sit far above them, one per
# strategy kind and replica count (all processes of a job must compute the same key).
_GROUP_KEY_BASE = 1_700_000_000


class Exchange:
    """The collective group of one strategy's replicas: group key, per-replica instance-key
    counter (the ordering token of every collective of the replica). One per strategy, shared
    by all layers, so their collectives are numbered in one sequence. Build it inside
    ``strategy.scope()`` (``for_strategy`` does)."""

    def __init__(self, strategy):
        self.strategy = strategy
        self.size = int(strategy.num_replicas_in_sync)
        kind = type(strategy).__name__
        self.group_key = _GROUP_KEY_BASE + (zlib.crc32(kind.encode()) % 1000) * 1000 + self.size
        self.timeout = keras_adapter.communication_timeout(strategy)
        with strategy.scope():
            # SyncOnRead: each replica updates its own component (and gets its own handle).
            self._counter = tf.Variable(
                0, dtype=tf.int32, trainable=False, name="dualemb_alltoall_instance_key",
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

    def _key_and_token(self):
        # A fresh instance key per collective: the padded shapes change from step to step, and
        # TF aborts every later collective of the process when a key is reused with another
        # shape. The per-replica counter is also the ordering token, which orders a collective
        # only with its own replica's (tf.function chains token-less stateful ops in program
        # order, across the replicas MirroredStrategy traces into one graph: a deadlock).
        key = self._counter.assign_add(1, read_value=True)
        return tf.convert_to_tensor(key), [self._counter.handle]

    def all_gather(self, x):
        """``x`` of every rank concatenated along axis 0, in rank order."""
        key, token = self._key_and_token()
        return tf.raw_ops.CollectiveGatherV2(
            input=x, group_size=self.size, group_key=self.group_key, instance_key=key,
            ordering_token=token, timeout_seconds=self.timeout)

    def all_to_all(self, x):
        """Chunk ``j`` of ``x`` (axis 0 split into ``size`` equal chunks) goes to rank ``j``;
        chunk ``i`` of the result came from rank ``i``."""
        key, token = self._key_and_token()
        # TF's kernel exchanges x[j] with rank j: axis 0 must be the group size.
        chunks = tf.reshape(x, tf.concat([[self.size, -1], tf.shape(x)[1:]], 0))
        out = tf.raw_ops.CollectiveAllToAllV2(
            input=chunks, group_size=self.size, group_key=self.group_key, instance_key=key,
            ordering_token=token, timeout_seconds=self.timeout)
        return tf.reshape(out, tf.shape(x))

    def exchange_rows(self, rows):
        """``all_to_all`` of float rows, whose gradient is the ``all_to_all`` of the gradient."""

        @tf.custom_gradient
        def exchange(x):
            def grad(dy):
                return self.all_to_all(tf.convert_to_tensor(dy))
            return self.all_to_all(x), grad

        return exchange(rows)


_exchanges: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def for_strategy(strategy) -> Exchange:
    """The ``Exchange`` of ``strategy`` (made on first use; call inside its scope)."""
    exchange = _exchanges.get(strategy)
    if exchange is None:
        exchange = _exchanges[strategy] = Exchange(strategy)
    return exchange


def lookup_rows(params, flat_ids, name: str, exchange: Exchange, replica: int,
                secondary_unique: bool = True):
    """Rows [n, dim] float32 of this replica's flat ids, read from the replicas that own them
    (see the module docstring). ``secondary_unique``: the owner reads each key it receives
    once, even when several replicas asked for it."""
    n = exchange.size
    tables = params.tables
    if n % len(tables):
        raise ValueError(f"Variable {params.name!r} has {len(tables)} local shards, which does "
                         f"not divide the {n} replicas")
    # Replicas are numbered task-major, one shard per local replica: replica r's table is
    # local shard r mod (local replicas), where the fused optimizer writes (replica_shards.py).
    local = tables[replica % len(tables)]
    dim = params.dim

    uniq, index = tf.unique(flat_ids)
    owner = tf.cast(shard_of(uniq, n), tf.int32)
    counts = tf.math.bincount(owner, minlength=n, maxlength=n, dtype=tf.int32)
    info = tf.reshape(exchange.all_gather(tf.concat([[replica], counts], 0)), [n, n + 1])
    rank_replica = info[:, 0]  # the replica id of each rank
    rank_of_replica = tf.math.invert_permutation(rank_replica)
    cap = tf.maximum(tf.reduce_max(info[:, 1:]), 1)
    recv_counts = info[:, 1 + replica]  # how many ids each rank sends this replica

    dest = tf.gather(rank_of_replica, owner)  # the rank each distinct id goes to
    order = tf.argsort(dest, stable=True)
    sorted_dest = tf.gather(dest, order)
    counts_by_rank = tf.gather(counts, rank_replica)
    starts = tf.cumsum(counts_by_rank, exclusive=True)
    sorted_slot = sorted_dest * cap + (tf.range(tf.size(uniq)) - tf.gather(starts, sorted_dest))
    slot = tf.gather(sorted_slot, tf.math.invert_permutation(order))  # per distinct id
    send_ids = tf.scatter_nd(slot[:, None], uniq, [n * cap])
    recv_ids = exchange.all_to_all(send_ids)

    valid = tf.range(n * cap) % cap < tf.repeat(recv_counts, cap)
    owned_pos = tf.cast(tf.where(valid), tf.int32)  # [m, 1]
    owned_ids = tf.gather_nd(recv_ids, owned_pos)
    if secondary_unique:
        keys, key_index = tf.unique(owned_ids)
    else:
        keys, key_index = owned_ids, None
    rows, _ = ops.find(local.resource, keys, dim, params.value_dtype)
    if params.trainable and modes.is_training():
        rows = attach_gradient(params.trainable_wrapper(name), rows, keys)
    if key_index is not None:
        rows = tf.gather(rows, key_index)
    recv_rows = tf.scatter_nd(owned_pos, rows, tf.stack([n * cap, dim]))
    back = exchange.exchange_rows(recv_rows)
    return tf.gather(tf.gather(back, slot), index)


def bytes_per_lookup(cap: int, num_replicas: int, dim: int, key_bytes: int = 8,
                     training: bool = True) -> int:
    """Bytes one replica sends per lookup: sizes, padded ids, rows and (``training``) the rows'
    gradients, each ``num_replicas`` chunks of ``cap`` entries."""
    rows = num_replicas * cap * 4 * dim
    return 4 * (num_replicas + 1) + num_replicas * cap * key_bytes + rows * (2 if training else 1)

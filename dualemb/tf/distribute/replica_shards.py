"""Variables whose shards are owned by the replicas of a ``MirroredStrategy`` /
``MultiWorkerMirroredStrategy`` (the all-to-all embedding, ``alltoall.py``).

Such a Variable has one shard per local replica; replica ``r`` of ``N`` owns the keys
``shard_of(key, N) == r``, in local shard ``r mod len(shards)``. Inside a replica, its reads and
writes through ``Variable._find_flat`` / ``_write_flat`` (the optimizer's fused step, weight
decay, the restrict policy's status) go to that one shard only, and keys the replica does not own
raise ``InvalidArgumentError`` instead of landing in another replica's shard. Touching only its
own shard is also what keeps replicas independent: MirroredStrategy traces all replicas into one
graph, where automatic control dependencies order every op on a shard in program order, so a
write of replica 0 to replica 1's shard would wait for replica 1's lookup, which waits (through
the all-to-all) for replica 0: a deadlock.
"""

from __future__ import annotations

import tensorflow as tf

from dualemb.core.routing import shard_of


def mark(variable, num_replicas: int) -> None:
    """Makes ``variable`` (and its restrict policy's status) owned by ``num_replicas``
    replicas."""
    variable._owning_replicas = int(num_replicas)
    policy = variable.restrict_policy
    if policy is not None:
        mark(policy.status_variable, num_replicas)


def replica_position():
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
        raise ValueError("the all-to-all embedding needs a static replica id (MirroredStrategy "
                         "or MultiWorkerMirroredStrategy)")
    return int(rid), int(n)


def local_shard(variable, flat_keys):
    """(index of this replica's shard, ``flat_keys`` checked to be its own) inside a replica of
    the strategy owning ``variable``; None elsewhere (every shard is used, routed by key)."""
    owners = getattr(variable, "_owning_replicas", None)
    position = replica_position() if owners else None
    if position is None:
        return None
    replica, n = position
    if n != owners:
        raise ValueError(f"Variable {variable.name!r} is sharded over {owners} replicas but is "
                         f"used in a replica of a {n}-replica strategy")
    check = tf.debugging.assert_equal(
        shard_of(flat_keys, n), tf.cast(replica, flat_keys.dtype),
        message=f"Variable {variable.name!r}: replica {replica} of {n} got keys owned by another "
                "replica (look them up through the all-to-all embedding layer)")
    with tf.control_dependencies([check]):
        flat_keys = tf.identity(flat_keys)
    return replica % len(variable.tables), flat_keys

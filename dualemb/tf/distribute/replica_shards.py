"""Variables whose shards are owned by the replicas of a ``MirroredStrategy`` /
``MultiWorkerMirroredStrategy`` (the all-to-all embedding, ``alltoall.py``).

Such a Variable has one shard per local replica; replica ``r`` of ``N`` owns the keys
``shard_of(key, N) == r``, in local shard ``r mod len(shards)``. ``mark`` gives the Variable's
router (``dualemb/tf/shard_router.py``) a ``ReplicaPlacement``: inside a replica, its reads and
writes (the optimizer's fused step, weight decay, the restrict policy's status) go to that one
shard only, and keys the replica does not own
raise ``InvalidArgumentError`` instead of landing in another replica's shard. Touching only its
own shard is also what keeps replicas independent: MirroredStrategy traces all replicas into one
graph, where automatic control dependencies order every op on a shard in program order, so a
write of replica 0 to replica 1's shard would wait for replica 1's lookup, which waits (through
the all-to-all) for replica 0: a deadlock.
"""

from __future__ import annotations

import weakref

import numpy as np
import tensorflow as tf

from dualemb.core.routing import shard_of


def local_replica_ids(strategy) -> list:
    """The sync-group ids of the replicas this process runs, in local order (the order of
    ``extended.worker_devices``, hence of a Variable's shards)."""
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(ctx.replica_id_in_sync_group, tf.int64))
    return [int(v) for v in strategy.experimental_local_results(values)]


class ReplicaPlacement:
    """The placement (``ShardRouter.place``) of a Variable owned by ``num_replicas`` replicas:
    inside a replica, reads and writes go to the replica's own shard."""

    def __init__(self, name: str, num_shards: int, num_replicas: int, strategy=None,
                 local_replicas=None):
        self.name = name
        self.num_shards = num_shards
        self.num_replicas = num_replicas
        self.strategy = None if strategy is None else weakref.ref(strategy)
        # sync-group ids of this process' replicas, in local shard order (None: all local)
        self.local_replicas = local_replicas

    def local_shard(self, flat_keys):
        """(index of this replica's shard, ``flat_keys`` checked to be its own) inside a replica
        of the owning strategy; None elsewhere (every shard is used, routed by key)."""
        position = replica_position()
        if position is None:
            return None
        replica, n = position
        if n != self.num_replicas:
            raise ValueError(f"Variable {self.name!r} is sharded over {self.num_replicas} "
                             f"replicas but is used in a replica of a {n}-replica strategy")
        check = tf.debugging.assert_equal(
            shard_of(flat_keys, n), tf.cast(replica, flat_keys.dtype),
            message=f"Variable {self.name!r}: replica {replica} of {n} got keys owned by "
                    "another replica (look them up through the all-to-all embedding layer)")
        with tf.control_dependencies([check]):
            flat_keys = tf.identity(flat_keys)
        return replica % self.num_shards, flat_keys


def mark(variable, num_replicas: int, strategy=None) -> None:
    """Makes ``variable`` (and its restrict policy's status) owned by ``num_replicas``
    replicas of ``strategy``: its local shard ``i`` holds the keys of local replica ``i``."""
    local = None
    if strategy is not None:
        local = local_replica_ids(strategy)
        if len(local) != len(variable.tables):
            raise ValueError(f"Variable {variable.name!r} has {len(variable.tables)} shards but "
                             f"this process runs {len(local)} replicas")
    variable.router.place(ReplicaPlacement(variable.name, len(variable.tables),
                                           int(num_replicas), strategy, local))
    policy = variable.restrict_policy
    if policy is not None:
        mark(policy.status_variable, num_replicas, strategy)


def _placement(variable):
    placement = variable.router.placement
    return placement if isinstance(placement, ReplicaPlacement) else None


def owning_replicas(variable) -> int | None:
    """How many replicas own ``variable``'s keys (None: not an all-to-all Variable)."""
    placement = _placement(variable)
    return None if placement is None else placement.num_replicas


def held_elsewhere(variable) -> bool:
    """Whether some of ``variable``'s replica shards live in other processes (a
    MultiWorkerMirroredStrategy job with more than one worker): this process alone cannot save
    the whole table, and it must keep only its own replicas' keys when it restores one."""
    n = owning_replicas(variable)
    return n is not None and len(variable.tables) < n


def strategy_of(variable):
    """The strategy whose replicas own ``variable`` (None if gone or not recorded)."""
    placement = _placement(variable)
    ref = None if placement is None else placement.strategy
    return None if ref is None else ref()


def local_replicas(variable) -> list:
    """The sync-group ids of the replicas whose shards this process holds, in local shard
    order (``range(len(tables))`` when the strategy was not recorded)."""
    placement = _placement(variable)
    local = None if placement is None else placement.local_replicas
    return list(range(len(variable.tables))) if local is None else list(local)


def local_shard_of_keys(variable, keys: np.ndarray) -> np.ndarray:
    """For numpy ``keys``: the local shard holding each key in this process, -1 for keys that
    replicas of other processes own (``shard_of(key, N)`` names the owning replica)."""
    n = owning_replicas(variable)
    local = local_replicas(variable)
    to_local = np.full(n, -1, np.intp)
    to_local[np.asarray(local, np.intp)] = np.arange(len(local))
    return to_local[shard_of(np.asarray(keys), n).astype(np.intp)]


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

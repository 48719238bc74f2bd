"""One common-format checkpoint of a MultiWorkerMirroredStrategy job whose all-to-all embeddings
keep each replica's shard in its own worker process (``dualemb.tf.save`` delegates here).

Every worker calls the save (as TF's own multi-worker checkpointing requires); they run the
common multi-writer protocol (``dualemb.core.checkpoint.parts``, docs/checkpoint_format.md §6)
with the strategy's all-reduce as its ``sync`` (both how they agree on values and a barrier). The
chief (``extended.should_checkpoint``) coordinates; every worker writes the shard files of its
replicas (file index = the replica's id, so the saved shard ``r`` holds exactly the keys
``shard_of(key, N) == r``); the chief also writes the dense weights (mirrored: its copy is
everyone's) and the manifest, last, and publishes the directory atomically.

A worker that fails writes nothing visible: the chief removes the staging directory, the previous
checkpoint at the path stays, and every worker raises. The directory must be on a file system that every worker
sees at the same path (one machine, or a shared mount). Restoring is per process and needs no
coordination (``variable_state.numpy_partitioner`` keeps each worker's own keys).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from dualemb.core import checkpoint as _ckpt
from dualemb.core.table import Table
from dualemb.tf.distribute import replica_shards


def job_strategy(variables: dict):
    """The strategy of the variables that are spread over several processes (None if none is);
    all of them must belong to the same one."""
    split = [v for v in variables.values() if replica_shards.held_elsewhere(v)]
    if not split:
        return None
    strategies = {id(replica_shards.strategy_of(v)): replica_shards.strategy_of(v) for v in split}
    if len(strategies) != 1 or None in strategies.values():
        raise ValueError("the all-to-all variables to save belong to different strategies (or "
                         "their strategy is gone); save each job's model separately")
    return next(iter(strategies.values()))


def _all_sum(strategy, values) -> np.ndarray:
    """Sum over the job's processes of each process's int64 ``values`` (one contribution per
    process: its first local replica's)."""
    values = np.asarray(values, np.int64)
    first = min(replica_shards.local_replica_ids(strategy))
    zeros = np.zeros_like(values)
    per_replica = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(values if ctx.replica_id_in_sync_group == first else zeros))
    return np.asarray(strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None))


def save_job(strategy, path: str, variables: dict, *, steps=None, dense=None,
             metadata=None) -> None:
    """Writes one checkpoint of the whole job at ``path``: every table with the shards of every
    worker. Must be called by every worker, with the same variables in the same order."""
    names = list(variables)
    local = replica_shards.local_replica_ids(strategy)
    num_replicas = int(strategy.num_replicas_in_sync)
    for name, var in variables.items():
        if replica_shards.held_elsewhere(var) and replica_shards.owning_replicas(var) != \
                num_replicas:
            raise ValueError(f"de.Variable {name!r} is owned by "
                             f"{replica_shards.owning_replicas(var)} replicas, the job has "
                             f"{num_replicas}")
    num_parts = num_replicas // len(local)
    part = min(local) // len(local)
    chief = bool(strategy.extended.should_checkpoint)

    def tables() -> dict:
        out = {}
        for name, var in variables.items():
            # A Variable not spread over the processes (a plain layer) is the same everywhere:
            # the chief saves it.
            if replica_shards.held_elsewhere(var):
                ids = replica_shards.local_replicas(var)
            elif chief:
                ids = list(range(len(var.tables)))
            else:
                continue
            out[name] = [(j, Table.attach(int(getattr(t, "table_id", t)), name=name))
                         for j, t in zip(ids, var.tables)]
        return out

    _ckpt.parts.save(path, tables, names=names,
                     sync=lambda tag, values: _all_sum(strategy, values).tolist(),
                     part=part, num_parts=num_parts, coordinator=chief, steps=steps,
                     dense=dense, metadata=metadata)

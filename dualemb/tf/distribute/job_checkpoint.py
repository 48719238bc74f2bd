"""One common-format checkpoint of a MultiWorkerMirroredStrategy job whose all-to-all embeddings
keep each replica's shard in its own worker process (``dualemb.tf.save`` delegates here).

Every worker calls the save (as TF's own multi-worker checkpointing requires); the workers
coordinate through the strategy's all-reduce, which is both how they agree on values and a
barrier:

1. the chief (``extended.should_checkpoint``) checks the path and creates a staging directory
   named by a random token; an all-reduce hands every worker the token (0: the chief failed);
2. every worker writes the shard files of its replicas (file index = the replica's id, so the
   saved shard ``r`` holds exactly the keys ``shard_of(key, N) == r``) and a part record listing
   them into that directory; an all-reduce counts the workers that succeeded;
3. the chief writes the dense weights (mirrored: its copy is everyone's) and the manifest, last,
   and publishes the directory atomically (``dualemb.core.checkpoint.parts``); a last all-reduce
   tells every worker whether it did, so no worker returns before the checkpoint exists and all
   of them raise if it does not.

A worker that fails writes nothing visible: the chief removes the staging directory and the
previous checkpoint at the path stays. The directory must be on a file system that every worker
sees at the same path (one machine, or a shared mount). Restoring is per process and needs no
coordination (``variable_state.numpy_partitioner`` keeps each worker's own keys).
"""

from __future__ import annotations

import secrets

import numpy as np
import tensorflow as tf

from dualemb.core import checkpoint as _ckpt
from dualemb.core.checkpoint import CheckpointError
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
    failure = None

    # 1. The chief makes the staging directory; everyone learns its token.
    token = 0
    if chief:
        try:
            token = secrets.randbelow(2 ** 62) + 1
            staging = _ckpt.parts.begin(path, token)
        except Exception as e:  # noqa: BLE001 - reported after the barrier, on every worker
            failure, token = e, 0
    token = int(_all_sum(strategy, [token])[0])
    if token == 0:
        raise failure or CheckpointError(f"{path}: the chief could not start the checkpoint "
                                         "(see its log)")

    # 2. Every worker writes the shards of its replicas.
    ok = 1
    try:
        staging = _ckpt.parts.find_staging(path, token)
        tables = {}
        for name, var in variables.items():
            # A Variable not spread over the processes (a plain layer) is the same everywhere:
            # the chief saves it.
            if replica_shards.held_elsewhere(var):
                ids = replica_shards.local_replicas(var)
            elif chief:
                ids = list(range(len(var.tables)))
            else:
                continue
            tables[name] = [(j, Table.attach(int(getattr(t, "table_id", t)), name=name))
                            for j, t in zip(ids, var.tables)]
        _ckpt.parts.write_part(staging, part, names, tables)
    except Exception as e:  # noqa: BLE001 - every worker must reach the next all-reduce
        failure, ok = e, 0
    written = int(_all_sum(strategy, [ok])[0])

    # 3. The chief writes the manifest and publishes, or removes the staging directory.
    published = 0
    if chief:
        try:
            if written != num_parts:
                raise CheckpointError(f"{path}: {num_parts - written} of {num_parts} workers "
                                      "failed to write their shards; the previous checkpoint "
                                      "is kept")
            _ckpt.parts.finish(staging, path, num_parts, names, steps=steps, dense=dense,
                               metadata=metadata)
            published = 1
        except Exception as e:  # noqa: BLE001
            _ckpt.parts.abort(staging)
            failure = failure or e
    if int(_all_sum(strategy, [published])[0]) == 0:
        raise failure or CheckpointError(f"{path}: the checkpoint was not written (see the "
                                         "chief's log); the previous checkpoint is kept")

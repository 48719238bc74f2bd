"""``dualemb.tf.distribute``: dynamic embeddings on TensorFlow's own distributed runtime.

One module per concern, all built on the single-process API (``de.Variable`` shards are
TensorFlow resources placed on a device; every table op runs where its handle lives):

- ``placement``: where a Variable's shards go under ``ParameterServerStrategy`` (spread over the
  PS tasks by default) — ``ps_devices``, ``default_devices``.
- ``server``: the PS/worker process entry point (``python -m dualemb.tf.server``), which loads the
  op library before serving.
- ``recovery``: after ``coordinator.join()``, wait until a failed worker's recovery is over so
  the chief can exit (``wait_for_recovery``; TF's coordinator otherwise hangs at exit).
- ``local_cluster``: start a throw-away cluster of such processes on 127.0.0.1 (tests, examples,
  benchmarks).
- ``alltoall``: ids routed to the replica owning their shard with TF's collective all-to-all under
  ``MirroredStrategy`` / ``MultiWorkerMirroredStrategy`` (``de.keras.layers.HvdAllToAllEmbedding``).
- ``replica_shards``: inside a replica, a Variable owned by the replicas reads and writes only
  the replica's own shard.

See docs/scaling_tf.md.
"""

from dualemb.tf.distribute.placement import default_devices, num_ps_tasks, ps_devices
from dualemb.tf.distribute.recovery import recovery_pending, wait_for_recovery

__all__ = ["default_devices", "num_ps_tasks", "ps_devices", "recovery_pending",
           "wait_for_recovery"]

"""A small all-to-all embedding job: single-process, MirroredStrategy over 2 logical CPUs, or one
worker of a 2-worker MultiWorkerMirroredStrategy (TF_CONFIG set by the caller).

    python tests/tf/distribute/jobs/mirrored_job.py --mode single|mirrored|multiworker --out f.npz
        [--cpus N] [--save DIR] [--restore DIR] [--tf-save PREFIX] [--tf-restore PREFIX]

Every mode trains on the same global batches (replica r takes rows [r*B/N, (r+1)*B/N)); the loss
is summed over examples and divided by the global batch, so the sum over replicas is the
single-process mean. The result file holds the rows and slots of the shards this process owns
(local shard i belongs to replica ``first_replica + i``), and the dense layer's weights.

Checkpoints (docs/scaling_tf.md): ``--restore`` loads a common-format checkpoint (``de.load``)
and ``--tf-restore`` a ``tf.train.Checkpoint`` before training (use ``--steps 0`` to only
restore); ``--save`` writes ``de.save`` after training (every worker calls it) and ``--tf-save``
tries ``tf.train.Checkpoint.write``, recording in the result file whether it raised
``CheckpointError`` (``tf_save_refused``) instead of failing. ``--cpus`` sets the number of
logical CPUs (replicas) of ``mirrored`` mode.
"""

from __future__ import annotations

import argparse

import numpy as np
import tensorflow as tf

MODES = ("single", "mirrored", "multiworker")
DIM = 4
GLOBAL_BATCH = 16


def batches(steps: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        ids = rng.integers(-30, 120, size=(GLOBAL_BATCH, 3)).astype(np.int64)
        labels = rng.normal(size=(GLOBAL_BATCH, 1)).astype(np.float32)
        yield ids, labels


def patient_coordination_service(minutes: float = 5.0) -> None:
    """Configures the coordination service MultiWorkerMirroredStrategy starts (it configures its
    own only when none is), as it would (standalone, led by the first worker, every worker
    coordinated) but with heartbeat and shutdown-barrier timeouts of ``minutes`` instead of TF's
    10 s: on a loaded machine a worker can miss 10 s of heartbeats (its peers are then told it
    died), or reach exit more than 10 s after its peer."""
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    spec = tf.distribute.cluster_resolver.TFConfigClusterResolver().cluster_spec()
    ms = int(minutes * 60_000)
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(spec),
        heartbeat_timeout_in_ms=ms, shutdown_barrier_timeout_in_ms=ms,
        coordinated_jobs=[coordination_config_pb2.CoordinatedJob(
            name="worker", num_tasks=spec.num_tasks("worker"))])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    p.add_argument("--cpus", type=int, default=2)
    p.add_argument("--save")
    p.add_argument("--restore")
    p.add_argument("--tf-save")
    p.add_argument("--tf-restore")
    args = p.parse_args()

    if args.mode == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * args.cpus)
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.cpus)])
    elif args.mode == "multiworker":
        patient_coordination_service()
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        strategy = tf.distribute.get_strategy()  # the default (no distribution)

    import keras

    import dualemb.tf as de
    from dualemb.tf import ops

    with strategy.scope():
        emb = de.keras.layers.HvdAllToAllEmbedding(
            embedding_size=DIM, name="emb", initializer=keras.initializers.RandomNormal(stddev=0.1))
        squash = keras.layers.Lambda(lambda x: tf.reduce_sum(x, axis=1))
        dense = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed=3))
        inputs = keras.Input(shape=(3,), dtype="int64")
        model = keras.Model(inputs, dense(squash(emb(inputs))))
        inner = (keras.optimizers.Adam(0.05) if args.optimizer == "adam"
                 else keras.optimizers.SGD(0.1))
        optimizer = de.DynamicEmbeddingOptimizer(inner)
        optimizer.build(model.trainable_variables)

    def replica_fn(ids, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(model(ids, training=True) - labels)) / GLOBAL_BATCH
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    @tf.function
    def step(ids, labels):
        n = strategy.num_replicas_in_sync

        def part(t):
            def fn(ctx):
                size = GLOBAL_BATCH // n
                return t[ctx.replica_id_in_sync_group * size:
                         (ctx.replica_id_in_sync_group + 1) * size]
            return strategy.experimental_distribute_values_from_function(fn)

        if n == 1:
            return replica_fn(ids, labels)
        return strategy.run(replica_fn, args=(part(ids), part(labels)))

    from dualemb.core.checkpoint import CheckpointError

    if args.restore:
        de.load(model, args.restore, optimizer=optimizer)
    if args.tf_restore:
        tf.train.Checkpoint(model=model, optimizer=optimizer).read(args.tf_restore).expect_partial()
    for ids, labels in batches(args.steps):
        step(tf.constant(ids), tf.constant(labels))
    if args.save:
        de.save(model, args.save, optimizer=optimizer)
    refused = False
    if args.tf_save:
        try:
            tf.train.Checkpoint(model=model, optimizer=optimizer).write(args.tf_save)
        except CheckpointError as e:
            refused = "dualemb.tf.save" in str(e)

    # The replica owning local shard i: replicas are numbered task-major.
    task = strategy.cluster_resolver.task_id if args.mode == "multiworker" else 0
    out = {"num_replicas": np.array(strategy.num_replicas_in_sync),
           "first_replica": np.array(task * len(emb.params.tables)),
           "iterations": np.array(int(optimizer.iterations.numpy())),
           "tf_save_refused": np.array(refused)}
    for i, shard in enumerate(emb.params.tables):
        page = ops.export_table(shard.resource, tf.int64, DIM)
        out[f"shard{i}_keys"] = page["keys"].numpy()
        out[f"shard{i}_values"] = page["values"].numpy()
        out[f"shard{i}_slots"] = page["slots"].numpy()
    out["num_local_shards"] = np.array(len(emb.params.tables))
    out["kernel"] = np.asarray(dense.kernel.numpy())
    out["bias"] = np.asarray(dense.bias.numpy())
    np.savez(args.out, **out)


if __name__ == "__main__":
    main()

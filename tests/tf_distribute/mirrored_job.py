"""A small all-to-all embedding job: single-process, MirroredStrategy over 2 logical CPUs, or one
worker of a 2-worker MultiWorkerMirroredStrategy (TF_CONFIG set by the caller).

    python tests/tf_distribute/mirrored_job.py --mode single|mirrored|multiworker --out f.npz

Every mode trains on the same global batches (replica r takes rows [r*B/N, (r+1)*B/N)); the loss
is summed over examples and divided by the global batch, so the sum over replicas is the
single-process mean. The result file holds the rows and slots of the shards this process owns
(local shard i belongs to replica ``first_replica + i``), and the dense layer's weights.
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    args = p.parse_args()

    if args.mode == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    elif args.mode == "multiworker":
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

    for ids, labels in batches(args.steps):
        step(tf.constant(ids), tf.constant(labels))

    # The replica owning local shard i: replicas are numbered task-major.
    task = strategy.cluster_resolver.task_id if args.mode == "multiworker" else 0
    out = {"num_replicas": np.array(strategy.num_replicas_in_sync),
           "first_replica": np.array(task * len(emb.params.tables))}
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

"""Keras 3 ``model.fit`` with the all-to-all embedding, in one process or under MirroredStrategy
over 2 logical CPUs, on the same data.

    python tests/tf/distribute/jobs/fit_job.py --mode single|mirrored --out f.npz

Keras splits each global batch of 16 between the replicas and sums their gradients; the result
file holds each local shard's keys and rows and the dense kernel and bias.
"""

from __future__ import annotations

import argparse

import numpy as np
import tensorflow as tf

DIM = 4
GLOBAL_BATCH = 16
STEPS = 8


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("single", "mirrored"), required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    if args.mode == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    else:
        strategy = tf.distribute.get_strategy()

    import keras

    import dualemb.tf as de
    from dualemb.tf import ops

    rng = np.random.default_rng(1)
    ids = rng.integers(-30, 120, size=(GLOBAL_BATCH * STEPS, 3)).astype(np.int64)
    labels = rng.normal(size=(GLOBAL_BATCH * STEPS, 1)).astype(np.float32)
    with strategy.scope():
        emb = de.keras.layers.HvdAllToAllEmbedding(
            embedding_size=DIM, name="emb", initializer=keras.initializers.RandomNormal(stddev=0.1))
        dense = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed=3))
        inputs = keras.Input(shape=(3,), dtype="int64")
        model = keras.Model(inputs, dense(keras.ops.sum(emb(inputs), axis=1)))
        model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05)),
                      loss="mse")
    data = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(GLOBAL_BATCH)
    model.fit(data, epochs=1, verbose=0, shuffle=False)

    out = {"num_local_shards": np.array(len(emb.params.tables)),
           "kernel": np.asarray(dense.kernel.numpy()), "bias": np.asarray(dense.bias.numpy())}
    for i, shard in enumerate(emb.params.tables):
        page = ops.export_table(shard.resource, tf.int64, DIM)
        out[f"shard{i}_keys"] = page["keys"].numpy()
        out[f"shard{i}_values"] = page["values"].numpy()
        out[f"shard{i}_slots"] = page["slots"].numpy()
    np.savez(args.out, **out)


if __name__ == "__main__":
    main()

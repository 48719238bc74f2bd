"""tf_keras (Keras 2) ``model.fit`` of a model with a dynamic embedding, run single-process or as
the chief of a ParameterServerStrategy cluster. tests/tf/distribute/test_tf_distribute_keras2_fit.py runs it as
a subprocess with ``TF_USE_LEGACY_KERAS=1`` (so ``tf.keras`` and ``de.keras.layers`` are tf_keras
there, and the variable never reaches the test process).

    python tests/tf/distribute/jobs/keras2_fit_ps_job.py --out result.npz [--cluster JSON]
        [--model dense|linear] [--optimizer adam|sgd] [--steps N] [--shards-per-ps K]
        [--same-batch] [--pause-step K --marker FILE]

The batches are ``ps_job.batches`` (the custom-loop job's), fed by ``model.fit`` in order:
single-process from a dataset, under the cluster from the same dataset on every worker
(``steps_per_epoch`` = N, one epoch). The result file has the layout of ``ps_job.py``'s (per
shard: keys, values, slots, update counts, device), plus the dense weights,
``optimizer.iterations`` and, single-process, ``initial_keys`` / ``initial_rows``: every key of
the batches and its row before training (the initializer is a pure function of the key, so a
cluster's tables start from the same rows).

Fault tests: ``--same-batch`` feeds the first batch at every step (so which worker runs a step,
and a retry reading its worker's next batch, change nothing); ``--pause-step K --marker F``:
the K-th step to run writes F on its worker after its updates and busy-waits until the test
writes ``F.release`` (``PausingModel``; at most 600 s), while the test kills and restarts the
workers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import tensorflow as tf

import dualemb.tf as de
from dualemb.tf import ops
from dualemb.tf.distribute import placement, recovery

sys.path.insert(0, os.path.dirname(__file__))
from ps_job import BATCH, DIM, IDS_PER_EXAMPLE, batches, pause_until_released  # noqa: E402

keras = tf.keras  # tf_keras under TF_USE_LEGACY_KERAS=1


def dataset(steps: int, same_batch: bool = False):
    if same_batch:
        ids, labels = next(batches(1))
        return tf.data.Dataset.from_tensors((ids, labels)).repeat()
    ids, labels = zip(*batches(steps))
    return tf.data.Dataset.from_tensor_slices(
        (np.concatenate(ids), np.concatenate(labels))).batch(BATCH)


class PausingModel(keras.Model):
    """A functional tf_keras model whose train step, once its updates are applied, pauses the
    ``pause_step``-th step to run (counted by an atomic ``assign_add`` on a PS, so exactly one
    step pauses, retries included): it writes ``marker`` on its worker and busy-waits until
    ``marker.release`` exists (at most ``pause_seconds``), so a test can kill the workers after
    that step's update reached the PS
    tasks (batch-level callbacks, which would pause the chief, are refused under this strategy)."""

    pause_step, marker, pause_seconds = 0, "", 600.0

    def train_step(self, data):
        logs = super().train_step(data)
        if not self.pause_step:
            return logs
        # tf.function orders ops on the same resource in program order, not ops on different
        # resources: reading every shard after its update is what makes the pause come after
        # the updates (without it, a shard's update could still be running when the test kills).
        with tf.control_dependencies([ops.table_size(r) for r in self.table_resources]):
            n = self.steps_started.assign_add(1)
        paused = tf.cond(tf.equal(n, self.pause_step), self._pause,
                         lambda: tf.constant(0.0, tf.float64))
        with tf.control_dependencies([paused]):
            return tf.nest.map_structure(tf.identity, logs)

    def _pause(self):
        tf.io.write_file(self.marker, "updated")
        return pause_until_released(self.marker + ".release", self.pause_seconds)


def linear_loss(labels, pred):
    """Linear in the rows: a step's gradient does not depend on the state (order-free SGD)."""
    return tf.reduce_sum(pred * labels)


def build(model_kind: str, optimizer: str, strategy=None, shards_per_ps: int = 1):
    devices = placement.ps_devices(strategy, shards_per_ps) if shards_per_ps > 1 else None
    with strategy.scope() if strategy is not None else tf.init_scope():
        embedding = de.keras.layers.SquashedEmbedding(
            DIM, combiner="sum", devices=devices, name="emb",
            initializer=keras.initializers.RandomNormal(stddev=0.1))
        inputs = keras.Input(shape=(IDS_PER_EXAMPLE,), dtype="int64")
        out = embedding(inputs)
        if model_kind == "dense":
            out = keras.layers.Dense(
                1, kernel_initializer=keras.initializers.GlorotUniform(seed=3))(out)
        model = PausingModel(inputs, out)
        model.steps_started = tf.Variable(0, dtype=tf.int64, trainable=False)
        model.table_resources = [shard.resource for shard in embedding.params.tables]
        inner = keras.optimizers.Adam(0.05) if optimizer == "adam" else keras.optimizers.SGD(0.1)
        model.compile(optimizer=de.DynamicEmbeddingOptimizer(inner),
                      loss="mse" if model_kind == "dense" else linear_loss)
    return model, embedding


def table_state(model, embedding):
    out = {}
    for i, shard in enumerate(embedding.params.tables):
        page = ops.export_table(shard.resource, tf.int64, DIM)
        for name in ("keys", "values", "slots", "update_count"):
            out[f"shard{i}_{name}"] = page[name].numpy()
        out[f"shard{i}_device"] = np.array(shard.resource.device)
    out["num_shards"] = np.array(len(embedding.params.tables))
    dense = [w for w in model.trainable_weights if w.shape.num_elements() != 0]  # not the anchor
    for j, w in enumerate(dense):
        out[f"dense{j}"] = np.asarray(w.numpy())
    out["iterations"] = np.array(int(model.optimizer.iterations.numpy()))
    out["layer_is_tf_keras"] = np.array(
        isinstance(embedding, sys.modules["tf_keras"].layers.Layer))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--cluster", default="")
    p.add_argument("--model", default="dense", choices=["dense", "linear"])
    p.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--shards-per-ps", type=int, default=1)
    p.add_argument("--same-batch", action="store_true")
    p.add_argument("--pause-step", type=int, default=0)
    p.add_argument("--marker", default="")
    args = p.parse_args()
    strategy = None
    if args.cluster:
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(json.loads(args.cluster)), rpc_layer="grpc",
            task_type="chief", task_id=0)
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    model, embedding = build(args.model, args.optimizer, strategy, args.shards_per_ps)
    initial = {}
    if strategy is None:
        used = batches(1 if args.same_batch else args.steps)
        keys = np.unique(np.concatenate([ids.ravel() for ids, _ in used]))
        initial = {"initial_keys": keys, "initial_rows": embedding.params.lookup(keys).numpy()}
    # Under the strategy every worker iterates its own copy of the dataset; with one worker that
    # is the single-process order.
    model.pause_step, model.marker = args.pause_step, args.marker
    model.fit(dataset(args.steps, args.same_batch), epochs=1, steps_per_epoch=args.steps,
              verbose=0)
    if strategy is not None:
        recovery.wait_for_recovery(model._cluster_coordinator, timeout=300)
    np.savez(args.out, **table_state(model, embedding), **initial)
    if strategy is not None:
        # After a worker recovery, TF's coordinator keeps daemon threads (the task-state poller,
        # the failure handler) that call into the runtime; an interpreter shutdown that stops
        # one inside such a call aborts the process ("FATAL: exception not rethrown", seen in
        # CI once in a few runs after the fault test). The results are saved: end here, as
        # dualemb.tf.distribute.wait_for_recovery's docstring advises.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()

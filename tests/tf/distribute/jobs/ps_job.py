"""A small training job, run single-process or as the chief of a ParameterServerStrategy cluster
(tests/tf/distribute/test_tf_distribute_ps.py starts it as a subprocess so the test process's TF context is
never connected to a cluster).

    python tests/tf/distribute/jobs/ps_job.py --out result.npz [--cluster JSON] [--model dense|linear]
        [--optimizer adam|sgd] [--steps N] [--kill-worker-after K --marker FILE]
        [--save-dir DIR [--save-after K]] [--string-keys] [--plain-apply]
        [--pause-step K --pause-marker FILE] [--delta-chain]

With ``--save-dir`` the trained job also writes ``DIR/tf/ckpt`` (a ``tf.train.Checkpoint`` of the
model and optimizer) and ``DIR/common`` (``de.save``, step = --steps); under a cluster both gather
the rows from the PS tasks through the shards' handles. With ``--save-after K`` it saves after
step K instead (joining the coordinator first) and writes the state it saved to ``DIR/saved.npz``,
then trains on. If a step fails (a PS killed), the result file holds only ``error`` and
``error_type`` and the job exits with status 3.

With ``--save-dir DIR --delta-chain`` the chief then goes on from that full save (the base) as an
online-learning trainer: :func:`delta_chain` trains, erases and restricts keys and writes deltas
``DIR/chain/delta-<r>`` (one in the background) and a full ``DIR/chain/full`` at the last step,
with the state exported from the PS tasks at each save in ``DIR/chain/state-<r>.npz``.

With ``--string-keys`` the table has ``key_dtype=tf.string`` and every id ``k`` becomes the key
:func:`string_key` (k); the result then holds each shard's keys as ``shard<i>_key_offsets`` +
``shard<i>_key_bytes`` (npz holds no byte strings without pickling).

The result file holds, per table shard: keys, values, slots and the device it lives on, plus the
dense weights, so the test compares a cluster run with a single-process run row by row.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import keras
import numpy as np
import tensorflow as tf

import dualemb.tf as de
from dualemb.core import _string_keys
from dualemb.tf import ops
from dualemb.tf.distribute import placement, recovery

DIM = 4
IDS_PER_EXAMPLE = 3
BATCH = 16


def pause_until_released(release: str, max_seconds: float):
    """Busy-waits, in the graph, until the file ``release`` exists (at most ``max_seconds``, a
    safety bound), so a test that kills the worker meanwhile needs no timing assumption and a
    retried step is let through at once. Returns the last timestamp (float64)."""
    end = tf.timestamp() + max_seconds

    def waiting(t):
        # The pattern depends on the loop variable, so that Grappler cannot fold MatchingFiles
        # (not a stateful op) into a constant evaluated once, before the file appears.
        pattern = tf.strings.join([release, tf.strings.substr(tf.strings.as_string(t), 0, 0)])
        absent = tf.equal(tf.size(tf.io.matching_files(pattern)), 0)
        return tf.logical_and(t < end, absent)

    return tf.while_loop(waiting, lambda t: [tf.timestamp()], [tf.timestamp()])[0]


def string_key(k: int) -> bytes:
    """The string key of id k: some end in a NUL byte, some are not valid UTF-8."""
    key = b"id:%d" % k
    if k % 5 == 0:
        key += b"\x00"
    if k % 7 == 0:
        key = b"\xff" + key
    return key


def batches(steps: int, seed: int = 0, string_keys: bool = False):
    """Deterministic (ids [BATCH, 3] int64 incl. negative ids, labels [BATCH, 1] f32); with
    ``string_keys`` the ids are the object array of their :func:`string_key`."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        ids = rng.integers(-40, 160, size=(BATCH, IDS_PER_EXAMPLE)).astype(np.int64)
        labels = rng.normal(size=(BATCH, 1)).astype(np.float32)
        if string_keys:
            ids = np.array([[string_key(int(k)) for k in row] for row in ids], dtype=object)
        yield ids, labels


class Job:
    """The model, optimizer and train step; under ``strategy`` when one is given."""

    def __init__(self, model_kind: str, optimizer: str, strategy=None, shards_per_ps: int = 1,
                 local_shards: int = 1, key_dtype=tf.int64):
        self.model_kind = model_kind
        self.key_dtype = key_dtype
        scope = strategy.scope() if strategy is not None else tf.init_scope()
        devices = None
        if strategy is not None and shards_per_ps > 1:
            devices = placement.ps_devices(strategy, shards_per_ps)
        elif strategy is None and local_shards > 1:
            devices = ["/CPU:0"] * local_shards
        with scope:
            self.embedding = de.keras.layers.SquashedEmbedding(
                DIM, combiner="sum", devices=devices, name="emb", key_dtype=key_dtype,
                initializer=keras.initializers.RandomNormal(stddev=0.1))
            inputs = keras.Input(shape=(IDS_PER_EXAMPLE,), dtype=key_dtype.name)
            pooled = self.embedding(inputs)
            if model_kind == "dense":
                out = keras.layers.Dense(
                    1, kernel_initializer=keras.initializers.GlorotUniform(seed=3))(pooled)
            else:  # linear in the rows: gradients do not depend on the state (order-free SGD)
                out = pooled
            self.model = keras.Model(inputs, out)
            inner = (keras.optimizers.Adam(0.05) if optimizer == "adam"
                     else keras.optimizers.SGD(0.1))
            self.optimizer = de.DynamicEmbeddingOptimizer(inner)
            self.optimizer.build(self.model.trainable_variables)
        self.strategy = strategy
        # --plain-apply: optimizer.apply_gradients(zip(grads, variables)), no step= (the
        # wrapper reads iterations, as Keras does for the dense weights)
        self.plain_apply = False
        # --pause-step K --pause-marker F: the step K closure, after its updates, writes F on its
        # worker and busy-waits until F.release exists (at most --pause-seconds), so a test can
        # kill the worker after the update
        # reached the PS tasks (its retry then applies step K a second time).
        self.pause_step, self.pause_marker, self.pause_seconds = 0, "", 0.0

    def replica_step(self, ids, labels, step):
        with tf.GradientTape() as tape:
            pred = self.model(ids, training=True)
            if self.model_kind == "dense":
                loss = tf.reduce_mean(tf.square(pred - labels))
            else:
                loss = tf.reduce_sum(pred * labels)
        variables = self.model.trainable_variables
        grads = tape.gradient(loss, variables)
        if self.plain_apply:
            self.optimizer.apply_gradients(zip(grads, variables))
        else:
            self.optimizer.apply(grads, variables, step=step)
        if self.pause_step:
            # tf.function orders ops on one resource in program order, but not ops on different
            # resources (nor the cond, which has none) with each other: without reading every
            # shard after its update, the pause could start before the updates ran, and the
            # test's kill land before they reach the PS.
            shards_read = [ops.table_size(s.resource) for s in self.embedding.params.tables]
            with tf.control_dependencies(shards_read):
                paused = tf.cond(tf.equal(step, self.pause_step), self._pause,
                                 lambda: tf.constant(0.0, tf.float64))
            with tf.control_dependencies([paused]):
                loss = tf.identity(loss)
        return loss

    def _pause(self):
        tf.io.write_file(self.pause_marker, "updated")
        return pause_until_released(self.pause_marker + ".release", self.pause_seconds)

    def save(self, save_dir: str, step: int) -> None:
        tf.train.Checkpoint(model=self.model, optimizer=self.optimizer).write(
            os.path.join(save_dir, "tf", "ckpt"))
        de.save(self.model, os.path.join(save_dir, "common"), optimizer=self.optimizer, step=step)

    def restore(self, save_dir: str, kind: str) -> None:
        if kind == "tf":
            tf.train.Checkpoint(model=self.model, optimizer=self.optimizer).read(
                os.path.join(save_dir, "tf", "ckpt")).assert_existing_objects_matched()
        else:
            de.load(self.model, os.path.join(save_dir, "common"), optimizer=self.optimizer)

    def table_state(self):
        """Per shard: keys, values, slots, the shard's device and core table id."""
        out = {}
        var = self.embedding.params
        for i, shard in enumerate(var.tables):
            page = ops.export_table(shard.resource, self.key_dtype, DIM)
            if self.key_dtype == tf.string:
                offsets, data = _string_keys.pack(page["keys"].numpy())
                out[f"shard{i}_key_offsets"], out[f"shard{i}_key_bytes"] = offsets, data
            else:
                out[f"shard{i}_keys"] = page["keys"].numpy()
            out[f"shard{i}_values"] = page["values"].numpy()
            out[f"shard{i}_slots"] = page["slots"].numpy()
            out[f"shard{i}_update_count"] = page["update_count"].numpy()
            out[f"shard{i}_device"] = np.array(shard.resource.device)
        out["num_shards"] = np.array(len(var.tables))
        out["iterations"] = np.array(int(self.optimizer.iterations.numpy()))
        for j, w in enumerate(v for v in self.model.weights if v is not self.embedding.shadow):
            out[f"dense{j}"] = np.asarray(w.numpy())
        return out


DELTA_ROUNDS = 4


def delta_chain(job, run_steps, save_dir: str, step: int) -> None:
    """Base: ``save_dir/common`` (step ``step``). Each round trains 2 steps (``run_steps(batches,
    first_step)``, returns when they ran), erases 8 keys, and saves a delta on the previous
    save; round 2 also restricts shard 0 (5 rows fewer), round 3 saves in the background and
    trains a step more before it waits (that step goes into round 4's delta)."""
    chain = os.path.join(save_dir, "chain")
    os.makedirs(chain, exist_ok=True)
    var = job.embedding.params
    base = os.path.join(save_dir, "common")
    rng = np.random.default_rng(11)
    for r in range(1, DELTA_ROUNDS + 1):
        run_steps(list(batches(2, seed=100 + r)), step + 1)
        step += 2
        keys = np.concatenate([ops.export_table(t.resource, job.key_dtype, DIM)["keys"].numpy()
                               for t in var.tables])
        var.remove(tf.constant(rng.choice(keys, 8, replace=False)))
        if r == 2:
            shard = var.tables[0].resource
            ops.restrict(shard, int(ops.table_size(shard)) - 5, "recency")
        np.savez(os.path.join(chain, f"state-{r}.npz"), **job.table_state())
        path = os.path.join(chain, f"delta-{r}")
        if r == 3:
            handle = de.save(job.model, path, optimizer=job.optimizer, step=step, base=base,
                             blocking=False)
            run_steps(list(batches(1, seed=200)), step + 1)  # after the snapshot
            step += 1
            handle.wait()
        else:
            de.save(job.model, path, optimizer=job.optimizer, step=step, base=base)
        base = path
    de.save(job.model, os.path.join(chain, "full"), optimizer=job.optimizer, step=step)


def run_single(args):
    job = Job(args.model, args.optimizer, key_dtype=_key_dtype(args))
    job.plain_apply = args.plain_apply
    step_fn = tf.function(job.replica_step)
    for k, (ids, labels) in enumerate(batches(args.steps, string_keys=args.string_keys)):
        step_fn(tf.constant(ids), tf.constant(labels), tf.constant(k + 1, tf.int64))
    return job.table_state()


def run_cluster(args):
    spec = json.loads(args.cluster)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), rpc_layer="grpc", task_type="chief", task_id=0)
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    job = Job(args.model, args.optimizer, strategy, args.shards_per_ps,
              key_dtype=_key_dtype(args))
    if args.restore_dir:
        job.restore(args.restore_dir, args.restore_kind)

    job.plain_apply = args.plain_apply
    job.pause_step, job.pause_marker = args.pause_step, args.pause_marker
    job.pause_seconds = args.pause_seconds

    @tf.function
    def train_step(ids, labels, step):
        return strategy.run(job.replica_step, args=(ids, labels, step))

    try:
        for k, (ids, labels) in enumerate(batches(args.steps, string_keys=args.string_keys)):
            coordinator.schedule(train_step, args=(tf.constant(ids), tf.constant(labels),
                                                   tf.constant(k + 1, tf.int64)))
            if args.save_dir and k + 1 == args.save_after:
                coordinator.join()
                job.save(args.save_dir, k + 1)
                np.savez(os.path.join(args.save_dir, "saved.npz"), **job.table_state())
            if args.marker and k == args.kill_worker_after:
                # Mid-training, with steps queued and in flight: tell the test to kill (and
                # later restart) a task; the coordinator retries the closures it held.
                with open(args.marker, "w") as f:
                    f.write("scheduled")
                while os.path.exists(args.marker):
                    time.sleep(0.05)
        coordinator.join()
    except tf.errors.OpError as e:  # a PS died: TF does not retry, the job fails
        np.savez(args.out, error=np.array(str(e)), error_type=np.array(type(e).__name__))
        raise SystemExit(3)
    # A worker that failed may still be reconnecting; the chief cannot exit before that ends.
    recovery.wait_for_recovery(coordinator, timeout=args.recovery_timeout)
    if args.save_dir and args.save_after < 0:
        job.save(args.save_dir, args.steps)
    state = job.table_state()
    if args.delta_chain:
        def run_steps(chunk, first):
            for k, (ids, labels) in enumerate(chunk):
                coordinator.schedule(train_step, args=(tf.constant(ids), tf.constant(labels),
                                                       tf.constant(first + k, tf.int64)))
            coordinator.join()
        delta_chain(job, run_steps, args.save_dir, args.steps)
    # The tables live on the PS tasks, not in this process's core registry.
    from dualemb.core import Table
    local = []
    for shard in job.embedding.params.tables:
        try:
            Table.attach(shard.table_id)
            local.append(True)
        except Exception:
            local.append(False)
    state["shard_in_chief_process"] = np.array(local)
    return state


def _key_dtype(args):
    return tf.string if args.string_keys else tf.int64


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--cluster", default="")
    p.add_argument("--model", default="dense", choices=["dense", "linear"])
    p.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--shards-per-ps", type=int, default=1)
    p.add_argument("--save-dir", default="")
    p.add_argument("--save-after", type=int, default=-1,
                   help="save after this many steps (default: at the end)")
    p.add_argument("--recovery-timeout", type=float, default=300.0)
    p.add_argument("--plain-apply", action="store_true",
                   help="optimizer.apply_gradients(zip(grads, variables)), without step=")
    p.add_argument("--restore-dir", default="", help="restore a --save-dir before training")
    p.add_argument("--restore-kind", default="tf", choices=["tf", "common"])
    p.add_argument("--kill-worker-after", type=int, default=-1)
    p.add_argument("--pause-step", type=int, default=0)
    p.add_argument("--pause-marker", default="")
    p.add_argument("--pause-seconds", type=float, default=600.0,
                   help="the longest a paused step waits for --pause-marker's .release file")
    p.add_argument("--marker", default="", help="file written mid-training; waits until removed")
    p.add_argument("--delta-chain", action="store_true",
                   help="after the --save-dir save: deltas on it (see delta_chain)")
    p.add_argument("--string-keys", action="store_true", help="key_dtype=tf.string (string_key)")
    args = p.parse_args()
    state = run_cluster(args) if args.cluster else run_single(args)
    np.savez(args.out, **state)


if __name__ == "__main__":
    main()

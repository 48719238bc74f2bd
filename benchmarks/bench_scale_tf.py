"""Scale-out benchmark of dualemb.tf under ParameterServerStrategy (JSON on stdout).

    python benchmarks/bench_scale_tf.py [--steps 30] [--ps 2] [--batch 2048]

The demo-sized model (dualemb/demo/config.py: 8 sparse features, one table each, dim 16, 4 dense
features, MLP 64-32-1, Keras Adam through DynamicEmbeddingOptimizer, batch 2048), trained by a
custom loop (``ClusterCoordinator.schedule``) on a local cluster (``LocalCluster``: chief + W
workers + P PS on 127.0.0.1), for W = 1 and 2; plus the same loop single-process for reference.
Each worker reads its batches from a per-worker dataset (``create_per_worker_dataset``), so the
chief sends only the step number. Examples/s = timed steps x batch / wall time of scheduling them
and joining, after warm-up steps (tracing, first run on every worker). Under async PS with W
workers, W steps run at once, each on its own batch.

Bytes moved per step are an estimate from the sizes of what crosses a process boundary, not a
measurement (TF exposes no per-RPC byte counter): per feature table, the layer looks up each
distinct id once (``with_unique=True``), so with U distinct ids in the batch the worker sends U
int64 ids to the PS tasks and gets U rows of dim float32 back, then sends U ids and U gradient rows
for the fused update (Adam's slots stay on the PS); the dense weights live on the PS, so a step
reads them all and sends their gradients (Keras' update runs on the PS). U is counted exactly on
the benchmark's batches. Tensor framing and gRPC headers are not counted.

``--strategy alltoall`` is the hook for the all-to-all strategy (another branch): it reports
``null`` until that strategy registers a runner in ``RUNNERS``. The machine may be shared: the
load average is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_BATCHES = 8  # distinct batches each worker cycles through


def demo_batches(cfg, n):
    """The first ``n`` demo training batches: ids [B, F] int64, dense [B, D], labels [B, 1]."""
    return [cfg.train_batch(s) for s in range(n)]


def build(cfg, strategy=None):
    """(model, optimizer) of the demo architecture; under ``strategy``'s scope when given (the
    tables then get one shard per PS task by default)."""
    import keras
    import tensorflow as tf

    import dualemb.tf as de
    scope = strategy.scope() if strategy is not None else tf.init_scope()
    with scope:
        ids = keras.Input(shape=(cfg.features,), dtype="int64", name="ids")
        dense = keras.Input(shape=(cfg.num_dense,), dtype="float32", name="dense")
        rows = [de.keras.layers.Embedding(cfg.dim, initializer=cfg.initializer(f),
                                          name=cfg.table_name(f))(ids[:, f])
                for f in range(cfg.features)]
        x = keras.layers.Concatenate()(rows + [dense])
        for i, (name, _, units) in enumerate(cfg.layer_sizes):
            x = keras.layers.Dense(
                units, activation=None if name == "out" else "relu", name=name,
                kernel_initializer=keras.initializers.GlorotUniform(seed=cfg.dense_init_seed(i)))(x)
        model = keras.Model([ids, dense], x)
        optimizer = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(cfg.learning_rate))
        optimizer.build(model.trainable_variables)
    return model, optimizer


def make_replica_step(model, optimizer):
    import keras
    import tensorflow as tf
    bce = keras.losses.BinaryCrossentropy(from_logits=True)

    def replica_step(ids, dense, labels, step):
        with tf.GradientTape() as tape:
            loss = bce(labels, model([ids, dense], training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables, step=step)
        return loss
    return replica_step


def bytes_per_step(cfg, batches):
    """The estimate described in the module docstring, averaged over ``batches``."""
    import numpy as np
    unique = np.mean([sum(np.unique(ids[:, f]).size for f in range(cfg.features))
                      for ids, _, _ in batches])
    dense_params = sum(fan_in * fan_out + fan_out for _, fan_in, fan_out in cfg.layer_sizes)
    lookup = unique * (8 + 4 * cfg.dim)          # ids out, rows back
    update = unique * (8 + 4 * cfg.dim)          # ids and gradient rows out
    dense = 2 * 4 * dense_params                 # weights read, gradients sent
    return {"distinct_ids_per_step": float(unique), "dense_params": dense_params,
            "embedding_lookup_bytes": float(lookup), "embedding_update_bytes": float(update),
            "dense_bytes": float(dense), "total_bytes": float(lookup + update + dense)}


def run_single(a):
    import tensorflow as tf

    from dualemb.demo.config import DemoConfig
    cfg = DemoConfig(batch_size=a.batch)
    batches = demo_batches(cfg, DATA_BATCHES)
    model, optimizer = build(cfg)
    step_fn = tf.function(make_replica_step(model, optimizer))
    feed = [tuple(tf.constant(x) for x in b) for b in batches]

    def run(k):
        step_fn(*feed[k % DATA_BATCHES], tf.constant(k + 1, tf.int64))
    for k in range(a.warmup):
        run(k)
    t0 = time.perf_counter()
    for k in range(a.warmup, a.warmup + a.steps):
        run(k)
    float(optimizer.iterations.numpy())  # waits for the last step
    dt = time.perf_counter() - t0
    return {"examples_per_s": a.steps * a.batch / dt, "seconds": dt}


def run_ps(a):
    import numpy as np
    import tensorflow as tf

    from dualemb.demo.config import DemoConfig
    from dualemb.tf.distribute import wait_for_recovery
    from dualemb.tf.distribute.local_cluster import LocalCluster
    cfg = DemoConfig(batch_size=a.batch)
    batches = demo_batches(cfg, DATA_BATCHES)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    with LocalCluster(num_workers=a.workers, num_ps=a.ps, env=env) as cluster:
        strategy = tf.distribute.experimental.ParameterServerStrategy(cluster.resolver())
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        model, optimizer = build(cfg, strategy)
        replica_step = make_replica_step(model, optimizer)

        def dataset_fn():
            cols = [tf.constant(np.stack([b[i] for b in batches])) for i in range(3)]
            return tf.data.Dataset.from_tensor_slices(tuple(cols)).repeat()

        per_worker = coordinator.create_per_worker_dataset(dataset_fn)
        iterator = iter(per_worker)

        @tf.function
        def train_step(iterator, step):
            ids, dense, labels = next(iterator)
            return strategy.run(replica_step, args=(ids, dense, labels, step))

        def schedule(k):
            coordinator.schedule(train_step, args=(iterator, tf.constant(k + 1, tf.int64)))
        for k in range(a.warmup * a.workers):
            schedule(k)
        coordinator.join()
        t0 = time.perf_counter()
        first = a.warmup * a.workers
        for k in range(first, first + a.steps):
            schedule(k)
        coordinator.join()
        dt = time.perf_counter() - t0
        wait_for_recovery(coordinator, timeout=60)
        import dualemb.tf as de
        rows = sum(int(de.ops.table_size(shard.resource)) for layer in model.layers
                   if isinstance(layer, de.keras.layers.Embedding)
                   for shard in layer.params.tables)
        return {"examples_per_s": a.steps * a.batch / dt, "seconds": dt,
                "workers": a.workers, "ps": a.ps, "table_rows": rows,
                "bytes_per_step_estimate": bytes_per_step(cfg, batches)}


# strategy name -> runner(args) returning a dict with "examples_per_s" (the all-to-all strategy
# adds its own entry here).
RUNNERS = {"single": run_single, "ps": run_ps}


def child(a) -> int:
    runner = RUNNERS.get(a.run)
    out = runner(a) if runner is not None else None
    print("RESULT " + json.dumps(out), flush=True)
    return 0


def spawn(run, workers, a) -> dict | None:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", run, "--workers", str(workers),
           "--ps", str(a.ps), "--steps", str(a.steps), "--warmup", str(a.warmup),
           "--batch", str(a.batch)]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=a.timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{run} with {workers} worker(s) failed:\n{err[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", default="ps", choices=["ps", "alltoall"])
    p.add_argument("--child", dest="run", default="")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--ps", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600)
    a = p.parse_args()
    if a.run:
        return child(a)
    load0 = os.getloadavg()
    configs = [("single", 1), (a.strategy, 1), (a.strategy, 2)]
    names = ["single_process", f"{a.strategy}_1_workers", f"{a.strategy}_2_workers"]
    runs = {n: [] for n in names}
    for _ in range(a.repeats):  # alternating rounds: a burst of load hits every config alike
        for name, (run, workers) in zip(names, configs):
            runs[name].append(spawn(run, workers, a))
    res = {"model": "demo (dualemb/demo/config.py): 8 tables x dim 16, MLP 64-32-1, Keras Adam",
           "batch": a.batch, "steps": a.steps, "warmup_steps_per_worker": a.warmup,
           "repeats": a.repeats, "cores": os.cpu_count(), "strategy": a.strategy}
    for name in names:
        done = [r for r in runs[name] if r]
        res[name] = {"examples_per_s_median": statistics.median(r["examples_per_s"]
                                                                for r in done) if done else None,
                     "examples_per_s_runs": [r["examples_per_s"] for r in done]}
        if done and "bytes_per_step_estimate" in done[0]:
            res[name]["bytes_per_step_estimate"] = done[0]["bytes_per_step_estimate"]
            res[name]["table_rows"] = done[0]["table_rows"]
    one, two = res[names[1]]["examples_per_s_median"], res[names[2]]["examples_per_s_median"]
    if one and two:
        res["speedup_2_vs_1_workers"] = two / one
    res["load_average_before_after"] = [load0[0], os.getloadavg()[0]]
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

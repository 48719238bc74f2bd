"""Scale-out benchmark of dualemb.tf (JSON on stdout): ParameterServerStrategy, or the all-to-all
embedding under (MultiWorker)MirroredStrategy.

    python benchmarks/bench_scale_tf.py [--strategy ps|alltoall] [--steps 30] [--ps 2]
        [--batch 2048]

The demo-sized model (dualemb/demo/config.py: 8 sparse features, one table each, dim 16, 4 dense
features, MLP 64-32-1, Keras Adam through DynamicEmbeddingOptimizer, batch 2048); the same step
single-process for reference. ``--strategy ps`` (default): trained by a custom loop
(``ClusterCoordinator.schedule``) on a local cluster (``LocalCluster``: chief + W workers + P PS
on 127.0.0.1), for W = 1 and 2. Each worker reads its batches from a per-worker dataset
(``create_per_worker_dataset``), so the chief sends only the step number. Examples/s = timed
steps x batch / wall time of scheduling them and joining, after warm-up steps (tracing, first
run on every worker). Under async PS with W workers, W steps run at once, each on its own batch.

Bytes moved per step are an estimate from the sizes of what crosses a process boundary, not a
measurement (TF exposes no per-RPC byte counter): per feature table, the layer looks up each
distinct id once (``with_unique=True``), so with U distinct ids in the batch the worker sends U
int64 ids to the PS tasks and gets U rows of dim float32 back, then sends U ids and U gradient rows
for the fused update (Adam's slots stay on the PS); the dense weights live on the PS, so a step
reads them all and sends their gradients (Keras' update runs on the PS). U is counted exactly on
the benchmark's batches. Tensor framing and gRPC headers are not counted.

``--strategy alltoall``: the same model with ``Embedding(..., all_to_all=True)``, trained
synchronously by a custom loop (``strategy.run``) on a global batch of ``--batch`` examples split
between the replicas (replica r takes rows [r*B/N, (r+1)*B/N)): ``MirroredStrategy`` over 1 and
2 logical CPUs of one process (with 1 replica the layer is a plain embedding: no exchange), and
``MultiWorkerMirroredStrategy`` with 2 worker processes on 127.0.0.1 (``TF_CONFIG`` on free
ports; every worker feeds the same global batch; worker 0's figure is reported). Examples/s =
timed steps x global batch / wall time. Bytes one replica sends per step: the all-to-all
embedding's formula (``alltoall.bytes_per_lookup``, docs/scaling_tf.md) summed over the 8
features, with each exchange's padding ``cap`` computed exactly on the benchmark's batches, plus
an estimate of the dense gradients' ring all-reduce (``2 (N-1)/N`` of their bytes).

The machine may be shared: the load average is recorded.
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


def build(cfg, strategy=None, all_to_all=False):
    """(model, optimizer) of the demo architecture; under ``strategy``'s scope when given (the
    tables then get one shard per PS task by default, or with ``all_to_all`` under a
    (MultiWorker)MirroredStrategy with several replicas, one shard per replica)."""
    import keras
    import tensorflow as tf

    import dualemb.tf as de
    scope = strategy.scope() if strategy is not None else tf.init_scope()
    with scope:
        ids = keras.Input(shape=(cfg.features,), dtype="int64", name="ids")
        dense = keras.Input(shape=(cfg.num_dense,), dtype="float32", name="dense")
        rows = [de.keras.layers.Embedding(cfg.dim, initializer=cfg.initializer(f),
                                          name=cfg.table_name(f), all_to_all=all_to_all)(ids[:, f])
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


# ---- all-to-all embedding under (MultiWorker)MirroredStrategy -----------------------------------
def alltoall_bytes_per_step(cfg, batches, replicas):
    """Bytes one replica sends per training step by the all-to-all embedding
    (``alltoall.bytes_per_lookup``, docs/scaling_tf.md), from the exact padding ``cap`` of each
    feature's exchange on these batches (replica r takes rows [r*B/N, (r+1)*B/N) of the global
    batch; cap = the largest number of distinct ids any replica sends one owner); plus an estimate
    of the dense gradients' all-reduce (ring: 2(N-1)/N of the gradient bytes)."""
    import numpy as np

    from dualemb.core.routing import shard_of
    from dualemb.tf.distribute.alltoall import bytes_per_lookup
    if replicas == 1:  # a plain embedding: nothing is exchanged
        return {"embedding_exchange_bytes": 0.0, "dense_allreduce_bytes": 0.0,
                "total_bytes": 0.0, "mean_cap": 0.0}
    per = cfg.batch_size // replicas
    caps, exchange = [], []
    for ids, _, _ in batches:
        step = 0
        for f in range(cfg.features):
            cap = max(int(np.bincount(shard_of(np.unique(ids[r * per:(r + 1) * per, f]),
                                               replicas), minlength=replicas).max())
                      for r in range(replicas))
            caps.append(cap)
            step += bytes_per_lookup(cap, replicas, cfg.dim, key_bytes=8, training=True)
        exchange.append(step)
    dense_params = sum(fan_in * fan_out + fan_out for _, fan_in, fan_out in cfg.layer_sizes)
    dense = 2 * (replicas - 1) / replicas * 4 * dense_params
    emb = float(np.mean(exchange))
    return {"embedding_exchange_bytes": emb, "dense_allreduce_bytes": dense,
            "total_bytes": emb + dense, "mean_cap": float(np.mean(caps))}


def _alltoall_train(a, strategy, process_note):
    """Times the demo model's synchronous steps under ``strategy`` (every process feeds the same
    global batch of ``a.batch`` examples; replica r trains on its slice)."""
    import keras
    import tensorflow as tf

    from dualemb.demo.config import DemoConfig
    cfg = DemoConfig(batch_size=a.batch)
    batches = demo_batches(cfg, DATA_BATCHES)
    n = strategy.num_replicas_in_sync
    if a.batch % n:
        raise ValueError(f"--batch {a.batch} is not divisible by {n} replicas")
    model, optimizer = build(cfg, strategy, all_to_all=True)
    bce = keras.losses.BinaryCrossentropy(from_logits=True, reduction="sum")

    def replica_step(ids, dense, labels):
        with tf.GradientTape() as tape:  # summed per replica / global batch: the global mean
            loss = bce(labels, model([ids, dense], training=True)) / a.batch
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    per = a.batch // n

    def part(t):
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: t[ctx.replica_id_in_sync_group * per:
                          (ctx.replica_id_in_sync_group + 1) * per])

    @tf.function
    def train_step(ids, dense, labels):
        losses = strategy.run(replica_step, args=(part(ids), part(dense), part(labels)))
        return strategy.reduce("SUM", losses, axis=None)

    feed = [tuple(tf.constant(x) for x in b) for b in batches]
    for k in range(a.warmup):
        train_step(*feed[k % DATA_BATCHES])
    t0 = time.perf_counter()
    for k in range(a.warmup, a.warmup + a.steps):
        loss = train_step(*feed[k % DATA_BATCHES])
    float(loss)  # waits for the last step
    dt = time.perf_counter() - t0
    import dualemb.tf as de
    rows = sum(int(de.ops.table_size(shard.resource)) for layer in model.layers
               if isinstance(layer, de.keras.layers.Embedding)
               for shard in layer.params.tables)
    return {"examples_per_s": a.steps * a.batch / dt, "seconds": dt, "replicas": n,
            "processes": process_note, "local_table_rows": rows,
            "bytes_per_replica_step": alltoall_bytes_per_step(cfg, batches, n)}


def run_alltoall_mirrored(a):
    """MirroredStrategy over ``a.workers`` logical CPUs of this process (one replica each)."""
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * a.workers)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(a.workers)])
    return _alltoall_train(a, strategy, 1)


def run_alltoall_worker(a):
    """One worker process of a MultiWorkerMirroredStrategy job (``TF_CONFIG`` set by
    ``run_alltoall_multiworker``)."""
    import tensorflow as tf
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=a.timeout)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    return _alltoall_train(a, strategy, a.workers)


def run_alltoall_multiworker(a):
    """Starts ``a.workers`` worker processes on 127.0.0.1 (free ports, killed by pid at the end)
    and returns worker 0's figures (every worker times the same synchronous steps)."""
    from dualemb.tf.distribute.local_cluster import free_ports
    workers = [f"127.0.0.1:{p}" for p in free_ports(a.workers)]
    procs = []
    try:
        for i in range(a.workers):
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps(
                {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}))
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), *_child_args("alltoall_worker", a)],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        results = [_result(p, a.timeout, f"all-to-all worker {i}") for i, p in enumerate(procs)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    out = results[0]
    out["examples_per_s_each_worker"] = [r["examples_per_s"] for r in results]
    return out


# strategy name -> runner(args) returning a dict with "examples_per_s" (the all-to-all strategy
# adds its own entry here).
RUNNERS = {"single": run_single, "ps": run_ps, "alltoall_mirrored": run_alltoall_mirrored,
           "alltoall_multiworker": run_alltoall_multiworker,
           "alltoall_worker": run_alltoall_worker}
# --strategy -> the (run name, workers or replicas) measured after the single-process reference.
CONFIGS = {"ps": [("ps", 1), ("ps", 2)],
           "alltoall": [("alltoall_mirrored", 1), ("alltoall_mirrored", 2),
                        ("alltoall_multiworker", 2)]}


def child(a) -> int:
    runner = RUNNERS.get(a.run)
    out = runner(a) if runner is not None else None
    print("RESULT " + json.dumps(out), flush=True)
    return 0


def _child_args(run, a, workers=None) -> list[str]:
    return ["--child", run, "--workers", str(a.workers if workers is None else workers),
            "--ps", str(a.ps), "--steps", str(a.steps), "--warmup", str(a.warmup),
            "--batch", str(a.batch), "--timeout", str(a.timeout)]


def _result(proc, timeout, what) -> dict | None:
    """The RESULT line of child ``proc`` (killed by pid if it outlives ``timeout``)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{what} failed:\n{err[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def spawn(run, workers, a) -> dict | None:
    cmd = [sys.executable, os.path.abspath(__file__), *_child_args(run, a, workers)]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    return _result(proc, a.timeout, f"{run} with {workers} worker(s)")


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
    configs = [("single", 1), *CONFIGS[a.strategy]]
    unit = "replicas" if a.strategy == "alltoall" else "workers"
    names = ["single_process", *(f"{run}_{n}_{unit}" for run, n in CONFIGS[a.strategy])]
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
        for key in ("bytes_per_step_estimate", "table_rows", "bytes_per_replica_step",
                    "local_table_rows"):
            if done and key in done[0]:
                res[name][key] = done[0][key]
    one, two = res[names[1]]["examples_per_s_median"], res[names[2]]["examples_per_s_median"]
    if one and two:
        res["speedup_2_vs_1_workers"] = two / one
    if len(names) > 3 and one and res[names[3]]["examples_per_s_median"]:
        res["speedup_multiworker_2_vs_1_replica"] = res[names[3]]["examples_per_s_median"] / one
    res["load_average_before_after"] = [load0[0], os.getloadavg()[0]]
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

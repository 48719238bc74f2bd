"""TensorFlow front-end benchmarks; prints one JSON object.

1. ``lookup``: the cost of one lookup of a batch of 4,096 int64 keys (dim 16, table of 1M rows)
   through the core's Python path (``dualemb.core.Table.find``, numpy in and out) and through the
   TF op (eagerly, raw op and ``Variable.lookup``, and inside a ``tf.function``); the TF overhead is
   the difference of medians (target: <= 20 us).
2. ``fit``: ``model.fit`` examples/s on 8 sparse features (ids drawn from a Zipf distribution over
   10M ids), one ``de.keras.layers.Embedding`` of dim 16 per feature, an MLP 128-64-32-1, batch
   4,096, Adam, binary cross-entropy.

    DUALEMB_NATIVE_DIR=build/tf/dualemb PYTHONPATH=. python benchmarks/bench_tf.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import dualemb.tf as de  # noqa: E402
from dualemb.core import Table  # noqa: E402
from dualemb.tf import ops  # noqa: E402


def _interleaved_us(fns: dict, repeats: int, inner: int) -> dict:
    """Per function, the per-call time of each repeat (us). The functions take turns within each
    repeat, so background load affects them alike and paired differences stay meaningful."""
    for fn in fns.values():
        fn()  # warm up
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            times[name].append((time.perf_counter() - t0) / inner * 1e6)
    return times


def bench_lookup(batch=4096, dim=16, rows=1_000_000, repeats=30, inner=50):
    var = de.Variable(dim=dim, name="bench_lookup",
                      initializer=keras.initializers.RandomNormal(seed=1))
    rng = np.random.default_rng(0)
    keys_all = np.arange(rows, dtype=np.int64)
    for start in range(0, rows, 1 << 18):
        chunk = keys_all[start:start + (1 << 18)]
        var.upsert(chunk, rng.normal(0, 1, (len(chunk), dim)).astype(np.float32))
    table = Table.attach(var.tables[0].table_id)
    keys_np = rng.integers(0, 2 * rows, batch).astype(np.int64)  # half hits, half misses
    keys_tf = tf.constant(keys_np)
    handle = var.tables[0].resource
    np.testing.assert_array_equal(table.find(keys_np)[0], var.lookup(keys_tf).numpy())

    lookup_fn = tf.function(lambda k: var.lookup(k))
    times = _interleaved_us({
        "core_python_find_us": lambda: table.find(keys_np),
        "tf_eager_op_us": lambda: ops.find(handle, keys_tf, dim),
        "tf_eager_variable_lookup_us": lambda: var.lookup(keys_tf),
        "tf_function_lookup_us": lambda: lookup_fn(keys_tf),
    }, repeats, inner)
    results = {name: statistics.median(t) for name, t in times.items()}
    core = times["core_python_find_us"]
    for name, key in (("tf_eager_op_us", "tf_op_overhead_us"),
                      ("tf_eager_variable_lookup_us", "tf_variable_overhead_us"),
                      ("tf_function_lookup_us", "tf_function_overhead_us")):
        results[key] = statistics.median(t - c for t, c in zip(times[name], core))
    results["keys_per_s_tf_op"] = batch / (results["tf_eager_op_us"] * 1e-6)
    results["keys_per_s_core"] = batch / (results["core_python_find_us"] * 1e-6)
    results.update(batch=batch, dim=dim, table_rows=rows, target_overhead_us=20.0)
    return results


def _zipf_ids(rng, shape, vocab=10_000_000, a=1.2):
    ids = rng.zipf(a, size=shape).astype(np.int64) - 1
    return ids % vocab


def build_model(features=8, dim=16):
    inputs = [keras.Input((1,), dtype="int64", name=f"f{i}") for i in range(features)]
    embedded = [keras.layers.Flatten()(de.keras.layers.Embedding(dim, name=f"emb{i}")(x))
                for i, x in enumerate(inputs)]
    x = keras.layers.Concatenate()(embedded)
    x = keras.layers.Dense(64, activation="relu")(x)
    x = keras.layers.Dense(32, activation="relu")(x)
    out = keras.layers.Dense(1, activation="sigmoid")(x)
    model = keras.Model(inputs, out)
    model.compile(de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(1e-3)),
                  keras.losses.BinaryCrossentropy())
    return model


def bench_fit(features=8, dim=16, batch=4096, steps=60, epochs=2):
    rng = np.random.default_rng(1)
    n = batch * steps
    ids = _zipf_ids(rng, (n, features))
    labels = (rng.random((n, 1)) < 0.3).astype(np.float32)
    data = {f"f{i}": ids[:, i:i + 1] for i in range(features)}
    model = build_model(features, dim)
    model.fit(data, labels, batch_size=batch, epochs=1, verbose=0, shuffle=False)  # warm-up
    per_epoch = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        model.fit(data, labels, batch_size=batch, epochs=1, verbose=0, shuffle=False)
        per_epoch.append(time.perf_counter() - t0)
    best = min(per_epoch)
    sizes = [int(layer.params.size()) for layer in model.layers
             if isinstance(layer, de.keras.layers.Embedding)]
    return {"examples_per_s": n / best, "step_ms": best / steps * 1e3, "batch": batch,
            "features": features, "dim": dim, "steps_per_epoch": steps,
            "distinct_ids_per_feature": sizes, "zipf_a": 1.2, "vocab": 10_000_000}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repeats and steps")
    args = parser.parse_args()
    out = {
        "benchmark": "dualemb.tf",
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "lookup": bench_lookup(repeats=5 if args.quick else 30, inner=20 if args.quick else 50),
        "fit": bench_fit(steps=10 if args.quick else 60, epochs=1 if args.quick else 2),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

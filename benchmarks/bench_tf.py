"""TensorFlow front-end benchmarks; prints one JSON object.

1. ``lookup``: the cost of one lookup of a batch of 4,096 int64 keys (dim 16, table of 1M rows)
   through the core's Python path (``dualemb.core.Table.find``, numpy in and out) and through the
   TF op (eagerly, raw op and ``Variable.lookup``, and inside a ``tf.function``); the TF overhead is
   the difference of medians (target: <= 20 us).
2. ``fit``: ``model.fit`` examples/s on 8 sparse features (ids drawn from a Zipf distribution over
   10M ids), one ``de.keras.layers.Embedding`` of dim 16 per feature, an MLP 128-64-32-1, batch
   4,096, Adam, binary cross-entropy.

3. ``restore``: ``tf.train.Checkpoint(emb=var)`` written once, then read back into the same
   object (``read(path).assert_consumed()``) ``--restores`` times, a 1M x 64 table: seconds and
   CPU seconds per restore, and the minor page faults per restore, a count that the machine's
   load does not change (an import that faults in fresh memory shows there, not in instruction
   counts: docs/benchmarks.md, "Regressions since the turn-2 main").

    DUALEMB_NATIVE_DIR=build/tf/dualemb PYTHONPATH=. python benchmarks/bench_tf.py [--quick]
        [--sections lookup fit restore] [--build NAME=TREE[:NATIVE_DIR] ... [--rounds 3]]

Each --build is a source tree (its Python package) with a built TF op library (NATIVE_DIR,
default TREE/build/dev/dualemb), e.g. ``--build old=/tmp/old --build new=.``: every round runs
the sections once per build, each in its own process, the builds taking turns, so two commits
built side by side compare directly (the trees' own Python code, this file's workloads; the
workloads use only APIs the turn-2 main a7ab7ef already had). The JSON then holds each build's
per-round results and the median of each number over the rounds, and each build's medians
divided by the first build's (``ratios``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
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


def bench_restore(rows=1_000_000, dim=64, restores=7):
    """tf.train.Checkpoint restore into the same object: per restore, median/min seconds, CPU
    seconds (all threads) and minor page faults (both medians)."""
    var = de.Variable(key_dtype=tf.int64, value_dtype=tf.float32, dim=dim, name="bench_restore")
    rng = np.random.default_rng(0)
    keys = rng.permutation(rows * 4)[:rows].astype(np.int64)
    for start in range(0, rows, 1 << 18):
        chunk = keys[start:start + (1 << 18)]
        var.upsert(tf.constant(chunk),
                   tf.constant(rng.normal(0, 1, (len(chunk), dim)).astype(np.float32)))
    ckpt = tf.train.Checkpoint(emb=var)
    with tempfile.TemporaryDirectory(prefix="bench_tf_restore_") as d:
        t0 = time.perf_counter()
        path = ckpt.write(os.path.join(d, "ckpt"))
        write_s = time.perf_counter() - t0
        ckpt.read(path).assert_consumed()  # warm-up: the first restore builds TF's restore ops
        wall, cpu, faults = [], [], []
        for _ in range(restores):
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            c0, t0 = time.process_time(), time.perf_counter()
            ckpt.read(path).assert_consumed()
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    assert int(var.size()) == rows
    return {"restore_s": statistics.median(wall), "restore_min_s": min(wall),
            "restore_cpu_s": statistics.median(cpu),
            "restore_minor_faults": statistics.median(faults), "write_s": write_s,
            "rows": rows, "dim": dim, "restores": restores}


def run_sections(args) -> dict:
    out = {}
    for section in args.sections:
        if section == "lookup":
            out["lookup"] = bench_lookup(repeats=5 if args.quick else 30,
                                         inner=20 if args.quick else 50)
        elif section == "fit":
            out["fit"] = bench_fit(steps=10 if args.quick else 60, epochs=1 if args.quick else 2)
        elif section == "restore":
            out["restore"] = bench_restore(rows=args.restore_rows, dim=args.restore_dim,
                                           restores=3 if args.quick else args.restores)
    return out


def parse_build(spec):
    name, _, rest = spec.partition("=")
    tree, _, native = rest.partition(":")
    tree = os.path.abspath(tree or ".")
    return name, tree, os.path.abspath(native or os.path.join(tree, "build", "dev", "dualemb"))


def _numbers(result: dict, prefix="") -> dict:
    """The numeric leaves of a section's result, as {"section.name": value}."""
    flat = {}
    for key, value in result.items():
        if isinstance(value, dict):
            flat.update(_numbers(value, f"{prefix}{key}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[prefix + key] = value
    return flat


def compare_builds(args) -> dict:
    """Runs this file's sections once per build and round, the builds taking turns."""
    builds = [parse_build(b) for b in args.build]
    passthrough = ["--sections", *args.sections, "--restore-rows", str(args.restore_rows),
                   "--restore-dim", str(args.restore_dim), "--restores", str(args.restores)]
    if args.quick:
        passthrough.append("--quick")
    rounds = {name: [] for name, _, _ in builds}
    for r in range(args.rounds):
        order = builds if r % 2 == 0 else builds[::-1]
        for name, tree, native in order:
            env = dict(os.environ, PYTHONPATH=tree, DUALEMB_NATIVE_DIR=native)
            done = subprocess.run([sys.executable, os.path.abspath(__file__), *passthrough],
                                  env=env, check=True, capture_output=True, text=True)
            rounds[name].append(json.loads(done.stdout))
    medians = {}
    for name, results in rounds.items():
        flat = [_numbers({k: v for k, v in res.items() if k in args.sections}) for res in results]
        medians[name] = {k: statistics.median(f[k] for f in flat) for k in flat[0]}
    first = builds[0][0]
    ratios = {name: {k: round(v / medians[first][k], 4) for k, v in medians[name].items()
                     if medians[first].get(k)}
              for name in medians if name != first}
    return {"builds": {n: {"tree": t, "native": nd} for n, t, nd in builds},
            "rounds": rounds, "medians": medians, "ratios": ratios}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats and steps")
    parser.add_argument("--sections", nargs="+", choices=["lookup", "fit", "restore"],
                        default=["lookup", "fit", "restore"])
    parser.add_argument("--restore-rows", type=int, default=1_000_000)
    parser.add_argument("--restore-dim", type=int, default=64)
    parser.add_argument("--restores", type=int, default=7)
    parser.add_argument("--build", action="append", default=[],
                        help="NAME=TREE[:NATIVE_DIR]; compare builds side by side")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of a --build comparison")
    args = parser.parse_args()
    out = {
        "benchmark": "dualemb.tf",
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "load_average": os.getloadavg(),
    }
    if args.build:
        out.update(compare_builds(args))
    else:
        out.update(run_sections(args))
    out["load_average_end"] = os.getloadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

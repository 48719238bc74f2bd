"""Where a ``model.fit`` step of the compare_tfra.py model spends its time; prints JSON.

The model and data are compare_tfra.py's (``tfra_worker.build_fit_model`` / ``fit_batches``: 8 Zipf
features over 10M ids, one ``dualemb.tf.keras.layers.Embedding(16)`` each, MLP, batch 4,096, Adam
in ``DynamicEmbeddingOptimizer``). After an untimed warm-up fit, one ``model.fit`` of --steps
steps runs under ``tf.profiler``; the trace's host events are grouped by op type. Reported:
wall time and process CPU time (all threads) per step, the summed time of dualemb's own ops
(``Dualemb*`` kernels) per step and its share of the step's wall time and of all op time, the op
types that take the most time, and the op types of the traced train function (its graph and the
functions it calls: what the layers and the optimizer add to a step).

    DUALEMB_NATIVE_DIR=build/x/dualemb PYTHONPATH=. python benchmarks/profile_fit_step.py [--steps 20]
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: E402

import dualemb.tf as de  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tfra_worker as W  # noqa: E402


def op_times(logdir: str) -> dict:
    """Summed duration (s) per TF op type over the host threads of the trace in ``logdir``.
    Kernel events are named "<node name>:<op type>" by TF's executor (eager ops: the type)."""
    paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        raise RuntimeError(f"no xplane.pb under {logdir}")
    space = xplane_pb2.XSpace()
    data = open(paths[0], "rb").read()
    space.ParseFromString(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    by_type = collections.Counter()
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        names = {k: m.name for k, m in plane.event_metadata.items()}
        for line in plane.lines:
            if "python" in line.name.lower():  # Python trace lines (tracer level 0: none)
                continue
            for ev in line.events:
                name = names.get(ev.metadata_id, "")
                if ":" not in name or "::" in name:  # not a kernel (executor's own events)
                    continue
                by_type[name.rsplit(":", 1)[1]] += ev.duration_ps * 1e-12
    return by_type


def graph_op_counts(model, element_spec) -> dict:
    """Op type -> count in ``model.train_step`` traced for one batch of ``element_spec`` (what
    ``fit`` runs per step), the functions it calls included."""
    concrete = tf.function(model.train_step).get_concrete_function(element_spec)
    graph_def = concrete.graph.as_graph_def()
    counts = collections.Counter(node.op for node in graph_def.node)
    for f in graph_def.library.function:
        counts.update(node.op for node in f.node_def)
    return dict(counts.most_common())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--no-unique", action="store_true",
                    help="Embedding layers with with_unique=False (no tf.unique + tf.gather)")
    args = ap.parse_args()
    spec = W.fit_spec({"warmup": args.warmup, "rounds": 1, "epochs": 1, "steps": args.steps})
    ids, labels = W.fit_batches(spec, 0, args.warmup + args.steps)

    def dataset(start, count):
        feats = {f"f{i}": ids[start:start + count, :, i:i + 1] for i in range(spec["features"])}
        return tf.data.Dataset.from_tensor_slices((feats, labels[start:start + count]))

    model, _ = W.build_fit_model(keras, de, spec,
                                 **({"with_unique": False} if args.no_unique else {}))
    model.fit(dataset(0, args.warmup), steps_per_epoch=args.warmup, epochs=1, verbose=0)
    logdir = tempfile.mkdtemp(prefix="dualemb_fit_profile_")
    load0 = os.getloadavg()
    try:
        ds = dataset(args.warmup, args.steps)
        tf.profiler.experimental.start(
            logdir, options=tf.profiler.experimental.ProfilerOptions(host_tracer_level=2,
                                                                     python_tracer_level=0))
        t0, c0 = time.perf_counter(), time.process_time()
        model.fit(ds, steps_per_epoch=args.steps, epochs=1, verbose=0)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        tf.profiler.experimental.stop()
        by_type = op_times(logdir)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    steps = args.steps
    graph_ops = graph_op_counts(model, ds.element_spec)
    ours = {k: v for k, v in by_type.items() if k.startswith("Dualemb")}
    total_ops = sum(by_type.values())
    ours_s = sum(ours.values())
    out = {
        "spec": spec, "steps": steps, "with_unique": not args.no_unique, "load_avg_start": load0,
        "load_avg_end": os.getloadavg(),
        "step_wall_ms": wall / steps * 1e3,
        "step_process_cpu_ms": cpu / steps * 1e3,
        "dualemb_ops_ms_per_step": ours_s / steps * 1e3,
        "dualemb_share_of_step_wall": ours_s / wall,
        "all_ops_ms_per_step": total_ops / steps * 1e3,
        "dualemb_share_of_op_time": ours_s / total_ops if total_ops else None,
        "dualemb_ops_ms_per_step_by_type": {k: v / steps * 1e3 for k, v in
                                            sorted(ours.items(), key=lambda kv: -kv[1])},
        "top_op_types_ms_per_step": {k: v / steps * 1e3 for k, v in
                                     by_type.most_common(args.top)},
        "train_graph_ops": sum(graph_ops.values()),
        "train_graph_op_types": graph_ops,
        "note": "op times are summed over threads (ops run in parallel on the inter-op pool), "
                "so shares of op time are the meaningful figure; the whole fit runs under the "
                "profiler, which adds its own overhead.",
    }
    print(f"step {out['step_wall_ms']:.1f} ms wall, {out['step_process_cpu_ms']:.1f} ms CPU; "
          f"{out['train_graph_ops']} ops in the train graph; dualemb ops {out['dualemb_ops_ms_per_step']:.2f}"
          f" ms/step = {out['dualemb_share_of_step_wall']:.1%} of wall, "
          f"{out['dualemb_share_of_op_time'] or 0:.1%} of all op time; load {load0[0]:.2f}",
          file=sys.stderr)
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

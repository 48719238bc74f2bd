"""Cost of the dualemb TF ops inside ``tf.function`` against the core's own time; prints JSON.

For each op (find = ``Variable.lookup``, upsert, accum, apply_gradients with Adam), batch size and
dim, on a table preloaded with --rows keys (batches of present keys), four timings of the same
batch, taking turns within each round so that background load hits them alike:

  empty   an empty ``tf.function`` taking the same tensors (TF's fixed cost of a function call)
  core    ``dualemb.core.Table`` on the same table and numpy batch (the core's own time)
  eager   the ``dualemb.tf`` call made eagerly
  graph   the same call inside a ``tf.function``

Reported per cell: median and min (ms) of each, ``graph / (empty + core)`` (target <= 1.2) and
``graph / eager`` (target <= 1), both from medians.

    DUALEMB_NATIVE_DIR=build/x/dualemb PYTHONPATH=. python benchmarks/bench_tf_graph.py \\
        [--dims 8 64] [--batches 4096 65536] [--rounds 15] [--ops find upsert accum apply_gradients]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.eager import context  # noqa: E402  (async_wait: no public equivalent)

import dualemb.tf as de  # noqa: E402
from dualemb.core import Table  # noqa: E402
from dualemb.tf import ops  # noqa: E402

OPS = ("find", "upsert", "accum", "apply_gradients")
ADAM = {"name": "adam"}


def make_variable(dim: int, rows: int, seed: int):
    var = de.Variable(key_dtype=tf.int64, value_dtype=tf.float32, dim=dim,
                      name=f"bench_graph_{dim}")
    keys = np.arange(rows, dtype=np.int64) * 2654435761 + 17
    rng = np.random.default_rng(seed)
    for s in range(0, rows, 1 << 18):
        k = keys[s:s + (1 << 18)]
        var.upsert(tf.constant(k), tf.constant(rng.standard_normal((len(k), dim), np.float32)))
    return var, keys


def callables(op: str, var, table: Table, handle, k_np, v_np, e_np, dim: int) -> dict:
    """The four zero-argument calls of one cell (their tensors made once, outside the timing)."""
    k, v, e = tf.constant(k_np), tf.constant(v_np), tf.constant(e_np)
    lr, step = tf.constant(0.001, tf.float32), tf.constant(1, tf.int64)
    if op == "find":
        eager = lambda: var.lookup(k)  # noqa: E731
        graph_fn = tf.function(lambda k: var.lookup(k))
        core = lambda: table.find(k_np)  # noqa: E731
        graph = lambda: graph_fn(k)  # noqa: E731
        empty_fn = tf.function(lambda k: tf.constant(0))
        empty = lambda: empty_fn(k)  # noqa: E731
    elif op == "upsert":
        eager = lambda: var.upsert(k, v)  # noqa: E731
        graph_fn = tf.function(lambda k, v: var.upsert(k, v))
        core = lambda: table.insert_or_assign(k_np, v_np)  # noqa: E731
        graph = lambda: graph_fn(k, v)  # noqa: E731
        empty_fn = tf.function(lambda k, v: tf.constant(0))
        empty = lambda: empty_fn(k, v)  # noqa: E731
    elif op == "accum":
        # Variable.accum(keys, old, new, exists): the op (DualembAccumRows) hands old and new
        # rows to the core, which forms new - old where exists as it adds; the core column makes
        # the same call (Table.accum_rows) on the same batch.
        zeros = tf.zeros_like(v)
        zeros_np = np.zeros_like(v_np)
        eager = lambda: var.accum(k, zeros, v, e)  # noqa: E731
        graph_fn = tf.function(lambda k, o, v, e: var.accum(k, o, v, e))
        core = lambda: table.accum_rows(k_np, zeros_np, v_np, e_np)  # noqa: E731
        graph = lambda: graph_fn(k, zeros, v, e)  # noqa: E731
        empty_fn = tf.function(lambda k, o, v, e: tf.constant(0))
        empty = lambda: empty_fn(k, zeros, v, e)  # noqa: E731
    elif op == "apply_gradients":
        eager = lambda: ops.apply_gradients(handle, k, v, lr, step)  # noqa: E731
        graph_fn = tf.function(lambda k, g, lr, s: ops.apply_gradients(handle, k, g, lr, s))
        core = lambda: table.apply_gradients(k_np, v_np, 0.001, 1)  # noqa: E731
        graph = lambda: graph_fn(k, v, lr, step)  # noqa: E731
        empty_fn = tf.function(lambda k, g, lr, s: tf.constant(0))
        empty = lambda: empty_fn(k, v, lr, step)  # noqa: E731
    else:
        raise ValueError(op)
    return {"empty": empty, "core": core, "eager": eager, "graph": graph}


def time_cell(fns: dict, rounds: int, inner: int) -> dict:
    for f in fns.values():  # trace / warm up
        f()
        f()
    samples = {n: [] for n in fns}
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(fns)[::-1]
        for name in order:
            f = fns[name]
            t0 = time.perf_counter()
            for _ in range(inner):
                f()
            # Every call has finished: eager CPU ops run synchronously unless async mode is on
            # (then this waits for them). No `.numpy()` of the result: converting a 16 MB
            # result would add a copy the core side does not pay.
            context.async_wait()
            samples[name].append((time.perf_counter() - t0) / inner)
    med = {n: statistics.median(s) for n, s in samples.items()}
    return {"median_ms": {n: m * 1e3 for n, m in med.items()},
            "min_ms": {n: min(s) * 1e3 for n, s in samples.items()},
            "graph_over_empty_plus_core": med["graph"] / (med["empty"] + med["core"]),
            "graph_over_eager": med["graph"] / med["eager"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--batches", type=int, nargs="+", default=[4096, 65536])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    args = ap.parse_args()
    out = {"config": vars(args), "machine": {"cpus": os.cpu_count(),
                                              "platform": platform.platform(),
                                              "load_avg_start": os.getloadavg()},
           "versions": {"tf": tf.__version__}, "cells": {}}
    for dim in args.dims:
        var, keys = make_variable(dim, args.rows, seed=dim)
        table = Table.attach(var.tables[0].table_id)
        handle = var.tables[0].resource
        for op in args.ops:
            if op == "apply_gradients":
                table.set_optimizer(ADAM)
            for b in args.batches:
                rng = np.random.default_rng(b + dim)
                k_np = keys[rng.integers(0, args.rows, b)]
                v_np = rng.standard_normal((b, dim), np.float32) * np.float32(1e-3)
                e_np = np.ones(b, bool)
                fns = callables(op, var, table, handle, k_np, v_np, e_np, dim)
                # >= 5 calls per sample: one call of a big batch is too short a sample to time alone.
                inner = max(5, 200_000 // b)
                cell = time_cell(fns, args.rounds, inner)
                out["cells"][f"{op}/d{dim}/b{b}"] = cell
                m = cell["median_ms"]
                print(f"[{op} d{dim} b{b}] empty {m['empty']:.3f} core {m['core']:.3f} eager "
                      f"{m['eager']:.3f} graph {m['graph']:.3f} ms; graph/(empty+core) "
                      f"{cell['graph_over_empty_plus_core']:.2f}, graph/eager "
                      f"{cell['graph_over_eager']:.2f}; load {os.getloadavg()[0]:.2f}",
                      file=sys.stderr, flush=True)
            if op == "apply_gradients":
                table.set_optimizer(None)
        var.clear()
    out["machine"]["load_avg_end"] = os.getloadavg()
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

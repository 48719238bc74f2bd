"""The core table's per-key work against a dense numpy gather/scatter of the same rows (issue 22,
small rows), printed as JSON.

    python benchmarks/bench_core_vs_gather.py [--dims 4 8 16 32 64 128] [--threads 1 2]
        [--rows 1000000] [--batch 65536] [--rounds 7] [--mode wall|callgrind]

For each dim: a table of `--rows` random int64 keys (reserved, filled by insert_or_assign) and a
dense float32 array of as many rows, holding the same values. Each batch draws `--batch` random
row numbers `idx` (all present keys; repeats as random draws give them); the table gets
`keys[idx]`, numpy gets `idx`, both made before the timing starts (until 2026-12-07 the core's
timing included the `keys[idx]` gather itself, a second gather numpy did not pay):

- find              vs  np.take(values, idx, axis=0)       (the gather)
- insert_or_assign  vs  values[idx] = rows                   (the scatter)
- apply_gradients   vs  np.add.at(values, idx, grads)        (the scatter-add)
  (Keras Adam on a second table with its two slots; the scatter-add is the dense floor of any
  sparse update of those rows, not an Adam: Adam reads and writes three times the bytes.)

--mode wall: `--rounds` rounds, each timing every op of every side once on the same batch
(sides interleaved, so a load change hits both); median keys/s per op and side, and
core/numpy ratios (issue 22's goal: >= 0.8 at every dim). numpy runs on one thread: the
2-thread rows compare against the same numpy number (`numpy_threads` says so). Wall time means
something on an idle machine only; the load average is recorded.

--mode callgrind: each (dim, op, side) in its own process under valgrind's callgrind with cache
simulation (D1 32 KiB; LL 8 MiB, smaller than every structure of a 1M-row table, the
dense array of dim 4 included: the misses of rows that a shared cache would not hold), collection
on only inside the op (the C ABI's de_find / de_insert_or_assign / de_apply_gradients; numpy's
PyArray_TakeFrom / array_assign_subscript / ufunc_at), `--calls` calls of `--batch` keys on one
thread: instructions, data reads and D1 / LL read misses per key. These counts do not depend on
the machine's load (they count work and a modelled cache, not stalls).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

OPS = ("find", "insert_or_assign", "apply_gradients")
# What callgrind collects inside, per op and side.
COLLECT = {
    ("find", "core"): "de_find",
    ("insert_or_assign", "core"): "de_insert_or_assign",
    ("apply_gradients", "core"): "de_apply_gradients",
    ("find", "numpy"): "PyArray_TakeFrom",
    ("insert_or_assign", "numpy"): "array_assign_subscript",
    ("apply_gradients", "numpy"): "ufunc_at",
}
NUMPY_OP = {"find": "np.take(values, idx, axis=0)", "insert_or_assign": "values[idx] = rows",
            "apply_gradients": "np.add.at(values, idx, grads)"}


def make_data(rows, dim, seed=0):
    rng = np.random.default_rng(seed)
    # Distinct random keys, cheaply (rng.choice without replacement takes seconds at 1M rows,
    # minutes under valgrind).
    keys = np.unique(rng.integers(1, 1 << 62, rows + rows // 8 + 16, dtype=np.int64))[:rows]
    if keys.size < rows:
        raise RuntimeError("drew too few distinct keys")
    keys = rng.permutation(keys)
    values = rng.random((rows, dim), dtype=np.float32)
    return rng, keys, values


def filled_table(keys, values, threads, optimizer=None):
    from dualemb.core import Table

    t = Table(dim=values.shape[1], num_threads=threads, optimizer=optimizer)
    t.reserve(keys.size + keys.size // 4)
    # import_rows, not insert_or_assign: callgrind mode collects inside de_insert_or_assign.
    for s in range(0, keys.size, 1 << 17):
        t.import_rows(keys[s:s + (1 << 17)], values[s:s + (1 << 17)])
    return t


def core_ops(plain, adam):
    """op -> fn(batch_keys, rows, grads) on the tables (batch_keys: keys[idx], made untimed)."""
    return {
        "find": lambda q, rows, grads: plain.find(q),
        "insert_or_assign": lambda q, rows, grads: plain.insert_or_assign(q, rows),
        "apply_gradients": lambda q, rows, grads: adam.apply_gradients(
            q, grads, lr=1e-3, step=1),
    }


def numpy_ops(values):
    return {
        "find": lambda idx, rows, grads: np.take(values, idx, axis=0),
        "insert_or_assign": lambda idx, rows, grads: values.__setitem__(idx, rows),
        "apply_gradients": lambda idx, rows, grads: np.add.at(values, idx, grads),
    }


def wall_dim(a, dim):
    rng, keys, values = make_data(a.rows, dim)
    # The numpy side writes into its own copy; the tables keep theirs.
    dense = values.copy()
    plain = {th: filled_table(keys, values, th) for th in a.threads}
    adam = {th: filled_table(keys, values, th, {"name": "adam", "flavor": "keras"})
            for th in a.threads}
    del values
    sides = {"numpy": numpy_ops(dense)}
    for th in a.threads:
        sides[f"core_{th}t"] = core_ops(plain[th], adam[th])
    times = {(side, op): [] for side in sides for op in OPS}
    for rnd in range(a.rounds):
        idx = rng.integers(0, keys.size, a.batch)
        batch_keys = keys[idx]
        rows = rng.normal(0, 0.01, size=(a.batch, dim)).astype(np.float32)
        grads = rng.normal(0, 0.01, size=(a.batch, dim)).astype(np.float32)
        order = list(sides)
        if rnd % 2:
            order.reverse()  # alternate who goes first
        for op in OPS:
            for side in order:
                fn = sides[side][op]
                sel = idx if side == "numpy" else batch_keys
                t0 = time.perf_counter()
                fn(sel, rows, grads)
                times[(side, op)].append(time.perf_counter() - t0)
    for t in list(plain.values()) + list(adam.values()):
        t.destroy()
    out = []
    for th in a.threads:
        row = {"dim": dim, "threads": th, "numpy_threads": 1}
        for op in OPS:
            core = a.batch / statistics.median(times[(f"core_{th}t", op)]) / 1e6
            ref = a.batch / statistics.median(times[("numpy", op)]) / 1e6
            row[op] = {"core": round(core, 3), "numpy": round(ref, 3),
                       "core/numpy": round(core / ref, 3)}
        out.append(row)
    return out


def callgrind_inner(a):
    """Runs in the child process: one op of one side, `--calls` times."""
    dim, op, side = a.dims[0], a.op, a.side
    rng, keys, values = make_data(a.rows, dim)
    if side == "core":
        opt = {"name": "adam", "flavor": "keras"} if op == "apply_gradients" else None
        t = filled_table(keys, values, 1, opt)
        fn = core_ops(t, t)[op]
    else:
        fn = numpy_ops(values)[op]
    # A fresh batch every call: rows a repeated batch left in the cache would hide its misses.
    batches = [rng.integers(0, keys.size, a.batch) for _ in range(a.calls)]
    if side == "core":
        batches = [keys[b] for b in batches]
    rows = rng.normal(0, 0.01, size=(a.batch, dim)).astype(np.float32)
    for c in range(a.calls):
        fn(batches[c], rows, rows)


def callgrind_one(a, dim, op, side):
    inner = [sys.executable, os.path.abspath(__file__), "--inner", "--dims", str(dim),
             "--op", op, "--side", side, "--rows", str(a.rows), "--batch", str(a.batch),
             "--calls", str(a.calls)]
    with tempfile.TemporaryDirectory() as tmp:
        out_file = os.path.join(tmp, "cg.out")
        cmd = ["valgrind", "--tool=callgrind", "--cache-sim=yes", "--D1=32768,8,64",
               "--LL=8388608,16,64", "--collect-atstart=no",
               f"--toggle-collect={COLLECT[(op, side)]}", f"--callgrind-out-file={out_file}",
               *inner]
        subprocess.run(cmd, check=True, capture_output=True)
        with open(out_file) as f:
            text = f.read()
    events = re.search(r"^events:\s+(.*)$", text, re.M).group(1).split()
    totals = [int(x) for x in re.search(r"^(?:summary|totals):\s+(.*)$", text, re.M)
              .group(1).split()]
    got = dict(zip(events, totals))
    n = a.calls * a.batch
    return {"instructions": round(got["Ir"] / n, 1), "data_reads": round(got["Dr"] / n, 2),
            "D1_read_misses": round(got["D1mr"] / n, 3),
            "LL_read_misses": round(got["DLmr"] / n, 3),
            "LL_write_misses": round(got["DLmw"] / n, 3)}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dims", type=int, nargs="+", default=[4, 8, 16, 32, 64, 128])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=None,
                   help="keys per call (default: 65536 wall, 4096 callgrind)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=20, help="callgrind: calls per op")
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS), help="callgrind only")
    p.add_argument("--sides", nargs="+", choices=["core", "numpy"], default=["core", "numpy"],
                   help="callgrind only (e.g. core alone to compare two builds)")
    p.add_argument("--mode", choices=["wall", "callgrind"], default="wall")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--op", choices=OPS, help=argparse.SUPPRESS)
    p.add_argument("--side", choices=["core", "numpy"], help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.batch is None:
        a.batch = 65536 if a.mode == "wall" else 4096
    if a.inner:
        callgrind_inner(a)
        return
    result = {"machine": platform.processor() or platform.machine(), "mode": a.mode,
              "rows": a.rows, "batch": a.batch, "numpy_version": np.__version__,
              "numpy_side": NUMPY_OP, "load_average_start": os.getloadavg()}
    runs = []
    if a.mode == "wall":
        result.update(rounds=a.rounds, unit="M keys/s (median over rounds)",
                      note="numpy is single-threaded: every threads row compares against the "
                           "same numpy number")
        for dim in a.dims:
            runs += wall_dim(a, dim)
    else:
        result.update(calls=a.calls, threads=1, unit="per key (callgrind, cache simulation)")
        for dim in a.dims:
            row = {"dim": dim}
            for op in a.ops:
                row[op] = {side: callgrind_one(a, dim, op, side) for side in a.sides}
                if len(a.sides) == 2:
                    row[op]["instructions core/numpy"] = round(
                        row[op]["core"]["instructions"] / row[op]["numpy"]["instructions"], 2)
            runs.append(row)
    result["runs"] = runs
    result["load_average_end"] = os.getloadavg()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

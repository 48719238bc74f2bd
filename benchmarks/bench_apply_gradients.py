"""Cost of the core's fused Keras-Adam apply_gradients, old build vs new, printed as JSON.

    python benchmarks/bench_apply_gradients.py [--dims 8 64] [--keys 200000] [--batch 4096]
        [--calls 20] [--threads 1] [--mode instructions|wall]
        [--build NAME=TREE[:NATIVE_DIR] ...]

Each --build is a source tree (its Python package) with a built core (NATIVE_DIR, default
TREE/build/core/dualemb), e.g. `--build old=/tmp/old --build new=.`: the same workload runs
against each, in its own process, so two commits built side by side compare directly.

The workload: a table of `--keys` rows (dim d, normal initializer, Keras Adam), preloaded by
insert_or_assign; then `--calls` apply_gradients of `--batch` keys drawn from the table (so a few
repeat within a batch, as in training) with fixed gradients.

--mode instructions (default) runs each build under valgrind's callgrind with collection on only
inside the C ABI's de_apply_gradients (and what it calls), and reports instructions per key: a count
that the machine's load does not change, so it compares builds on a shared, busy machine where
wall time cannot (a regression of a few percent shows as a few percent here, run after run).
It counts work, not cache misses or memory stalls: quote keys/s (--mode wall, on an idle
machine) beside it. --mode wall reports the median keys/s of the calls.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def workload(dim, num_keys, batch, calls, threads):
    """Runs in the child process; returns the median seconds per apply_gradients call."""
    import numpy as np

    from dualemb.core import Table, initializers

    rng = np.random.default_rng(0)
    keys = rng.choice(1 << 62, num_keys, replace=False).astype(np.int64)
    t = Table(dim=dim, initializer=initializers.normal(0, 0.01, seed=1), num_threads=threads,
              optimizer={"name": "adam", "flavor": "keras"})
    t.reserve(num_keys + num_keys // 4)
    for s in range(0, num_keys, 1 << 16):
        k = keys[s:s + (1 << 16)]
        t.insert_or_assign(k, np.ones((k.size, dim), np.float32))
    batches = [rng.choice(keys, batch) for _ in range(4)]
    grads = rng.normal(size=(batch, dim)).astype(np.float32)
    times = []
    for c in range(calls):
        t0 = time.perf_counter()
        t.apply_gradients(batches[c % 4], grads, lr=1e-3, step=c + 1)
        times.append(time.perf_counter() - t0)
    t.destroy()
    times.sort()
    return times[len(times) // 2]


def child_env(tree, native):
    env = dict(os.environ)
    env["PYTHONPATH"] = tree
    env["DUALEMB_NATIVE_DIR"] = native
    return env


def parse_build(spec):
    name, _, rest = spec.partition("=")
    tree, _, native = rest.partition(":")
    tree = os.path.abspath(tree or ".")
    return name, tree, os.path.abspath(native or os.path.join(tree, "build", "core", "dualemb"))


def run_child(args, tree, native, dim, instructions):
    inner = [sys.executable, os.path.abspath(__file__), "--inner", "--dims", str(dim),
             "--keys", str(args.keys), "--batch", str(args.batch), "--calls", str(args.calls),
             "--threads", str(args.threads)]
    if not instructions:
        out = subprocess.run(inner, env=child_env(tree, native), check=True,
                             capture_output=True, text=True).stdout
        sec = json.loads(out.strip().splitlines()[-1])["median_s"]
        return {"keys_per_s": round(args.batch / sec)}
    with tempfile.TemporaryDirectory() as tmp:
        out_file = os.path.join(tmp, "cg.out")
        cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no",
               "--toggle-collect=de_apply_gradients", f"--callgrind-out-file={out_file}",
               *inner]
        subprocess.run(cmd, env=child_env(tree, native), check=True, capture_output=True)
        with open(out_file) as f:
            text = f.read()
    m = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.M)
    ir = int(m.group(1))
    return {"instructions_per_key": round(ir / (args.calls * args.batch), 1),
            "instructions_total": ir}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dims", type=int, nargs="+", default=[8, 64])
    p.add_argument("--keys", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--mode", choices=["instructions", "wall"], default="instructions")
    p.add_argument("--build", action="append", default=[],
                   help="NAME=TREE[:NATIVE_DIR]; default: this=<repo>")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.inner:
        sec = workload(a.dims[0], a.keys, a.batch, a.calls, a.threads)
        print(json.dumps({"median_s": sec}))
        return
    builds = [parse_build(b) for b in (a.build or ["this=" + os.path.dirname(HERE)])]
    runs = []
    for dim in a.dims:
        row = {"dim": dim}
        for name, tree, native in builds:
            row[name] = run_child(a, tree, native, dim, a.mode == "instructions")
        key = "instructions_per_key" if a.mode == "instructions" else "keys_per_s"
        first = builds[0][0]
        for name, *_ in builds[1:]:  # every build against the first
            row[f"{name}/{first}"] = round(row[name][key] / row[first][key], 4)
        runs.append(row)
    print(json.dumps({"machine": platform.processor() or platform.machine(),
                      "optimizer": "adam (keras)", "mode": a.mode, "keys": a.keys,
                      "batch": a.batch, "calls": a.calls, "threads": a.threads,
                      "load_average": os.getloadavg(),
                      "builds": {n: t for n, t, _ in builds}, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()

"""Process CPU time of ``Variable.upsert`` / ``Variable.accum`` against the op alone and the core,
eagerly, on the same batch; prints one line per call (median over rounds, ms per call).

CPU time rather than wall time: on a loaded machine a call waits for a core, and wall time then
says more about the load than about the call. The gap ``Variable.x - op`` is what the Python
front end adds (argument checks, and for accum the deltas ``new - old`` where ``exists``).

    DUALEMB_NATIVE_DIR=build/x/dualemb PYTHONPATH=. python benchmarks/bench_tf_write_cpu.py \\
        [--batch 4096] [--dim 64] [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import dualemb.tf as de  # noqa: E402
from dualemb.core import Table  # noqa: E402
from dualemb.tf import ops  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    n, d = args.batch, args.dim
    var = de.Variable(dim=d, name="bench_write_cpu")
    rng = np.random.default_rng(0)
    k_np = rng.integers(0, 1 << 40, n)
    v_np = rng.standard_normal((n, d), np.float32)
    e_np = np.ones(n, bool)
    k, v, e = tf.constant(k_np), tf.constant(v_np), tf.constant(e_np)
    zeros = tf.zeros_like(v)
    handle = var.tables[0].resource
    table = Table.attach(var.tables[0].table_id)
    calls = {
        "Variable.upsert": lambda: var.upsert(k, v),
        "ops.insert_or_assign": lambda: ops.insert_or_assign(handle, k, v),
        "core insert_or_assign": lambda: table.insert_or_assign(k_np, v_np),
        "Variable.accum": lambda: var.accum(k, zeros, v, e),
        "ops.accum": lambda: ops.accum(handle, k, v, e),
        "core accum": lambda: table.accum(k_np, v_np, e_np),
    }
    inner = max(1, 200_000 // n)
    print(f"batch {n} dim {d}, load {os.getloadavg()[0]:.2f}")
    for name, f in calls.items():
        for _ in range(5):
            f()
        wall, cpu = [], []
        for _ in range(args.rounds):
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(inner):
                out = f()
            if isinstance(out, tf.Tensor):
                out.numpy()
            wall.append((time.perf_counter() - t0) / inner * 1e3)
            cpu.append((time.process_time() - c0) / inner * 1e3)
        print(f"{name:22s} cpu {statistics.median(cpu):8.3f} ms  wall {statistics.median(wall):8.3f}"
              f" ms (min {min(wall):.3f})")
    print(f"load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

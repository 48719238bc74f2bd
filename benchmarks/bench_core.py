"""Throughput of the core table's batched operations, printed as JSON.

    python benchmarks/bench_core.py [--keys 1000000] [--dims 8 64 128] [--batch 65536]
                                    [--threads 1 2] [--repeats 15] [--memory-keys 10000000]

For each (dim, threads): find of present keys, find with 50% missing keys (normal initializer),
insert_or_assign, apply_gradients with Adam — median keys/s over `repeats` batches. Then the
memory of a `--memory-keys` table relative to the raw bytes of its keys and values.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

from dualemb.core import Table, initializers


def median_rate(fn, batches, repeats):
    times = []
    for i in range(repeats):
        b = batches[i % len(batches)]
        t0 = time.perf_counter()
        fn(b)
        times.append(time.perf_counter() - t0)
    n = len(batches[0]) if not isinstance(batches[0], tuple) else len(batches[0][0])
    return n / statistics.median(times)


def filled_table(keys, dim, threads, optimizer=None):
    t = Table(dim=dim, initializer=initializers.normal(0, 0.01, seed=1), num_threads=threads,
              optimizer=optimizer)
    t.reserve(keys.size + keys.size // 4)
    for s in range(0, keys.size, 1 << 17):
        k = keys[s:s + (1 << 17)]
        t.insert_or_assign(k, np.ones((k.size, dim), np.float32))
    return t


def bench(num_keys, dim, batch, threads, repeats, rng):
    """Reads and inserts on a plain table; apply_gradients on a table with Adam's two slots."""
    keys = rng.choice(1 << 62, num_keys, replace=False).astype(np.int64)
    present = [rng.choice(keys, batch) for _ in range(4)]
    half = []
    for _ in range(4):
        k = rng.choice(keys, batch)
        k[: batch // 2] = rng.integers(1 << 62, (1 << 63) - 1, batch // 2)
        half.append(rng.permutation(k))
    rows = np.ones((batch, dim), np.float32)
    t = filled_table(keys, dim, threads)
    out = {
        "find_present": median_rate(lambda k: t.find(k), present, repeats),
        "find_50pct_missing_normal_init": median_rate(lambda k: t.find(k), half, repeats),
        "insert_or_assign": median_rate(lambda k: t.insert_or_assign(k, rows), present, repeats),
    }
    t.destroy()
    t = filled_table(keys, dim, threads, {"name": "adam", "flavor": "keras"})
    grads = [(p, rng.normal(size=(batch, dim)).astype(np.float32)) for p in present]
    out["apply_gradients_adam"] = median_rate(
        lambda kg: t.apply_gradients(kg[0], kg[1], lr=1e-3, step=1), grads, repeats)
    t.destroy()
    return {k: round(v / 1e6, 3) for k, v in out.items()}


def memory(num_keys, dim, rng):
    t = Table(dim=dim)
    for s in range(0, num_keys, 1 << 20):
        n = min(1 << 20, num_keys - s)
        k = np.arange(s, s + n, dtype=np.int64) * 2654435761
        t.insert_or_assign(k, np.zeros((n, dim), np.float32))
    raw = num_keys * (8 + 4 * dim)
    used = t.memory_bytes()
    t.destroy()
    return {"keys": num_keys, "dim": dim, "raw_bytes": raw, "table_bytes": used,
            "ratio": round(used / raw, 3)}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--dims", type=int, nargs="+", default=[8, 64, 128])
    p.add_argument("--batch", type=int, default=65536)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--memory-keys", type=int, default=10_000_000)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    results = {"machine": platform.processor() or platform.machine(), "keys": a.keys,
               "batch": a.batch, "unit": "M keys/s (median)", "runs": []}
    for dim in a.dims:
        for th in a.threads:
            r = bench(a.keys, dim, a.batch, th, a.repeats, rng)
            results["runs"].append({"dim": dim, "threads": th, **r})
    for dim in a.dims:
        one = next(r for r in results["runs"] if r["dim"] == dim and r["threads"] == 1)
        for r in results["runs"]:
            if r["dim"] == dim and r["threads"] > 1:
                r["speedup_vs_1_thread"] = {k: round(r[k] / one[k], 2) for k in one
                                            if k not in ("dim", "threads")}
    if a.memory_keys:
        results["memory"] = memory(a.memory_keys, 64, rng)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

"""Delta checkpoints: bytes and time of a delta vs a full checkpoint, and apply_gradients time.

    DUALEMB_NATIVE_DIR=build/<name>/dualemb PYTHONPATH=. python benchmarks/bench_delta.py \
        [--rows 1000000] [--dim 64] [--dir /tmp] [--batch 4096]

Prints one JSON object. An N x dim float32 table with Keras Adam (2 slots) is filled, saved in
full (timed), then for each changed fraction (1%, 10%) that fraction of its keys is stepped by
apply_gradients and a delta on the full checkpoint is saved (timed; the table is reloaded from
the full checkpoint between fractions so each delta is on the same base). Bytes are the sizes of
all files of each checkpoint directory. ``apply_gradients_ms`` is the median time of one
``batch``-key Adam step on the filled table at this commit: the change-tracking stamp is part of
it, so the integrator compares it between builds with and without tracking on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

from dualemb.core import Table, checkpoint


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    n, dim = args.rows, args.dim
    rng = np.random.default_rng(0)
    t = Table(dim, optimizer={"name": "adam", "flavor": "keras"})
    t.reserve(n)
    page = 1 << 16
    for lo in range(0, n, page):
        keys = np.arange(lo, min(n, lo + page), dtype=np.int64)
        t.insert_or_assign(keys, rng.standard_normal((len(keys), dim), dtype=np.float32))

    times = []
    for step in range(1, 12):
        keys = rng.integers(0, n, args.batch)
        grads = rng.standard_normal((args.batch, dim), dtype=np.float32)
        t0 = time.perf_counter()
        t.apply_gradients(keys, grads, 0.001, step)
        times.append(time.perf_counter() - t0)
    out = {"rows": n, "dim": dim, "optimizer": "adam",
           "apply_gradients_ms": round(statistics.median(times[1:]) * 1e3, 3),
           "apply_gradients_batch": args.batch}

    root = tempfile.mkdtemp(prefix="dualemb-bench-delta-", dir=args.dir)
    try:
        # A tiny full + delta save first, so one-time imports (numpy's lazy modules) and thread
        # start-up do not count against the first timed save.
        w = Table(dim, optimizer={"name": "adam", "flavor": "keras"})
        w.insert_or_assign(np.arange(10), np.zeros((10, dim), np.float32))
        checkpoint.save(os.path.join(root, "warm"), {"w": w})
        w.erase(np.arange(2))
        checkpoint.save(os.path.join(root, "warm-delta"), {"w": w}, base=os.path.join(root, "warm"))
        w.destroy()
        full = os.path.join(root, "full")
        t0 = time.perf_counter()
        checkpoint.save(full, {"emb": t}, steps=11)
        out["full_s"] = round(time.perf_counter() - t0, 4)
        out["full_bytes"] = _dir_bytes(full)
        for frac in (0.01, 0.10):
            m = max(1, int(n * frac))
            changed = rng.choice(n, m, replace=False).astype(np.int64)
            for lo in range(0, m, args.batch):
                k = changed[lo:lo + args.batch]
                t.apply_gradients(k, rng.standard_normal((len(k), dim), dtype=np.float32),
                                  0.001, 12)
            d = os.path.join(root, f"delta{int(frac * 100)}")
            t0 = time.perf_counter()
            checkpoint.save(d, {"emb": t}, steps=12, base=full)
            tag = f"{int(frac * 100)}pct"
            out[f"delta_{tag}_s"] = round(time.perf_counter() - t0, 4)
            out[f"delta_{tag}_bytes"] = _dir_bytes(d)
            out[f"delta_{tag}_bytes_vs_full"] = round(out[f"delta_{tag}_bytes"] /
                                                      out["full_bytes"], 5)
            out[f"delta_{tag}_time_vs_full"] = round(out[f"delta_{tag}_s"] / out["full_s"], 4)
            checkpoint.load(full, {"emb": t})  # the next delta is on the same base
    finally:
        shutil.rmtree(root, ignore_errors=True)
        t.destroy()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

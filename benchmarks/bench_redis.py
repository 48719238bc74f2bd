"""Throughput of the Redis backend against the in-memory table, printed as JSON.

    python benchmarks/bench_redis.py [--keys 200000] [--dims 8 64] [--batches 4096 65536]
                                     [--repeats 5] [--port 0]

Starts its own redis-server (tests/redis_server.py: free 127.0.0.1 port, no persistence, killed at
the end). For each (dim, batch): lookup (find of present keys) and upsert (insert_or_assign of
present keys), median keys/s over `repeats` batches, for the Redis table and the memory table. The
load average is printed with the figures: the host is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from dualemb.core import Table  # noqa: E402
from redis_server import RedisServer  # noqa: E402


def rate(fn, batches, repeats):
    times = []
    for i in range(repeats):
        b = batches[i % len(batches)]
        t0 = time.perf_counter()
        fn(b)
        times.append(time.perf_counter() - t0)
    return len(batches[0]) / statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--dims", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--batches", type=int, nargs="+", default=[4096, 65536])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    server = RedisServer()
    results = []
    try:
        rng = np.random.default_rng(0)
        keys = rng.choice(1 << 50, args.keys, replace=False).astype(np.int64)
        for dim in args.dims:
            vals = rng.normal(size=(args.keys, dim)).astype(np.float32)
            tables = {
                "redis": Table(dim=dim, backend={"redis": {
                    "name": f"bench{dim}", "addresses": [server.address],
                    "command_timeout_ms": 60000}}),
                "memory": Table(dim=dim),
            }
            for t in tables.values():
                for s in range(0, args.keys, 65536):
                    t.insert_or_assign(keys[s:s + 65536], vals[s:s + 65536])
            for batch in args.batches:
                picks = [rng.choice(args.keys, batch) for _ in range(args.repeats)]
                for backend, t in tables.items():
                    look = rate(lambda p: t.find(keys[p]), picks, args.repeats)
                    up = rate(lambda p: t.insert_or_assign(keys[p], vals[p]), picks, args.repeats)
                    results.append({"backend": backend, "dim": dim, "batch": batch,
                                    "lookup_keys_per_s": round(look),
                                    "upsert_keys_per_s": round(up)})
    finally:
        server.cleanup()
    print(json.dumps({"keys": args.keys, "loadavg": os.getloadavg(),
                      "cpus": os.cpu_count(), "results": results}, indent=1))


if __name__ == "__main__":
    main()

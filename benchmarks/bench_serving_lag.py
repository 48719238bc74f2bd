"""Live serving updates: the lag from a delta landing in the directory to a server answering
with it, and how long lookups wait meanwhile.

    DUALEMB_NATIVE_DIR=build/<name>/dualemb PYTHONPATH=. python benchmarks/bench_serving_lag.py \
        [--rows 1000000] [--dim 64] [--fraction 0.01] [--rounds 5] [--interval 0.05] [--dir /tmp]

Prints one JSON object. A trainer table (N x dim float32, Keras Adam) and a serving table that
follows its checkpoint directory (``checkpoint.Follower.start(interval)``) in the same process.
Each round the trainer rewrites ``fraction`` of its rows with the round number and publishes a
delta (``checkpoint.Publisher``); ``publish_s`` is the save. A reader thread looks up a probe key
of the changed rows in a loop; ``lag_s`` is the time from the publish returning to the first
lookup that answers with the new row (the polling interval, listing, verifying and applying the
delta). ``lookup_ms_p50/max`` are the reader's lookups over the whole run (1,024 keys each), which
wait only while the apply holds a table's lock for one page.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time

import numpy as np

from dualemb.core import Table, checkpoint


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--fraction", type=float, default=0.01)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--interval", type=float, default=0.05)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    n, dim = args.rows, args.dim
    rng = np.random.default_rng(0)
    adam = {"name": "adam", "flavor": "keras"}
    trainer = Table(dim, optimizer=adam)
    trainer.reserve(n)
    page = 1 << 16
    for lo in range(0, n, page):
        keys = np.arange(lo, min(n, lo + page), dtype=np.int64)
        trainer.insert_or_assign(keys, np.zeros((len(keys), dim), np.float32))
    root = tempfile.mkdtemp(prefix="dualemb-bench-serving-", dir=args.dir)
    serving = Table(dim, optimizer=adam)
    out = {"rows": n, "dim": dim, "optimizer": "adam", "fraction": args.fraction,
           "interval_s": args.interval}
    try:
        pub = checkpoint.Publisher(root, {"emb": trainer}, full_every=args.rounds + 1)
        t0 = time.perf_counter()
        pub.publish(0)
        out["full_publish_s"] = round(time.perf_counter() - t0, 4)
        follower = checkpoint.Follower(root, {"emb": serving})
        t0 = time.perf_counter()
        follower.poll()
        out["full_apply_s"] = round(time.perf_counter() - t0, 4)
        probe = np.arange(1024, dtype=np.int64)
        stop, lookups = threading.Event(), []
        seen = {"version": 0.0, "at": 0.0}

        def reader():
            while not stop.is_set():
                t = time.perf_counter()
                rows, _ = serving.find(probe)
                lookups.append(time.perf_counter() - t)
                v = float(rows[0, 0])
                if v != seen["version"]:
                    seen["version"], seen["at"] = v, time.perf_counter()

        thread = threading.Thread(target=reader)
        thread.start()
        follower.start(args.interval)
        publish, lag = [], []
        try:
            m = max(len(probe), int(n * args.fraction))
            for r in range(1, args.rounds + 1):
                changed = np.concatenate([probe, rng.choice(np.arange(len(probe), n),
                                                            m - len(probe), replace=False)])
                for lo in range(0, m, page):
                    k = changed[lo:lo + page]
                    trainer.insert_or_assign(k, np.full((len(k), dim), r, np.float32))
                t0 = time.perf_counter()
                pub.publish(r)
                landed = time.perf_counter()
                publish.append(landed - t0)
                while seen["version"] != r:
                    if follower.error is not None:
                        raise follower.error
                    time.sleep(0.001)
                lag.append(seen["at"] - landed)
        finally:
            follower.stop()
            stop.set()
            thread.join()
        out.update({"rounds": args.rounds, "changed_rows": m,
                    "publish_s": round(statistics.median(publish), 4),
                    "lag_s": round(statistics.median(lag), 4),
                    "lag_max_s": round(max(lag), 4),
                    "lookup_ms_p50": round(statistics.median(lookups) * 1e3, 3),
                    "lookup_ms_max": round(max(lookups) * 1e3, 3)})
    finally:
        shutil.rmtree(root, ignore_errors=True)
        trainer.destroy()
        serving.destroy()
    print(json.dumps(out))


if __name__ == "__main__":
    main()

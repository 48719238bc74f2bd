"""Checkpoint save/load throughput and peak extra memory of a save.

    DUALEMB_NATIVE_DIR=build/<name>/dualemb PYTHONPATH=. python benchmarks/bench_checkpoint.py \
        [--rows 1000000] [--dim 64] [--dir /tmp] [--repeats 3]

Prints one JSON object. For each configuration (no optimizer, and with an optimizer when the
core has them) a child process builds a rows x dim float32 table page by page, then times
``checkpoint.save`` (including fsync and the atomic replace of the previous save), ``load`` into
the live table and ``load`` into fresh tables. Throughput is GB/s of table payload: the bytes of
keys, values, optimizer slots and per-row metadata (last_update, update_count) in the shard files.
Peak extra memory is the growth of the process's peak RSS (VmHWM, reset through
/proc/self/clear_refs before the save) during the save, compared with the table's payload size.
Loads read files that are in the page cache (just written), as a restore after a save would.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def child(rows: int, dim: int, optimizer: str | None, directory: str, repeats: int) -> dict:
    import gc

    import numpy as np

    from dualemb.core import Table, checkpoint

    opt = json.loads(optimizer) if optimizer else None
    table = Table(dim=dim, optimizer=opt)
    table.reserve(rows)
    rng = np.random.default_rng(0)
    page = 1 << 16
    keys = rng.permutation(rows * 4)[:rows].astype(np.int64)
    for i in range(0, rows, page):
        k = keys[i:i + page]
        table.insert_or_assign(k, rng.standard_normal((len(k), dim), dtype=np.float32))
        if opt is not None:
            table.apply_gradients(k, rng.standard_normal((len(k), dim), dtype=np.float32),
                                  0.01, 1)
    del keys, k
    gc.collect()
    ns = table.num_slots
    payload = rows * (8 + 4 * dim * (1 + ns) + 16)
    path = os.path.join(directory, "bench_ckpt")
    shutil.rmtree(path, ignore_errors=True)
    checkpoint.save(path, {"t": table}, steps=1)  # warm up (and a previous checkpoint to replace)

    save_s, peak_extra = [], []
    for _ in range(repeats):
        gc.collect()
        rss0 = _status_kb("VmRSS")
        ok = _reset_peak()
        t0 = time.perf_counter()
        checkpoint.save(path, {"t": table}, steps=1)
        save_s.append(time.perf_counter() - t0)
        if ok:
            peak_extra.append((_status_kb("VmHWM") - rss0) * 1024)
    load_s, fresh_s = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        checkpoint.load(path, {"t": table})
        load_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ck = checkpoint.load(path)
        fresh_s.append(time.perf_counter() - t0)
        assert len(ck.tables["t"]) == rows
        ck.tables["t"].destroy()
    shutil.rmtree(path, ignore_errors=True)
    best = min
    return {
        "optimizer": opt, "rows": rows, "dim": dim, "slots": ns,
        "payload_bytes": payload,
        "save_s": best(save_s), "save_GBps": payload / best(save_s) / 1e9,
        "load_into_live_s": best(load_s), "load_into_live_GBps": payload / best(load_s) / 1e9,
        "load_fresh_s": best(fresh_s), "load_fresh_GBps": payload / best(fresh_s) / 1e9,
        "save_peak_extra_rss_bytes": max(peak_extra) if peak_extra else None,
        "save_peak_extra_rss_fraction": (max(peak_extra) / payload) if peak_extra else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.rows, args.dim, args.child or None, args.dir, args.repeats)))
        return
    directory = args.dir or tempfile.mkdtemp(prefix="dualemb-bench-")
    results = []
    for opt in (None, {"name": "adam", "flavor": "keras"}):
        cmd = [sys.executable, __file__, "--rows", str(args.rows), "--dim", str(args.dim),
               "--dir", directory, "--repeats", str(args.repeats),
               "--child", json.dumps(opt) if opt else ""]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            err = (proc.stderr.strip().splitlines() or ["?"])[-1]
            results.append({"optimizer": opt, "error": err})
        else:
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    if args.dir is None:
        shutil.rmtree(directory, ignore_errors=True)
    print(json.dumps({"benchmark": "checkpoint", "cpu_count": os.cpu_count(),
                      "results": results}, indent=1))


if __name__ == "__main__":
    main()

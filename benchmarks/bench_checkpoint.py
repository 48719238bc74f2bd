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
``disk_pwrite_fsync_GBps`` is the same number of bytes written with plain pwrite + fsync: what the
disk allows a save (which always fsyncs) at best.
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


def child(rows: int, dim: int, optimizer: str | None, directory: str, repeats: int,
          measure_memory: bool) -> dict:
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
    # A previous checkpoint to replace (from a tiny table, so no page buffers are allocated yet).
    small = Table(dim=dim)
    small.insert_or_assign(np.arange(10), np.zeros((10, dim), np.float32))
    checkpoint.save(path, {"t": small}, steps=0)
    gc.collect()
    if measure_memory:
        # Peak RSS growth (VmHWM reset before the save; the parent runs this child with glibc's
        # dynamic mmap threshold off, so freed page buffers go back to the OS and are not
        # silently reused from earlier allocations), and tracemalloc's peak of the numpy and
        # Python allocations the save makes.
        import tracemalloc
        rss0 = _status_kb("VmRSS")
        ok = _reset_peak()
        tracemalloc.start()
        checkpoint.save(path, {"t": table}, steps=1)
        _, traced_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rss_peak = (_status_kb("VmHWM") - rss0) * 1024 if ok else None
        tracemalloc.start()
        checkpoint.load(path, {"t": table})
        _, load_traced = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        shutil.rmtree(path, ignore_errors=True)
        return {"payload_bytes": payload,
                "load_peak_traced_alloc_bytes": load_traced,
                "save_peak_extra_rss_bytes": rss_peak,
                "save_peak_extra_rss_fraction": None if rss_peak is None else rss_peak / payload,
                "save_peak_traced_alloc_bytes": traced_peak,
                "save_peak_traced_alloc_fraction": traced_peak / payload}
    # What the disk alone allows: write the payload's size with pwrite, then fsync.
    raw = os.path.join(directory, "bench_raw")
    piece = np.random.default_rng(1).bytes(4 << 20)
    fd = os.open(raw, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    t0 = time.perf_counter()
    for off in range(0, payload, len(piece)):
        os.pwrite(fd, piece[:payload - off], off)
    os.fsync(fd)
    disk_s = time.perf_counter() - t0
    os.close(fd)
    os.unlink(raw)

    t0 = time.perf_counter()
    checkpoint.save(path, {"t": table}, steps=1)
    first_save_s = time.perf_counter() - t0
    save_s = [first_save_s]
    for _ in range(repeats - 1):
        t0 = time.perf_counter()
        checkpoint.save(path, {"t": table}, steps=1)
        save_s.append(time.perf_counter() - t0)
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
    best = min  # the machine may be shared: the fastest run is the least disturbed
    return {
        "optimizer": opt, "rows": rows, "dim": dim, "slots": ns,
        "payload_bytes": payload,
        "disk_pwrite_fsync_GBps": payload / disk_s / 1e9,
        "save_s": best(save_s), "save_GBps": payload / best(save_s) / 1e9,
        "load_into_live_s": best(load_s), "load_into_live_GBps": payload / best(load_s) / 1e9,
        "load_fresh_s": best(fresh_s), "load_fresh_GBps": payload / best(fresh_s) / 1e9,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--memory", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.rows, args.dim, args.child or None, args.dir, args.repeats,
                               args.memory)))
        return
    directory = args.dir or tempfile.mkdtemp(prefix="dualemb-bench-")
    results = []
    for opt in (None, {"name": "adam", "flavor": "keras"}):
        cmd = [sys.executable, __file__, "--rows", str(args.rows), "--dim", str(args.dim),
               "--dir", directory, "--repeats", str(args.repeats),
               "--child", json.dumps(opt) if opt else ""]
        result = {}
        for extra, env in (([], None),
                           (["--memory"], dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072",
                                               MALLOC_TRIM_THRESHOLD_="131072"))):
            proc = subprocess.run(cmd + extra, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                err = (proc.stderr.strip().splitlines() or ["?"])[-1]
                result = {"optimizer": opt, "error": err}
                break
            result.update(json.loads(proc.stdout.strip().splitlines()[-1]))
        results.append(result)
    if args.dir is None:
        shutil.rmtree(directory, ignore_errors=True)
    print(json.dumps({"benchmark": "checkpoint", "cpu_count": os.cpu_count(),
                      "results": results}, indent=1))


if __name__ == "__main__":
    main()

"""Training throughput while a background checkpoint save runs, and what its snapshot costs.

    DUALEMB_NATIVE_DIR=build/<name>/dualemb PYTHONPATH=. python benchmarks/bench_background_save.py \
        [--rows 1000000] [--dim 64] [--batch 4096] [--seconds 5] [--dir /tmp] [--writer-nice N] \
        [--duty D]

Prints one JSON object. A rows x dim float32 table with Adam (two slot columns) is filled, then:

* ``train_steps_per_s_idle``: core ``apply_gradients`` steps (``--batch`` random existing keys
  each) per second for ``--seconds`` with nothing else running;
* ``clone_s`` and ``clone_extra_rss_mb``: the time of ``Table.clone()`` (the snapshot a
  background save takes while writers wait: the shards are copied in parallel into prefaulted
  memory) and the growth of the resident set it causes, beside ``table_memory_mb``
  (``memory_bytes()``): a snapshot costs one table copy while the save runs;
* ``train_steps_per_s_during_save``: the same training while ``checkpoint.save(...,
  blocking=False)`` runs, counted from the call until the save has published (the call itself,
  i.e. the snapshot, included), and ``save_s`` its duration; ``train_steps_per_s_idle_after``:
  idle again, right after; ``ratio`` = during / the mean of the two idle rates (on a shared
  machine the load drifts between the phases);
* ``blocking_save_s``: a blocking save of the same table, for comparison, and
  ``blocking_save_cpu_s`` the CPU time it took (every thread's, user + system): the work a save
  does, which a background save does beside training (less sensitive to the machine's load than
  the wall times);
* ``writer_nice``: how many nice steps below training the writer threads run (10 unless
  ``DUALEMB_BACKGROUND_SAVE_NICE`` or ``--writer-nice`` says otherwise; null for code without
  the setting), ``writer_duty``: the fraction of time the writer works (pausing between pages;
  ``DUALEMB_BACKGROUND_SAVE_DUTY`` or ``--duty``; null for code without the setting),
  ``crc32``: the CRC-32 implementation (``isal`` if installed, else ``zlib``), and ``loadavg``
  (``/proc/loadavg``) at the start and at the end: on a loaded machine a lowered writer gets
  little CPU and the save takes much longer.

The issue's goal is a ratio >= 0.7 on 2 cores; numbers from a loaded machine say little.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time

import numpy as np


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s() -> float:
    """CPU seconds (user + system) of every thread of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def loadavg() -> str | None:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--writer-nice", type=int, default=None,
                    help="the background writer's nice steps (default: the library's)")
    ap.add_argument("--duty", type=float, default=None,
                    help="the background writer's duty cycle, in (0, 1] (default: the library's)")
    args = ap.parse_args()

    from dualemb.core import Table, checkpoint
    from dualemb.core.checkpoint import _background

    if args.writer_nice is not None:  # the library reads it at every background save
        os.environ["DUALEMB_BACKGROUND_SAVE_NICE"] = str(args.writer_nice)
    if args.duty is not None:
        os.environ["DUALEMB_BACKGROUND_SAVE_DUTY"] = str(args.duty)
    writer_nice = _background.writer_nice() if hasattr(_background, "writer_nice") else None
    duty = _background.writer_duty() if hasattr(_background, "writer_duty") else None
    try:
        from dualemb.core.checkpoint._crc import IMPLEMENTATION as crc32_implementation
    except ImportError:  # code before the choice: zlib's
        crc32_implementation = "zlib"
    load_start = loadavg()

    rows, dim = args.rows, args.dim
    t = Table(dim, optimizer={"name": "adam"})
    t.reserve(rows)
    rng = np.random.default_rng(0)
    page = 1 << 16
    for i in range(0, rows, page):
        k = np.arange(i, min(rows, i + page), dtype=np.int64)
        t.insert_or_assign(k, rng.standard_normal((len(k), dim), dtype=np.float32))
    grads = rng.standard_normal((args.batch, dim), dtype=np.float32)
    step = [0]

    def train_step():
        step[0] += 1
        keys = rng.integers(0, rows, args.batch)
        t.apply_gradients(keys, grads, 0.001, step[0])

    def steps_per_s(seconds, until=None):
        n, t0 = 0, time.perf_counter()
        while (time.perf_counter() - t0 < seconds) if until is None else not until():
            train_step()
            n += 1
        return n / (time.perf_counter() - t0), time.perf_counter() - t0

    idle, _ = steps_per_s(args.seconds)

    rss0 = rss_mb()
    t0 = time.perf_counter()
    c = t.clone()
    clone_s = time.perf_counter() - t0
    clone_extra = rss_mb() - rss0
    c.destroy()

    tmp = tempfile.mkdtemp(prefix="dualemb-bench-bg-", dir=args.dir)
    try:
        path = os.path.join(tmp, "ckpt")
        t0, cpu0 = time.perf_counter(), cpu_s()
        checkpoint.save(path, {"t": t}, steps=step[0])
        blocking_s, blocking_cpu = time.perf_counter() - t0, cpu_s() - cpu0

        n, t0 = 0, time.perf_counter()
        handle = checkpoint.save(path, {"t": t}, steps=step[0], blocking=False)
        while not handle.done():
            train_step()
            n += 1
        handle.wait()
        save_s = time.perf_counter() - t0
        during = n / save_s
        idle_after, _ = steps_per_s(args.seconds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(json.dumps({
        "rows": rows, "dim": dim, "optimizer": "adam", "batch": args.batch,
        "cpu_count": os.cpu_count(),
        "table_memory_mb": round(t.memory_bytes() / 2**20, 1),
        "train_steps_per_s_idle": round(idle, 2),
        "clone_s": round(clone_s, 4),
        "clone_extra_rss_mb": round(clone_extra, 1),
        "blocking_save_s": round(blocking_s, 3),
        "blocking_save_cpu_s": round(blocking_cpu, 3),
        "save_s": round(save_s, 3),
        "train_steps_during_save": n,
        "train_steps_per_s_during_save": round(during, 2),
        "train_steps_per_s_idle_after": round(idle_after, 2),
        "ratio": round(2 * during / (idle + idle_after), 3) if idle + idle_after else None,
        "writer_nice": writer_nice,
        "writer_duty": duty,
        "crc32": crc32_implementation,
        "loadavg": [load_start, loadavg()],
    }, indent=1))


if __name__ == "__main__":
    main()

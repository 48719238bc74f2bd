"""What a small-row layout (the row in its index slot's cache line) could gain for `find`, next to
the real table (issue 22); prints one JSON object.

    python benchmarks/bench_small_row_layout.py [--rows 1048576 16777216] [--dims 4 8]
        [--repeats 3]

Compiles `small_row_layout.cc` (beside this file) against the installed core
(`libdualemb_core.so` and the headers in csrc/core) with the core's own optimisation level, and
runs it once per (rows, dim): the real table's `de_find`, a minimal model of today's layout, the
inline-values layout, and a plain C gather, on the same keys in one process (that file says
what each is). Adds numpy's `np.take` into a preallocated output for the same rows and dims,
the reference issue 22's goal names. One thread; wall clock, so it means something on an idle
machine only: the load average is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def build(out_dir: str) -> str:
    from dualemb._native import native_dir

    cxx = shutil.which(os.environ.get("CXX", "c++"))
    if cxx is None:
        raise SystemExit("no C++ compiler (set CXX)")
    lib = native_dir()
    exe = os.path.join(out_dir, "small_row_layout")
    subprocess.run([cxx, "-O3", "-std=c++17", "-I", os.path.join(REPO, "csrc", "core"),
                    os.path.join(HERE, "small_row_layout.cc"), "-o", exe, "-L", lib,
                    "-ldualemb_core", f"-Wl,-rpath,{lib}"], check=True)
    return exe


def np_take(rows: int, dim: int, batch: int = 65536, calls: int = 20) -> float:
    """M rows/s of np.take into a reused output (median of 9 runs of `calls` batches)."""
    rng = np.random.default_rng(7)
    values = rng.random((rows, dim), dtype=np.float32)
    idx = [rng.integers(0, rows, batch) for _ in range(calls)]
    out = np.empty((batch, dim), np.float32)
    times = []
    for _ in range(9):
        t0 = time.perf_counter()
        for i in idx:
            np.take(values, i, axis=0, out=out)
        times.append(time.perf_counter() - t0)
    return round(batch * calls / sorted(times)[4] / 1e6, 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1 << 20, 1 << 24])
    p.add_argument("--dims", type=int, nargs="+", default=[4, 8], choices=[4, 8])
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    result = {"benchmark": "small_row_layout", "machine": platform.machine(),
              "cpu": platform.processor() or None, "threads": 1,
              "unit": "M keys/s (median of 9 runs of 20 batches of 65,536)",
              "load_average_start": os.getloadavg(), "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(tmp)
        for rows in a.rows:
            for dim in a.dims:
                proc = subprocess.run([exe, str(rows), str(dim), str(a.repeats)],
                                      capture_output=True, text=True)
                if proc.returncode != 0:
                    raise SystemExit(f"small_row_layout {rows} {dim} failed: {proc.stderr}")
                lines = [json.loads(line) for line in proc.stdout.splitlines()]
                result["runs"].append({"rows": rows, "dim": dim, "repeats": lines,
                                       "np_take_mrows_per_s": np_take(rows, dim)})
    result["load_average_end"] = os.getloadavg()
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()

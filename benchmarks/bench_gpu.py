"""GPU table throughput, HierarchicalKV's harness (issue 20); prints and writes JSON.

For load factors 0.5 / 0.75 / 1.0 and dims 8 / 32 / 64 / 128: a table filled to the load factor
(max_load 1.0, capacity fixed by capacity_hint), then 1M keys per call (half present, half
absent for find / find_or_insert) through find, find_or_insert, insert_or_assign and
apply_gradients (Adam) on device buffers. Reported in keys/s and as a share of the bound set by the
device-to-device copy bandwidth measured in the same run (bytes read plus bytes written per
second): bytes each op must move per key, read and written (see ``ops`` below) / copy bandwidth.
Run on an H200 on 2026-11-28 (docs/bench/gpu_2026-11-28_h200.json).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time

import numpy as np

from dualemb.core import _cuda

BATCH = 1 << 20


def _dev(lib, array: np.ndarray):
    p = ctypes.c_void_p()
    _cuda._check(lib.dec_malloc(ctypes.byref(p), array.nbytes))
    _cuda._check(lib.dec_memcpy(p, array.ctypes.data, array.nbytes, 1))  # host to device
    return p


def _timed(lib, fn, repeats: int) -> float:
    fn()
    _cuda._check(lib.dec_synchronize())
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    _cuda._check(lib.dec_synchronize())
    return (time.perf_counter() - t0) / repeats


def run(load: float, dim: int, bandwidth: float, repeats: int, max_slots: int) -> list[dict]:
    lib = _cuda.library()
    cap = max_slots  # sized below per dim to fit memory
    cap = min(cap, int(40e9 // (4 * dim * 3 + 24)))
    fill = int(cap * load) - BATCH // 2
    t = _cuda.GpuTable(dim, optimizer={"name": "adam", "flavor": "keras"}, capacity_hint=cap,
                       max_load=1.0)
    rng = np.random.default_rng(0)
    # Distinct random keys (drawn with a 1% surplus; duplicates below 2**62 are rare).
    present = np.unique(rng.integers(0, 2**62, size=int(fill * 1.01) + 16))[:fill]
    rng.shuffle(present)
    for i in range(0, fill, BATCH):
        t.insert_or_assign(present[i:i + BATCH], np.zeros((len(present[i:i + BATCH]), dim),
                                                          np.float32))
    keys = np.concatenate([present[:BATCH // 2], rng.integers(2**62, 2**63 - 1, BATCH // 2)])
    d_keys = _dev(lib, keys.astype(np.int64))
    d_vals = _dev(lib, np.zeros((BATCH, dim), np.float32))
    d_exists = _dev(lib, np.zeros(BATCH, np.uint8))
    ev = ctypes.c_int64()
    row, slots = 4 * dim, 2 * 4 * dim
    # Bytes each op must move per key, read and written (as the copy bandwidth counts them):
    # find and find_or_insert read the key and the row and write the row and the exists flag
    # (the timed calls of find_or_insert find every key: the untimed first call inserted the
    # absent half); insert_or_assign reads the key and the new row and writes the row; Adam
    # reads the key and the gradient and reads and writes the row and its two slots.
    ops = {
        "find": (lambda: lib.dec_find(t._h, d_keys, BATCH, d_vals, d_exists, None),
                 8 + 2 * row + 1),
        "find_or_insert": (lambda: lib.dec_find_or_insert(t._h, d_keys, BATCH, d_vals, d_exists,
                                                          None, ctypes.byref(ev)), 8 + 2 * row + 1),
        "insert_or_assign": (lambda: lib.dec_insert_or_assign(t._h, d_keys, BATCH, d_vals, None,
                                                              ctypes.byref(ev)), 8 + 2 * row),
        "apply_gradients_adam": (lambda: lib.dec_apply_gradients(
            t._h, d_keys, BATCH, d_vals, 1e-3, 1, None, ctypes.byref(ev)),
            8 + row + 2 * (row + slots)),
    }
    out = []
    for name, (fn, bytes_per_key) in ops.items():
        sec = _timed(lib, fn, repeats)
        keys_per_s = BATCH / sec
        bound = bandwidth / bytes_per_key
        out.append({"op": name, "load_factor": load, "dim": dim, "keys_per_s": keys_per_s,
                    "bytes_per_key": bytes_per_key, "share_of_copy_bound": keys_per_s / bound})
    for p in (d_keys, d_vals, d_exists):
        lib.dec_free(p)
    t.destroy()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true",
                    help="16M slots and 3 repeats (tools/gpu/check.sh's time budget)")
    ap.add_argument("--loads", default="0.5,0.75,1.0", help="load factors, comma-separated")
    ap.add_argument("--dims", default="8,32,64,128", help="dims, comma-separated")
    args = ap.parse_args()
    loads = [float(x) for x in args.loads.split(",")]
    dims = [int(x) for x in args.dims.split(",")]
    max_slots = (16 if args.quick else 64) * BATCH
    repeats = 3 if args.quick else args.repeats
    ok, why = _cuda.available()
    if not ok:
        print(json.dumps({"skipped": why}))
        return 0
    lib = _cuda.library()
    bw = ctypes.c_double()
    _cuda._check(lib.dec_copy_bandwidth(1 << 30, 20, ctypes.byref(bw)))
    results = {"device": why, "copy_bandwidth_bytes_per_s": bw.value, "batch": BATCH,
               "results": []}
    for load in loads:
        for dim in dims:
            if load >= 1.0:
                # Open addressing ends a miss's probe at a bucket with a free slot: a completely
                # full table would scan every bucket per absent key (HierarchicalKV instead evicts
                # within the bucket). Recorded, not run.
                results["results"].append({"load_factor": load, "dim": dim,
                                           "skipped": "a full table is not supported yet"})
                continue
            results["results"] += run(load, dim, bw.value, repeats, max_slots)
            print(json.dumps(results["results"][-4:]), file=sys.stderr, flush=True)
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

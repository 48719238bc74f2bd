"""The TFRA side of benchmarks/compare_tfra.py, run as a subprocess in a TFRA 0.8.1 virtualenv.

It speaks JSON lines on stdin/stdout (one request, one reply) and keeps its tables between
requests, so the driver can alternate dualemb and TFRA measurements in one run. TFRA runs in eager
mode with every table op wrapped in a `tf.function` (its fast path in TF2: no per-op Python
dispatch); results are brought to numpy (`.numpy()`), as dualemb's numpy API returns them.

The workload generators (`preload_keys`, `batch`) are pure numpy and shared with the driver, so
both sides see identical keys and values for the same seeds.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

_ODD = np.uint64(0x9E3779B97F4A7C15)
_MASK63 = np.uint64((1 << 63) - 1)


def key_of(index: np.ndarray, salt: int = 0) -> np.ndarray:
    """A bijection of [0, 2**63) scattering consecutive indices over int64 (unique, positive)."""
    i = (np.asarray(index, np.uint64) + np.uint64(salt)) & _MASK63
    with np.errstate(over="ignore"):
        return ((i * _ODD) & _MASK63).astype(np.int64)


def preload_keys(n: int) -> np.ndarray:
    return key_of(np.arange(n, dtype=np.uint64))


def preload_values(n: int, dim: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim), dtype=np.float32)


def batch(workload: str, n_present: int, size: int, dim: int, seed: int):
    """(keys, values or None) of one batch. Present keys are drawn from the preloaded indices
    [0, n_present); missing keys from indices >= n_present (never inserted)."""
    rng = np.random.default_rng(seed)
    if workload == "lookup_missing":
        idx = rng.integers(0, n_present, size, dtype=np.int64)
        miss = rng.random(size) < 0.5
        idx[miss] = n_present + rng.integers(0, 1 << 40, int(miss.sum()), dtype=np.int64)
    else:
        idx = rng.integers(0, n_present, size, dtype=np.int64)
    keys = key_of(idx.astype(np.uint64))
    values = (rng.standard_normal((size, dim), dtype=np.float32) if workload == "upsert"
              else None)
    return keys, values


def rss_mb() -> dict:
    """Current and peak resident memory of this process (MiB), from /proc/self/status."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out["rss" if line.startswith("VmRSS") else "peak"] = int(line.split()[1]) / 1024
    return out


def trim() -> None:
    """Returns freed heap memory to the OS (glibc malloc_trim), so that RSS deltas measured
    next are not hidden by memory the allocator kept from earlier phases."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def reset_peak() -> None:
    """Resets VmHWM to the current RSS (Linux clear_refs 5), so peaks are per phase."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def dir_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


class TfraSide:
    """TFRA tables: per dim one with a zeros default ("zeros") and one with RandomNormal
    ("normal"), both preloaded with the same rows."""

    def __init__(self):
        os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
        import tensorflow as tf
        from tensorflow_recommenders_addons import dynamic_embedding as de
        import tensorflow_recommenders_addons as tfra
        self.tf, self.de = tf, de
        self.vars = {}
        self.fns = {}
        self.batches = {}
        self.info = {"tf_version": tf.__version__, "tfra_version": tfra.__version__,
                     "mode": "eager, ops wrapped in tf.function",
                     "threads": {"intra": tf.config.threading.get_intra_op_parallelism_threads(),
                                 "inter": tf.config.threading.get_inter_op_parallelism_threads()}}

    def setup(self, dim: int, n: int, seed: int) -> dict:
        tf, de = self.tf, self.de
        import gc
        gc.collect()
        trim()
        before = rss_mb()["rss"]
        reset_peak()
        keys, values = preload_keys(n), preload_values(n, dim, seed)
        out = {}
        for kind in ("zeros", "normal"):
            init = (None if kind == "zeros"
                    else tf.keras.initializers.RandomNormal(mean=0.0, stddev=1.0, seed=seed))
            var = de.Variable(key_dtype=tf.int64, value_dtype=tf.float32, dim=dim,
                              name=f"bench_{kind}_{dim}", initializer=init, init_size=n)
            def _upsert(k, v, var=var):
                var.upsert(k, v)  # returns an Operation, which tf.function cannot return

            upsert = tf.function(_upsert)
            k_t, v_t = tf.constant(keys), tf.constant(values)
            t0 = time.perf_counter()
            upsert(k_t, v_t)
            out[f"preload_{kind}_s"] = time.perf_counter() - t0
            del k_t, v_t
            self.vars[(kind, dim)] = var
            self.fns[(kind, dim)] = {
                "upsert": upsert,
                "lookup": tf.function(lambda k, var=var: var.lookup(k)),
            }
            assert int(var.size()) == n
        del keys, values
        mem = rss_mb()
        out.update(rss_before_mb=before, rss_after_mb=mem["rss"], peak_mb=mem["peak"])
        return out

    def drop(self, dim: int) -> dict:
        for kind in ("zeros", "normal"):
            self.vars.pop((kind, dim), None)
            self.fns.pop((kind, dim), None)
        self.batches = {k: v for k, v in self.batches.items() if k[1] != dim}
        import gc
        gc.collect()
        return rss_mb()

    def _batches(self, workload, dim, size, n_present, seed, count):
        key = (workload, dim, size, seed)
        if key not in self.batches:
            tf = self.tf
            bs = []
            for j in range(count):
                k, v = batch(workload, n_present, size, dim, seed * 1000 + j)
                bs.append((tf.constant(k), None if v is None else tf.constant(v)))
            self.batches[key] = bs
        return self.batches[key]

    def time(self, workload: str, dim: int, size: int, n_present: int, iters: int,
             seed: int) -> list:
        kind = "normal" if workload == "lookup_missing" else "zeros"
        fns = self.fns[(kind, dim)]
        bs = self._batches(workload, dim, size, n_present, seed, 4)
        times = []
        for j in range(iters + 1):  # the first call traces/warms up and is not counted
            k, v = bs[j % len(bs)]
            t0 = time.perf_counter()
            if workload == "upsert":
                fns["upsert"](k, v)
            else:
                fns["lookup"](k).numpy()
            dt = time.perf_counter() - t0
            if j:
                times.append(dt)
        return times

    def checkpoint(self, dim: int, directory: str) -> dict:
        tf = self.tf
        var = self.vars[("zeros", dim)]
        n = int(var.size())
        import gc
        gc.collect()
        trim()
        rss0 = rss_mb()["rss"]
        reset_peak()
        ckpt = tf.train.Checkpoint(emb=var)
        prefix = os.path.join(directory, "tfra_ckpt")
        t0 = time.perf_counter()
        path = ckpt.write(prefix)
        save_s = time.perf_counter() - t0
        size = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)
                   if f.startswith("tfra_ckpt"))
        save_peak = rss_mb()["peak"]
        reset_peak()
        t0 = time.perf_counter()
        ckpt.read(path).assert_consumed()
        restore_s = time.perf_counter() - t0
        assert int(var.size()) == n
        out = {"save_s": save_s, "restore_s": restore_s, "bytes": size,
               "save_extra_mb": save_peak - rss0, "restore_extra_mb": rss_mb()["peak"] - rss0}
        # TFRA's other format: FileSystemSaver raw files (no TF checkpoint machinery).
        fs_dir = os.path.join(directory, "tfra_fs")
        t0 = time.perf_counter()
        var.save_to_file_system(fs_dir)
        out["fs_save_s"] = time.perf_counter() - t0
        out["fs_bytes"] = dir_bytes(fs_dir)
        var.clear()
        t0 = time.perf_counter()
        var.load_from_file_system(fs_dir)
        out["fs_restore_s"] = time.perf_counter() - t0
        assert int(var.size()) == n
        return out

    def fit(self, spec: dict) -> dict:
        """Hook for the model.fit examples/s comparison (the demo model is not written yet)."""
        return {"skipped": "no TFRA demo model yet (benchmarks/compare_tfra.py FIT_HOOK)"}


def main() -> None:
    side = None
    out = sys.stdout
    sys.stdout = sys.stderr  # anything TF prints goes to stderr, never into the protocol
    for line in sys.stdin:
        req = json.loads(line)
        op = req.pop("op")
        try:
            if op == "quit":
                break
            if side is None:
                side = TfraSide()
            if op == "info":
                res = {**side.info, **rss_mb()}
            elif op == "rss":
                res = rss_mb()
            else:
                res = getattr(side, op)(**req)
            reply = {"ok": True, "result": res}
        except Exception as e:  # noqa: BLE001 (reported to the driver)
            import traceback
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}",
                     "traceback": traceback.format_exc()}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()

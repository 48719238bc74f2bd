#!/usr/bin/env python
"""dualemb vs TFRA 0.8.1 on the same workloads, alternating the two sides in one run.

    DUALEMB_NATIVE_DIR=build/x/dualemb PYTHONPATH=. python benchmarks/compare_tfra.py \
        [--tfra-python /work/tfra-venv/bin/python] [--rounds 5] [--quick] > results.json

The TFRA side runs in a subprocess (benchmarks/tfra_worker.py) in a TFRA virtualenv: TF 2.16.2
+ TFRA 0.8.1 + tf_keras (TFRA cannot run on Keras 3). If --tfra-python does not exist, the venv
is created at --tfra-venv (python3.11 -m venv + pip). The dualemb side runs in this interpreter:
`dualemb.core.Table` (numpy API), plus a second column for the TF front end's lookup
(`dualemb.tf.Variable.lookup` in a tf.function) when `dualemb.tf` is importable and built.

Workloads, for each dim in --dims and batch in --batches, on tables preloaded with --rows keys:
  upsert           overwrite `batch` existing keys (insert_or_assign / Variable.upsert)
  lookup_present   `batch` present keys, zeros default (find / Variable.lookup)
  lookup_missing   50% present, 50% missing keys, random-normal initializer (TFRA draws
                   RandomNormal([batch, dim]) on every lookup; dualemb computes per-key rows)
and, for a --ckpt-rows x --ckpt-dim table: checkpoint save/restore time and size (dualemb:
`dualemb.core.checkpoint.save/load`; TFRA: `tf.train.Checkpoint.write/read` of the Variable,
plus its FileSystemSaver), and the resident memory (RSS) of each side.

Every measurement block runs the two sides back to back, the order alternating per round, on
the same 4 pre-built batches (identical keys and values on both sides); the reported time is the
median (and min) over all iterations of all rounds, per batch. The markdown table
goes to stderr (and --markdown FILE); the JSON with every number goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tfra_worker as W  # noqa: E402  (pure numpy at import: shared workload generators)

WORKLOADS = ("upsert", "lookup_present", "lookup_missing")

# Hook for a model.fit examples/s comparison. When the demo model exists, set this to a callable
# `fit(side: str, spec: dict) -> {"examples_per_s": float, ...}` for the dualemb side (and
# implement TfraSide.fit in tfra_worker.py for the TFRA side); `--fit` then runs both.
FIT_HOOK = None


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---- the TFRA side ---------------------------------------------------------------------------

def ensure_tfra_python(python: str, venv: str) -> str:
    if os.path.exists(python):
        return python
    log(f"[setup] {python} missing: creating a TFRA venv at {venv} (a few minutes)")
    subprocess.run(["python3.11", "-m", "venv", venv], check=True)
    pip = os.path.join(venv, "bin", "pip")
    subprocess.run([pip, "install", "-q", "tensorflow==2.16.2",
                    "tensorflow-recommenders-addons==0.8.1", "tf_keras~=2.16.0", "numpy<2"],
                   check=True)
    return os.path.join(venv, "bin", "python")


class TfraWorker:
    def __init__(self, python: str, log_path: str):
        env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
        env.pop("PYTHONPATH", None)
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([python, os.path.join(HERE, "tfra_worker.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, env=env, text=True, bufsize=1)

    def call(self, op, **kw):
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"TFRA worker died (see {self.log.name})")
        reply = json.loads(line)
        if not reply["ok"]:
            raise RuntimeError(f"TFRA worker: {reply['error']}\n{reply['traceback']}")
        return reply["result"]

    def close(self):
        try:
            self.call("quit")
        except Exception:  # noqa: BLE001
            pass
        self.proc.wait(timeout=60)
        self.log.close()


# ---- the dualemb sides -----------------------------------------------------------------------

class DualembSide:
    """dualemb.core.Table through its numpy API (the same call the front ends make)."""

    name = "dualemb"

    def __init__(self):
        from dualemb.core import Table, initializers
        self.Table, self.inits = Table, initializers
        self.tables, self.batches = {}, {}

    def setup(self, dim, n, seed):
        import gc
        gc.collect()
        W.trim()
        before = W.rss_mb()["rss"]
        W.reset_peak()
        keys, values = W.preload_keys(n), W.preload_values(n, dim, seed)
        out = {}
        for kind in ("zeros", "normal"):
            init = None if kind == "zeros" else self.inits.normal(0.0, 1.0, seed=seed)
            t = self.Table(dim, initializer=init)
            t.reserve(n)
            t0 = time.perf_counter()
            t.insert_or_assign(keys, values)
            out[f"preload_{kind}_s"] = time.perf_counter() - t0
            assert t.size() == n
            self.tables[(kind, dim)] = t
        del keys, values
        mem = W.rss_mb()
        out.update(rss_before_mb=before, rss_after_mb=mem["rss"], peak_mb=mem["peak"],
                   table_bytes=sum(self.tables[(k, dim)].memory_bytes()
                                   for k in ("zeros", "normal")))
        return out

    def drop(self, dim):
        for kind in ("zeros", "normal"):
            t = self.tables.pop((kind, dim), None)
            if t is not None:
                t.destroy()
        self.batches = {k: v for k, v in self.batches.items() if k[1] != dim}
        return W.rss_mb()

    def _batches(self, workload, dim, size, n_present, seed, count=4):
        key = (workload, dim, size, seed)
        if key not in self.batches:
            self.batches[key] = [W.batch(workload, n_present, size, dim, seed * 1000 + j)
                                 for j in range(count)]
        return self.batches[key]

    def time(self, workload, dim, size, n_present, iters, seed):
        t = self.tables[("normal" if workload == "lookup_missing" else "zeros", dim)]
        bs = self._batches(workload, dim, size, n_present, seed)
        times = []
        for j in range(iters + 1):
            k, v = bs[j % len(bs)]
            t0 = time.perf_counter()
            if workload == "upsert":
                t.insert_or_assign(k, v)
            else:
                t.find(k)
            dt = time.perf_counter() - t0
            if j:
                times.append(dt)
        return times

    def checkpoint(self, dim, directory):
        from dualemb.core import checkpoint
        t = self.tables[("zeros", dim)]
        n = t.size()
        path = os.path.join(directory, "dualemb_ckpt")
        import gc
        gc.collect()
        W.trim()
        rss0 = W.rss_mb()["rss"]
        W.reset_peak()
        t0 = time.perf_counter()
        checkpoint.save(path, {"emb": t})
        save_s = time.perf_counter() - t0
        save_peak = W.rss_mb()["peak"]
        size = W.dir_bytes(path)
        W.reset_peak()
        t0 = time.perf_counter()
        checkpoint.load(path, {"emb": t})
        restore_s = time.perf_counter() - t0
        assert t.size() == n
        return {"save_s": save_s, "restore_s": restore_s, "bytes": size,
                "save_extra_mb": save_peak - rss0, "restore_extra_mb": W.rss_mb()["peak"] - rss0}


class DualembTfSide(DualembSide):
    """The TF front end: `dualemb.tf.Variable.lookup` inside a tf.function (lookups only)."""

    name = "dualemb.tf"

    def __init__(self):
        import tensorflow as tf
        import dualemb.tf as de
        self.tf, self.de = tf, de
        self.vars, self.fns, self.batches = {}, {}, {}

    def setup(self, dim, n, seed):
        tf, de = self.tf, self.de
        import gc
        gc.collect()
        W.trim()
        before = W.rss_mb()["rss"]
        keys, values = W.preload_keys(n), W.preload_values(n, dim, seed)
        out = {}
        for kind in ("zeros", "normal"):
            init = (None if kind == "zeros"
                    else tf.keras.initializers.RandomNormal(mean=0.0, stddev=1.0, seed=seed))
            var = de.Variable(key_dtype=tf.int64, value_dtype=tf.float32, dim=dim,
                              name=f"bench_tf_{kind}_{dim}", initializer=init)
            t0 = time.perf_counter()
            var.upsert(tf.constant(keys), tf.constant(values))
            out[f"preload_{kind}_s"] = time.perf_counter() - t0
            self.vars[(kind, dim)] = var
            def _upsert(k, v, var=var):
                var.upsert(k, v)

            self.fns[(kind, dim)] = {
                "lookup": tf.function(lambda k, var=var: var.lookup(k)),
                "upsert": tf.function(_upsert)}
        out.update(rss_before_mb=before, rss_after_mb=W.rss_mb()["rss"])
        return out

    def drop(self, dim):
        for kind in ("zeros", "normal"):
            var = self.vars.pop((kind, dim), None)
            self.fns.pop((kind, dim), None)
            if var is not None and hasattr(var, "clear"):
                var.clear()
        self.batches = {k: v for k, v in self.batches.items() if k[1] != dim}
        return W.rss_mb()

    def time(self, workload, dim, size, n_present, iters, seed):
        tf = self.tf
        fns = self.fns[("normal" if workload == "lookup_missing" else "zeros", dim)]
        key = (workload, dim, size, seed)
        if key not in self.batches:
            self.batches[key] = [
                tuple(None if a is None else tf.constant(a)
                      for a in W.batch(workload, n_present, size, dim, seed * 1000 + j))
                for j in range(4)]
        bs = self.batches[key]
        times = []
        for j in range(iters + 1):
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


class LocalSide:
    """Adapter giving an in-process side the worker's call interface."""

    def __init__(self, impl):
        self.impl = impl

    def call(self, op, **kw):
        return getattr(self.impl, op)(**kw)


# ---- driver ----------------------------------------------------------------------------------

def iters_for(batch: int, budget_keys: float) -> int:
    return int(max(3, min(50, budget_keys / batch)))


def run(args) -> dict:
    tfra_python = ensure_tfra_python(args.tfra_python, args.tfra_venv)
    tmp = tempfile.mkdtemp(prefix="dualemb_vs_tfra_")
    worker = TfraWorker(tfra_python, os.path.join(tmp, "tfra_worker.log"))
    sides = {"dualemb": LocalSide(DualembSide())}
    notes = []
    if not args.no_tf_column:
        try:
            tf_side = DualembTfSide()
            sides["dualemb.tf"] = LocalSide(tf_side)
        except Exception as e:  # noqa: BLE001 (the front end may not be built yet)
            notes.append(f"dualemb.tf column skipped: {type(e).__name__}: {e}")
            log("[note]", notes[-1])
    sides["tfra"] = worker
    result = {"config": vars(args), "notes": notes,
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "load_avg_start": os.getloadavg()},
              "tfra": worker.call("info"), "baseline_rss_mb": {}, "setup": {}, "timings": {},
              "checkpoint": {}, "fit": None}
    result["tfra"]["python"] = tfra_python
    for name, s in sides.items():
        result["baseline_rss_mb"][name] = s.call("rss") if name == "tfra" else W.rss_mb()
    try:
        for dim in args.dims:
            for name, s in list(sides.items()):
                log(f"[setup] {name}: {args.rows:,} rows x dim {dim}")
                try:
                    result["setup"].setdefault(name, {})[dim] = s.call(
                        "setup", dim=dim, n=args.rows, seed=dim)
                except Exception as e:  # noqa: BLE001
                    if name != "dualemb.tf":
                        raise
                    notes.append(f"dualemb.tf column skipped: setup failed: "
                                 f"{type(e).__name__}: {e}")
                    log("[note]", notes[-1])
                    del sides[name]
            for workload in WORKLOADS:
                for size in args.batches:
                    cell = f"{workload}/d{dim}/b{size}"
                    iters = iters_for(size, args.budget_keys)
                    samples = {n: [] for n in sides}
                    for r in range(args.rounds):
                        order = list(sides) if r % 2 == 0 else list(reversed(sides))
                        for name in order:
                            if name == "dualemb.tf" and workload == "upsert" and not args.tf_upsert:
                                continue
                            samples[name] += sides[name].call(
                                "time", workload=workload, dim=dim, size=size,
                                n_present=args.rows, iters=iters, seed=1)
                    med = {n: statistics.median(v) for n, v in samples.items() if v}
                    result["timings"][cell] = {
                        n: {"median_s": med[n], "min_s": min(samples[n]),
                            "max_s": max(samples[n]), "n": len(samples[n]),
                            "mkeys_per_s": size / med[n] / 1e6} for n in med}
                    log(f"[time] {cell}: " + ", ".join(
                        f"{n} {med[n] * 1e3:.2f} ms" for n in med))
            if dim == args.ckpt_dim and args.rows == args.ckpt_rows and not args.no_ckpt:
                run_checkpoint(sides, dim, args, result, notes)
            for name, s in sides.items():
                s.call("drop", dim=dim)
        if args.ckpt_dim not in args.dims or args.rows != args.ckpt_rows:
            if not args.no_ckpt:
                ck = [n for n in ("dualemb", "tfra") if n in sides]
                for name in ck:
                    sides[name].call("setup", dim=args.ckpt_dim, n=args.ckpt_rows, seed=7)
                run_checkpoint({n: sides[n] for n in ck}, args.ckpt_dim, args, result, notes)
                for name in ck:
                    sides[name].call("drop", dim=args.ckpt_dim)
        if args.fit:
            if FIT_HOOK is None:
                result["fit"] = {"skipped": "no demo model yet: set FIT_HOOK"}
            else:
                result["fit"] = {"dualemb": FIT_HOOK("dualemb", {}),
                                 "tfra": worker.call("fit", spec={})}
        W.trim()
        result["final_rss_mb"] = {"dualemb": W.rss_mb(), "tfra": worker.call("rss")}
        result["machine"]["load_avg_end"] = os.getloadavg()
    finally:
        worker.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def run_checkpoint(sides, dim, args, result, notes):
    for r in range(args.ckpt_rounds):
        order = ["dualemb", "tfra"] if r % 2 == 0 else ["tfra", "dualemb"]
        for name in order:
            d = tempfile.mkdtemp(prefix=f"ckpt_{name}_", dir=args.ckpt_dir)
            try:
                res = sides[name].call("checkpoint", dim=dim, directory=d)
                result["checkpoint"].setdefault(name, []).append(res)
                log(f"[ckpt] {name}: " + ", ".join(
                    f"{k}={v:.3g}" for k, v in res.items() if isinstance(v, float)))
            except Exception as e:  # noqa: BLE001 (checkpoint API still being written)
                if name == "tfra":
                    raise
                msg = f"dualemb checkpoint skipped: {type(e).__name__}: {e}"
                if msg not in notes:
                    notes.append(msg)
                    log("[note]", msg)
            finally:
                shutil.rmtree(d, ignore_errors=True)


def markdown(res: dict) -> str:
    cfg = res["config"]
    cols = [c for c in ("dualemb", "dualemb.tf") if any(c in v for v in res["timings"].values())]
    lines = [f"### dualemb vs TFRA {res['tfra']['tfra_version']} (TF {res['tfra']['tf_version']},"
             f" {res['tfra']['mode']}), {cfg['rows']:,}-key tables, "
             f"{res['machine']['cpus']} CPUs, {cfg['rounds']} alternating rounds", "",
             "Time per batch in ms, median (min) over all iterations of all rounds; speed-up ="
             " TFRA median / dualemb median.", ""]
    head = "| workload | dim | batch | TFRA ms | " + " | ".join(
        f"{c} ms | speed-up ({c})" for c in cols) + " |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for cell, v in res["timings"].items():
        w, d, b = cell.split("/")
        row = (f"| {w} | {d[1:]} | {int(b[1:]):,} | {v['tfra']['median_s'] * 1e3:.2f} "
               f"({v['tfra']['min_s'] * 1e3:.2f}) |")
        for c in cols:
            if c in v:
                row += (f" {v[c]['median_s'] * 1e3:.2f} ({v[c]['min_s'] * 1e3:.2f}) | "
                        f"{v['tfra']['median_s'] / v[c]['median_s']:.2f}x |")
            else:
                row += " – | – |"
        lines.append(row)
    ck = res.get("checkpoint") or {}
    if ck:
        lines += ["", f"Checkpoint of a {cfg['ckpt_rows']:,} x {cfg['ckpt_dim']} table "
                  f"(median of {cfg['ckpt_rounds']}):", "",
                  "| side | save s | restore s | size MiB | save: peak RSS above before, MiB | "
                  "restore: same |", "|---|---|---|---|---|---|"]
        for name, runs in ck.items():
            m = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            label = {"tfra": "TFRA tf.train.Checkpoint",
                     "dualemb": "dualemb checkpoint"}.get(name, name)
            lines.append(f"| {label} | {m['save_s']:.2f} | {m['restore_s']:.2f} | "
                         f"{m['bytes'] / 2**20:.0f} | {m['save_extra_mb']:.0f} | "
                         f"{m['restore_extra_mb']:.0f} |")
            if "fs_save_s" in m:
                lines.append(f"| TFRA FileSystemSaver | {m['fs_save_s']:.2f} | "
                             f"{m['fs_restore_s']:.2f} | {m['fs_bytes'] / 2**20:.0f} | | |")
    if ck:
        lines += ["", "Checkpoint memory is the peak RSS during save/restore above the RSS before"
                  " (after malloc_trim). TF's allocator reuses memory it already holds, so the "
                  "TFRA figure can miss its full-table export copy."]
    lines += ["", "Memory (RSS MiB): baseline after imports; table growth = RSS after preloading"
              " the two tables (zeros + normal init) of a dim minus before (after malloc_trim);"
              " peak of that phase (which includes the numpy/tensor copies of the preload data)."
              " Memory freed by an earlier phase and kept by an allocator can hide growth.",
              "", "| side | baseline | " + " | ".join(
                  f"dim {d} tables | dim {d} phase peak" for d in cfg["dims"]) + " |",
              "|---|---|" + "---|---|" * len(cfg["dims"])]
    for name in ("dualemb", "tfra"):
        s = res["setup"].get(name, {})
        row = f"| {name} | {res['baseline_rss_mb'][name]['rss']:.0f} |"
        for d in cfg["dims"]:
            x = s.get(d) or s.get(str(d))
            row += (f" {x['rss_after_mb'] - x['rss_before_mb']:.0f} | {x['peak_mb']:.0f} |"
                    if x else " – | – |")
        lines.append(row)
    core = {d: x.get("table_bytes") for d, x in res["setup"].get("dualemb", {}).items()}
    if any(core.values()):
        lines += ["", "dualemb's own count of its table memory (Table.memory_bytes, both tables): "
                  + "; ".join(f"dim {d}: {b / 2**20:.0f} MiB" for d, b in core.items() if b)
                  + "."]
    pre = []
    for name in ("dualemb", "tfra"):
        for d, x in res["setup"].get(name, {}).items():
            pre.append(f"{name} dim {d}: {x['preload_zeros_s']:.2f} s")
    if pre:
        lines += ["", "Preloading 1 table in one upsert call: " + "; ".join(pre) + "."]
    if res["notes"]:
        lines += [""] + [f"- {n}" for n in res["notes"]]
    la0, la1 = res["machine"]["load_avg_start"], res["machine"].get("load_avg_end", (0,))
    lines += ["", f"Load average at start {la0[0]:.2f}, at end {la1[0]:.2f} on "
              f"{res['machine']['cpus']} CPUs: the machine is shared; "
              "medians of alternating rounds damp, but do not remove, that noise."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tfra-python", default="/work/tfra-venv/bin/python")
    ap.add_argument("--tfra-venv", default="/work/tfra-venv")
    ap.add_argument("--dims", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--batches", type=int, nargs="+", default=[4096, 65536])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget-keys", type=float, default=1e6,
                    help="keys per measurement block (iterations = budget / batch, 3..50)")
    ap.add_argument("--ckpt-rows", type=int, default=1_000_000)
    ap.add_argument("--ckpt-dim", type=int, default=64)
    ap.add_argument("--ckpt-rounds", type=int, default=3)
    ap.add_argument("--ckpt-dir", default=None, help="where checkpoints are written (tmp)")
    ap.add_argument("--no-ckpt", action="store_true")
    ap.add_argument("--no-tf-column", action="store_true")
    ap.add_argument("--tf-upsert", action="store_true", help="also time dualemb.tf upserts")
    ap.add_argument("--fit", action="store_true", help="model.fit comparison (FIT_HOOK)")
    ap.add_argument("--quick", action="store_true", help="100k rows, 2 rounds (smoke test)")
    ap.add_argument("--markdown", default=None, help="also write the markdown table here")
    args = ap.parse_args()
    if args.quick:
        args.rows = args.ckpt_rows = 100_000
        args.rounds, args.ckpt_rounds = 2, 1
    res = run(args)
    md = markdown(res)
    res["markdown"] = md
    log("\n" + md)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(md + "\n")
    json.dump(res, sys.stdout, indent=1, default=str)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""dualemb vs TFRA 0.8.1 on the same workloads, alternating the two sides in one run.

    DUALEMB_NATIVE_DIR=build/x/dualemb PYTHONPATH=. python benchmarks/compare_tfra.py \
        [--tfra-python /work/tfra-venv/bin/python] [--rounds 5] [--quick] [--fit [--fit-only]] \
        > results.json

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
`dualemb.core.checkpoint.save/load`; dualemb.tf and TFRA: `tf.train.Checkpoint.write/read` of
the Variable; TFRA also its FileSystemSaver), and the resident memory (RSS) of each side.
--ckpt-only runs only the checkpoint comparison.

--fit adds a model.fit comparison (--fit-only runs only that): 8 sparse features (ids: Zipf(1.2)
ranks hashed into [0, 10M), generated from the same seed on both sides and checked by checksum),
one dynamic `Embedding(16)` layer per feature (TFRA's `de.keras.layers.Embedding` on tf_keras;
`dualemb.tf.keras.layers.Embedding` on Keras 3), concatenated, MLP 64-32-1, binary cross-entropy,
batch 4096, Adam in `de.DynamicEmbeddingOptimizer`. Each side first runs an untimed warm-up fit
(--fit-warmup steps), then per round one `model.fit(dataset, steps_per_epoch=--fit-steps,
epochs=--fit-epochs)` on batches neither side has trained on yet (so the Zipf tail keeps inserting
new ids), the two sides alternating; examples/s = batch x steps / epoch time, median over all
epochs of all rounds. Then the forward pass of the 8 Embedding layers alone (one tf.function, a
trained batch of 8 x 4096 keys) in keys/s, also alternating. The code of the model and its timing
is shared (tfra_worker.FitRunner, given each side's tf, keras and de modules).

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
        t0, c0 = time.perf_counter(), time.process_time()
        checkpoint.save(path, {"emb": t})
        save_s, save_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        save_peak = W.rss_mb()["peak"]
        size = W.dir_bytes(path)
        W.reset_peak()
        t0, c0 = time.perf_counter(), time.process_time()
        checkpoint.load(path, {"emb": t})
        restore_s, restore_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        assert t.size() == n
        return {"save_s": save_s, "restore_s": restore_s, "bytes": size,
                "save_cpu_s": save_cpu_s, "restore_cpu_s": restore_cpu_s,
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
        return W.time_table_ops(fns, self.batches[key], workload, iters)

    def checkpoint(self, dim, directory):
        """`tf.train.Checkpoint(emb=var).write/read`, the code TFRA's side runs (tfra_worker)."""
        tf = self.tf
        var = self.vars[("zeros", dim)]
        n = int(var.size())
        import gc
        gc.collect()
        W.trim()
        rss0 = W.rss_mb()["rss"]
        W.reset_peak()
        ckpt = tf.train.Checkpoint(emb=var)
        prefix = os.path.join(directory, "tf_ckpt")
        t0, c0 = time.perf_counter(), time.process_time()
        path = ckpt.write(prefix)
        save_s, save_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        size = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)
                   if f.startswith("tf_ckpt"))
        save_peak = W.rss_mb()["peak"]
        W.reset_peak()
        t0, c0 = time.perf_counter(), time.process_time()
        ckpt.read(path).assert_consumed()
        restore_s, restore_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        assert int(var.size()) == n
        return {"save_s": save_s, "restore_s": restore_s, "bytes": size,
                "save_cpu_s": save_cpu_s, "restore_cpu_s": restore_cpu_s,
                "save_extra_mb": save_peak - rss0, "restore_extra_mb": W.rss_mb()["peak"] - rss0}


class DualembFitSide:
    """model.fit with `dualemb.tf` on Keras 3: tfra_worker.FitRunner given this interpreter's
    tf, keras and dualemb.tf (the TFRA side is TfraSide.fit in the worker)."""

    name = "dualemb.tf"

    def __init__(self):
        import keras
        import tensorflow as tf
        import dualemb.tf as de
        self.tf, self.keras, self.de = tf, keras, de
        self.fitter = None

    def fit(self, action: str, spec: dict | None = None, r: int = 0):
        if action == "setup":
            self.fitter = W.FitRunner(self.tf, self.keras, self.de, spec)
            out = self.fitter.setup()
            out["versions"] = {"tf": self.tf.__version__, "keras": self.keras.__version__}
            return out
        if action == "round":
            return self.fitter.round(r)
        if action == "lookup":
            return self.fitter.lookup(r)
        if action == "drop":
            out = self.fitter.drop()
            self.fitter = None
            return out
        raise ValueError(f"unknown fit action {action!r}")


# The dualemb side of the model.fit comparison (`--fit`): a class whose `fit(action, spec, r)`
# mirrors TfraSide.fit in tfra_worker.py.
FIT_HOOK = DualembFitSide


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
    sides = {} if args.fit_only else {"dualemb": LocalSide(DualembSide())}
    notes = []
    if not args.no_tf_column and not args.fit_only:
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
    if args.fit_only:
        sides = {}
    try:
        for dim in (() if args.fit_only else args.dims):
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
            for workload in (() if args.ckpt_only else WORKLOADS):
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
            if not args.no_ckpt and not args.fit_only:
                ck = [n for n in ("dualemb", "dualemb.tf", "tfra") if n in sides]
                for name in ck:
                    sides[name].call("setup", dim=args.ckpt_dim, n=args.ckpt_rows, seed=7)
                run_checkpoint({n: sides[n] for n in ck}, args.ckpt_dim, args, result, notes)
                for name in ck:
                    sides[name].call("drop", dim=args.ckpt_dim)
        if args.fit or args.fit_only:
            result["fit"] = run_fit(worker, args, notes)
        W.trim()
        result["final_rss_mb"] = {"dualemb": W.rss_mb(), "tfra": worker.call("rss")}
        result["machine"]["load_avg_end"] = os.getloadavg()
    finally:
        worker.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def run_fit(worker, args, notes) -> dict:
    spec = W.fit_spec({"rounds": args.fit_rounds, "steps": args.fit_steps,
                       "epochs": args.fit_epochs, "warmup": args.fit_warmup,
                       "batch": args.fit_batch, "lookup_iters": args.fit_lookup_iters})
    try:
        sides = {"dualemb.tf": LocalSide(FIT_HOOK())}
    except Exception as e:  # noqa: BLE001 (the TF front end may not be built)
        msg = f"model.fit comparison skipped: dualemb.tf: {type(e).__name__}: {e}"
        notes.append(msg)
        log("[note]", msg)
        return {"skipped": msg}
    sides["tfra"] = worker
    out = {"spec": spec, "setup": {}, "rounds": {n: [] for n in sides},
           "lookup_s": {n: [] for n in sides}}
    for name, s in sides.items():
        n = spec["warmup"] + spec["rounds"] * spec["epochs"] * spec["steps"]
        log(f"[fit] {name}: generating {n} batches of {spec['batch']}, building the model, "
            f"{spec['warmup']} warm-up steps")
        out["setup"][name] = s.call("fit", action="setup", spec=spec)
        log(f"[fit] {name}: warm-up fit {out['setup'][name]['warmup_fit_s']:.1f} s")
    sums = {n: x["ids_checksum"] for n, x in out["setup"].items()}
    if len(set(sums.values())) != 1:
        msg = f"model.fit: the two sides generated different ids (checksums {sums})"
        notes.append(msg)
        log("[note]", msg)
    for r in range(spec["rounds"]):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            res = sides[name].call("fit", action="round", r=r)
            out["rounds"][name].append(res)
            eps = spec["batch"] * spec["steps"] / statistics.median(res["epoch_s"])
            log(f"[fit] round {r} {name}: epochs "
                + ", ".join(f"{t:.2f} s" for t in res["epoch_s"])
                + f" ({eps:,.0f} ex/s), loss {res['loss'][-1]:.4f}, load {res['load_avg']:.2f}")
    for r in range(spec["rounds"]):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            out["lookup_s"][name] += sides[name].call("fit", action="lookup", r=r)
    rows = {n: v[-1]["rows"] for n, v in out["rounds"].items()}
    if rows["tfra"] != rows["dualemb.tf"]:
        msg = f"model.fit: table rows after training differ: {rows}"
        notes.append(msg)
        log("[note]", msg)
    summary = {}
    keys = spec["batch"] * spec["features"]
    for name in sides:
        epochs = [t for res in out["rounds"][name] for t in res["epoch_s"]]
        eps = [spec["batch"] * spec["steps"] / t for t in epochs]
        calls = [spec["batch"] * spec["steps"] * spec["epochs"] / res["fit_s"]
                 for res in out["rounds"][name]]
        lk = out["lookup_s"][name]
        summary[name] = {
            "examples_per_s": statistics.median(eps), "examples_per_s_min": min(eps),
            "examples_per_s_max": max(eps), "n_epochs": len(eps),
            "examples_per_s_whole_fit_calls": statistics.median(calls),
            "step_ms": statistics.median(epochs) / spec["steps"] * 1e3,
            "final_loss": out["rounds"][name][-1]["loss"][-1],
            "rows_per_table": rows[name],
            "lookup_median_s": statistics.median(lk),
            "lookup_keys_per_s": keys / statistics.median(lk),
            "rss_mb": out["rounds"][name][-1]["rss"]}
    summary["ratio_examples_per_s"] = (summary["dualemb.tf"]["examples_per_s"]
                                       / summary["tfra"]["examples_per_s"])
    summary["ratio_lookup_keys_per_s"] = (summary["dualemb.tf"]["lookup_keys_per_s"]
                                          / summary["tfra"]["lookup_keys_per_s"])
    out["summary"] = summary
    log(f"[fit] examples/s: dualemb.tf {summary['dualemb.tf']['examples_per_s']:,.0f}, TFRA "
        f"{summary['tfra']['examples_per_s']:,.0f} ({summary['ratio_examples_per_s']:.2f}x)")
    for name, s in sides.items():
        s.call("fit", action="drop")
    return out


def run_checkpoint(sides, dim, args, result, notes):
    for r in range(args.ckpt_rounds):
        order = [n for n in ("dualemb", "dualemb.tf", "tfra") if n in sides]
        for name in (order if r % 2 == 0 else order[::-1]):
            d = tempfile.mkdtemp(prefix=f"ckpt_{name}_", dir=args.ckpt_dir)
            try:
                res = sides[name].call("checkpoint", dim=dim, directory=d)
                result["checkpoint"].setdefault(name, []).append(res)
                log(f"[ckpt] {name}: " + ", ".join(
                    f"{k}={v:.3g}" for k, v in res.items() if isinstance(v, float)))
            except Exception as e:  # noqa: BLE001 (checkpoint API still being written)
                if name == "tfra":
                    raise
                msg = f"{name} checkpoint skipped: {type(e).__name__}: {e}"
                if msg not in notes:
                    notes.append(msg)
                    log("[note]", msg)
            finally:
                shutil.rmtree(d, ignore_errors=True)


def markdown(res: dict) -> str:
    cfg = res["config"]
    cols = [c for c in ("dualemb", "dualemb.tf") if any(c in v for v in res["timings"].values())]
    if not res["timings"] and not res.get("checkpoint"):
        lines = [f"### dualemb vs TFRA {res['tfra']['tfra_version']} (TF "
                 f"{res['tfra']['tf_version']}): model.fit, {res['machine']['cpus']} CPUs"]
        lines += markdown_fit(res)
        if res["notes"]:
            lines += [""] + [f"- {n}" for n in res["notes"]]
        lines += load_line(res)
        return "\n".join(lines)
    lines = [f"### dualemb vs TFRA {res['tfra']['tfra_version']} (TF {res['tfra']['tf_version']},"
             f" {res['tfra']['mode']}), {cfg['rows']:,}-key tables, "
             f"{res['machine']['cpus']} CPUs, {cfg['rounds']} alternating rounds"]
    if res["timings"]:
        lines += ["", "Time per batch in ms, median (min) over all iterations of all rounds; "
                  "speed-up = TFRA median / dualemb median.", ""]
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
                     "dualemb": "dualemb checkpoint (common format)",
                     "dualemb.tf": "dualemb.tf tf.train.Checkpoint"}.get(name, name)
            lines.append(f"| {label} | {m['save_s']:.2f} | {m['restore_s']:.2f} | "
                         f"{m['bytes'] / 2**20:.0f} | {m['save_extra_mb']:.0f} | "
                         f"{m['restore_extra_mb']:.0f} |")
            if "fs_save_s" in m:
                lines.append(f"| TFRA FileSystemSaver | {m['fs_save_s']:.2f} | "
                             f"{m['fs_restore_s']:.2f} | {m['fs_bytes'] / 2**20:.0f} | | |")
    if "tfra" in ck and "dualemb.tf" in ck:
        # Per round (the two sides ran back to back), then the median: damps a shared machine.
        pairs = list(zip(ck["tfra"], ck["dualemb.tf"]))
        keys = [k for k in ("save_s", "restore_s", "save_cpu_s", "restore_cpu_s")
                if all(k in t and k in d for t, d in pairs)]
        up = {k: statistics.median(t[k] / d[k] for t, d in pairs) for k in keys}
        lines += ["", f"`tf.train.Checkpoint` of the same table, TFRA / dualemb.tf (median of the"
                  f" per-round ratios): wall time save {up['save_s']:.2f}x, restore "
                  f"{up['restore_s']:.2f}x"
                  + (f"; process CPU time (all threads; less sensitive to other jobs) save "
                     f"{up['save_cpu_s']:.2f}x, restore {up['restore_cpu_s']:.2f}x"
                     if "save_cpu_s" in up else "") + "."]
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
    lines += markdown_fit(res)
    if res["notes"]:
        lines += [""] + [f"- {n}" for n in res["notes"]]
    lines += load_line(res)
    return "\n".join(lines)


def load_line(res: dict) -> list:
    la0, la1 = res["machine"]["load_avg_start"], res["machine"].get("load_avg_end", (0,))
    return ["", f"Load average at start {la0[0]:.2f}, at end {la1[0]:.2f} on "
            f"{res['machine']['cpus']} CPUs: the machine is shared; "
            "medians of alternating rounds damp, but do not remove, that noise."]


def markdown_fit(res: dict) -> list:
    fit = res.get("fit")
    if not fit:
        return []
    if "summary" not in fit:
        return ["", f"model.fit comparison: {fit.get('skipped', 'not run')}."]
    sp, sm, st = fit["spec"], fit["summary"], fit["setup"]
    loads = [x["load_avg"] for v in fit["rounds"].values() for x in v]
    vers = st["dualemb.tf"].get("versions", {})
    lines = ["", f"model.fit: {sp['features']} sparse features (Zipf({sp['zipf_a']}) ids over "
             f"{sp['vocab']:,}), one dynamic Embedding({sp['dim']}) per feature, MLP "
             f"{'-'.join(str(h) for h in sp['hidden'])}-1, binary cross-entropy, batch "
             f"{sp['batch']:,}, Adam in DynamicEmbeddingOptimizer. {sp['warmup']} untimed warm-up"
             f" steps, then {sp['rounds']} alternating rounds of one model.fit of {sp['epochs']} "
             f"x {sp['steps']} steps on new batches; examples/s over each epoch, median (min-max)"
             f" of {sm['tfra']['n_epochs']} epochs. Layer forward: the {sp['features']} Embedding"
             f" layers on a trained batch ({sp['features'] * sp['batch']:,} keys) in one "
             f"tf.function, median of {len(fit['lookup_s']['tfra'])}. 1-min load average during "
             f"the rounds {min(loads):.2f}-{max(loads):.2f}.", "",
             "| side | examples/s | step ms | speed-up | layer forward keys/s | speed-up | "
             "rows/table at end | final loss |", "|---|---|---|---|---|---|---|---|"]
    labels = {"tfra": f"TFRA {res['tfra']['tfra_version']} (tf_keras, TF "
                      f"{res['tfra']['tf_version']})",
              "dualemb.tf": f"dualemb.tf (Keras {vers.get('keras', '3')}, TF "
                            f"{vers.get('tf', '?')})"}
    for name in ("tfra", "dualemb.tf"):
        x = sm[name]
        up = "1.00x" if name == "tfra" else f"{sm['ratio_examples_per_s']:.2f}x"
        lup = "1.00x" if name == "tfra" else f"{sm['ratio_lookup_keys_per_s']:.2f}x"
        rows = x["rows_per_table"]
        lines.append(f"| {labels[name]} | {x['examples_per_s']:,.0f} "
                     f"({x['examples_per_s_min']:,.0f}-{x['examples_per_s_max']:,.0f}) | "
                     f"{x['step_ms']:.1f} | {up} | "
                     f"{x['lookup_keys_per_s'] / 1e6:.2f} M | {lup} | "
                     f"{min(rows):,}-{max(rows):,} | {x['final_loss']:.4f} |")
    return lines


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
    ap.add_argument("--ckpt-only", action="store_true",
                    help="only the checkpoint comparison (tables of --ckpt-rows x --ckpt-dim)")
    ap.add_argument("--no-tf-column", action="store_true")
    ap.add_argument("--tf-upsert", action="store_true", help="also time dualemb.tf upserts")
    ap.add_argument("--fit", action="store_true", help="also run the model.fit comparison")
    ap.add_argument("--fit-only", action="store_true",
                    help="only the model.fit comparison (no table ops, no checkpoint)")
    ap.add_argument("--fit-rounds", type=int, default=None,
                    help="alternating timed model.fit calls per side (default 6)")
    ap.add_argument("--fit-steps", type=int, default=None, help="steps_per_epoch (default 30)")
    ap.add_argument("--fit-epochs", type=int, default=None,
                    help="epochs per timed model.fit (default 2)")
    ap.add_argument("--fit-warmup", type=int, default=None,
                    help="steps of the untimed warm-up fit (default 5)")
    ap.add_argument("--fit-batch", type=int, default=None, help="batch size (default 4096)")
    ap.add_argument("--fit-lookup-iters", type=int, default=None,
                    help="layer-forward lookups per side per round (default 20)")
    ap.add_argument("--quick", action="store_true", help="100k rows, 2 rounds (smoke test)")
    ap.add_argument("--markdown", default=None, help="also write the markdown table here")
    args = ap.parse_args()
    if args.ckpt_only:
        args.dims, args.rows = [args.ckpt_dim], args.ckpt_rows
    if args.quick:
        args.rows = args.ckpt_rows = 100_000
        args.rounds, args.ckpt_rounds = 2, 1
        args.fit_rounds = args.fit_rounds or 2
        args.fit_steps = args.fit_steps or 10
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

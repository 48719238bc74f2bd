#!/usr/bin/env python
"""dualemb's Redis table vs TFRA 0.8.1's RedisTable (and both in-memory tables), in one run,
through the same TFRA API, printed as JSON.

    DUALEMB_NATIVE_DIR=build/x/dualemb PYTHONPATH=. python benchmarks/bench_redis.py \
        [--tfra-python /work/tfra-venv/bin/python] [--rows 200000] [--dims 8 64] \
        [--batches 4096 65536] [--rounds 4] [--budget-keys 5e5] [--no-tfra] [--no-probe] \
        > results.json

Starts one redis-server (tests/redis_server.py: free 127.0.0.1 port, no persistence, killed by
pid at the end) and writes one TFRA Redis JSON config for it (host, port, standalone mode, 10 s
socket timeout). Each side makes its tables with
`de.get_variable(name, dim=..., kv_creator=de.RedisTableCreator(de.RedisTableConfig(path)))`
("redis") or with its default creator ("memory"): dualemb.tf in this interpreter, TFRA in a
subprocess in its virtualenv (benchmarks/tfra_worker.py; compare_tfra.ensure_tfra_python creates
the venv when missing). Both run tfra_worker.KvRunner, so the table code and the timing loop
(tfra_worker.time_table_ops) are the same; the keys and values are the same too (same seeds).

For each dim and batch: upsert (overwrite `batch` preloaded keys) and lookup (`batch` preloaded
keys), --rounds rounds in which the four columns (dualemb.tf/TFRA x redis/memory) run back to back,
the order reversed every other round; keys/s = batch / median seconds over all iterations of all
rounds. Ratios: dualemb over TFRA per backend, and Redis over memory per side.

Then (unless --no-probe), TFRA's behaviour with the server paused (SIGSTOP), which the Redis issue
describes: each side looks up 64 stored keys of its Redis table while the server is stopped (the
error text, or whether the rows came back stored or default), and again after SIGCONT. A watchdog
resumes the server after --probe-watchdog seconds, so a client that never times out cannot hang
the run. The load average (os.getloadavg) is recorded before and after: the host is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import tfra_worker as W  # noqa: E402
from compare_tfra import LocalSide, TfraWorker, ensure_tfra_python, iters_for, log  # noqa: E402
from redis_server import RedisServer  # noqa: E402

WORKLOADS = ("upsert", "lookup")
BACKENDS = ("redis", "memory")


class DualembKvSide:
    """dualemb.tf's side: the same KvRunner as TfraSide.kv in the worker, on dualemb.tf."""

    def __init__(self):
        import tensorflow as tf
        import dualemb.tf as de
        self.tf, self.de = tf, de

    def kv(self, action: str, **kw):
        if action == "init":
            self.kv_runner = W.KvRunner(self.tf, self.de, **kw)
            return {}
        return self.kv_runner.call(action, **kw)


def one_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:2000]


def start_tfra(args, tmp: str, errors: dict):
    """The TFRA worker, or None with the reason in errors["tfra"]."""
    log_path = os.path.join(tmp, "tfra_worker.log")
    worker = None
    try:
        python = ensure_tfra_python(args.tfra_python, args.tfra_venv)
        worker = TfraWorker(python, log_path)
        info = worker.call("info")
        info["python"] = python
        return worker, info
    except Exception as e:  # noqa: BLE001 (recorded: why TFRA cannot run here)
        errors["tfra"] = one_line(e)
        if worker is not None:
            worker.proc.kill()
            worker.proc.wait(timeout=60)
            worker.log.close()
        if os.path.exists(log_path):  # the import error, if TFRA failed to load
            with open(log_path, errors="replace") as f:
                tail = [x for x in f.read().splitlines() if x.strip()][-5:]
            errors["tfra_log_tail"] = "\n".join(tail)
        log("[tfra]", errors["tfra"], errors.get("tfra_log_tail", ""))
        return None, None


def summarize(samples: dict, size: int) -> dict:
    out = {}
    for col, times in samples.items():
        med = statistics.median(times)
        out[col] = {"median_s": med, "min_s": min(times), "n": len(times),
                    "keys_per_s": size / med}
    ratios = {}
    for backend in BACKENDS:
        d, t = out.get(f"dualemb.tf/{backend}"), out.get(f"tfra/{backend}")
        if d and t:
            ratios[f"dualemb_over_tfra_{backend}"] = d["keys_per_s"] / t["keys_per_s"]
    for side in ("dualemb.tf", "tfra"):
        r, m = out.get(f"{side}/redis"), out.get(f"{side}/memory")
        if r and m:
            ratios[f"{side}_redis_over_memory"] = r["keys_per_s"] / m["keys_per_s"]
    out["ratios"] = ratios
    return out


def probe_paused(server: RedisServer, sides: dict, dim: int, watchdog_s: float) -> dict:
    """Each side's lookup of stored keys with the server stopped, then after it is resumed."""
    out = {}
    for name, side in sides.items():
        res = {"before_pause": side.call("kv", action="snapshot", dim=dim)}
        server.pause()
        timer = threading.Timer(watchdog_s, server.resume)  # never leave the run hung
        timer.start()
        try:
            res["paused"] = side.call("kv", action="probe", dim=dim)
        except Exception as e:  # noqa: BLE001 (a crashed worker is a finding, not a bench bug)
            res["paused"] = {"side_failed": one_line(e)}
        finally:
            timer.cancel()
            server.resume()
        res["watchdog_fired"] = res["paused"].get("seconds", 0) >= watchdog_s
        try:
            res["after_resume"] = side.call("kv", action="probe", dim=dim)
        except Exception as e:  # noqa: BLE001
            res["after_resume"] = {"side_failed": one_line(e)}
        out[name] = res
        log(f"[probe] {name}: {res}")
    return out


def run(args) -> dict:
    tmp = tempfile.mkdtemp(prefix="dualemb_bench_redis_")
    errors, notes = {}, []
    result = {"config": vars(args), "errors": errors, "notes": notes,
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "load_avg_before": os.getloadavg()}}
    server = RedisServer()
    worker = None
    try:
        result["redis_server"] = server.cli("INFO", "server").split("redis_version:")[1].split()[0]
        cfg_path = os.path.join(tmp, "redis.json")
        with open(cfg_path, "w") as f:
            json.dump({"redis_connection_mode": 2, "redis_host_ip": ["127.0.0.1"],
                       "redis_host_port": [server.port], "redis_socket_timeout": 10000}, f)
        sides = {"dualemb.tf": LocalSide(DualembKvSide())}
        if not args.no_tfra:
            worker, result["tfra"] = start_tfra(args, tmp, errors)
            if worker is not None:
                sides["tfra"] = worker
        for name, side in sides.items():
            side.call("kv", action="init", redis_config_path=cfg_path,
                      prefix=name.replace(".", "_") + "_bench")
        result["setup"], result["timings"], result["probe"] = {}, {}, {}
        for dim in args.dims:
            cols = {}
            for name, side in sides.items():
                for backend in BACKENDS:
                    col = f"{name}/{backend}"
                    try:
                        res = side.call("kv", action="setup", backend=backend, dim=dim,
                                        n=args.rows, seed=dim)
                    except Exception as e:  # noqa: BLE001 (e.g. TFRA's RedisTable fails here)
                        errors[f"{col}/d{dim}"] = one_line(e)
                        log(f"[setup] {col} dim {dim} failed: {errors[f'{col}/d{dim}']}")
                        continue
                    if res["size"] != args.rows:
                        notes.append(f"{col} dim {dim}: size() {res['size']} after preloading "
                                     f"{args.rows} keys")
                    result["setup"][f"{col}/d{dim}"] = res
                    cols[col] = side
                    log(f"[setup] {col} dim {dim}: {res}")
            for workload in WORKLOADS:
                for size in args.batches:
                    iters = iters_for(size, args.budget_keys)
                    samples = {c: [] for c in cols}
                    for r in range(args.rounds):
                        order = list(cols) if r % 2 == 0 else list(reversed(cols))
                        for col in order:
                            side_name, backend = col.split("/")
                            samples[col] += cols[col].call(
                                "kv", action="time", backend=backend,
                                workload="upsert" if workload == "upsert" else "lookup_present",
                                dim=dim, size=size, n_present=args.rows, iters=iters,
                                seed=dim * 7 + size % 97)
                    cell = f"{workload}/d{dim}/b{size}"
                    result["timings"][cell] = summarize(samples, size)
                    log(f"[{cell}] " + ", ".join(
                        f"{c} {v['keys_per_s'] / 1e3:,.0f} k/s"
                        for c, v in result["timings"][cell].items() if c != "ratios"))
            if not args.no_probe and dim == args.dims[-1]:
                redis_sides = {n: s for n, s in sides.items() if f"{n}/redis" in cols}
                result["probe"] = {"dim": dim, "sides": probe_paused(
                    server, redis_sides, dim, args.probe_watchdog)}
            for name, side in sides.items():
                side.call("kv", action="drop", dim=dim)
    finally:
        if worker is not None:
            worker.close()
        server.cleanup()
        result["machine"]["load_avg_after"] = os.getloadavg()
        if errors:  # the TFRA worker's log may say more than the one-line error
            result["tfra_worker_log"] = os.path.join(tmp, "tfra_worker.log")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return result


def markdown(res: dict) -> str:
    m = res["machine"]
    tfra = res.get("tfra") or {}
    lines = [f"redis-server {res.get('redis_server', '?')}, {res['config']['rows']:,} preloaded "
             f"keys per table, {res['config']['rounds']} alternating rounds; TFRA "
             f"{tfra.get('tfra_version', '-')} (TF {tfra.get('tf_version', '-')}). keys/s = batch"
             " / median seconds per call.", "",
             "| op | dim | batch | dualemb.tf Redis | TFRA Redis | dualemb/TFRA (Redis) | "
             "dualemb.tf memory | TFRA memory | dualemb/TFRA (memory) |",
             "|---|---|---|---|---|---|---|---|---|"]

    def ks(v):
        if v is None:
            return "-"
        k = v["keys_per_s"]
        return f"{k / 1e6:.2f} M/s" if k >= 1e6 else f"{k / 1e3:.0f} k/s"

    def ratio(x):
        return "-" if x is None else f"{x:.2f}x"

    for cell, v in res["timings"].items():
        w, d, b = cell.split("/")
        r = v["ratios"]
        lines.append(f"| {w} | {d[1:]} | {int(b[1:]):,} | {ks(v.get('dualemb.tf/redis'))} | "
                     f"{ks(v.get('tfra/redis'))} | {ratio(r.get('dualemb_over_tfra_redis'))} | "
                     f"{ks(v.get('dualemb.tf/memory'))} | {ks(v.get('tfra/memory'))} | "
                     f"{ratio(r.get('dualemb_over_tfra_memory'))} |")
    for k, e in res["errors"].items():
        lines.append(f"\n- {k}: {e}")
    for n in res["notes"]:
        lines.append(f"\n- {n}")
    la0, la1 = m["load_avg_before"], m["load_avg_after"]
    lines += ["", f"Load average (1/5/15 min) before {la0[0]:.2f}/{la0[1]:.2f}/{la0[2]:.2f}, after "
              f"{la1[0]:.2f}/{la1[1]:.2f}/{la1[2]:.2f}, {m['cpus']} CPUs."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tfra-python", default="/work/tfra-venv/bin/python")
    ap.add_argument("--tfra-venv", default="/work/tfra-venv")
    ap.add_argument("--no-tfra", action="store_true", help="dualemb columns only")
    ap.add_argument("--rows", type=int, default=200_000, help="preloaded keys per table")
    ap.add_argument("--dims", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--batches", type=int, nargs="+", default=[4096, 65536])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--budget-keys", type=float, default=5e5,
                    help="keys per column per round (iterations = budget / batch, 3..50)")
    ap.add_argument("--no-probe", action="store_true", help="skip the paused-server lookups")
    ap.add_argument("--probe-watchdog", type=float, default=30.0,
                    help="seconds after which a paused server is resumed regardless")
    ap.add_argument("--markdown", default=None, help="also write the markdown table here")
    args = ap.parse_args()
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

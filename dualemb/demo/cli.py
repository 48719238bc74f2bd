"""``python -m dualemb.demo`` / ``dualemb-demo``: train a DLRM-style model across frameworks.

Leg 1 trains in TF (Keras ``model.fit``) and saves a checkpoint in the common format (tables with
optimizer slots, dense weights, the Adam slots of the dense weights, the step). Leg 2 loads it
into the same model written in JAX/Flax, checks that its held-out predictions equal TF's, trains
on and saves; leg 3 loads that into a fresh Keras model, checks predictions again and trains on.
The reference run is leg 1's model continued in TF without leaving it. ``--framework tf`` or
``jax`` runs all three legs (and the reference) in that one framework, still through checkpoints.
See docs/demo.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

PROG = "dualemb-demo"
PARITY_TOLERANCE = 1e-5  # max |p_before - p_after| of held-out click probabilities at a hand-off
LEGS = {"both": ("tf", "jax", "tf"), "tf": ("tf", "tf", "tf"), "jax": ("jax", "jax", "jax")}
DEFAULTS = {"framework": "both", "steps": 200, "batch_size": 2048, "features": 8, "dim": 16,
            "seed": 0, "out": "dualemb-demo-out"}


class UsageError(Exception):
    """A bad command-line option (reported on one line, exit status 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=(
        "Train a DLRM-style model with dynamic embeddings in TensorFlow (Keras model.fit), move "
        "it to JAX/Flax through dualemb's common checkpoint format, train on, move it back and "
        "train again; compare with a run that never left TensorFlow."))
    p.add_argument("--framework", choices=tuple(LEGS), default=DEFAULTS["framework"],
                   help="legs TF -> JAX -> TF (both, the default), or all three in one framework")
    p.add_argument("--steps", default=DEFAULTS["steps"], metavar="N",
                   help=f"training steps per leg (default {DEFAULTS['steps']})")
    p.add_argument("--batch-size", default=DEFAULTS["batch_size"], metavar="B",
                   help=f"examples per step (default {DEFAULTS['batch_size']})")
    p.add_argument("--features", default=DEFAULTS["features"], metavar="F",
                   help=f"sparse features, one dynamic table each, 1-64 (default "
                        f"{DEFAULTS['features']})")
    p.add_argument("--dim", default=DEFAULTS["dim"], metavar="D",
                   help=f"embedding dimension (default {DEFAULTS['dim']})")
    p.add_argument("--seed", default=DEFAULTS["seed"], metavar="S",
                   help="seed of the data, the initial rows and the dense weights (default 0)")
    p.add_argument("--out", default=DEFAULTS["out"], metavar="DIR",
                   help=f"output directory: checkpoints, losses.png, summary.json (default "
                        f"./{DEFAULTS['out']})")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def _int(name: str, text, lo: int, hi: int | None = None) -> int:
    try:
        value = int(str(text), 10)
    except ValueError:
        raise UsageError(f"{name} must be an integer, got {text!r}") from None
    if value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise UsageError(f"{name} must be {rng}, got {value}")
    return value


def parse_args(argv=None):
    """(DemoConfig, framework, out dir, verbose) from the command line; UsageError if bad."""
    args = build_parser().parse_args(argv)
    steps = _int("--steps", args.steps, 1, 1_000_000)
    batch = _int("--batch-size", args.batch_size, 1, 1 << 20)
    features = _int("--features", args.features, 1, 64)
    dim = _int("--dim", args.dim, 1, 4096)
    seed = _int("--seed", args.seed, 0, (1 << 31) - 1)
    out = os.path.abspath(os.path.expanduser(args.out))
    if os.path.lexists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {args.out!r} exists and is not a directory")
    parent = out
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UsageError(f"--out {args.out!r}: {parent!r} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--out {args.out!r}: {parent!r} is not writable")
    from dualemb.demo.config import DemoConfig
    cfg = DemoConfig(features=features, dim=dim, batch_size=batch, steps=steps, seed=seed)
    return cfg, args.framework, out, not args.quiet


def _runner_class(framework: str):
    if framework == "tf":
        from dualemb.demo.tf_side import TFRunner
        return TFRunner
    from dualemb.demo.jax_side import JaxRunner
    return JaxRunner


def _say(text: str = "") -> None:
    print(text, flush=True)


def _fmt_rate(x: float) -> str:
    return "-" if not np.isfinite(x) else f"{x:,.0f}"


def run(cfg, framework: str, out: str, verbose: bool = True) -> dict:
    """The demo; returns the summary it also writes to ``<out>/summary.json``."""
    from dualemb.demo.config import sigmoid
    from dualemb.demo.data import auc

    t_start = time.perf_counter()
    legs_fw = LEGS[framework]
    n = cfg.steps
    os.makedirs(out, exist_ok=True)
    ids, dense, labels, planted = cfg.held_out()
    ceiling = auc(labels, planted)
    _say(f"dualemb demo: {' -> '.join(f.upper() for f in legs_fw)}, {n} steps per leg, batch "
         f"{cfg.batch_size}, {cfg.features} features x dim {cfg.dim}, seed {cfg.seed}")
    _say(f"held-out: days {', '.join(map(str, cfg.held_out_days))} ({len(labels):,} examples, "
         f"{labels.mean():.1%} clicks); the planted model's AUC there is {ceiling:.4f}")
    for fw in dict.fromkeys(legs_fw):  # import the frameworks up front (not timed as a load)
        _runner_class(fw)
    meta = {"demo": {"features": cfg.features, "dim": cfg.dim, "batch_size": cfg.batch_size,
                     "seed": cfg.seed, "learning_rate": cfg.learning_rate,
                     "hidden": list(cfg.hidden), "num_dense": cfg.num_dense}}

    legs: list[dict] = []
    handoffs: list[dict] = []
    runner = None
    first = None
    prev_probs = None
    for k, fw in enumerate(legs_fw):
        start, stop = k * n, (k + 1) * n
        cls = _runner_class(fw)
        _say()
        if k == 0:
            _say(f"[leg 1] {fw.upper()}: a fresh model, steps {start}-{stop}")
            runner = first = cls(cfg)
        else:
            src = legs[-1]
            _say(f"[leg {k + 1}] {fw.upper()}: loading {src['checkpoint']} (written by "
                 f"{src['framework'].upper()})")
            t0 = time.perf_counter()
            runner = cls.load(cfg, src["checkpoint"])
            t_load = time.perf_counter() - t0
            probs = sigmoid(runner.predict_logits(ids, dense))
            diff = float(np.max(np.abs(probs - prev_probs)))
            ok = diff <= PARITY_TOLERANCE
            handoffs.append({"step": start, "from": src["framework"], "to": fw,
                             "max_abs_diff": diff, "ok": ok, "load_seconds": t_load})
            _say(f"  loaded in {t_load:.2f}s at step {runner.step}; held-out predictions "
                 f"{src['framework'].upper()} vs {fw.upper()}: max abs diff {diff:.3g} "
                 f"({'OK' if ok else 'MISMATCH'}, tolerance {PARITY_TOLERANCE:g})")
        t0 = time.perf_counter()
        losses, rate = runner.train(start, stop, verbose=int(verbose))
        t_train = time.perf_counter() - t0
        logits = runner.predict_logits(ids, dense)
        prev_probs = sigmoid(logits)
        leg_auc = auc(labels, logits)
        rows = runner.table_rows()
        path = os.path.join(out, f"leg{k + 1}-{fw}")
        t0 = time.perf_counter()
        runner.save(path, {**meta, "leg": k + 1, "global_step": stop})
        t_save = time.perf_counter() - t0
        legs.append({"leg": k + 1, "framework": fw, "start": start, "stop": stop,
                     "losses": losses, "examples_per_second": rate, "auc": leg_auc,
                     "table_rows": rows, "checkpoint": path, "train_seconds": t_train,
                     "save_seconds": t_save})
        if runner is not first:
            runner.close()  # its checkpoint and predictions are all the next legs need
        _say(f"  loss {np.mean(losses[:10]):.4f} (first 10) -> {np.mean(losses[-10:]):.4f} "
             f"(last 10); held-out AUC {leg_auc:.4f}; {_fmt_rate(rate)} examples/s; "
             f"{rows:,} table rows; saved {path} in {t_save:.2f}s")

    _say()
    total = len(legs_fw) * n
    _say(f"[reference] {legs_fw[0].upper()}: leg 1's model continued without leaving "
         f"{legs_fw[0].upper()}, steps {n}-{total}")
    more, ref_rate = first.train(n, total, verbose=int(verbose))
    ref_losses = legs[0]["losses"] + more
    ref_logits = first.predict_logits(ids, dense)
    reference = {"framework": legs_fw[0], "start": 0, "losses": ref_losses,
                 "examples_per_second": ref_rate, "auc": auc(labels, ref_logits),
                 "table_rows": first.table_rows()}
    for leg in legs:
        ref = np.asarray(ref_losses[leg["start"]:leg["stop"]], np.float64)
        leg["max_abs_loss_diff_vs_reference"] = float(
            np.max(np.abs(np.asarray(leg["losses"], np.float64) - ref)))
    final = np.abs(sigmoid(ref_logits) - prev_probs)
    reference["final_prediction_max_abs_diff"] = float(final.max())
    reference["final_prediction_mean_abs_diff"] = float(final.mean())

    png = os.path.join(out, "losses.png")
    from dualemb.demo.plot import plot_losses
    plot_losses(png, legs, reference,
                f"dualemb demo: {' -> '.join(f.upper() for f in legs_fw)} vs reference "
                f"({cfg.features} features, dim {cfg.dim}, batch {cfg.batch_size})")
    elapsed = time.perf_counter() - t_start
    summary = {"config": meta["demo"], "framework": framework, "steps_per_leg": n,
               "planted_auc": ceiling, "legs": legs, "handoffs": handoffs,
               "reference": reference, "plot": png, "seconds": elapsed,
               "parity_tolerance": PARITY_TOLERANCE,
               "ok": all(h["ok"] for h in handoffs)}
    _print_summary(summary)
    tmp = os.path.join(out, ".summary.json.tmp")
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(tmp, os.path.join(out, "summary.json"))
    return summary


def _print_summary(s: dict) -> None:
    head = ("run", "steps", "loss first10 -> last10", "AUC", "examples/s", "table rows",
            "max|dloss| vs ref")
    rows = []
    for leg in s["legs"]:
        l = leg["losses"]
        rows.append((f"leg {leg['leg']} {leg['framework'].upper()}",
                     f"{leg['start']}-{leg['stop']}",
                     f"{np.mean(l[:10]):.4f} -> {np.mean(l[-10:]):.4f}", f"{leg['auc']:.4f}",
                     _fmt_rate(leg["examples_per_second"]), f"{leg['table_rows']:,}",
                     f"{leg['max_abs_loss_diff_vs_reference']:.2e}"))
    r = s["reference"]
    l = r["losses"]
    rows.append((f"reference {r['framework'].upper()}", f"0-{len(l)}",
                 f"{np.mean(l[:10]):.4f} -> {np.mean(l[-10:]):.4f}", f"{r['auc']:.4f}",
                 _fmt_rate(r["examples_per_second"]), f"{r['table_rows']:,}", "-"))
    widths = [max(len(str(x[i])) for x in [head] + rows) for i in range(len(head))]
    line = "  ".join("{:<%d}" % w for w in widths)
    _say()
    _say("summary")
    _say(line.format(*head))
    _say(line.format(*("-" * w for w in widths)))
    for row in rows:
        _say(line.format(*row))
    _say()
    for h in s["handoffs"]:
        _say(f"hand-off at step {h['step']}, {h['from'].upper()} -> {h['to'].upper()}: held-out "
             f"predictions max abs diff {h['max_abs_diff']:.3g} "
             f"({'OK' if h['ok'] else 'MISMATCH'}, <= {s['parity_tolerance']:g})")
    _say(f"final held-out predictions, leg 3 vs reference: max abs diff "
         f"{r['final_prediction_max_abs_diff']:.3g}, "
         f"mean {r['final_prediction_mean_abs_diff']:.3g}")
    if len({leg["framework"] for leg in s["legs"]}) > 1:
        _say("  (the state moves exactly: rows, slots, dense weights, Adam moments and step. What "
             "differs is float32 rounding: TF's and XLA's matmul kernels sum in different orders "
             "(~1e-7 per step) and Adam, which normalises each update, amplifies it over the "
             "steps. The same legs within one framework, --framework tf or jax, are "
             "bit-identical to the reference.)")
    _say(f"planted model's AUC (ceiling) {s['planted_auc']:.4f}; loss curves: {s['plot']}")
    _say(f"checkpoints: {', '.join(leg['checkpoint'] for leg in s['legs'])}")
    _say(f"total {s['seconds']:.1f}s")


def _quiet_frameworks() -> None:
    """Less start-up noise from TF and XLA (the user's own settings win)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None) -> int:
    try:
        cfg, framework, out, verbose = parse_args(argv)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    _quiet_frameworks()
    # A program may set the process's malloc (a library may not): both frameworks' steps
    # allocate their results afresh, and without this every step faults them in again
    # (dualemb/host_memory.py).
    from dualemb.host_memory import tune_malloc
    tune_malloc()
    from dualemb.core.checkpoint import CheckpointError
    try:
        summary = run(cfg, framework, out, verbose)
    except (CheckpointError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted. Checkpoints already written under {out} are complete "
              "(every save is atomic: an interrupted save leaves the previous checkpoint in "
              "place and no partial one).", file=sys.stderr)
        return 130
    if not summary["ok"]:
        print(f"{PROG}: error: predictions changed across a hand-off by more than "
              f"{PARITY_TOLERANCE:g}", file=sys.stderr)
        return 1
    return 0

"""Where the demo's JAX training step spends its time: fractions measured within one run.

The machine this runs on may be shared, so absolute numbers are not the point: every variant
below runs in the same process, interleaved round by round, and the JSON reports each variant's
time per step (minimum and median over rounds), its process CPU time per step (all threads:
the work done, robust to other load) and their ratios to the full step. Variants (all with the demo's model: F
features, dim 16, batch 2,048, Keras-Adam on the tables and the dense MLP):

* ``demo_runner``: ``dualemb.demo``'s own JAX loop (``JaxRunner.train``: it generates each
  batch and converts its ids inside the timed loop);
* ``full``: the same jitted step on batches generated beforehand (device arrays ready);
* ``data_gen`` / ``host_convert``: generating one batch (``cfg.train_batch``) / turning it into
  JAX operands (``dej.ids``, ``jnp.asarray``), outside any jit;
* ``no_apply``: the step without the tables' optimizer calls (lookups + dense part);
* ``dense_gather``: the embedding calls replaced by a plain gather from, and a scatter-add into,
  dense ``[V, dim]`` arrays of the same row shape (no hashing: the physical-limit proxy);
* ``dense_only``: no embedding at all (constant rows): the MLP, its gradient and Keras Adam;
* ``one_table``: the same keys in one table (one lookup, one optimizer call of F x B keys):
  the per-call overhead of F tables against one;
* ``lookups_only`` / ``applies_only``: F lookups / F optimizer calls alone in a jit;
* ``multi_table`` (when ``dualemb.jax.lookup_many`` exists): the step with one lookup call and
  one optimizer call for all tables;
* ``nnx_per_table`` / ``nnx_grouped`` / ``nnx_grouped_flat``: the demo's Flax NNX step
  (``JaxRunner``) with one call per table, with one call for all tables, and the latter through
  the flat-leaves step ``JaxRunner.train`` uses.

``demo_runner`` includes whatever ``JaxRunner.train`` does per step (batch preparation too).

Run: ``python benchmarks/profile_jax_step.py [--features 8] [--steps 20] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dualemb.jax as dej
from dualemb import interop
from dualemb.demo.config import ADAM_SPEC, DemoConfig


def _mlp_init(cfg, key):
    params = {}
    for name, fan_in, fan_out in cfg.layer_sizes:
        key, sub = jax.random.split(key)
        lim = np.sqrt(6.0 / (fan_in + fan_out))
        params[name] = {"kernel": jax.random.uniform(sub, (fan_in, fan_out), jnp.float32,
                                                     -lim, lim),
                        "bias": jnp.zeros((fan_out,), jnp.float32)}
    return params


def _mlp(cfg, params, rows, dense):
    x = jnp.concatenate(list(rows) + [dense], axis=1)
    names = [n for n, _, _ in cfg.layer_sizes]
    for name in names[:-1]:
        x = jax.nn.relu(x @ params[name]["kernel"] + params[name]["bias"])
    out = x @ params[names[-1]]["kernel"] + params[names[-1]]["bias"]
    return out


def _bce(labels, logits):
    return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, labels))


def _make_tables(cfg, n):
    opt = dej.optimizers.from_spec(ADAM_SPEC, cfg.learning_rate)
    return [dej.create(cfg.dim, initializer=cfg.initializer(f), optimizer=opt) for f in range(n)]


class Variants:
    """The jitted steps; each takes and returns (state, ...) so they can be chained."""

    def __init__(self, cfg: DemoConfig):
        self.cfg = cfg
        F, B, D = cfg.features, cfg.batch_size, cfg.dim
        self.tx = interop.keras_adam(cfg.learning_rate)
        self.params = _mlp_init(cfg, jax.random.PRNGKey(0))
        self.opt_state = self.tx.init(self.params)
        self.tables = _make_tables(cfg, F)
        self.one = _make_tables(cfg, 1)[0]
        self.vocab = 1 << 16
        self.dense_tables = [jnp.zeros((self.vocab, D), jnp.float32) for _ in range(F)]
        self.const_rows = [jnp.full((B, D), 0.01, jnp.float32) for _ in range(F)]
        self.multi = [dej.create(D, initializer=cfg.initializer(f),
                                 optimizer=dej.optimizers.from_spec(ADAM_SPEC, cfg.learning_rate))
                      for f in range(F)] if hasattr(dej, "lookup_many") else None

        tx = self.tx

        def dense_update(params, opt_state, grads):
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        def loss_rows(params, rows, dense, labels):
            return _bce(labels, _mlp(cfg, params, rows, dense))

        vg = jax.value_and_grad(loss_rows, argnums=(0, 1))

        def full(params, opt_state, tables, ids, dense, labels, apply=True):
            rows = [dej.lookup(t, ids[:, f]) for f, t in enumerate(tables)]
            loss, (gp, gr) = vg(params, rows, dense, labels)
            params, opt_state = dense_update(params, opt_state, gp)
            if apply:
                tables = [dej.apply_gradients(t, ids[:, f], g)
                          for f, (t, g) in enumerate(zip(tables, gr))]
            return params, opt_state, tables, loss

        def one_table(params, opt_state, table, ids, dense, labels):
            flat = ids.reshape(-1)  # [B * F] (Ids pairs reshape along the id axes)
            allrows = dej.lookup(table, flat).reshape(B, F, D)
            rows = [allrows[:, f] for f in range(F)]
            loss, (gp, gr) = vg(params, rows, dense, labels)
            params, opt_state = dense_update(params, opt_state, gp)
            g = jnp.stack(gr, axis=1).reshape(B * F, D)
            table = dej.apply_gradients(table, flat, g)
            return params, opt_state, table, loss

        def dense_gather(params, opt_state, embs, idx, dense, labels):
            rows = [jnp.take(e, idx[:, f], axis=0) for f, e in enumerate(embs)]
            loss, (gp, gr) = vg(params, rows, dense, labels)
            params, opt_state = dense_update(params, opt_state, gp)
            embs = [e.at[idx[:, f]].add(-cfg.learning_rate * g)
                    for f, (e, g) in enumerate(zip(embs, gr))]
            return params, opt_state, embs, loss

        def dense_only(params, opt_state, rows, dense, labels):
            loss, (gp, _) = vg(params, rows, dense, labels)
            params, opt_state = dense_update(params, opt_state, gp)
            return params, opt_state, loss

        def lookups_only(tables, ids):
            return [dej.lookup(t, ids[:, f]) for f, t in enumerate(tables)]

        def applies_only(tables, ids, grads):
            return [dej.apply_gradients(t, ids[:, f], grads[f]) for f, t in enumerate(tables)]

        def multi(params, opt_state, tables, ids, dense, labels):
            cols = [ids[:, f] for f in range(F)]
            rows = dej.lookup_many(tables, cols)
            loss, (gp, gr) = vg(params, rows, dense, labels)
            params, opt_state = dense_update(params, opt_state, gp)
            tables = dej.apply_gradients_many(tables, cols, gr)
            return params, opt_state, tables, loss

        self.j_full = jax.jit(full, donate_argnums=(0, 1))
        self.j_no_apply = jax.jit(lambda *a: full(*a, apply=False), donate_argnums=(0, 1))
        self.j_one = jax.jit(one_table, donate_argnums=(0, 1))
        self.j_gather = jax.jit(dense_gather, donate_argnums=(0, 1, 2))
        self.j_dense = jax.jit(dense_only, donate_argnums=(0, 1))
        self.j_lookups = jax.jit(lookups_only)
        self.j_applies = jax.jit(applies_only)
        self.j_multi = jax.jit(multi, donate_argnums=(0, 1))
        self.runners = _runners(cfg)

    # Each runner: n steps over the prepared batches; returns seconds per step.
    def run(self, name, batches, n):
        cfg = self.cfg
        p, o = self.params, self.opt_state
        t0 = time.perf_counter()
        c0 = time.process_time()
        out = None
        if name == "full":
            tables = self.tables
            for i in range(n):
                ids, dense, labels, _ = batches[i % len(batches)]
                p, o, tables, out = self.j_full(p, o, tables, ids, dense, labels)
            self.tables = tables
            jax.block_until_ready((out, [t.version for t in tables]))
        elif name == "no_apply":
            for i in range(n):
                ids, dense, labels, _ = batches[i % len(batches)]
                p, o, _, out = self.j_no_apply(p, o, self.tables, ids, dense, labels)
            jax.block_until_ready(out)
        elif name == "one_table":
            t = self.one
            for i in range(n):
                ids, dense, labels, _ = batches[i % len(batches)]
                p, o, t, out = self.j_one(p, o, t, ids, dense, labels)
            self.one = t
            jax.block_until_ready((out, t.version))
        elif name == "dense_gather":
            embs = self.dense_tables
            for i in range(n):
                _, dense, labels, idx = batches[i % len(batches)]
                p, o, embs, out = self.j_gather(p, o, embs, idx, dense, labels)
            self.dense_tables = embs
            jax.block_until_ready((out, embs))
        elif name == "dense_only":
            for i in range(n):
                _, dense, labels, _ = batches[i % len(batches)]
                p, o, out = self.j_dense(p, o, self.const_rows, dense, labels)
            jax.block_until_ready(out)
        elif name == "lookups_only":
            for i in range(n):
                ids = batches[i % len(batches)][0]
                out = self.j_lookups(self.tables, ids)
            jax.block_until_ready(out)
        elif name == "applies_only":
            tables = self.tables
            for i in range(n):
                ids = batches[i % len(batches)][0]
                tables = self.j_applies(tables, ids, self.const_rows)
            self.tables = tables
            jax.block_until_ready([t.version for t in tables])
        elif name == "multi_table":
            tables = self.multi
            for i in range(n):
                ids, dense, labels, _ = batches[i % len(batches)]
                p, o, tables, out = self.j_multi(p, o, tables, ids, dense, labels)
            self.multi = tables
            jax.block_until_ready((out, [t.version for t in tables]))
        elif name in ("nnx_per_table", "nnx_grouped"):
            r = self.runners[name]
            st, os_ = r.state, r.opt_state
            t0 = time.perf_counter()
            c0 = time.process_time()
            for i in range(n):
                ids, dense, labels, _ = batches[i % len(batches)]
                st, os_, out = r._train_step(st, os_, ids, dense, labels)
            jax.block_until_ready((out, st))
            r.state, r.opt_state = st, os_
        elif name == "nnx_grouped_flat":
            r = self.runners["nnx_grouped"]
            leaves, r._treedef = jax.tree_util.tree_flatten((r.state, r.opt_state))
            t0 = time.perf_counter()
            c0 = time.process_time()
            for i in range(n):
                ids, dense, labels, _ = batches[i % len(batches)]
                leaves, out = r._train_flat(leaves, ids, dense, labels)
            jax.block_until_ready((out, leaves))
            r.state, r.opt_state = jax.tree_util.tree_unflatten(r._treedef, leaves)
        elif name == "data_gen":
            for i in range(n):
                cfg.train_batch(1000 + i)
        elif name == "host_convert":
            raw = [cfg.train_batch(s) for s in range(2)]
            t0 = time.perf_counter()
            c0 = time.process_time()
            for i in range(n):
                ids, dense, labels = raw[i % 2]
                jax.block_until_ready((dej.ids(ids).halves, jnp.asarray(dense),
                                       jnp.asarray(labels)))
        else:
            raise ValueError(name)
        dt = (time.perf_counter() - t0) / n
        dc = (time.process_time() - c0) / n
        self.params, self.opt_state = p, o
        return dt, dc


def _runners(cfg):
    """The demo's JAX runner as it is (``FlaxDLRM``: one lookup call and one optimizer call for
    all the tables) and with one ``Embed`` call and one optimizer call per table."""
    from flax import nnx
    from dualemb.demo import jax_side
    import dualemb.jax.nnx as denn

    class PerTable(jax_side.JaxRunner):
        def _step(self, state, opt_state, ids, dense, labels):
            model = nnx.merge(self.graphdef, state)
            loss, grads, emb_grads = denn.value_and_grad(jax_side._loss)(model, ids, dense,
                                                                          labels)
            params = nnx.state(model, nnx.Param)
            updates, opt_state = self.tx.update(grads, opt_state, params)
            nnx.update(model, optax.apply_updates(params, updates))
            by_path = {"/".join(map(str, p)): m for p, m in nnx.iter_graph(model)
                       if isinstance(m, denn.Embed)}
            for key, [(ids_, g)] in emb_grads.items():
                by_path[key].apply_gradients(ids_, g)
            return nnx.state(model), opt_state, loss

    kw = {}
    if "grouped" in jax_side.FlaxDLRM.__init__.__code__.co_varnames:
        kw = {"grouped": False}
    out = {"nnx_per_table": PerTable(cfg, model=jax_side.FlaxDLRM(cfg, nnx.Rngs(cfg.seed), **kw))}
    if kw:
        out["nnx_grouped"] = jax_side.JaxRunner(cfg)
    if hasattr(jax_side.JaxRunner, "_step_flat"):
        out["nnx_grouped_flat"] = None  # nnx_grouped's runner, through its flat-leaves step
    return out


def _demo_runner_rate(cfg, steps):
    from dualemb.demo.jax_side import JaxRunner
    r = JaxRunner(cfg)
    try:
        _, rate = r.train(0, steps + 1, verbose=0)
    finally:
        r.close()
    return cfg.batch_size / rate  # seconds per step


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--features", type=int, default=8)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", default="", help="comma-separated variant names")
    ap.add_argument("--malloc", choices=("tuned", "default"), default="tuned",
                    help="tuned: dualemb.host_memory.tune_malloc() first, as the demo does "
                         "(both frameworks' steps stop faulting their result buffers in afresh)")
    args = ap.parse_args(argv)
    if args.malloc == "tuned":
        from dualemb.host_memory import tune_malloc
        tune_malloc()
    cfg = DemoConfig(features=args.features, batch_size=args.batch, dim=args.dim)
    v = Variants(cfg)
    batches = []
    for s in range(8):
        ids, dense, labels = cfg.train_batch(s)
        batches.append((dej.ids(ids), jnp.asarray(dense), jnp.asarray(labels),
                        jnp.asarray((ids % v.vocab).astype(np.int32))))
    names = ["full", "no_apply", "one_table", "dense_gather", "dense_only", "lookups_only",
             "applies_only", "data_gen", "host_convert"] + list(v.runners)
    if v.multi is not None:
        names.append("multi_table")
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    for name in names:  # compile + warm
        v.run(name, batches, 2)
    times = {n: [] for n in names}
    cpu = {n: [] for n in names}
    times["demo_runner"] = []
    for _ in range(args.rounds):
        for name in names:
            wall, c = v.run(name, batches, args.steps)
            times[name].append(wall)
            cpu[name].append(c)
        if not args.only or "demo_runner" in args.only:
            times["demo_runner"].append(_demo_runner_rate(cfg, args.steps))
    times = {k: t for k, t in times.items() if t}
    # The minimum over rounds: on a shared machine, the round least disturbed by other work.
    # Process CPU time (all threads) per step is the load-robust measure of work done.
    best = {k: min(t) for k, t in times.items()}
    base = best.get("full")
    cbase = min(cpu["full"]) if cpu.get("full") else None
    out = {"load_avg": os.getloadavg(), "malloc": args.malloc, "features": cfg.features, "batch": cfg.batch_size,
           "dim": cfg.dim, "steps": args.steps, "rounds": args.rounds,
           "ms_per_step_min": {k: round(1e3 * m, 3) for k, m in best.items()},
           "ms_per_step_median": {k: round(1e3 * statistics.median(t), 3)
                                  for k, t in times.items()},
           "cpu_ms_per_step_min": {k: round(1e3 * min(c), 3) for k, c in cpu.items() if c},
           "fraction_of_full": ({k: round(m / base, 3) for k, m in best.items()} if base else {}),
           "cpu_fraction_of_full": ({k: round(min(c) / cbase, 3) for k, c in cpu.items() if c}
                                    if cbase else {}),
           "examples_per_s": {k: round(cfg.batch_size / m) for k, m in best.items()}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

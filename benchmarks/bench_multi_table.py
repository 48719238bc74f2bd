"""Per-table against multi-table calls (issue 22); prints one JSON object.

Models (DLRM-style: one dynamic table per sparse feature, Zipf ids over 10^9 with new ids every
step, the rows concatenated with 4 dense features into an MLP 64-32-1, binary cross-entropy,
Keras' Adam on the tables (fused, in the core) and on the MLP (``dualemb.interop.keras_adam``)):

* ``demo``: 8 features, dim 16, batch 2,048 (``python -m dualemb.demo``'s model);
* ``criteo``: 26 features, dim 16, batch 4,096 (Criteo-like); ``criteo_dim64`` the same at
  dim 64, ``criteo_batch64k`` at batch 65,536 (its rounds run proportionally fewer steps, at
  least 3, so that every model's round trains about the same number of examples).

For each, in one process, rounds interleaved so that load drifts hit both alike:

* ``jax``: a jitted training step with one ``dej.lookup`` and one ``dej.apply_gradients`` per
  table (``per_table``) and with ``dej.lookup_many`` / ``dej.apply_gradients_many``
  (``multi_table``: one FFI call each for all the tables);
* ``core``: the core alone (no framework), a step's lookups and Adam updates of every table by
  per-table calls and by ``dualemb.core.find_many`` / ``apply_gradients_many``;
* ``tf_loop``: the same model in TensorFlow (``de.Variable`` per feature, a Keras MLP,
  ``DynamicEmbeddingOptimizer(Adam)``), a custom training step in ``tf.function``: one lookup op
  and one optimizer op per table (``per_table``) against one ``de.embedding_lookup_many`` and
  one multi-table optimizer op for all (``multi_table``);
* ``tf_fit``: ``model.fit`` of the model with one ``de.keras.layers.Embedding`` per feature
  (lookups one op per layer in both), the optimizer's step per table or in one op;
* ``jax_dense`` / ``tf_dense`` (not run unless named in ``--legs``): each framework's floor,
  the same step without tables: the MLP and its Adam on one fixed [batch, features x dim] input
  in place of the looked-up rows (same concatenation with the dense features, same loss). The
  ratio of the two floors is the part of a JAX/TF ratio that the frameworks' dense code makes.

Reported per row: examples/s (median and best round), process CPU ms per step (all threads),
and ``speedup`` = multi-table examples/s over per-table (median rounds). Run on an idle machine::

    python benchmarks/bench_multi_table.py [--quick] [--models demo,criteo] [--no-tf]
        [--legs jax,core,tf_loop,tf_fit]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dualemb.jax as dej
from dualemb import core, interop
from dualemb.core import optimizers as core_opts

MODELS = {"demo": dict(features=8, dim=16, batch=2048),
          "criteo": dict(features=26, dim=16, batch=4096),
          "criteo_dim64": dict(features=26, dim=64, batch=4096),
          "criteo_batch64k": dict(features=26, dim=16, batch=65536)}
LEGS = ("jax", "core", "tf_loop", "tf_fit")
DENSE_LEGS = ("jax_dense", "tf_dense")  # floors, run only when named
HIDDEN = (64, 32)
NUM_DENSE = 4
LR = 3e-3
ADAM_SPEC = {"name": "adam", "flavor": "keras", "beta_1": 0.9, "beta_2": 0.999,
             "epsilon": 1e-7, "amsgrad": False}


def _batches(features, batch, count, seed=0):
    """[(ids [B, F] int64, dense [B, 4], labels [B, 1])]: Zipf ids scattered over 10^9."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        ranks = np.minimum(rng.zipf(1.15, (batch, features)), 1 << 40).astype(np.uint64)
        ids = ((ranks * np.uint64(0x9E3779B97F4A7C15)
                + np.arange(features, dtype=np.uint64)) % np.uint64(10**9)).astype(np.int64)
        out.append((ids, rng.standard_normal((batch, NUM_DENSE)).astype(np.float32),
                    (rng.random((batch, 1)) < 0.3).astype(np.float32)))
    return out


def _mlp_params(features, dim, key):
    sizes = [features * dim + NUM_DENSE, *HIDDEN, 1]
    params = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        key, sub = jax.random.split(key)
        lim = np.sqrt(6.0 / (a + b))
        params.append({"kernel": jax.random.uniform(sub, (a, b), jnp.float32, -lim, lim),
                       "bias": jnp.zeros((b,), jnp.float32)})
    return params


def _loss(params, rows, dense, labels):
    x = jnp.concatenate(list(rows) + [dense], axis=1)
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["kernel"] + layer["bias"])
    logits = x @ params[-1]["kernel"] + params[-1]["bias"]
    return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, labels))


def _jax_steps(features):
    tx = interop.keras_adam(LR)
    vg = jax.value_and_grad(_loss, argnums=(0, 1))

    def dense_update(params, opt_state, grads):
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def per_table(params, opt_state, tables, ids, dense, labels):
        cols = [ids[:, f] for f in range(features)]
        rows = [dej.lookup(t, c) for t, c in zip(tables, cols)]
        loss, (gp, gr) = vg(params, rows, dense, labels)
        params, opt_state = dense_update(params, opt_state, gp)
        tables = [dej.apply_gradients(t, c, g) for t, c, g in zip(tables, cols, gr)]
        return params, opt_state, tables, loss

    def multi_table(params, opt_state, tables, ids, dense, labels):
        cols = [ids[:, f] for f in range(features)]
        rows = dej.lookup_many(tables, cols)
        loss, (gp, gr) = vg(params, rows, dense, labels)
        params, opt_state = dense_update(params, opt_state, gp)
        tables = dej.apply_gradients_many(tables, cols, gr)
        return params, opt_state, tables, loss

    return tx, {"per_table": jax.jit(per_table, donate_argnums=(0, 1)),
                "multi_table": jax.jit(multi_table, donate_argnums=(0, 1))}


def _bench_jax(m, batches, steps, rounds):
    features, dim, batch = m["features"], m["dim"], m["batch"]
    tx, steps_fn = _jax_steps(features)
    opt = dej.optimizers.from_spec(ADAM_SPEC, LR)
    state = {}
    for name in steps_fn:
        tables = [dej.create(dim, optimizer=opt,
                             initializer=dej.initializers.normal(0.0, 0.05, seed=f + 1))
                  for f in range(features)]
        params = _mlp_params(features, dim, jax.random.PRNGKey(0))
        state[name] = [params, tx.init(params), tables]
    ops = [(dej.ids(i), jnp.asarray(d), jnp.asarray(y)) for i, d, y in batches]

    def run(name, n, offset):
        p, o, t = state[name]
        for k in range(n):
            p, o, t, loss = steps_fn[name](p, o, t, *ops[(offset + k) % len(ops)])
        jax.block_until_ready((loss, [x.version for x in t]))
        state[name] = [p, o, t]

    for name in steps_fn:
        run(name, 2, 0)  # compile
    out = _rounds(run, list(steps_fn), steps, rounds, batch)
    for name in state:
        for t in state[name][2]:
            dej.destroy(t)
    return out


def _bench_jax_dense(m, batches, steps, rounds):
    """The JAX step's floor: the MLP on a fixed rows input, no tables (``jax_dense``)."""
    features, dim, batch = m["features"], m["dim"], m["batch"]
    tx = interop.keras_adam(LR)

    def step(params, opt_state, rows, dense, labels):
        loss, gp = jax.value_and_grad(_loss)(params, [rows], dense, labels)
        updates, opt_state = tx.update(gp, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    step = jax.jit(step, donate_argnums=(0, 1))
    rows = jnp.asarray(np.random.default_rng(1).standard_normal((batch, features * dim)),
                       jnp.float32)
    params = _mlp_params(features, dim, jax.random.PRNGKey(0))
    state = {"dense": [params, tx.init(params)]}
    ops = [(jnp.asarray(d), jnp.asarray(y)) for _, d, y in batches]

    def run(name, n, offset):
        p, o = state[name]
        for k in range(n):
            p, o, loss = step(p, o, rows, *ops[(offset + k) % len(ops)])
        jax.block_until_ready(loss)
        state[name] = [p, o]

    run("dense", 2, 0)  # compile
    return _rounds(run, ["dense"], steps, rounds, batch)


def _bench_core(m, batches, steps, rounds):
    features, dim, batch = m["features"], m["dim"], m["batch"]
    spec = core_opts.make("adam", beta_1=0.9, beta_2=0.999, epsilon=1e-7)
    tables = {name: [core.Table(dim, optimizer=spec) for _ in range(features)]
              for name in ("per_table", "multi_table")}
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal((batch, dim)).astype(np.float32) * 0.01
             for _ in range(features)]
    count = {"per_table": 0, "multi_table": 0}

    def run(name, n, offset):
        ts = tables[name]
        for k in range(n):
            ids = batches[(offset + k) % len(batches)][0]
            cols = [np.ascontiguousarray(ids[:, f]) for f in range(features)]
            count[name] += 1
            if name == "per_table":
                for t, c in zip(ts, cols):
                    t.find(c)
                for t, c, g in zip(ts, cols, grads):
                    t.apply_gradients(c, g, LR, count[name])
            else:
                core.find_many(ts, cols)
                core.apply_gradients_many(ts, cols, grads, LR, count[name])

    for name in tables:
        run(name, 2, 0)
    out = _rounds(run, list(tables), steps, rounds, batch)
    for ts in tables.values():
        for t in ts:
            t.destroy()
    return out


def _rounds(run, names, steps, rounds, batch):
    wall = {n: [] for n in names}
    cpu = {n: [] for n in names}
    offset = 2
    for _ in range(rounds):
        for name in names:
            c0, t0 = time.process_time(), time.perf_counter()
            run(name, steps, offset)
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
        offset += steps
    res = {n: {"examples_per_s_median": round(batch * steps / statistics.median(wall[n])),
               "examples_per_s_best": round(batch * steps / min(wall[n])),
               "cpu_ms_per_step": round(1e3 * statistics.median(cpu[n]) / steps, 3)}
           for n in names}
    if "multi_table" in res and "per_table" in res:
        res["speedup"] = round(res["multi_table"]["examples_per_s_median"]
                               / res["per_table"]["examples_per_s_median"], 3)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="few steps (a smoke run)")
    ap.add_argument("--models", default="demo,criteo",
                    help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--steps", type=int, default=None, help="steps per round")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--no-tf", action="store_true", help="leave out the TensorFlow rows")
    ap.add_argument("--legs", default=",".join(LEGS),
                    help="comma-separated legs to run (a leg alone in its own process, e.g. to "
                         "compare jax and tf_loop in alternating processes)")
    ap.add_argument("--malloc", choices=("tuned", "default"), default="tuned",
                    help="tuned: dualemb.host_memory.tune_malloc() first, as the demo does "
                         "(both frameworks' steps stop faulting their result buffers in afresh)")
    args = ap.parse_args(argv)
    if args.malloc == "tuned":
        from dualemb.host_memory import tune_malloc
        tune_malloc()
    steps = args.steps or (3 if args.quick else 30)
    rounds = args.rounds or (2 if args.quick else 5)
    out = {"benchmark": "multi_table", "load_avg_before": os.getloadavg(), "malloc": args.malloc,
           "cpu_count": os.cpu_count(), "machine": platform.processor() or platform.machine(),
           "jax": jax.__version__, "steps_per_round": steps, "rounds": rounds, "models": {}}
    legs = args.legs.split(",")
    unknown = sorted(set(legs) - set(LEGS) - set(DENSE_LEGS))
    if unknown:
        ap.error(f"unknown legs {unknown}: choose from {', '.join(LEGS + DENSE_LEGS)}")
    if args.no_tf:
        legs = [leg for leg in legs if not leg.startswith("tf_")]
    for name in args.models.split(","):
        m = MODELS[name]
        m_steps = max(3, steps * 4096 // max(m["batch"], 4096))
        batches = _batches(m["features"], m["batch"], 2 + m_steps * rounds)
        row = out["models"][name] = {**m, "steps_per_round": m_steps}
        if "jax" in legs:
            row["jax"] = _bench_jax(m, batches, m_steps, rounds)
        if "jax_dense" in legs:
            row["jax_dense"] = _bench_jax_dense(m, batches, m_steps, rounds)
        if "core" in legs:
            row["core"] = _bench_core(m, batches, m_steps, rounds)
        for mode in ("loop", "fit", "dense"):
            if "tf_" + mode in legs:
                import bench_multi_table_tf as tf_rows  # TensorFlow only when asked for
                out["tensorflow"] = tf_rows.versions()
                row["tf_" + mode] = tf_rows.bench(m, batches, m_steps, rounds, mode, _rounds,
                                                  hidden=HIDDEN, lr=LR)
    out["load_avg_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

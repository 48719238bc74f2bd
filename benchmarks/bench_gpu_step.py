"""A jitted JAX training step on a GPU: GPU tables against the host path and dense embeddings
(issue 20); prints and writes one JSON object.

The model: 8 sparse features, one dynamic table each (dim 64), Zipf ids scattered over 10^9 with
new ids every step, the rows concatenated into an MLP 512-64-1, binary cross-entropy, batch
65,536, Keras' Adam on tables and MLP. Three variants of the same step, each jitted, in one
process, rounds interleaved so that drifts hit all alike:

* ``gpu_tables``: ``dej.create(..., placement="gpu")``: the CUDA FFI handlers on XLA's stream;
* ``host_tables``: ``dej.create(...)`` (the default, host memory): on a GPU backend every table
  call is a host callback;
* ``dense_hashed``: no dynamic table: a dense ``[1M, 64]`` ``jnp`` array per feature indexed by
  ``id % 1M`` and trained with the same Adam on the whole array (what a JAX user does without a
  dynamic-embedding library).

Reported per variant: steps/s and examples/s (median of rounds), and ratios against
``gpu_tables``. Run on a GPU machine (tools/gpu/check.sh runs it with --quick)::

    python benchmarks/bench_gpu_step.py [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dualemb.jax as dej
from dualemb import interop

FEATURES, DIM, BATCH, HIDDEN, VOCAB = 8, 64, 65536, 64, 1 << 20
LR = 1e-3
ADAM_SPEC = {"name": "adam", "flavor": "keras", "beta_1": 0.9, "beta_2": 0.999,
             "epsilon": 1e-7, "amsgrad": False}


def _batches(count, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        ranks = np.minimum(rng.zipf(1.15, (BATCH, FEATURES)), 1 << 40).astype(np.uint64)
        ids = ((ranks * np.uint64(0x9E3779B97F4A7C15) + np.arange(FEATURES, dtype=np.uint64))
               % np.uint64(10**9)).astype(np.int64)
        out.append((ids, (rng.random((BATCH, 1)) < 0.3).astype(np.float32)))
    return out


def _mlp(key):
    k1, k2 = jax.random.split(key)
    a = FEATURES * DIM
    return [{"kernel": jax.random.normal(k1, (a, HIDDEN)) * (1 / np.sqrt(a)),
             "bias": jnp.zeros((HIDDEN,))},
            {"kernel": jax.random.normal(k2, (HIDDEN, 1)) * (1 / np.sqrt(HIDDEN)),
             "bias": jnp.zeros((1,))}]


def _loss(params, rows, labels):
    x = jnp.concatenate(list(rows), axis=1)
    x = jax.nn.relu(x @ params[0]["kernel"] + params[0]["bias"])
    logits = x @ params[1]["kernel"] + params[1]["bias"]
    return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, labels))


def _table_step(tx):
    vg = jax.value_and_grad(_loss, argnums=(0, 1))

    def step(params, opt_state, tables, ids, labels):
        cols = [ids[:, f] for f in range(FEATURES)]
        rows = [dej.lookup(t, c) for t, c in zip(tables, cols)]
        loss, (gp, gr) = vg(params, rows, labels)
        updates, opt_state = tx.update(gp, opt_state, params)
        params = optax.apply_updates(params, updates)
        tables = [dej.apply_gradients(t, c, g) for t, c, g in zip(tables, cols, gr)]
        return params, opt_state, tables, loss

    return jax.jit(step, donate_argnums=(0, 1))


def _dense_step(tx):
    def loss(params, embs, idx, labels):
        rows = [e[idx[:, f]] for f, e in enumerate(embs)]
        return _loss(params, rows, labels)

    vg = jax.value_and_grad(loss, argnums=(0, 1))

    def step(state, idx, labels):
        params, embs, opt_state = state
        loss_v, grads = vg(params, embs, idx, labels)
        updates, opt_state = tx.update(grads, opt_state, (params, embs))
        params, embs = optax.apply_updates((params, embs), updates)
        return (params, embs, opt_state), loss_v

    return jax.jit(step, donate_argnums=(0,))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="2 rounds of 3 steps")
    ap.add_argument("--out", default=None)
    ap.add_argument("--variants", default="gpu_tables,host_tables,dense_hashed")
    ap.add_argument("--smoke", action="store_true",
                    help="batch 512 and a 4,096-row dense vocabulary on any backend: checks the "
                         "script, measures nothing")
    args = ap.parse_args()
    global BATCH, VOCAB
    if args.smoke:
        BATCH, VOCAB = 512, 4096
    rounds, steps = (2, 3) if args.quick else (5, 20)
    variants = args.variants.split(",")
    result = {"backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
              "features": FEATURES, "dim": DIM, "batch": BATCH, "vocab_dense": VOCAB,
              "rounds": rounds, "steps_per_round": steps}
    if jax.default_backend() != "gpu" and not args.smoke:
        result["skipped"] = f"the JAX backend is {jax.default_backend()!r}, not 'gpu'"
        print(json.dumps(result))
        return 0
    tx = interop.keras_adam(LR)
    opt = dej.optimizers.from_spec(ADAM_SPEC, LR)
    data = _batches(4)
    state, fns, feeds = {}, {}, {}
    for v in variants:
        params = _mlp(jax.random.PRNGKey(0))
        if v == "dense_hashed":
            embs = [jax.random.normal(jax.random.PRNGKey(f + 1), (VOCAB, DIM)) * 0.05
                    for f in range(FEATURES)]
            state[v] = ((params, embs, tx.init((params, embs))),)
            fns[v] = _dense_step(tx)
            feeds[v] = [(jnp.asarray((i % VOCAB).astype(np.int32)), jnp.asarray(y))
                        for i, y in data]
        else:
            placement = "gpu" if v == "gpu_tables" else "host"
            tables = [dej.create(DIM, optimizer=opt, placement=placement,
                                 initializer=dej.initializers.normal(0.0, 0.05, seed=f + 1))
                      for f in range(FEATURES)]
            state[v] = (params, tx.init(params), tables)
            fns[v] = _table_step(tx)
            feeds[v] = [(dej.ids(i), jnp.asarray(y)) for i, y in data]

    def run(v, n, offset):
        s = state[v]
        for k in range(n):
            feed = feeds[v][(offset + k) % len(feeds[v])]
            if v == "dense_hashed":
                st, loss = fns[v](s[0], *feed)
                s = (st,)
            else:
                p, o, t, loss = fns[v](*s, *feed)
                s = (p, o, t)
        jax.block_until_ready((loss, s))
        state[v] = s

    times = {v: [] for v in variants}
    t_start = time.perf_counter()

    def progress(what):  # where the time goes, as it goes (a GPU run has a hard time limit)
        print(f"[{time.perf_counter() - t_start:7.1f}s] {what}", file=sys.stderr, flush=True)

    progress("set up: " + ", ".join(variants))
    for v in variants:
        t0 = time.perf_counter()
        run(v, 2, 0)  # compile and warm
        result[f"{v}_first_two_steps_s"] = time.perf_counter() - t0
        progress(f"{v}: first two steps (compile) {time.perf_counter() - t0:.2f}s")
    for r in range(rounds):
        for v in variants:
            t0 = time.perf_counter()
            run(v, steps, r)
            times[v].append((time.perf_counter() - t0) / steps)
            progress(f"{v}: round {r}: {times[v][-1] * 1e3:.1f} ms/step")
    rows = {}
    for v in variants:
        med = statistics.median(times[v])
        rows[v] = {"step_ms_median": med * 1e3, "step_ms_all": [t * 1e3 for t in times[v]],
                   "examples_per_s": BATCH / med}
    if "gpu_tables" in rows:
        g = rows["gpu_tables"]["examples_per_s"]
        for v in rows:
            rows[v]["gpu_tables_speedup_over_this"] = g / rows[v]["examples_per_s"]
    result["variants"] = rows
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    for v in variants:
        if v != "dense_hashed":
            for t in state[v][2]:
                dej.destroy(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())

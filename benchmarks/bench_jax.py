"""Benchmarks of dualemb.jax; prints one JSON object.

1. ``lookup``: a jitted ``dej.lookup`` of 4,096 ids (dim 16) against the core's Python path
   (``dualemb.core.Table.find``) on the same table: the added cost per call (target <= 15 us).
2. ``train``: a jitted training step — 8 sparse features, dim 16, Zipf ids over 10M, an MLP
   (128-64-1), batch 4,096, Adam — in examples/s, with dualemb tables (fused Adam in the core)
   and with the same model on a dense jnp embedding of a hashed 1M-row vocabulary (Optax Adam
   over the whole array, as a dense model does).

    python benchmarks/bench_jax.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dualemb.jax as dej

DIM = 16
BATCH = 4096
FEATURES = 8
ID_SPACE = 10_000_000
DENSE_VOCAB = 1_000_000
HIDDEN = (128, 64)


def _interleaved_medians_us(fns: dict, calls: int) -> dict:
    """Median per-call time of each function, calls interleaved so that load drifts (the
    machine is shared) hit all of them alike."""
    times = {k: [] for k in fns}
    for _ in range(calls):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: float(np.median(v) * 1e6) for k, v in times.items()}


def bench_lookup(quick: bool) -> dict:
    """Per-call cost of a jitted lookup vs the core's Python path, at several batch sizes."""
    rs = np.random.RandomState(0)
    table = dej.create(DIM, initializer=dej.initializers.normal(0, 0.01, seed=0))
    keys = rs.randint(0, 2**62, size=200_000).astype(np.int64)
    table = dej.insert(table, keys, rs.randn(len(keys), DIM).astype(np.float32))
    core = table.core()
    f = jax.jit(dej.lookup)
    # The floor of any jitted call (XLA dispatch), for reference.
    noop = jax.jit(lambda t: t.version)
    calls = 500 if quick else 3000
    out = {"dim": DIM, "table_rows": len(keys), "target_added_us_at_4096": 15.0, "batches": {}}
    for batch in (1, 1024, BATCH):
        ids_np = keys[rs.randint(0, len(keys), size=batch)]
        ids_dev = jax.device_put(dej.ids(ids_np))
        jax.block_until_ready((f(table, ids_dev), noop(table)))
        m = _interleaved_medians_us({
            "core": lambda: core.find(ids_np),
            "jit": lambda: jax.block_until_ready(f(table, ids_dev)),
            "noop": lambda: jax.block_until_ready(noop(table)),
        }, calls)
        out["batches"][str(batch)] = {
            "core_python_find_us": round(m["core"], 2), "jit_lookup_us": round(m["jit"], 2),
            "added_us": round(m["jit"] - m["core"], 2),
            "jit_dispatch_floor_us": round(m["noop"], 2)}
    dej.destroy(table)
    return out


# ---- training step -----------------------------------------------------------------------------

def _zipf_batches(n: int, seed: int = 0) -> np.ndarray:
    """[n, BATCH, FEATURES] int64 ids: Zipf(1.2) ranks over 10M ids, scrambled per feature."""
    rs = np.random.RandomState(seed)
    ranks = (rs.zipf(1.2, size=(n, BATCH, FEATURES)) % ID_SPACE).astype(np.int64)
    salt = np.arange(FEATURES, dtype=np.int64) * 1_000_003
    return (ranks * 2654435761 + salt) % ID_SPACE  # < 2**57: no overflow


def _mlp_init(key):
    sizes = (FEATURES * DIM,) + HIDDEN + (1,)
    params = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        k = jax.random.fold_in(key, i)
        params.append({"w": jax.random.normal(k, (a, b)) * np.sqrt(2.0 / a),
                       "b": jnp.zeros((b,))})
    return params


def _mlp(params, x):
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return (x @ params[-1]["w"] + params[-1]["b"]).squeeze(-1)


def _loss(params, rows, y):
    """rows [B, F, DIM] -> logistic loss."""
    logits = _mlp(params, rows.reshape(rows.shape[0], -1))
    return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, y))


def _labels(ids: np.ndarray) -> np.ndarray:
    return ((ids[..., 0] % 3) == 0).astype(np.float32)


def _time_steps(step, state, batches, labels, warmup: int, timed: int) -> tuple[float, object]:
    for i in range(warmup):
        state = step(state, batches[i % len(batches)], labels[i % len(labels)])
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    for i in range(timed):
        j = (warmup + i) % len(batches)
        state = step(state, batches[j], labels[j])
    jax.block_until_ready(state)
    return (time.perf_counter() - t0) / timed, state


def bench_train(quick: bool) -> dict:
    n_batches = 8 if quick else 24
    warmup, timed = (5, 10) if quick else (20, 40)
    ids = _zipf_batches(n_batches)
    labels = [jnp.asarray(_labels(b)) for b in ids]
    tx = optax.adam(1e-3)

    # dualemb: one table per feature, fused Adam in the core.
    tables = [dej.create(DIM, initializer=dej.initializers.normal(0, 0.01, seed=f),
                         optimizer=dej.optimizers.adam(1e-3)) for f in range(FEATURES)]
    params = _mlp_init(jax.random.PRNGKey(0))
    dev_ids = [[jax.device_put(dej.ids(b[:, f])) for f in range(FEATURES)] for b in ids]

    @jax.jit
    def de_step(state, batch_ids, y):
        tables, params, opt_state = state
        rows = jnp.stack([dej.lookup(t, i) for t, i in zip(tables, batch_ids)], axis=1)
        loss, (gp, gr) = jax.value_and_grad(_loss, argnums=(0, 1))(params, rows, y)
        updates, opt_state = tx.update(gp, opt_state, params)
        params = optax.apply_updates(params, updates)
        tables = [dej.apply_gradients(t, i, gr[:, f])
                  for f, (t, i) in enumerate(zip(tables, batch_ids))]
        return tables, params, opt_state

    de_s, (tables, _, _) = _time_steps(de_step, (tables, params, tx.init(params)), dev_ids,
                                       labels, warmup, timed)
    rows_after = sum(int(dej.size(t)) for t in tables)
    for t in tables:
        dej.destroy(t)

    # Dense baseline: ids hashed into one 1M-row jnp embedding, Optax Adam over everything.
    hashed = [jnp.asarray((b % DENSE_VOCAB).astype(np.int32)) for b in ids]
    emb = jax.random.normal(jax.random.PRNGKey(1), (DENSE_VOCAB, DIM)) * 0.01
    dense_params = {"emb": emb, "mlp": _mlp_init(jax.random.PRNGKey(0))}

    def dense_loss(p, idx, y):
        return _loss(p["mlp"], p["emb"][idx], y)

    @jax.jit
    def dense_step(state, idx, y):
        p, opt_state = state
        g = jax.grad(dense_loss)(p, idx, y)
        updates, opt_state = tx.update(g, opt_state, p)
        return optax.apply_updates(p, updates), opt_state

    dense_s, _ = _time_steps(dense_step, (dense_params, tx.init(dense_params)), hashed, labels,
                             warmup, timed)
    return {"batch": BATCH, "features": FEATURES, "dim": DIM, "id_space": ID_SPACE,
            "zipf_a": 1.2, "mlp": list(HIDDEN), "optimizer": "adam",
            "dualemb_step_ms": round(de_s * 1e3, 2),
            "dualemb_examples_per_s": round(BATCH / de_s),
            "dualemb_rows_after": rows_after,
            "dense_hashed_1M_step_ms": round(dense_s * 1e3, 2),
            "dense_hashed_1M_examples_per_s": round(BATCH / dense_s),
            "speedup_vs_dense": round(dense_s / de_s, 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--only", choices=("lookup", "train"), default=None)
    args = ap.parse_args()
    out = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                       "jax": jax.__version__, "backend": jax.default_backend()}}
    if args.only in (None, "lookup"):
        out["lookup"] = bench_lookup(args.quick)
    if args.only in (None, "train"):
        out["train"] = bench_train(args.quick)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

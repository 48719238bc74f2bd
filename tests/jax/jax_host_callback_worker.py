"""Worker of tests/jax/test_jax_host_callback.py: runs one fixed sequence of dualemb.jax operations
and saves every result to an .npz, so that a run on the FFI path and one on the host-callback
path (``DUALEMB_JAX_HOST_CALLBACK=0`` / ``=1``, set by the caller before the import) can be
compared bit for bit. Also records which lowering was chosen.

Run as ``python tests/jax/jax_host_callback_worker.py OUT.npz``.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dualemb.jax as dej
from dualemb.jax import _ffi

DIM = 4
VOCAB = np.array([3, 2**40 + 1, 17, -5, 2**50, 0, 99], np.int64)


def export_sorted(table, prefix, out):
    e = table.core().export(0, 10**6)
    order = np.argsort(e["keys"])
    for k in ("keys", "values", "slots", "update_count"):
        out[f"{prefix}.{k}"] = e[k][order]


def main(path):
    out = {"host_callback": np.asarray(_ffi.uses_host_callback())}
    rs = np.random.RandomState(0)
    init = dej.initializers.normal(0.0, 0.1, seed=5)

    # -- fused Adam under jit, with grad through the lookup's custom_vjp, several steps ------
    t = dej.create(DIM, initializer=init, optimizer=dej.optimizers.adam(0.05))
    w = jnp.asarray(rs.randn(DIM), jnp.float32)

    @jax.jit
    def step(t, ids, y):
        loss, g = jax.value_and_grad(
            lambda rows: jnp.mean((jnp.tanh(rows.sum(-2) @ w) - y) ** 2))(dej.lookup(t, ids))
        return dej.apply_gradients(t, ids, g), loss, g

    for s in range(5):
        ids = VOCAB[rs.randint(0, len(VOCAB), size=(6, 3))]  # repeated ids: sums in the core
        y = rs.randn(6).astype(np.float32)
        t, loss, g = step(t, dej.ids(ids), y)
        out[f"adam.loss{s}"], out[f"adam.grad{s}"] = np.asarray(loss), np.asarray(g)
    out["adam.step"] = np.asarray(t.step)
    out["adam.size"] = np.asarray(dej.size(t))
    export_sorted(t, "adam", out)
    keys, values, slots, count = jax.jit(
        lambda t: dej.export(t, 16, with_slots=True))(t)
    out.update({"export.keys": np.asarray(keys.numpy()), "export.values": np.asarray(values),
                "export.slots": np.asarray(slots), "export.count": np.asarray(count)})

    # -- vmap: lookup/find per example, and one update of the whole batch --------------------
    vids = dej.ids(VOCAB[rs.randint(0, len(VOCAB), size=(3, 4))])
    out["vmap.lookup"] = np.asarray(jax.jit(jax.vmap(lambda i: dej.lookup(t, i)))(vids))
    r, e = jax.vmap(lambda i: dej.find(t, i))(vids)
    out["vmap.find.rows"], out["vmap.find.exists"] = np.asarray(r), np.asarray(e)
    version = jax.vmap(lambda i, gg: dej.apply_gradients(t, i, gg).version)(
        vids, jnp.asarray(rs.randn(3, 4, DIM), jnp.float32))
    out["vmap.version"] = np.asarray(version)
    export_sorted(t, "vmap", out)

    # -- plain writes: find_or_insert, insert, accum, erase, in one jitted chain ---------------
    u = dej.create(DIM, initializer=init)

    @jax.jit
    def writes(u, a, b, ab, gone, rows, deltas, exists):
        r0, e0, u = dej.find_or_insert(u, a)
        u = dej.insert(u, b, rows)
        r1, e1 = dej.find(u, a)
        u = dej.accum(u, a, deltas, exists)
        u = dej.erase(u, gone)
        r2, e2 = dej.find(u, ab)
        return u, (r0, e0, r1, e1, r2, e2, dej.size(u))

    a = np.array([1, 2, 3, 2**45, 1], np.int64)
    b = np.array([2, 7, 8, -9], np.int64)
    u, res = writes(u, dej.ids(a), dej.ids(b[:2]), dej.ids(np.concatenate([a, b])),
                    dej.ids(np.array([2, 8, 2**45])),
                    rs.randn(2, DIM).astype(np.float32),
                    rs.randn(5, DIM).astype(np.float32),
                    np.array([True, False, True, False, True]))
    for i, x in enumerate(res):
        out[f"writes.{i}"] = np.asarray(x)
    export_sorted(u, "writes", out)

    # -- an int32 table and int32 ids ----------------------------------------------------------
    s32 = dej.create(DIM, key_dtype="int32", initializer=init, optimizer=dej.optimizers.adagrad(0.3))
    ids32 = jnp.asarray([4, -4, 4, 2**31 - 1], jnp.int32)
    for _ in range(2):
        s32 = jax.jit(dej.apply_gradients)(s32, ids32, jnp.ones((4, DIM)))
    out["int32.rows"] = np.asarray(dej.lookup(s32, ids32))
    export_sorted(s32, "int32", out)

    # -- the generic Optax path (unique, masked writes) ----------------------------------------
    gt = dej.create(DIM, initializer=init, optimizer=optax.adam(0.1))
    for s in range(3):
        ids = dej.ids(VOCAB[rs.randint(0, len(VOCAB), size=8)])
        gt = jax.jit(dej.apply_gradients)(gt, ids, jnp.asarray(rs.randn(8, DIM), jnp.float32))
    out["generic.rows"] = np.asarray(dej.lookup(gt, dej.ids(VOCAB)))

    np.savez(path, **out)


if __name__ == "__main__":
    main(sys.argv[1])

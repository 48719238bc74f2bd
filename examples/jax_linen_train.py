"""End-to-end: a Flax linen click-through model on dynamic embedding tables.

The linen counterpart of ``examples/jax_flax_train.py``: three sparse features with ids from
huge id spaces, one ``dualemb.jax.linen.Embed`` each (fused Adam in the dualemb core), an MLP on
top (Optax Adam), one ``jax.jit`` step. The tables live in the ``"dualemb"`` variable
collection beside ``"params"``. An Orbax ``CheckpointManager`` keeps the two best checkpoints by
eval loss; at the end the best one is restored into new tables and evaluated again.

    python examples/jax_linen_train.py [--steps 300] [--ckpt /tmp/dualemb_linen_example]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

import dualemb.jax as dej
from dualemb.jax import linen as deln
from dualemb.jax import orbax as deo

FEATURES = ("user", "item", "category")
DIM = 16


class CTRModel(nn.Module):
    """One dynamic table per feature; concatenated rows -> MLP -> logit."""

    @nn.compact
    def __call__(self, ids: dict) -> jax.Array:
        rows = [deln.Embed(DIM, initializer=dej.initializers.normal(0.0, 0.05, seed=i),
                           optimizer=dej.optimizers.adam(1e-2), name=name)(ids[name])
                for i, name in enumerate(FEATURES)]
        x = nn.relu(nn.Dense(64)(jnp.concatenate(rows, axis=-1)))
        return nn.Dense(1)(x).squeeze(-1)


model = CTRModel()
tx = optax.adam(1e-3)


def loss_fn(params, tables, ids: dict, labels: jax.Array) -> jax.Array:
    logits = model.apply({"params": params, "dualemb": tables}, ids)
    return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, labels))


@jax.jit
def train_step(params, tables, opt_state, ids: dict, labels: jax.Array):
    loss, grads, emb_grads = deln.value_and_grad(loss_fn)(params, tables, ids, labels)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)          # the MLP: Optax Adam
    tables = deln.apply_gradients(tables, emb_grads)       # the tables: fused Adam in the core
    return params, tables, opt_state, loss


eval_loss = jax.jit(loss_fn)


def make_data(rs: np.random.RandomState, n: int) -> tuple[dict, np.ndarray]:
    """Synthetic clicks: Zipf-distributed ids beyond int32; a hidden affinity decides the
    label."""
    users = rs.zipf(1.3, n) % 5000
    items = rs.zipf(1.3, n) % 2000
    cats = items % 17
    affinity = np.sin(users * 0.37) * np.cos(items * 0.11) + 0.3 * np.sin(cats)
    labels = (rs.rand(n) < 1 / (1 + np.exp(-3 * affinity))).astype(np.float32)
    ids = {"user": users.astype(np.int64) * 1_000_003 + (1 << 40),
           "item": items.astype(np.int64) * 7919 + (1 << 35),
           "category": cats.astype(np.int64)}
    # int64 ids -> dualemb Ids (uint32 pairs): jit does not truncate them in 32-bit mode.
    return {k: dej.ids(v) for k, v in ids.items()}, labels


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--ckpt", default=None)
    args = ap.parse_args()
    ckpt_dir = os.path.abspath(args.ckpt or tempfile.mkdtemp(prefix="dualemb_linen_"))
    shutil.rmtree(ckpt_dir, ignore_errors=True)

    rs = np.random.RandomState(0)
    eval_ids, eval_labels = make_data(np.random.RandomState(1), 4096)
    variables = model.init(jax.random.key(0), eval_ids)     # creates the three tables
    params, tables = variables["params"], variables["dualemb"]
    opt_state = tx.init(params)
    print(f"initial eval loss {float(eval_loss(params, tables, eval_ids, eval_labels)):.4f}")

    options = ocp.CheckpointManagerOptions(max_to_keep=2, best_fn=lambda m: m["eval_loss"],
                                           best_mode="min")
    evals = {}
    with ocp.CheckpointManager(ckpt_dir, options=options) as mngr:
        for step in range(1, args.steps + 1):
            ids, labels = make_data(rs, args.batch)
            params, tables, opt_state, loss = train_step(params, tables, opt_state, ids, labels)
            if step % 50 == 0 or step == args.steps:
                ev = evals[step] = float(eval_loss(params, tables, eval_ids, eval_labels))
                mngr.save(step, metrics={"eval_loss": ev}, args=ocp.args.Composite(
                    params=ocp.args.StandardSave(params),
                    tables=deo.TablesSave(deln.tables(tables))))
                sizes = {k: int(dej.size(t)) for k, t in deln.tables(tables).items()}
                print(f"step {step}: train loss {float(loss):.4f}, eval loss {ev:.4f}, "
                      f"table sizes {sizes}")
        mngr.wait_until_finished()
        best = mngr.best_step()
        print(f"kept steps {mngr.all_steps()}, best {best}")

        # Restore the best checkpoint into new tables (a fresh init): rows, slots and steps.
        fresh = model.init(jax.random.key(1), eval_ids)
        restored = mngr.restore(best, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(fresh["params"]),
            tables=deo.TablesRestore(deln.tables(fresh["dualemb"]))))
    restored_tables = deln.set_tables(fresh["dualemb"], restored.tables)
    again = float(eval_loss(restored.params, restored_tables, eval_ids, eval_labels))
    print(f"best checkpoint (step {best}) eval loss after restoring: {again:.4f}")
    assert best == min(evals, key=evals.get), (best, evals)
    assert abs(evals[best] - again) < 1e-5, (evals[best], again)
    for t in list(deln.tables(tables).values()) + list(deln.tables(restored_tables).values()):
        dej.destroy(t)
    print(f"checkpoints in {ckpt_dir}")


if __name__ == "__main__":
    main()

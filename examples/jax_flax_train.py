"""End-to-end: a Flax NNX click-through model on dynamic embedding tables.

Three sparse features (user, item, category) with ids drawn from huge id spaces (no vocabulary,
no hashing), an MLP on top; the tables train with fused Adam in the dualemb core, the MLP with
Optax Adam; the whole step is one ``nnx.jit``. Every few hundred steps an Orbax
``CheckpointManager`` saves the tables beside the dense parameters; at the end the model is
restored into a fresh process-like state and evaluated again.

    python examples/jax_flax_train.py [--steps 300] [--ckpt /tmp/dualemb_flax_example]

``--ckpt DIR`` starts from an empty DIR: the checkpoints of an earlier run of this example there
are deleted first (it says so); a DIR holding anything else is refused, untouched.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx

import dualemb.jax as dej
from dualemb.jax import nnx as denn
from dualemb.jax import orbax as deo

FEATURES = ("user", "item", "category")
DIM = 16


class CTRModel(nnx.Module):
    """One dynamic table per feature; concatenated rows -> MLP -> logit."""

    def __init__(self, rngs: nnx.Rngs):
        self.embeddings = nnx.Dict({
            name: denn.Embed(DIM, initializer=dej.initializers.normal(0.0, 0.05, seed=i),
                             optimizer=dej.optimizers.adam(1e-2), name=name)
            for i, name in enumerate(FEATURES)})
        self.hidden = nnx.Linear(DIM * len(FEATURES), 64, rngs=rngs)
        self.out = nnx.Linear(64, 1, rngs=rngs)

    def __call__(self, ids: dict) -> jax.Array:
        x = jnp.concatenate([self.embeddings[name](ids[name]) for name in FEATURES], axis=-1)
        return self.out(nnx.relu(self.hidden(x))).squeeze(-1)


def loss_fn(model: CTRModel, ids: dict, labels: jax.Array) -> jax.Array:
    return jnp.mean(optax.sigmoid_binary_cross_entropy(model(ids), labels))


@nnx.jit
def train_step(model: CTRModel, optimizer: nnx.Optimizer, ids: dict, labels: jax.Array):
    loss, grads, emb_grads = denn.value_and_grad(loss_fn)(model, ids, labels)
    optimizer.update(model, grads)                 # the MLP: Optax Adam
    denn.apply_gradients(model, emb_grads)         # the tables: fused Adam in the core
    return loss


@nnx.jit
def eval_loss(model: CTRModel, ids: dict, labels: jax.Array) -> jax.Array:
    return loss_fn(model, ids, labels)


def make_data(rs: np.random.RandomState, n: int) -> tuple[dict, np.ndarray]:
    """Synthetic clicks: Zipf-distributed ids over 2**40 (users) ... ; a hidden affinity
    decides the label."""
    users = rs.zipf(1.3, n) % 5000
    items = rs.zipf(1.3, n) % 2000
    cats = items % 17
    affinity = np.sin(users * 0.37) * np.cos(items * 0.11) + 0.3 * np.sin(cats)
    labels = (rs.rand(n) < 1 / (1 + np.exp(-3 * affinity))).astype(np.float32)
    ids = {"user": users.astype(np.int64) * 1_000_003 + (1 << 40),   # beyond int32
           "item": items.astype(np.int64) * 7919 + (1 << 35),
           "category": cats.astype(np.int64)}
    return ids, labels


def to_device(ids: dict) -> dict:
    """int64 ids -> dualemb Ids (uint32 pairs), so jit does not truncate them in 32-bit mode."""
    return {k: dej.ids(v) for k, v in ids.items()}


# What Orbax's CheckpointManager writes in its directory: one folder per saved step (and a
# temporary one while a save is running).
_STEP_DIR = re.compile(r"^\d+(\.orbax-checkpoint-tmp.*)?$")


def prepare_ckpt_dir(path: str) -> str:
    """Makes `path` ready for a new run: a missing or empty directory is used as it is; one
    holding only an earlier run's step folders is emptied (and says so); anything else is
    refused without touching it."""
    if os.path.isdir(path) and os.listdir(path):
        entries = sorted(os.listdir(path))
        foreign = [e for e in entries
                   if not (_STEP_DIR.match(e) and os.path.isdir(os.path.join(path, e)))]
        if foreign:
            sys.exit(f"--ckpt {path}: the directory is not empty and holds files that are not "
                     f"this example's checkpoints ({', '.join(foreign[:5])}"
                     f"{', ...' if len(foreign) > 5 else ''}); nothing was deleted. Pass a new "
                     "or empty directory.")
        print(f"--ckpt {path}: deleting the checkpoints of an earlier run (steps "
              f"{', '.join(entries)})")
        shutil.rmtree(path)
    elif os.path.exists(path) and not os.path.isdir(path):
        sys.exit(f"--ckpt {path}: exists and is not a directory")
    return path


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="--ckpt DIR: where the Orbax checkpoints go (default: a new temporary "
               "directory). An earlier run's checkpoints in DIR are deleted first; a DIR "
               "holding anything else is refused.")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--ckpt", default=None, metavar="DIR",
                    help="checkpoint directory: new, empty, or an earlier run's (deleted first)")
    args = ap.parse_args()
    ckpt_dir = prepare_ckpt_dir(args.ckpt) if args.ckpt else tempfile.mkdtemp(
        prefix="dualemb_flax_")

    rs = np.random.RandomState(0)
    model = CTRModel(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    eval_ids, eval_labels = make_data(np.random.RandomState(1), 4096)
    eval_ids = to_device(eval_ids)
    print(f"initial eval loss {float(eval_loss(model, eval_ids, eval_labels)):.4f}")

    options = ocp.CheckpointManagerOptions(max_to_keep=2)
    with ocp.CheckpointManager(os.path.abspath(ckpt_dir), options=options) as mngr:
        for step in range(1, args.steps + 1):
            ids, labels = make_data(rs, args.batch)
            loss = train_step(model, optimizer, to_device(ids), labels)
            if step % 100 == 0 or step == args.steps:
                tables = {k: e.table.get_value() for k, e in model.embeddings.items()}
                mngr.save(step, args=ocp.args.Composite(
                    params=ocp.args.StandardSave(nnx.state(model, nnx.Param)),
                    tables=deo.TablesSave(tables)))
                sizes = {k: int(dej.size(t)) for k, t in tables.items()}
                print(f"step {step}: train loss {float(loss):.4f}, "
                      f"eval loss {float(eval_loss(model, eval_ids, eval_labels)):.4f}, "
                      f"table sizes {sizes}")
        mngr.wait_until_finished()
        final = float(eval_loss(model, eval_ids, eval_labels))

        # Restore into a new model (new, empty tables): rows, slots, steps and the MLP.
        restored_model = CTRModel(nnx.Rngs(1))
        targets = {k: e.table.get_value() for k, e in restored_model.embeddings.items()}
        abstract = nnx.state(restored_model, nnx.Param)
        restored = mngr.restore(mngr.latest_step(), args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract), tables=deo.TablesRestore(targets)))
    nnx.update(restored_model, restored.params)
    for k, e in restored_model.embeddings.items():
        e.table.set_value(restored.tables[k])
    again = float(eval_loss(restored_model, eval_ids, eval_labels))
    print(f"final eval loss {final:.4f}; after restoring the checkpoint {again:.4f}")
    assert abs(final - again) < 1e-5, (final, again)
    print(f"checkpoints in {ckpt_dir}")


if __name__ == "__main__":
    main()

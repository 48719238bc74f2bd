"""The demo model in JAX / Flax (``flax.nnx``) with ``dualemb.jax``: the same architecture, loss
and optimizer definition as the Keras model of ``tf_side.py``."""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import dualemb.jax as dej
from dualemb.jax import nnx as denn
from dualemb import interop
from dualemb.core import checkpoint
from dualemb.demo.config import ADAM_SPEC, DemoConfig

FRAMEWORK = "jax"


class FlaxDLRM(nnx.Module):
    """The Keras model of ``tf_side.py`` in Flax NNX: one ``dualemb.jax.nnx.Embed`` per sparse
    feature (attributes ``feature_<f>``, the checkpoint's table names) and the MLP ``fc0`` (relu),
    ``fc1`` (relu), ``out`` over [embeddings, dense features]. The MLP's parameter names
    (``fc0/kernel`` ...) are the Keras model's weight names; kernels are [in, out] in both.

    ``tables``: existing ``dualemb.jax.Table`` handles to own (e.g. loaded from a checkpoint),
    else new tables are created with the demo's initializers and Keras-Adam fused optimizer.
    ``grouped``: look every feature up in one call (``dualemb.jax.nnx.lookup_many``; the same
    rows as one ``Embed`` call per feature, which ``grouped=False`` makes)."""

    def __init__(self, cfg: DemoConfig, rngs: nnx.Rngs, tables=None, grouped: bool = True):
        self.grouped = grouped
        self.table_names = list(cfg.table_names)
        self.hidden_names = [name for name, _, _ in cfg.layer_sizes[:-1]]
        for f, name in enumerate(self.table_names):
            table = None if tables is None else tables[f]
            setattr(self, name, denn.Embed(cfg.dim, table=table, initializer=cfg.initializer(f),
                                           optimizer=table_optimizer(cfg), name=name))
        for name, fan_in, fan_out in cfg.layer_sizes:
            setattr(self, name, nnx.Linear(fan_in, fan_out, rngs=rngs,
                                           kernel_init=nnx.initializers.glorot_uniform(),
                                           bias_init=nnx.initializers.zeros_init()))

    def __call__(self, ids, dense):
        """ids: [B, F] (a ``dualemb.jax.Ids`` for int64 ids), dense: [B, D] -> logits [B, 1]."""
        embeds = [getattr(self, name) for name in self.table_names]
        cols = [ids[:, f] for f in range(len(embeds))]
        if self.grouped:
            rows = denn.lookup_many(embeds, cols)
        else:
            rows = [e(c) for e, c in zip(embeds, cols)]
        x = jnp.concatenate(rows + [dense], axis=1)
        for name in self.hidden_names:
            x = nnx.relu(getattr(self, name)(x))
        return self.out(x)

    def tables(self) -> list:
        """The ``dualemb.jax.Table`` handles, in feature order."""
        return [getattr(self, name).table.get_value() for name in self.table_names]


def bce_from_logits(labels, logits):
    """Keras' ``BinaryCrossentropy(from_logits=True)`` on TensorFlow, op for op:
    ``tf.nn.sigmoid_cross_entropy_with_logits``, mean over the last axis, sum / batch size."""
    zeros = jnp.zeros_like(logits)
    cond = logits >= zeros
    relu_logits = jnp.where(cond, logits, zeros)
    neg_abs_logits = jnp.where(cond, -logits, logits)
    per = (relu_logits - logits * labels) + jnp.log1p(jnp.exp(neg_abs_logits))
    per = jnp.mean(per, axis=-1)
    return jnp.sum(per) / jnp.asarray(per.shape[0], per.dtype)


def table_optimizer(cfg: DemoConfig):
    """The core's fused Adam, Keras' definition (what DynamicEmbeddingOptimizer(Adam) runs)."""
    return dej.optimizers.from_spec(ADAM_SPEC, cfg.learning_rate)


def _loss(model, ids, dense, labels):
    return bce_from_logits(labels, model(ids, dense))


class JaxRunner:
    """The Flax model (tables inside) + its Keras-Adam state, as one leg of the demo sees it.

    The jitted step takes the model as ``nnx.split`` state (the tables' handles are part of it)
    and returns the new state: ``dej.nnx.value_and_grad`` gives the dense gradients and the
    rows' gradients, ``interop.keras_adam`` updates the dense parameters, and
    ``dej.nnx.apply_gradients`` runs the tables' fused optimizer in the core (one call for all
    the tables)."""

    framework = FRAMEWORK

    def __init__(self, cfg: DemoConfig, model: FlaxDLRM | None = None, opt_state=None):
        self.cfg = cfg
        if model is None:
            model = FlaxDLRM(cfg, nnx.Rngs(cfg.seed))
        self.graphdef, self.state = nnx.split(model)
        self.tx = interop.keras_adam(cfg.learning_rate)
        if opt_state is None:
            opt_state = self.tx.init(nnx.state(model, nnx.Param))
        self.opt_state = opt_state
        self._train_step = jax.jit(self._step)
        self._train_flat = jax.jit(self._step_flat)
        self._predict = jax.jit(self._logits)

    # ---- jitted functions -----------------------------------------------------------------------
    def _step(self, state, opt_state, ids, dense, labels):
        model = nnx.merge(self.graphdef, state)
        loss, grads, emb_grads = denn.value_and_grad(_loss)(model, ids, dense, labels)
        params = nnx.state(model, nnx.Param)
        updates, opt_state = self.tx.update(grads, opt_state, params)
        nnx.update(model, optax.apply_updates(params, updates))
        denn.apply_gradients(model, emb_grads)
        return nnx.state(model), opt_state, loss

    def _step_flat(self, leaves, ids, dense, labels):
        """``_step`` on the leaves of (state, opt_state): the training loop hands jit a flat
        list, so a step does not flatten the nnx.State and Optax pytrees in Python (about as
        much host time as the rest of the step's dispatch)."""
        state, opt_state = jax.tree_util.tree_unflatten(self._treedef, leaves)
        state, opt_state, loss = self._step(state, opt_state, ids, dense, labels)
        return jax.tree_util.tree_leaves((state, opt_state)), loss

    def _logits(self, state, ids, dense):
        return nnx.merge(self.graphdef, state)(ids, dense)

    # ---- state ------------------------------------------------------------------------------
    @property
    def model(self) -> FlaxDLRM:
        return nnx.merge(self.graphdef, self.state)

    @property
    def step(self) -> int:
        return int(np.asarray(self.opt_state.count))

    def tables(self) -> list:
        return self.model.tables()

    def table_rows(self) -> int:
        return sum(int(t.core().size()) for t in self.tables())

    def dense_dict(self) -> dict:
        """Dense parameters and the Keras-Adam slots and step (dualemb.interop names)."""
        out = interop.flax_params_to_dict(self.model)
        out.update(interop.adam_state_to_dict(self.opt_state))
        return out

    def close(self) -> None:
        """Frees the tables (the model must not be used afterwards)."""
        for t in self.tables():
            dej.destroy(t)

    # ---- training and inference ----------------------------------------------------------------
    def train(self, start: int, stop: int, verbose: int = 1) -> tuple[list, float]:
        """Trains on the batches of steps [start, stop); returns (per-step losses, examples/s)."""
        if self.step != start:
            raise RuntimeError(f"the JAX model is at step {self.step}, asked to train from {start}")
        # The batches are made before the loop, as the TF leg's model.fit gets them: the
        # examples/s of both legs time training, not the synthetic data's generation (which
        # costs about a third of a JAX step).
        batches = [self.cfg.train_batch(s) for s in range(start, stop)]
        bar = _Progress(stop - start, verbose)
        losses = []
        t1 = None
        leaves, self._treedef = jax.tree_util.tree_flatten((self.state, self.opt_state))
        try:
            for i, (ids, dense, labels) in enumerate(batches):
                leaves, loss = self._train_flat(leaves, dej.ids(ids), jnp.asarray(dense),
                                                jnp.asarray(labels))
                losses.append(loss)
                if i == 0:
                    jax.block_until_ready(loss)
                    t1 = time.perf_counter()
                bar.update(i + 1, losses)
        finally:
            self.state, self.opt_state = jax.tree_util.tree_unflatten(self._treedef, leaves)
        jax.block_until_ready((losses[-1], self.state))
        for t in self.tables():
            dej.block(t)
        n = len(losses) - 1
        rate = n * self.cfg.batch_size / (time.perf_counter() - t1) if n > 0 else float("nan")
        losses = [float(x) for x in losses]
        bar.finish(losses, rate)
        return losses, rate

    def predict_logits(self, ids, dense) -> np.ndarray:
        out = []
        b = self.cfg.batch_size
        for i in range(0, len(ids), b):
            out.append(np.asarray(self._predict(self.state, dej.ids(ids[i:i + b]),
                                                jnp.asarray(dense[i:i + b]))))
        return np.concatenate(out).astype(np.float32).reshape(-1)

    # ---- the common checkpoint format -------------------------------------------------------
    def save(self, path, metadata: dict) -> None:
        tables = self.tables()
        for t in tables:
            if int(np.asarray(t.step)) != self.step:
                raise RuntimeError(f"table step {int(np.asarray(t.step))} != dense step "
                                   f"{self.step}")
        dej.save(dict(zip(self.cfg.table_names, tables)), path, dense=self.dense_dict(),
                 metadata={**metadata, "framework": "jax"})

    @classmethod
    def load(cls, cfg: DemoConfig, path) -> "JaxRunner":
        """A Flax model with fresh tables restored from a demo checkpoint written by either
        framework: rows with their Adam slots and step, dense parameters, Adam slots and step."""
        dense = checkpoint.load_dense(path)
        tables = [dej.load(path, name, learning_rate=cfg.learning_rate)
                  for name in cfg.table_names]
        for name, t in zip(cfg.table_names, tables):
            spec = t.optimizer.spec if t.optimizer is not None else None
            if spec is None or spec.get("flavor") != "keras" or spec.get("name") != "adam":
                raise checkpoint.CheckpointError(
                    f"{path}: table {name!r} was not trained with Keras' Adam ({spec})")
        model = FlaxDLRM(cfg, nnx.Rngs(cfg.seed), tables=tables)
        interop.dict_to_flax(model, dense)
        opt_state = interop.dict_to_adam_state(dense, model)
        runner = cls(cfg, model=model, opt_state=opt_state)
        steps = {int(np.asarray(t.step)) for t in tables}
        if steps != {runner.step}:
            raise checkpoint.CheckpointError(
                f"{path}: table steps {sorted(steps)} disagree with the dense optimizer step "
                f"{runner.step}")
        return runner


class _Progress:
    """A one-line progress bar in the style of Keras' (verbose=1), or nothing (verbose=0)."""

    WIDTH = 20

    def __init__(self, total: int, verbose: int):
        self.total = total
        self.verbose = verbose
        self.tty = sys.stdout.isatty()
        self.t0 = time.perf_counter()
        self.every = max(1, total // 50) if self.tty else max(1, total // 4)

    def update(self, done: int, losses) -> None:
        if not self.verbose or done == self.total or done % self.every:
            return
        loss = float(losses[-1])  # waits for this step
        self._line(done, f"loss: {loss:.4f}", end="\r" if self.tty else "\n")

    def finish(self, losses, rate) -> None:
        if self.verbose:
            self._line(self.total, f"loss: {np.mean(losses):.4f} - {rate:,.0f} examples/s",
                       end="\n")

    def _line(self, done: int, text: str, end: str) -> None:
        filled = int(self.WIDTH * done / max(1, self.total))
        bar = "━" * filled + "·" * (self.WIDTH - filled)
        elapsed = time.perf_counter() - self.t0
        sys.stdout.write(f"{done}/{self.total} {bar} {elapsed:.0f}s - {text}{end}")
        sys.stdout.flush()

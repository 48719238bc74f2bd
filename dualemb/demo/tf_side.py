"""The demo model in TensorFlow / Keras 3 with ``dualemb.tf``, trained with ``model.fit``."""

from __future__ import annotations

import sys
import time

import keras
import numpy as np
import tensorflow as tf

import dualemb.tf as de
from dualemb import interop
from dualemb.core import checkpoint
from dualemb.core.table import Table
from dualemb.demo.config import DemoConfig

FRAMEWORK = "tf"


class KerasDLRM(keras.Model):
    """One ``de.keras.layers.Embedding`` per sparse feature + an MLP over [embeddings, dense].

    Inputs: ``{"ids": int64 [B, F], "dense": float32 [B, D]}``; output: logits [B, 1].
    ``shards``: table shards per feature (``devices=["/CPU:0"] * shards``)."""

    def __init__(self, cfg: DemoConfig, shards: int = 1):
        super().__init__(name="dlrm")
        self.cfg = cfg
        self.embeddings = [
            de.keras.layers.Embedding(cfg.dim, initializer=cfg.initializer(f),
                                      devices=["/CPU:0"] * shards, name=cfg.table_name(f))
            for f in range(cfg.features)]
        self.mlp = []
        for i, (name, _, units) in enumerate(cfg.layer_sizes):
            last = name == "out"
            self.mlp.append(keras.layers.Dense(
                units, activation=None if last else "relu", name=name,
                kernel_initializer=keras.initializers.GlorotUniform(seed=cfg.dense_init_seed(i))))
        # The loss of the last training batch (read by LossRecorder); not a model weight.
        object.__setattr__(self, "batch_loss", tf.Variable(0.0, trainable=False))

    def build(self, input_shape=None):
        for emb in self.embeddings:
            emb.build()
        for layer, (_, fan_in, _) in zip(self.mlp, self.cfg.layer_sizes):
            layer.build((None, fan_in))
        self.built = True

    def call(self, inputs):
        ids, dense = inputs["ids"], inputs["dense"]
        rows = [emb(ids[:, f]) for f, emb in enumerate(self.embeddings)]
        x = tf.concat(rows + [tf.cast(dense, tf.float32)], axis=1)
        for layer in self.mlp:
            x = layer(x)
        return x

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                    training=training)
        if training:
            self.batch_loss.assign(tf.cast(loss, tf.float32))
        return loss


class LossRecorder(keras.callbacks.Callback):
    """Records every training batch's loss and the steady-state examples/s (from batch 2 on)."""

    def __init__(self, batch_size: int):
        super().__init__()
        self.batch_size = batch_size
        self.losses: list[float] = []
        self.t1 = None
        self.t_end = None

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(self.model.batch_loss.numpy()))
        now = time.perf_counter()
        if batch == 0:
            self.t1 = now
        self.t_end = now

    def examples_per_second(self) -> float:
        n = len(self.losses) - 1
        if n <= 0 or self.t_end is None or self.t_end <= self.t1:
            return float("nan")
        return n * self.batch_size / (self.t_end - self.t1)


class TFRunner:
    """A Keras model with its optimizer, as one leg of the demo sees it."""

    framework = FRAMEWORK

    def __init__(self, cfg: DemoConfig, shards: int = 1):
        self.cfg = cfg
        self.model = KerasDLRM(cfg, shards=shards)
        self.model.build()
        self.model.compile(
            optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(cfg.learning_rate)),
            loss=keras.losses.BinaryCrossentropy(from_logits=True))

    # ---- state ------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def core_tables(self) -> dict:
        """checkpoint table name -> the core Tables of its shards."""
        return {self.cfg.table_name(f): [Table.attach(s.table_id) for s in emb.params.tables]
                for f, emb in enumerate(self.model.embeddings)}

    def table_rows(self) -> int:
        return sum(t.size() for shards in self.core_tables().values() for t in shards)

    def dense_dict(self) -> dict:
        """Dense weights and the Keras optimizer's slots and step (dualemb.interop names)."""
        return interop.keras_weights_to_dict(self.model, optimizer=self.model.optimizer)

    def close(self) -> None:
        """Frees the tables (the model must not be used afterwards)."""
        for shards in self.core_tables().values():
            for t in shards:
                t.destroy()

    # ---- training and inference ----------------------------------------------------------------
    def train(self, start: int, stop: int, verbose: int = 1) -> tuple[list, float]:
        """Trains on the batches of steps [start, stop); returns (per-step losses, examples/s)."""
        if self.step != start:
            raise RuntimeError(f"the TF model is at step {self.step}, asked to train from {start}")
        ids, dense, labels = self.cfg.train_batches(start, stop)
        rec = LossRecorder(self.cfg.batch_size)
        if verbose and not sys.stdout.isatty():
            verbose = 2  # one line per leg instead of a progress bar redrawn with \r
        self.model.fit({"ids": ids, "dense": dense}, labels, batch_size=self.cfg.batch_size,
                       epochs=1, shuffle=False, verbose=verbose, callbacks=[rec])
        return rec.losses, rec.examples_per_second()

    def predict_logits(self, ids, dense) -> np.ndarray:
        out = self.model.predict({"ids": ids, "dense": dense}, batch_size=self.cfg.batch_size,
                                 verbose=0)
        return np.asarray(out, np.float32).reshape(-1)

    # ---- the common checkpoint format -------------------------------------------------------
    def save(self, path, metadata: dict) -> None:
        checkpoint.save(path, self.core_tables(), steps=self.step, dense=self.dense_dict(),
                        metadata={**metadata, "framework": "tensorflow"})

    @classmethod
    def load(cls, cfg: DemoConfig, path, shards: int = 1) -> "TFRunner":
        """A fresh Keras model restored from a demo checkpoint written by either framework:
        tables with slots (re-sharded onto ``shards`` by the default ``key mod N`` routing of
        ``de.Variable``), dense weights, Adam slots and the step."""
        runner = cls(cfg, shards=shards)
        ckpt = checkpoint.load(path, runner.core_tables())
        interop.dict_to_keras(runner.model, ckpt.dense, optimizer=runner.model.optimizer)
        steps = {s for s in ckpt.steps.values() if s is not None}
        if steps != {int(ckpt.dense[interop.STEP])}:
            raise checkpoint.CheckpointError(
                f"{path}: table steps {sorted(steps)} disagree with the dense optimizer step "
                f"{int(ckpt.dense[interop.STEP])}")
        return runner

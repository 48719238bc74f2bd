"""The demo's model definition and data plan, shared by its TF and JAX halves (numpy only).

The model is DLRM-style: one dynamic embedding table per sparse feature (``feature_<f>``, rows of
``dim``), the rows of an example's ids concatenated with its dense features, and an MLP
``fc0`` (relu) -> ``fc1`` (relu) -> ``out`` giving one logit; binary cross-entropy from logits.

Both frameworks train it with the **same optimizer definition**: Keras 3's Adam. In TF that is
``de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(lr))`` (dense weights by Keras, tables by the
core's fused Adam, flavor "keras"); in JAX the tables use the same fused optimizer
(``dualemb.jax.optimizers.from_spec(ADAM_SPEC, lr)``) and the dense parameters
``dualemb.interop.keras_adam(lr)``.

Data: training step ``s`` reads batch ``s % STEPS_PER_DAY`` of day ``s // STEPS_PER_DAY`` of the
synthetic click log (``dualemb.demo.data``); the held-out set is days ``HELD_OUT_DAYS``, which
training never reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dualemb.core import initializers as core_inits
from dualemb.demo.data import ClickLog

STEPS_PER_DAY = 50
HELD_OUT_DAYS = (10_000, 10_001)
HELD_OUT_BATCHES_PER_DAY = 4
NUM_DENSE = 4
HIDDEN = (64, 32)
LEARNING_RATE = 3e-3
INIT_STDDEV = 0.05
# keras.optimizers.Adam's defaults, as the core's fused optimizer spec (flavor "keras").
ADAM_SPEC = {"name": "adam", "flavor": "keras", "beta_1": 0.9, "beta_2": 0.999,
             "epsilon": 1e-7, "amsgrad": False}


@dataclass(frozen=True)
class DemoConfig:
    features: int = 8
    dim: int = 16
    batch_size: int = 2048
    steps: int = 200  # per leg
    seed: int = 0
    num_dense: int = NUM_DENSE
    hidden: tuple = HIDDEN
    learning_rate: float = LEARNING_RATE
    held_out_days: tuple = HELD_OUT_DAYS
    held_out_batches_per_day: int = HELD_OUT_BATCHES_PER_DAY
    _log: ClickLog = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_log", ClickLog(num_sparse=self.features,
                                                  num_dense=self.num_dense, seed=self.seed))

    # ---- names ----------------------------------------------------------------------------------
    def table_name(self, f: int) -> str:
        return f"feature_{f}"

    @property
    def table_names(self) -> list[str]:
        return [self.table_name(f) for f in range(self.features)]

    @property
    def layer_sizes(self) -> list[tuple[str, int, int]]:
        """(name, fan_in, fan_out) of the MLP's dense layers, input to output."""
        sizes = [self.features * self.dim + self.num_dense, *self.hidden, 1]
        names = [f"fc{i}" for i in range(len(self.hidden))] + ["out"]
        return [(n, a, b) for n, a, b in zip(names, sizes[:-1], sizes[1:])]

    @property
    def dense_names(self) -> list[str]:
        """The checkpoint's dense parameter names (see dualemb.interop)."""
        return [f"{n}/{w}" for n, _, _ in self.layer_sizes for w in ("kernel", "bias")]

    def initializer(self, f: int) -> dict:
        """Initializer of table f: normal(0, INIT_STDDEV), a pure function of (seed, key)."""
        return core_inits.normal(0.0, INIT_STDDEV, seed=self.seed * 1009 + f + 1)

    def dense_init_seed(self, layer_index: int) -> int:
        return self.seed * 1013 + layer_index + 7

    # ---- data -----------------------------------------------------------------------------------
    def train_batch(self, step: int):
        """(ids [B, F] int64, dense [B, D] float32, labels [B, 1] float32) of training step
        ``step`` (0-based, global over the legs)."""
        ids, dense, labels, _ = self._log.batch(step // STEPS_PER_DAY, step % STEPS_PER_DAY,
                                                self.batch_size)
        return ids, dense, labels[:, None]

    def train_batches(self, start: int, stop: int):
        """The batches of steps [start, stop), concatenated."""
        parts = [self.train_batch(s) for s in range(start, stop)]
        return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))

    def held_out(self):
        """(ids, dense, labels [n, 1], planted logits [n]) of the held-out days."""
        parts = [self._log.batch(day, i, self.batch_size) for day in self.held_out_days
                 for i in range(self.held_out_batches_per_day)]
        ids, dense, labels, logits = (np.concatenate([p[i] for p in parts]) for i in range(4))
        return ids, dense, labels[:, None], logits


def sigmoid(logits) -> np.ndarray:
    """Click probabilities from logits, in float64 (both frameworks' logits go through this)."""
    x = np.asarray(logits, np.float64).reshape(-1)
    return 1.0 / (1.0 + np.exp(-x))

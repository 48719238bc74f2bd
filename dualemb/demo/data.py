"""A deterministic synthetic click log of the Criteo kind, generated on the fly.

Each example has `num_sparse` categorical features whose ids are drawn from Zipf distributions
and scattered over a 10^9 id space (the long tail keeps producing ids never seen before, as in
production), `num_dense` standard-normal dense features, and a click label drawn from a planted
logistic model: popular ids (Zipf rank <= `signal_ranks`) carry a weight, tail ids none. The
planted model's own AUC on held-out data is the ceiling a learner can approach.

Everything is a pure function of (seed, day, batch index): a batch can be regenerated anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 arrays (wrapping arithmetic)."""
    z = z.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z ^= z >> np.uint64(30)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(27)
        z *= np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return z


def _hash_normal(keys: np.ndarray) -> np.ndarray:
    """A standard normal per uint64 key (Box-Muller on two hashed uniforms)."""
    h1 = _mix64(keys)
    with np.errstate(over="ignore"):
        h2 = _mix64(keys + _GOLDEN)
    u1 = ((h1 >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53
    u2 = (h2 >> np.uint64(11)).astype(np.float64) / 2.0**53
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2 * np.pi * u2)


@dataclass(frozen=True)
class ClickLog:
    num_sparse: int = 8
    num_dense: int = 4
    seed: int = 0
    id_space: int = 10**9
    zipf_a: float = 1.15
    signal_ranks: int = 5000
    signal_scale: float = 0.9
    bias: float = -1.2

    def __post_init__(self):
        if not 1 <= self.num_sparse <= 64:
            raise ValueError(f"num_sparse must be in [1, 64], got {self.num_sparse}")
        if self.num_dense < 0:
            raise ValueError(f"num_dense must be >= 0, got {self.num_dense}")

    def _ids(self, feature: int, ranks: np.ndarray) -> np.ndarray:
        key = (np.uint64(self.seed) << np.uint64(48)) ^ (np.uint64(feature) << np.uint64(40))
        with np.errstate(over="ignore"):
            h = _mix64(ranks.astype(np.uint64) + key)
        return (h % np.uint64(self.id_space)).astype(np.int64)

    def dense_weights(self) -> np.ndarray:
        k = np.arange(self.num_dense, dtype=np.uint64) + np.uint64(self.seed * 1000 + 7)
        return 0.5 * _hash_normal(k)

    def batch(self, day: int, index: int, batch_size: int):
        """(sparse ids [B, num_sparse] int64, dense [B, num_dense] float32, labels [B] float32,
        planted logits [B] float64)."""
        rng = np.random.default_rng([self.seed, day, index])
        ranks = np.minimum(rng.zipf(self.zipf_a, size=(batch_size, self.num_sparse)), 1 << 40)
        ids = np.stack([self._ids(f, ranks[:, f]) for f in range(self.num_sparse)], axis=1)
        dense = rng.standard_normal((batch_size, self.num_dense)).astype(np.float32)
        scale = self.signal_scale / np.sqrt(self.num_sparse)
        with np.errstate(over="ignore"):
            wkeys = ids.astype(np.uint64) * np.uint64(31) + np.arange(self.num_sparse, dtype=np.uint64)
        weights = scale * _hash_normal(wkeys) * (ranks <= self.signal_ranks)
        logits = self.bias + weights.sum(axis=1) + dense.astype(np.float64) @ self.dense_weights()
        labels = (rng.random(batch_size) < 1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
        return ids, dense, labels, logits


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U, ties averaged)."""
    labels = np.asarray(labels).reshape(-1) > 0.5
    scores = np.asarray(scores, np.float64).reshape(-1)
    pos, neg = labels.sum(), (~labels).sum()
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(scores.size, np.float64)
    sorted_scores = scores[order]
    # average ranks of ties
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))

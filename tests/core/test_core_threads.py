"""A table gives bit-identical results whether a batch runs on the calling thread alone or fans
out on the pool: the core decides by batch size (keys x (dim + 16) against a fixed amount of
work), so the same model sees both paths as its batches change size."""
import numpy as np
import pytest

from dualemb.core import Table


def _run(num_threads: int, dim: int, batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    t = Table(dim=dim, optimizer={"name": "adam"}, num_threads=num_threads,
              initializer={"initializer": "normal", "mean": 0.0, "stddev": 0.1, "seed": 3})
    found = []
    for step in range(1, 5):
        # Zipf ids: many duplicates (their gradients are summed) and new keys every step.
        keys = np.minimum(rng.zipf(1.3, batch), 1 << 40).astype(np.int64)
        grads = rng.standard_normal((batch, dim)).astype(np.float32)
        vals, exists = t.find(keys)
        found.append((vals, exists))
        t.apply_gradients(keys, grads, 0.01, step)
        t.accum(keys[: batch // 2], grads[: batch // 2] * np.float32(0.5), np.ones(batch // 2, bool))
    e = t.export()
    order = np.argsort(e["keys"])
    rows = np.concatenate([e["values"], e["slots"].reshape(len(order), -1)], axis=1)
    return found, e["keys"][order], rows[order]


@pytest.mark.parametrize("dim,batch", [
    (8, 40_000),   # 40,000 x 24 keys-work: above the threshold, parallel with 2 threads
    (64, 4_000),   # 4,000 x 80: parallel
    (16, 4_096),   # 4,096 x 32: below, on the calling thread
])
def test_one_thread_and_two_threads_agree_bit_for_bit(dim, batch):
    f1, k1, v1 = _run(1, dim, batch)
    f2, k2, v2 = _run(2, dim, batch)
    np.testing.assert_array_equal(k1, k2)
    np.testing.assert_array_equal(v1.view(np.uint32), v2.view(np.uint32))
    for (a, ea), (b, eb) in zip(f1, f2):
        np.testing.assert_array_equal(ea, eb)
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))

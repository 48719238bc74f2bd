"""dej.capture_evicted / take_evicted hand over what a jitted apply_gradients evicted: the keys
(and rows) that left the table, checked against the rows read before the eviction."""
import jax
import numpy as np

import dualemb.jax as dej


def test_apply_gradients_evictions_are_handed_over():
    t = dej.create(2, optimizer=dej.optimizers.sgd(0.1), capacity=8)
    dej.capture_evicted(t, rows=True)
    step = jax.jit(dej.apply_gradients)
    t = step(t, dej.ids(np.arange(8)), np.ones((8, 2), np.float32))
    before = np.asarray(dej.lookup(t, dej.ids(np.arange(8))))
    t = step(t, dej.ids(np.arange(8, 11)), np.ones((3, 2), np.float32))
    ev = dej.take_evicted(t)
    assert len(ev["keys"]) == 3 and dej.evicted_total(t) == 3
    kept = set(t.core().export()["keys"].tolist())
    assert kept.isdisjoint(ev["keys"].tolist()) and len(kept) == 8
    for k, row in zip(ev["keys"].tolist(), ev["values"]):
        np.testing.assert_array_equal(row, before[k])
    assert len(dej.take_evicted(t)["keys"]) == 0
    dej.destroy(t)

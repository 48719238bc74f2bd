"""dej.save(..., base=...) writes a delta that dej.load follows to the state a full save at the
same step gives (rows, slots, metadata, step); the reference is a full save of the same table."""
import jax
import numpy as np

import dualemb.jax as dej
from dualemb.core import checkpoint as core_ckpt

DIM = 4


def _export(t):
    page = t.core().export()
    order = np.argsort(page["keys"])
    return [page[k][order] for k in ("keys", "values", "slots", "last_update", "update_count")]


def test_delta_chain_loads_to_the_full_state(tmp_path):
    t = dej.create(DIM, initializer=dej.initializers.normal(0, 0.1, seed=1),
                   optimizer=dej.optimizers.adam(0.01))
    step = jax.jit(dej.apply_gradients)
    rng = np.random.default_rng(0)
    t = step(t, dej.ids(np.arange(50)), rng.standard_normal((50, DIM)).astype(np.float32))
    dej.save(t, tmp_path / "full")
    prev = tmp_path / "full"
    for i in range(3):
        ids = np.arange(i * 20, i * 20 + 10)
        t = step(t, dej.ids(ids), rng.standard_normal((10, DIM)).astype(np.float32))
        dej.save(t, tmp_path / f"d{i}", base=prev)
        prev = tmp_path / f"d{i}"
    m = core_ckpt.read_manifest(prev)
    assert m["version"] == 3 and m["tables"][0]["rows"] == 10
    loaded = dej.load(prev)
    assert int(loaded.step) == int(t.step) == 4
    for a, b in zip(_export(t), _export(loaded)):
        np.testing.assert_array_equal(a, b)
    dej.destroy(loaded)
    dej.destroy(t)

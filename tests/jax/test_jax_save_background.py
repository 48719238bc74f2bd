"""dej.save(..., blocking=False): the checkpoint holds the table (rows, slots, step) and the dense
arrays as of the call while jitted training goes on; reference: the table's own export at the
call, and a blocking save of the same state."""

import threading

import jax
import jax.numpy as jnp
import numpy as np

import dualemb.jax as dej
from dualemb.core import checkpoint as core_ckpt
from dualemb.core.checkpoint import _write

DIM = 4
IDS = np.array([1, 2**40 + 9, -77, 12345, 5], np.int64)


def _rows_and_slots(core_table):
    page = core_table.export()
    order = np.argsort(page["keys"])
    return {k: page[k][order] for k in ("keys", "values", "slots", "last_update",
                                        "update_count")}


def test_background_save_holds_the_state_of_the_call(tmp_path, monkeypatch):
    gate = threading.Event()
    real = _write._export_page

    def gated(table, offset, limit):
        assert gate.wait(30)
        return real(table, offset, limit)

    t = dej.create(DIM, initializer=dej.initializers.normal(0, 0.1, seed=1),
                   optimizer=dej.optimizers.adam(0.01))
    g = np.random.RandomState(0).randn(16, len(IDS), DIM).astype(np.float32)
    step = jax.jit(dej.apply_gradients)
    for i in range(4):
        t = step(t, dej.ids(IDS), g[i])
    w = jnp.arange(3.0)
    dej.save(t, tmp_path / "ref", dense={"w": w})
    at_k = _rows_and_slots(t.core())
    monkeypatch.setattr(_write, "_export_page", gated)
    h = dej.save(t, tmp_path / "bg", dense={"w": w}, blocking=False)
    assert isinstance(h, core_ckpt.SaveHandle)
    for i in range(4, 14):  # ten more steps while the save waits at its first page
        t = step(t, dej.ids(IDS), g[i])
    jax.block_until_ready(t)
    assert int(t.step) == 14 and not h.done()
    gate.set()
    h.wait(60)
    loaded = dej.load(tmp_path / "bg")
    assert int(loaded.step) == 4
    got = _rows_and_slots(loaded.core())
    for k in at_k:
        np.testing.assert_array_equal(got[k], at_k[k], err_msg=k)
    files = sorted(p.name for p in (tmp_path / "ref").glob("*.safetensors"))
    assert files and files == sorted(p.name for p in (tmp_path / "bg").glob("*.safetensors"))
    for f in files:
        assert (tmp_path / "ref" / f).read_bytes() == (tmp_path / "bg" / f).read_bytes(), f
    assert core_ckpt.load_dense(tmp_path / "bg")["w"].tolist() == [0.0, 1.0, 2.0]
    assert not np.array_equal(_rows_and_slots(t.core())["values"], at_k["values"])
    dej.destroy(loaded)


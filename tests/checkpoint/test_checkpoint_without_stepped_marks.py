"""A table that keeps no stepped marks (the GPU table: ``has_stepped = False``) in the common
checkpoint: its checkpoint leaves the optional ``stepped`` tensor out, loads into a CPU table by
the format's default rule, and a checkpoint with marks loads into it (the loader hands the marks
to ``import_rows``, which such a table drops). The GPU table's own round trip
(tests/gpu/test_gpu_table.py) needs a GPU; this runs the protocol on any machine, with a CPU
table behind an adapter that behaves as the GPU table does."""

import numpy as np
import pytest

from dualemb.core import Table, checkpoint

safetensors_numpy = pytest.importorskip("safetensors.numpy")

DIM = 4
ADAM = {"name": "adam", "flavor": "keras"}


class NoStepped:
    """A CPU table seen as a table without stepped marks, like dualemb.core._cuda.GpuTable."""

    has_stepped = False

    def __init__(self, table):
        self._t = table

    def __getattr__(self, name):
        return getattr(self._t, name)

    def export(self, *args, **kwargs):
        page = dict(self._t.export(*args, **kwargs))
        page.pop("stepped", None)
        return page

    def import_rows(self, keys, values, slots=None, last_update=None, update_count=None,
                    stepped=None):
        del stepped  # as GpuTable.import_rows: the marks are accepted and dropped
        return self._t.import_rows(keys, values, slots, last_update, update_count)


def _trained():
    t = Table(dim=DIM, optimizer=ADAM, initializer={"initializer": "normal", "seed": 1})
    keys = np.arange(40, dtype=np.int64)
    grads = np.random.RandomState(0).randn(40, DIM).astype(np.float32)
    grads[:5] = 0.0  # stepped with an all-zero gradient: slots stay initial, the mark says so
    t.apply_gradients(keys, grads, lr=0.01, step=1)
    return t


def _rows(t):
    p = t.export()
    order = np.argsort(p["keys"])
    return {k: np.asarray(p[k])[order] for k in ("keys", "values", "slots", "last_update",
                                                 "update_count")}


def test_a_table_without_marks_saves_without_the_tensor_and_loads_into_a_cpu_table(tmp_path):
    src = _trained()
    try:
        checkpoint.save(tmp_path / "ck", {"emb": NoStepped(src)}, steps=1)
        names = [n for f in (tmp_path / "ck").rglob("*.safetensors")
                 for n in safetensors_numpy.load_file(str(f))]
        assert names and "stepped" not in names
        into = Table(dim=DIM, optimizer=ADAM)
        try:
            checkpoint.load(tmp_path / "ck", {"emb": into})
            want, got = _rows(src), _rows(into)
            for k in want:
                np.testing.assert_array_equal(got[k], want[k], err_msg=k)
            # The default rule: stepped where the slots differ from the initial ones, so the
            # five all-zero-gradient rows load unmarked and the other 35 marked.
            stepped = into.export()["stepped"][np.argsort(into.export()["keys"])]
            assert int(np.sum(stepped)) == 35 and not stepped[:5].any()
        finally:
            into.destroy()
    finally:
        src.destroy()


def test_a_checkpoint_with_marks_loads_into_a_table_without_them(tmp_path):
    src = _trained()
    try:
        checkpoint.save(tmp_path / "ck", {"emb": src}, steps=1)
        inner = Table(dim=DIM, optimizer=ADAM)
        try:
            checkpoint.load(tmp_path / "ck", {"emb": NoStepped(inner)})
            want, got = _rows(src), _rows(inner)
            for k in want:
                np.testing.assert_array_equal(got[k], want[k], err_msg=k)
        finally:
            inner.destroy()
    finally:
        src.destroy()

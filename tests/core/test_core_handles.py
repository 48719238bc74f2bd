"""Two handles on one core table see each other's optimizer changes (issue 9, item 3): a handle
caches only immutable facts (dim, key dtype), so slots are never dropped or mis-sized."""

import numpy as np
import pytest

from dualemb.core import Table, checkpoint

ADAM = {"name": "adam", "beta_1": 0.8}


def trained(dim=3, n=20):
    t = Table(dim, optimizer=ADAM)
    keys = np.arange(n, dtype=np.int64) * 11
    grads = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32)
    t.apply_gradients(keys, grads, 0.1, 1)
    return t, keys


def test_stale_handle_sees_optimizer_attached_elsewhere():
    owner = Table(3)
    stale = Table.attach(owner.id)  # taken before the optimizer exists
    owner.set_optimizer(ADAM)
    assert stale.num_slots == 2 and stale.slot_names == owner.slot_names
    stale.insert_or_assign(np.array([1, 2]), np.ones((2, 3), np.float32))
    page = stale.export()
    assert page["slots"].shape == (2, 2, 3)
    np.testing.assert_array_equal(page["slots"], owner.export()["slots"])


def test_import_rows_through_stale_handle_keeps_slots():
    owner = Table(3)
    stale = Table.attach(owner.id)
    owner.set_optimizer(ADAM)
    slots = np.arange(2 * 2 * 3, dtype=np.float32).reshape(2, 2, 3) + 1
    stale.import_rows(np.array([5, 6]), np.zeros((2, 3), np.float32), slots=slots)
    page = owner.export()
    order = np.argsort(page["keys"])
    np.testing.assert_array_equal(page["slots"][order], slots)


def test_slots_for_a_table_without_optimizer_are_refused():
    owner = Table(3, optimizer=ADAM)
    other = Table.attach(owner.id)
    owner.set_optimizer(None)  # slots dropped through the other handle
    with pytest.raises(ValueError, match="slots"):
        other.import_rows(np.array([1]), np.zeros((1, 3), np.float32),
                          slots=np.ones((1, 2, 3), np.float32))
    assert other.size() == 0


def test_checkpoint_load_into_stale_handle_restores_slots(tmp_path):
    src, keys = trained()
    checkpoint.save(tmp_path / "ck", {"emb": src})
    owner = Table(3)
    stale = Table.attach(owner.id)
    owner.set_optimizer(ADAM)
    checkpoint.load(tmp_path / "ck", {"emb": stale})
    want, got = src.export(), owner.export()
    wo, go = np.argsort(want["keys"]), np.argsort(got["keys"])
    np.testing.assert_array_equal(got["keys"][go], want["keys"][wo])
    np.testing.assert_array_equal(got["values"][go], want["values"][wo])
    np.testing.assert_array_equal(got["slots"][go], want["slots"][wo])
    assert np.abs(got["slots"]).sum() > 0


def test_handle_detached_optimizer_elsewhere_exports_without_slots():
    t, keys = trained()
    other = Table.attach(t.id)
    t.set_optimizer(None)
    assert other.num_slots == 0 and other.export()["slots"].shape == (len(keys), 0, 3)

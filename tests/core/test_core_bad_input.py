"""Bad input raises a clear exception naming the problem and leaves the table unchanged."""

import numpy as np
import pytest

from dualemb.core import Table


@pytest.fixture
def table():
    t = Table(dim=3)
    t.insert_or_assign(np.array([1, 2, 3]), np.arange(9, dtype=np.float32).reshape(3, 3))
    return t


def snapshot(t):
    out = t.export()
    order = np.argsort(out["keys"])
    return out["keys"][order].copy(), out["values"][order].copy()


def unchanged(t, before):
    after = snapshot(t)
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])


@pytest.mark.parametrize("keys", [np.array([1.0, 2.0]), np.array(["a", "b"]), np.array([True, False])])
def test_non_integer_keys(table, keys):
    before = snapshot(table)
    with pytest.raises(TypeError, match="keys must be integers"):
        table.insert_or_assign(keys, np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="keys must be integers"):
        table.find(keys)
    unchanged(table, before)


def test_values_of_wrong_shape_or_dtype(table):
    before = snapshot(table)
    with pytest.raises(ValueError, match=r"shape \(2, 4\)"):
        table.insert_or_assign(np.array([7, 8]), np.zeros((2, 4), np.float32))
    with pytest.raises(TypeError, match="floating point"):
        table.insert_or_assign(np.array([7, 8]), np.zeros((2, 3), np.int32))
    with pytest.raises(ValueError, match="deltas"):
        table.accum(np.array([7]), np.zeros((1, 2), np.float32), np.array([False]))
    unchanged(table, before)


def test_gradients_of_wrong_shape(table):
    table.set_optimizer({"name": "sgd", "flavor": "keras"})
    before = snapshot(table)
    with pytest.raises(ValueError, match="gradients"):
        table.apply_gradients(np.array([1, 2]), np.zeros((2, 2), np.float32), lr=0.1, step=1)
    unchanged(table, before)


@pytest.mark.parametrize("dim", [0, -3, 2.5, True])
def test_bad_dim(dim):
    with pytest.raises(ValueError, match="dim"):
        Table(dim=dim)


def test_unknown_table_id():
    with pytest.raises(KeyError, match="unknown table id 12345"):
        Table.attach(12345)
    t = Table(dim=1)
    t.destroy()
    with pytest.raises(KeyError, match="unknown table id"):
        t.find(np.array([1]))


def test_unknown_optimizer_and_hyper_parameter(table):
    before = snapshot(table)
    with pytest.raises(ValueError, match="unknown optimizer 'adamx'"):
        table.set_optimizer({"name": "adamx"})
    with pytest.raises(ValueError, match="bogus"):
        table.set_optimizer({"name": "adam", "flavor": "keras", "bogus": 1})
    with pytest.raises(ValueError, match="flavor"):
        table.set_optimizer({"name": "adam", "flavor": "torch"})
    assert table.optimizer is None
    unchanged(table, before)


def test_unknown_initializer_and_key_dtype():
    with pytest.raises(ValueError, match="unknown initializer 'gamma'"):
        Table(dim=2, initializer={"initializer": "gamma"})
    with pytest.raises(TypeError, match="key dtype"):
        Table(dim=2, key_dtype="float32")
    with pytest.raises(TypeError, match="initializer"):
        Table(dim=2, initializer=object())


def test_apply_gradients_without_optimizer(table):
    with pytest.raises(ValueError, match="no optimizer"):
        table.apply_gradients(np.array([1]), np.zeros((1, 3), np.float32), lr=0.1, step=1)


def test_bad_restrict_and_step(table):
    before = snapshot(table)
    with pytest.raises(ValueError, match="restrict policy"):
        table.restrict(1, by="age")
    with pytest.raises(ValueError, match="num_reserved"):
        table.restrict(-1)
    table.set_optimizer({"name": "sgd", "flavor": "keras"})
    with pytest.raises(ValueError, match="step must be >= 1"):
        table.apply_gradients(np.array([1]), np.zeros((1, 3), np.float32), lr=0.1, step=0)
    unchanged(table, before)

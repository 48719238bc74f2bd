"""Initializers are a pure function of (seed, key) with the right statistics."""

import numpy as np
import pytest

from dualemb.core import Table, initializers

N = 1 << 17


def sample(init, dim=8, seed_keys=0):
    t = Table(dim=dim, initializer=init)
    keys = np.random.default_rng(seed_keys).choice(1 << 50, N, replace=False)
    return t, keys, t.find(keys)[0]


@pytest.mark.parametrize("init,mean,std", [
    (initializers.normal(0.5, 2.0, seed=1), 0.5, 2.0),
    (initializers.truncated_normal(-1.0, 1.0, seed=2), -1.0, 0.87962566),  # std of N(0,1) cut at ±2
    (initializers.uniform(-3.0, 1.0, seed=3), -1.0, 4.0 / np.sqrt(12.0)),
])
def test_statistics_within_one_percent(init, mean, std):
    _, _, v = sample(init)
    assert abs(v.mean() - mean) <= 0.01 * std
    assert abs(v.std() - std) <= 0.01 * std


def test_truncated_normal_stays_within_two_stddevs():
    _, _, v = sample(initializers.truncated_normal(0.0, 0.5, seed=5))
    assert np.abs(v).max() <= 1.0 + 1e-6


def test_uniform_range():
    _, _, v = sample(initializers.uniform(2.0, 3.0, seed=4))
    assert v.min() >= 2.0 and v.max() <= 3.0


def test_same_row_whatever_order_table_and_threads():
    init = initializers.normal(0, 1, seed=11)
    keys = np.random.default_rng(1).choice(1 << 40, 20_000, replace=False)
    a = Table(dim=5, initializer=init)
    b = Table(dim=5, initializer=init, num_threads=1)
    ra = a.find(keys)[0]
    perm = np.random.default_rng(2).permutation(keys.size)
    rb = b.find(keys[perm])[0]
    np.testing.assert_array_equal(ra[perm], rb)
    # inserting through find_or_insert stores exactly the row find reported
    b.find_or_insert(keys[perm][:100])
    np.testing.assert_array_equal(b.find(keys[:100])[0], ra[:100])


def test_seed_changes_rows_and_keys_differ():
    keys = np.arange(1000)
    r1 = Table(dim=4, initializer=initializers.normal(seed=1)).find(keys)[0]
    r2 = Table(dim=4, initializer=initializers.normal(seed=2)).find(keys)[0]
    assert not np.allclose(r1, r2)
    assert len({tuple(r) for r in r1}) == 1000


def test_constant_and_vector():
    t = Table(dim=3, initializer=[1.0, 2.0, 3.0])
    np.testing.assert_array_equal(t.find(np.array([9]))[0], [[1, 2, 3]])
    t = Table(dim=3, initializer=np.array([4.0]))  # length-1 broadcast
    np.testing.assert_array_equal(t.find(np.array([9]))[0], [[4, 4, 4]])
    t = Table(dim=2, initializer=0.25)
    np.testing.assert_array_equal(t.find(np.array([9]))[0], [[0.25, 0.25]])
    with pytest.raises(ValueError, match="vector initializer has 2 values"):
        Table(dim=3, initializer=[1.0, 2.0])

"""restrict and capacity eviction keep exactly the keys a numpy ranking keeps (issue 9, items 2
and 6): higher score first, equal scores ranked by the smaller key, NaN scores refused."""

import numpy as np
import pytest

from dualemb.core import Table


def reference_keep(keys, scores, n):
    """The n best keys: higher score first, then the smaller key (numpy, independent of C++)."""
    order = np.lexsort((keys, -np.asarray(scores, np.float64)))
    return set(keys[order[:n]].tolist())


def table_with(keys, dim=2, **kw):
    t = Table(dim, **kw)
    t.insert_or_assign(keys, np.repeat(keys[:, None], dim, 1).astype(np.float32))
    return t


def live_keys(t):
    return set(t.export()["keys"].tolist())


@pytest.mark.parametrize("nan_fraction", [0.05, 1.0])
def test_custom_nan_scores_are_refused_and_change_nothing(nan_fraction):
    rng = np.random.default_rng(1)
    keys = rng.permutation(1000).astype(np.int64)
    t = table_with(keys)
    before = t.export()
    scores = rng.random(1000).astype(np.float32)
    scores[rng.random(1000) < nan_fraction] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        t.restrict(500, by="custom", keys=keys, scores=scores)
    after = t.export()
    assert t.size() == 1000
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])


@pytest.mark.parametrize("n", [0, 1, 137, 500, 999, 1000, 5000])
def test_custom_scores_with_heavy_ties_keep_exactly_n(n):
    rng = np.random.default_rng(n)
    keys = rng.choice(10**9, 1000, replace=False).astype(np.int64)
    t = table_with(keys)
    # Few distinct values (many ties), infinities, and some keys left unscored (-inf).
    scores = rng.choice(np.array([0.0, 1.0, 2.0, np.inf, -np.inf], np.float32), 1000)
    scored = rng.random(1000) < 0.8
    removed = t.restrict(n, by="custom", keys=keys[scored], scores=scores[scored])
    full = np.where(scored, scores, -np.inf)
    assert live_keys(t) == reference_keep(keys, full, min(n, 1000))
    assert removed == 1000 - min(n, 1000) and t.size() == min(n, 1000)


def test_custom_repeated_key_uses_its_last_score():
    keys = np.arange(10, dtype=np.int64)
    t = table_with(keys)
    t.restrict(1, by="custom", keys=np.array([3, 7, 3]), scores=np.array([9.0, 5.0, 1.0]))
    assert live_keys(t) == {7}


@pytest.mark.parametrize("by", ["recency", "frequency"])
def test_equal_recency_or_frequency_keep_exactly_n_smallest_keys(by):
    rng = np.random.default_rng(7)
    keys = rng.choice(10**12, 3000, replace=False).astype(np.int64)
    t = table_with(keys)  # one write: equal stamps and equal counts everywhere
    t.restrict(1234, by=by)
    assert live_keys(t) == set(np.sort(keys)[:1234].tolist())


@pytest.mark.parametrize("by", ["recency", "frequency"])
def test_mixed_scores_match_reference(by):
    rng = np.random.default_rng(3)
    t = Table(1)
    keys = rng.choice(10**6, 800, replace=False).astype(np.int64)
    written = np.zeros(800, np.int64)
    last = np.zeros(800, np.int64)
    for step in range(1, 9):  # several writes over random subsets: distinct clocks and counts
        pick = rng.random(800) < 0.4
        t.insert_or_assign(keys[pick], np.ones((pick.sum(), 1), np.float32))
        written[pick] += 1
        last[pick] = step
    present = written > 0
    score = last if by == "recency" else written
    t.restrict(300, by=by)
    assert live_keys(t) == reference_keep(keys[present], score[present], 300)

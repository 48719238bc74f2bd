"""The core's multi-table calls (de_find_many, de_find_or_insert_many, de_apply_gradients_many
through dualemb.core.find_many / find_or_insert_many / apply_gradients_many) against the
per-table calls on twin tables: rows, slots, metadata, clock and evictions bit for bit."""

import numpy as np
import pytest

from dualemb import core
from dualemb.core import initializers, optimizers

ADAM = optimizers.make("adam", beta_1=0.9, beta_2=0.999, epsilon=1e-7)


def _twins(specs):
    """Two identical lists of tables: [(dim, optimizer, value dtype, capacity)]."""
    def make(seed0):
        return [core.Table(dim, value_dtype=vd, optimizer=opt, capacity=cap,
                           initializer=initializers.normal(0.0, 0.1, seed=seed0 + i))
                for i, (dim, opt, vd, cap) in enumerate(specs)]
    return make(11), make(11)


def _state(t):
    """The table's whole state in a canonical order: keys, rows, slots, metadata, clock."""
    e = t.export()
    order = np.argsort(e["keys"], kind="stable")
    return ({k: v[order] for k, v in e.items()}, t.clock, t.evicted_total)


def _assert_same(a, b):
    (ea, ca, va), (eb, cb, vb) = _state(a), _state(b)
    for k in ea:
        np.testing.assert_array_equal(ea[k].view(np.uint8), eb[k].view(np.uint8), err_msg=k)
    assert (ca, va) == (cb, vb)


@pytest.fixture
def tables():
    specs = [(16, ADAM, "float32", 0), (4, ADAM, "float32", 0), (8, ADAM, "float16", 0),
             (3, optimizers.make("adagrad"), "float32", 0), (5, ADAM, "float32", 40)]
    many, single = _twins(specs)
    yield many, single
    for t in many + single:
        t.destroy()


def _batch(rng, n, dim, new_from):
    """Ids with duplicates and ids never seen before (from `new_from` on), and gradients."""
    ids = np.concatenate([rng.integers(0, 30, n - 4), np.arange(new_from, new_from + 4)])
    rng.shuffle(ids)
    return ids.astype(np.int64), rng.standard_normal((n, dim)).astype(np.float32)


def test_training_many_equals_per_table(tables):
    many, single = tables
    rng = np.random.default_rng(0)
    for step in range(1, 5):
        batches = [_batch(rng, 24 + 3 * i, t.dim, 1000 * step) for i, t in enumerate(many)]
        ids = [b[0] for b in batches]
        grads = [b[1] for b in batches]
        lrs = [0.01 * (i + 1) for i in range(len(many))]
        ev_many = core.apply_gradients_many(many, ids, grads, lrs, step)
        ev_single = [t.apply_gradients(i, g, lr, step)
                     for t, i, g, lr in zip(single, ids, grads, lrs)]
        assert ev_many == ev_single
        assert [t.last_evicted for t in many] == ev_single
        # Reads of trained and new ids, and inserts, through both paths.
        probe = [np.concatenate([i, [10**6 + step]]) for i in ids]
        for (rm, em), (rs, es) in zip(core.find_many(many, probe),
                                      [t.find(p) for t, p in zip(single, probe)]):
            np.testing.assert_array_equal(rm.view(np.uint8), rs.view(np.uint8))
            np.testing.assert_array_equal(em, es)
            assert not em[-1]
        ins = [np.array([2 * 10**6 + step, 2 * 10**6 + step, 5], np.int64)] * len(many)
        for (rm, em), (rs, es) in zip(core.find_or_insert_many(many, ins),
                                      [t.find_or_insert(p) for t, p in zip(single, ins)]):
            np.testing.assert_array_equal(rm.view(np.uint8), rs.view(np.uint8))
            np.testing.assert_array_equal(em, es)
    for a, b in zip(many, single):
        _assert_same(a, b)
    assert many[-1].evicted_total > 0  # the capacity table did evict, identically


def test_duplicates_are_summed_like_the_per_table_call():
    (a,), (b,) = _twins([(4, optimizers.make("sgd"), "float32", 0)])
    try:
        ids = np.array([7, 7, 7, 3], np.int64)
        g = np.arange(16, dtype=np.float32).reshape(4, 4) / 7
        core.apply_gradients_many([a], [ids], [g], 0.5, 1)
        b.apply_gradients(ids, g, 0.5, 1)
        _assert_same(a, b)
        # An independent reference: SGD on the initial row with the summed gradient, in batch
        # order (float32 additions).
        init = a.initial_values(np.array([7], np.int64))[0]
        s = (g[0] + g[1]) + g[2]
        np.testing.assert_array_equal(a.find(np.array([7]))[0][0],
                                      init - np.float32(0.5) * s)
    finally:
        a.destroy()
        b.destroy()


def test_a_table_listed_twice_runs_in_list_order():
    (a,), (b,) = _twins([(4, ADAM, "float32", 0)])
    try:
        i1, i2 = np.array([1, 2], np.int64), np.array([2, 3], np.int64)
        g1 = np.ones((2, 4), np.float32)
        g2 = np.full((2, 4), -2.0, np.float32)
        core.apply_gradients_many([a, a], [i1, i2], [g1, g2], [0.1, 0.2], [1, 2])
        b.apply_gradients(i1, g1, 0.1, 1)
        b.apply_gradients(i2, g2, 0.2, 2)
        _assert_same(a, b)
        (r1, e1), (r2, e2) = core.find_or_insert_many([a, a], [[9, 1], [9]])
        assert list(e1) == [False, True] and list(e2) == [True]  # the second saw the insert
    finally:
        a.destroy()
        b.destroy()


def test_bad_input_in_one_table_changes_no_table(tables):
    many, _ = tables
    rng = np.random.default_rng(1)
    ids = [rng.integers(0, 50, 10).astype(np.int64) for _ in many]
    grads = [rng.standard_normal((10, t.dim)).astype(np.float32) for t in many]
    core.apply_gradients_many(many, ids, grads, 0.1, 1)
    before = [_state(t) for t in many]
    no_opt = core.Table(4)
    try:
        bad_cases = [
            # a bad step in the last table
            (many, ids, grads, [1] * (len(many) - 1) + [0], "step must be >= 1"),
            # a table without an optimizer at the end
            (many + [no_opt], ids + [ids[0]], grads + [grads[1]], 2, "no optimizer"),
        ]
        for tabs, i, g, steps, msg in bad_cases:
            with pytest.raises(ValueError, match=msg):
                core.apply_gradients_many(tabs, i, g, 0.1, steps)
        # int32 keys for an int64 table cannot reach the core (the C ABI refuses them)
        from dualemb._native import load_extension
        raw = load_extension("_core")
        with pytest.raises(ValueError, match=r"table 2 of .*keys have dtype int32"):
            raw.apply_gradients_many([t.id for t in many],
                                     [ids[0], ids[1], ids[2].astype(np.int32), ids[3], ids[4]],
                                     grads, [0.1] * len(many), [2] * len(many))
        destroyed = core.Table(4, optimizer=ADAM)
        did = destroyed.id
        destroyed.destroy()
        with pytest.raises(KeyError, match=f"unknown table id {did}"):
            raw.find_or_insert_many([t.id for t in many] + [did], ids + [ids[0]],
                                    [np.empty((10, t.dim), t.value_dtype) for t in many]
                                    + [np.empty((10, 4), np.float32)], None)
    finally:
        no_opt.destroy()
    for t, b in zip(many, before):
        after = _state(t)
        for k in b[0]:
            np.testing.assert_array_equal(after[0][k].view(np.uint8), b[0][k].view(np.uint8))
        assert after[1:] == b[1:]


def test_string_keys_and_int32_keys():
    a = core.Table(3, key_dtype="string", optimizer=optimizers.make("sgd"))
    b = core.Table(3, key_dtype="int32", optimizer=optimizers.make("sgd"),
                   initializer=initializers.constant(0.25))
    try:
        (ra, ea), (rb, eb) = core.find_or_insert_many(
            [a, b], [np.array([b"x", b"y", b"x"], object), np.array([5, -5], np.int32)])
        assert list(ea) == [False, False, False] and list(eb) == [False, False]  # as find_or_insert
        np.testing.assert_array_equal(rb, np.full((2, 3), 0.25, np.float32))
        core.apply_gradients_many([a, b], [np.array([b"x"], object), np.array([5], np.int32)],
                                  [np.ones((1, 3), np.float32), np.ones((1, 3), np.float32)],
                                  1.0, 1)
        np.testing.assert_array_equal(a.find(np.array([b"x"], object))[0][0], ra[0] - 1)
        np.testing.assert_array_equal(b.find(np.array([5], np.int32))[0][0],
                                      np.full(3, -0.75, np.float32))
    finally:
        a.destroy()
        b.destroy()


def test_empty_lists_and_empty_batches():
    assert core.find_many([], []) == []
    assert core.apply_gradients_many([], [], [], 0.1, 1) == []
    t = core.Table(2, optimizer=ADAM)
    try:
        (r, e), = core.find_many([t], [np.zeros(0, np.int64)])
        assert r.shape == (0, 2) and e.shape == (0,)
        with pytest.raises(ValueError, match="2 tables but 1 key arrays"):
            core.find_many([t, t], [[1]])
    finally:
        t.destroy()

"""dualemb.jax: the functional operations, ids handling and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dualemb.jax as dej
from dualemb.core.table import Table as CoreTable

DIM = 4


@pytest.fixture
def table():
    t = dej.create(DIM, initializer=dej.initializers.normal(0.0, 0.1, seed=3),
                   optimizer=dej.optimizers.sgd(0.5))
    yield t
    dej.destroy(t)


@pytest.fixture
def x64():
    prev = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", prev)


BIG = np.array([1, 2**40 + 3, -(2**35), 2**62 + 11, 7], np.int64)


def test_lookup_missing_reads_initializer_and_does_not_insert(table):
    rows = dej.lookup(table, BIG)
    assert rows.shape == (5, DIM) and rows.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(rows), table.core().initial_values(BIG))
    assert int(dej.size(table)) == 0
    rows2, exists = dej.find(table, BIG)
    np.testing.assert_array_equal(rows, rows2)
    assert not np.asarray(exists).any()


def test_insert_then_lookup_any_shape(table):
    ids = BIG.reshape(1, 5)
    vals = np.arange(5 * DIM, dtype=np.float32).reshape(1, 5, DIM)
    t = dej.insert(table, ids, vals)
    np.testing.assert_array_equal(dej.lookup(t, ids), vals)
    assert int(dej.size(t)) == 5
    # 64-bit ids were not truncated: the core sees exactly those keys.
    got, exists = t.core().find(BIG)
    assert exists.all()
    np.testing.assert_array_equal(got, vals[0])


def test_int64_ids_in_32bit_mode_via_ids_under_jit(table):
    assert not jax.config.jax_enable_x64
    vals = np.random.RandomState(0).randn(5, DIM).astype(np.float32)

    @jax.jit
    def write_read(t, ids, v):
        t = dej.insert(t, ids, v)
        return t, dej.lookup(t, ids)

    t, rows = write_read(table, dej.ids(BIG), vals)
    np.testing.assert_array_equal(rows, vals)
    # Distinct from the truncated ids: 2**40+3 and 3 are different keys.
    np.testing.assert_array_equal(t.core().find(BIG)[0], vals)
    assert not t.core().find(np.array([3]))[1].any()


def test_int32_jax_ids_refused_for_int64_table_in_32bit_mode(table):
    with pytest.raises(TypeError, match="truncated"):
        dej.lookup(table, jnp.asarray([1, 2], jnp.int32))
    # Declared genuine int32 ids (sign-extended) are fine.
    t = dej.insert(table, dej.ids(jnp.asarray([-1, 2], jnp.int32)), np.ones((2, DIM), np.float32))
    assert t.core().find(np.array([-1, 2]))[1].all()


def test_int32_table_accepts_int32_ids(table):
    t = dej.create(DIM, key_dtype="int32")
    ids = jnp.asarray([5, -6, 7], jnp.int32)
    t = jax.jit(dej.insert)(t, ids, jnp.ones((3, DIM)))
    np.testing.assert_array_equal(jax.jit(dej.lookup)(t, ids), np.ones((3, DIM)))
    with pytest.raises(ValueError, match="int32"):
        dej.lookup(t, np.array([2**40]))
    # int64 ids that do not fit are refused at run time too (pairs reach the core).
    with pytest.raises(Exception, match="int32 key dtype"):
        jax.block_until_ready(dej.lookup(t, dej.ids(np.array([2**40]))))
    dej.destroy(t)


def test_x64_mode_int64_and_int32_ids(table, x64):
    ids = jnp.asarray(BIG)
    assert ids.dtype == jnp.int64
    vals = jnp.arange(5 * DIM, dtype=jnp.float32).reshape(5, DIM)
    t = jax.jit(dej.insert)(table, ids, vals)
    np.testing.assert_array_equal(jax.jit(dej.lookup)(t, ids), vals)
    np.testing.assert_array_equal(t.core().find(BIG)[0], vals)
    small = jnp.asarray([1, 7], jnp.int32)
    np.testing.assert_array_equal(dej.lookup(t, small), vals[jnp.array([0, 4])])
    assert dej.size(t).dtype == jnp.int64
    keys, values, count = dej.export(t, 8)
    assert keys.dtype == jnp.int64 and int(count) == 5
    assert sorted(np.asarray(keys)[:5].tolist()) == sorted(BIG.tolist())


def test_find_or_insert_accum_erase(table):
    rows, exists, t = dej.find_or_insert(table, BIG[:2])
    assert not np.asarray(exists).any()
    np.testing.assert_array_equal(rows, table.core().initial_values(BIG[:2]))
    _, exists, t = dej.find_or_insert(t, BIG[:3])
    np.testing.assert_array_equal(exists, [True, True, False])
    before = np.asarray(dej.lookup(t, BIG[:3]))
    delta = np.ones((3, DIM), np.float32)
    # present & exists -> add; absent(3rd id was inserted above, so present) & !exists -> ignored
    t = dej.accum(t, BIG[:3], delta, np.array([True, False, False]))
    after = np.asarray(dej.lookup(t, BIG[:3]))
    np.testing.assert_allclose(after[0], before[0] + 1, rtol=1e-6)
    np.testing.assert_array_equal(after[1:], before[1:])
    t = dej.accum(t, BIG[3:4], delta[:1], np.array([False]))  # absent & !exists -> insert
    np.testing.assert_array_equal(dej.lookup(t, BIG[3:4]), delta[:1])
    t = dej.erase(t, BIG[:2])
    assert int(dej.size(t)) == 2
    assert not np.asarray(dej.find(t, BIG[:2])[1]).any()


def test_export_pages_cover_table(table):
    ids = np.arange(100, dtype=np.int64) * (2**33)
    t = dej.insert(table, ids, np.random.RandomState(1).randn(100, DIM).astype(np.float32))
    seen = []
    export = jax.jit(lambda t, off: dej.export(t, 32, off))
    for off in range(0, 128, 32):
        keys, values, count = export(t, off)
        k = keys.numpy()[: int(count)]
        np.testing.assert_array_equal(values[: int(count)], t.core().find(k)[0])
        seen.extend(k.tolist())
    assert sorted(seen) == ids.tolist()
    keys, values, slots, count = dej.export(t, 4, with_slots=True)
    assert slots.shape == (4, 0, DIM)  # plain sgd has no slots


# ---- bad input ------------------------------------------------------------------------------

def _snapshot(t):
    page = t.core().export()
    order = np.argsort(page["keys"])
    return page["keys"][order], page["values"][order]


def test_float_ids_refused(table):
    t = dej.insert(table, [1, 2], np.ones((2, DIM), np.float32))
    before = _snapshot(t)
    for bad in (np.array([1.0, 2.0]), jnp.asarray([1.0, 2.0]), jnp.asarray([True, False])):
        with pytest.raises(TypeError, match="integer"):
            dej.insert(t, bad, np.zeros((2, DIM), np.float32))
        with pytest.raises(TypeError, match="integer"):
            dej.lookup(t, bad)
    with pytest.raises(TypeError, match="integer"):
        dej.ids(np.array([1.5]))
    after = _snapshot(t)
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])


def test_grads_of_wrong_shape_refused(table):
    t = dej.insert(table, [1, 2], np.ones((2, DIM), np.float32))
    before = _snapshot(t)
    for bad in (np.ones((2, DIM + 1), np.float32), np.ones((3, DIM), np.float32),
                np.ones((2,), np.float32)):
        with pytest.raises(ValueError, match=r"ids.shape \+ \(dim,\)"):
            dej.apply_gradients(t, np.array([1, 2]), bad)
    with pytest.raises(TypeError, match="floating"):
        dej.apply_gradients(t, np.array([1, 2]), np.ones((2, DIM), np.int32))
    with pytest.raises(ValueError, match=r"ids.shape \+ \(dim,\)"):
        dej.insert(t, np.array([1, 2]), np.ones((2, 1), np.float32))
    after = _snapshot(t)
    np.testing.assert_array_equal(before[1], after[1])
    assert int(t.step) == 0


def test_unknown_table_id_refused(table):
    ghost = table.replace(id=12345)  # e.g. a handle restored after a restart, never loaded
    assert not CoreTable.__dict__.get("_never")
    for call in (lambda: dej.lookup(ghost, [1]), lambda: dej.size(ghost),
                 lambda: dej.insert(ghost, [1], np.ones((1, DIM), np.float32)),
                 lambda: dej.apply_gradients(ghost, [1], np.ones((1, DIM), np.float32))):
        with pytest.raises(KeyError, match="unknown table id 12345"):
            call()


def test_unknown_table_id_at_run_time():
    # A compiled function keeps running after its table is gone: the handler refuses it.
    f = jax.jit(dej.lookup)
    t = dej.create(DIM)
    ids = dej.ids([1])
    f(t, ids)
    dej.destroy(t)
    with pytest.raises(Exception, match="unknown table id"):
        jax.block_until_ready(f(t, ids))


def test_no_optimizer_refused():
    t = dej.create(DIM)
    with pytest.raises(ValueError, match="no optimizer"):
        dej.apply_gradients(t, np.array([1]), np.ones((1, DIM), np.float32))
    dej.destroy(t)


def test_bad_optimizer_refused():
    with pytest.raises(TypeError, match="optimizer"):
        dej.create(DIM, optimizer="adam")
    with pytest.raises(Exception, match="out of range"):
        dej.create(DIM, optimizer=dej.optimizers.adam(1e-3, b1=1.5))


def test_scalar_and_empty_ids(table):
    assert dej.lookup(table, np.array(5)).shape == (DIM,)
    assert dej.lookup(table, 2**40).shape == (DIM,)
    t = dej.apply_gradients(table, np.array(2**40), np.ones(DIM, np.float32))
    np.testing.assert_allclose(dej.lookup(t, 2**40), table.core().initial_values([2**40])[0] - 0.5,
                               rtol=1e-6)
    empty = np.zeros((0,), np.int64)
    assert dej.lookup(t, empty).shape == (0, DIM)
    t = dej.insert(t, empty, np.zeros((0, DIM), np.float32))
    t = dej.apply_gradients(t, empty, np.zeros((0, DIM), np.float32))
    assert int(dej.size(t)) == 1 and int(t.step) == 2  # an update, even if empty, counts
    assert dej.ids(np.array(7)).numpy() == 7

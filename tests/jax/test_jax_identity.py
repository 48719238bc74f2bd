"""A table's identity is a runtime operand: one compiled step serves every table of the same
kind, tables are freed by dej.destroy without leaking compiled code, and the id travels without
truncation. Also: bad scalar arguments are refused in Python, before XLA sees them."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dualemb.jax as dej

DIM = 8
IDS = np.array([5, -3, 2**40 + 7, 2**62 + 1], np.int64)


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _new_table(seed: int, optimizer=None):
    t = dej.create(DIM, initializer=dej.initializers.normal(0.0, 1.0, seed=seed),
                   optimizer=optimizer if optimizer is not None else dej.optimizers.adam(0.1))
    rows = np.random.RandomState(seed).randn(len(IDS), DIM).astype(np.float32)
    return dej.insert(t, IDS, rows), rows


def test_rss_stays_flat_over_200_tables_used_by_one_jitted_step():
    """Regression: every new table id compiled the step anew (~1.5-4.5 MB each, never freed):
    200 tables grew RSS by >300 MB. Bound: 25 MB over 200 tables after a warm-up."""
    traces = []

    @jax.jit
    def step(t, ids, g):
        traces.append(1)
        rows = dej.lookup(t, ids)
        return dej.apply_gradients(t, ids, g), rows.sum()

    ids = dej.ids(np.arange(64, dtype=np.int64))
    g = np.ones((64, DIM), np.float32)

    def one_table():
        t = dej.create(DIM, optimizer=dej.optimizers.adam(0.1))
        t, s = step(t, ids, g)
        jax.block_until_ready(s)
        dej.destroy(t)

    for _ in range(20):  # warm-up: allocator pools, the one compilation
        one_table()
    before = _rss_mib()
    for _ in range(200):
        one_table()
    growth = _rss_mib() - before
    assert len(traces) == 1 and step._cache_size() == 1
    assert growth < 25.0, f"RSS grew by {growth:.1f} MiB over 200 tables"


def test_a_step_compiled_for_one_table_runs_on_another_without_retracing():
    traces = []

    @jax.jit
    def step(t, ids, g):
        traces.append(1)
        rows = dej.lookup(t, ids)
        # g does not depend on rows: without dej.after XLA may run the write first (the GPU
        # backend did: H200, 2026-11-28), and rows would be the updated ones.
        return dej.apply_gradients(dej.after(t, rows), ids, g), rows

    a, rows_a = _new_table(1)
    b, rows_b = _new_table(2)
    ids = dej.ids(IDS)
    g = np.full((len(IDS), DIM), 0.5, np.float32)
    a2, got_a = step(a, ids, g)
    b2, got_b = step(b, ids, g)
    np.testing.assert_array_equal(got_a, rows_a)
    np.testing.assert_array_equal(got_b, rows_b)  # B's rows, not A's
    assert len(traces) == 1 and step._cache_size() == 1
    # Each step trained its own table: Adam's first step moves every row by lr * sign(g).
    np.testing.assert_allclose(dej.lookup(a2, IDS), rows_a - 0.1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dej.lookup(b2, IDS), rows_b - 0.1, rtol=1e-5, atol=1e-6)
    assert int(a2.step) == 1 and int(b2.step) == 1
    dej.destroy(a2)
    dej.destroy(b2)


def test_load_without_into_reuses_the_compiled_step(tmp_path):
    traces = []

    @jax.jit
    def read(t, ids):
        traces.append(1)
        return dej.lookup(t, ids)

    t, rows = _new_table(3)
    read(t, dej.ids(IDS))
    dej.save(t, str(tmp_path / "ckpt"))
    loaded = dej.load(str(tmp_path / "ckpt"))  # a new table, with a new id
    assert loaded.id != t.id
    dej.destroy(t)
    np.testing.assert_array_equal(read(loaded, dej.ids(IDS)), rows)
    assert len(traces) == 1 and read._cache_size() == 1
    dej.destroy(loaded)


def test_scan_carries_the_table_and_runs_on_a_second_table_without_recompiling():
    ids = dej.ids(IDS)
    g = np.ones((3, len(IDS), DIM), np.float32)

    @jax.jit
    def train(t, gs):
        def body(t, gi):
            return dej.apply_gradients(t, ids, gi), None
        return jax.lax.scan(body, t, gs)[0]

    a, rows_a = _new_table(4, dej.optimizers.sgd(0.25))
    b, rows_b = _new_table(5, dej.optimizers.sgd(0.25))
    a, b = train(a, g), train(b, g)
    assert train._cache_size() == 1
    np.testing.assert_allclose(dej.lookup(a, IDS), rows_a - 0.75, rtol=1e-6)
    np.testing.assert_allclose(dej.lookup(b, IDS), rows_b - 0.75, rtol=1e-6)
    assert int(a.step) == 3
    dej.destroy(a)
    dej.destroy(b)


def test_high_bits_of_the_id_are_kept():
    """Two tables whose ids differ only above bit 31 (and one at the top of the 63-bit range)
    stay apart in JAX's 32-bit mode, under jit."""
    base = 2**62 + 12345
    t1 = dej.create(DIM, initializer=1.0, table_id=base)
    t2 = dej.create(DIM, initializer=2.0, table_id=base - 2**40)
    assert (t1.id, t2.id) == (base, base - 2**40)
    f = jax.jit(dej.lookup)
    np.testing.assert_array_equal(f(t1, dej.ids(IDS)), np.ones((len(IDS), DIM)))
    np.testing.assert_array_equal(f(t2, dej.ids(IDS)), np.full((len(IDS), DIM), 2.0))
    dej.destroy(t1)
    dej.destroy(t2)


def test_a_destroyed_table_gives_an_error_naming_its_id_eagerly_and_inside_jit():
    f = jax.jit(lambda t, i: dej.apply_gradients(t, i, jnp.ones((len(IDS), DIM))))
    t, _ = _new_table(6)
    jax.block_until_ready(f(t, dej.ids(IDS)).version)
    dej.destroy(t)
    with pytest.raises(KeyError, match=f"unknown table id {t.id}"):
        dej.lookup(t, IDS)
    with pytest.raises(Exception, match=f"unknown table id {t.id}"):
        jax.block_until_ready(f(t, dej.ids(IDS)).version)
    with pytest.raises(Exception, match=f"unknown table id {t.id}"):
        jax.block_until_ready(jax.jit(dej.size)(t))
    dej.destroy(t)  # destroying twice is a no-op, like jax.Array.delete


def test_vmap_over_a_batch_of_tables_is_refused_not_read_from_the_first():
    a, _ = _new_table(7)
    b, _ = _new_table(8)
    both = jax.tree_util.tree_map(lambda x, y: jnp.stack([x, y]), a, b)
    with pytest.raises(Exception, match="vmapping over a batch of tables"):
        jax.block_until_ready(jax.vmap(lambda t: dej.lookup(t, dej.ids(IDS)))(both))
    dej.destroy(a)
    dej.destroy(b)


def test_table_id_is_unavailable_while_tracing():
    t, _ = _new_table(9)
    with pytest.raises(TypeError, match="runtime operand"):
        jax.jit(lambda t: t.id)(t)
    dej.destroy(t)


# ---- bad scalar arguments: refused in Python, never reaching XLA ------------------------------

@pytest.mark.parametrize("limit, offset, error", [
    (-1, 0, ValueError),           # was MLIRError "invalid tensor dimension size"
    (2.5, 0, TypeError),           # was silently exported as 2 rows
    (True, 0, TypeError),          # was silently 1 row
    (2**40, 0, ValueError),        # was an out-of-memory error from XLA
    (2, -1, ValueError),           # was an FFI error at run time
    (2, 1.5, TypeError),           # was silently offset 1
    (2, 2**40, ValueError),        # was OverflowError from numpy
])
def test_export_refuses_bad_limit_and_offset(limit, offset, error):
    t, _ = _new_table(10)
    with pytest.raises(error, match="limit|offset"):
        dej.export(t, limit, offset)
    dej.destroy(t)


def test_export_with_a_traced_negative_offset_fails_at_run_time():
    t, _ = _new_table(11)
    f = jax.jit(lambda t, o: dej.export(t, 2, o))
    with pytest.raises(Exception, match="offset must be >= 0"):
        jax.block_until_ready(f(t, jnp.int32(-1)))
    keys, values, count = f(t, jnp.int32(0))
    assert int(count) == 2
    dej.destroy(t)


@pytest.mark.parametrize("step, error", [(-1, ValueError), (1.5, TypeError),
                                         (2**40, ValueError), (True, TypeError)])
def test_attach_refuses_a_bad_step(step, error):
    """Regression: step=-1 was accepted, and the first update then ran with step 0 (a
    division by zero in Adam's bias correction)."""
    t, _ = _new_table(12)
    with pytest.raises(error, match="step"):
        dej.attach(t.id, learning_rate=0.1, step=step)
    dej.destroy(t)


def test_a_schedule_returning_a_non_scalar_is_refused():
    t = dej.create(DIM, optimizer=dej.optimizers.sgd(lambda count: jnp.ones(3) * 0.1))
    before = np.asarray(dej.lookup(t, IDS))
    with pytest.raises(ValueError, match="scalar"):
        dej.apply_gradients(t, IDS, np.ones((len(IDS), DIM), np.float32))
    np.testing.assert_array_equal(dej.lookup(t, IDS), before)
    dej.destroy(t)


@pytest.mark.parametrize("table_id", [-1, 2**63, 2**64, 1.5])
def test_create_refuses_a_bad_table_id(table_id):
    with pytest.raises(ValueError, match="table_id"):
        dej.create(DIM, table_id=table_id)


def test_generic_optax_tables_share_one_compiled_step_too():
    """The generic path's state tables are leaves as well: two tables trained with the same
    Optax transformation run one executable, each on its own rows and state."""
    optax = pytest.importorskip("optax")
    tx = optax.adam(0.1)
    traces = []

    @jax.jit
    def step(t, ids, g):
        traces.append(1)
        return dej.apply_gradients(t, ids, g)

    ids = dej.ids(IDS)
    g = np.ones((len(IDS), DIM), np.float32)
    a, rows_a = _new_table(13, tx)
    b, rows_b = _new_table(14, tx)
    a, b = step(a, ids, g), step(b, ids, g)
    b = step(b, ids, g)
    assert len(traces) == 1 and step._cache_size() == 1
    # Reference: Optax Adam on the dense rows (a: one step, b: two).
    def ref(rows, n):
        p, s = jnp.asarray(rows), tx.init(jnp.asarray(rows))
        for _ in range(n):
            u, s = tx.update(jnp.ones_like(p), s, p)
            p = optax.apply_updates(p, u)
        return p
    np.testing.assert_allclose(dej.lookup(a, IDS), ref(rows_a, 1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dej.lookup(b, IDS), ref(rows_b, 2), rtol=1e-5, atol=1e-6)
    assert int(a.opt_state[0]) == 1 and int(b.opt_state[0]) == 2
    dej.destroy(a)
    dej.destroy(b)

"""Optax habits on dynamic tables: inject_hyperparams, mask, mu_dtype, nadamw, and what happens
to every Optax alias (fused, generic path, or refused by name).

References are dense jnp arrays trained by Optax itself on the same rows; every batch holds
every row (plus duplicates, whose gradients the dense reference sums), so lazy (sparse) updates
and dense ones agree.
"""

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dualemb.jax as dej
from dualemb.jax import optimizers as O
from dualemb.jax.generic import GenericOptimizer
from xla_division import optax_rounds_as_the_core

V, DIM, STEPS = 6, 5, 8
KEYS = np.array([11, 2**40 + 7, -3, 2**33, 5, 123456789], np.int64)
# The learning rate each step runs with: changed twice mid-run, by hand.
LRS = [0.05] * 3 + [0.01] * 3 + [0.2] * 2


def _batches(seed=0, steps=STEPS, duplicates=4):
    rs = np.random.RandomState(seed)
    out = []
    for _ in range(steps):
        idx = np.concatenate([rs.permutation(V), rs.randint(0, V, size=duplicates)])
        rs.shuffle(idx)
        out.append((idx, rs.randn(len(idx), DIM).astype(np.float32)))
    return out


def _new_table(opt):
    return dej.create(DIM, initializer=dej.initializers.normal(0.0, 0.5, seed=7), optimizer=opt)


def _dense_injected(factory, init, lrs, duplicates=4, **kwargs):
    """Optax's own inject_hyperparams on a dense matrix, its learning rate set by hand. Only the
    learning rate is injected, as on the fused path: Optax with b1, b2, ... injected as float32
    arrays rounds differently from Optax with them as constants (a few ulps after some steps)."""
    import inspect
    static = [n for n in inspect.signature(factory).parameters if n != "learning_rate"]
    tx = optax.inject_hyperparams(factory, static_args=static)(learning_rate=lrs[0], **kwargs)
    params = jnp.asarray(init)
    state = tx.init(params)

    # Not jitted: XLA would fuse ``p + (-lr) * g`` into one fused multiply-add (one rounding),
    # which the core never does (DESIGN: no FMA contraction); op by op, each operation rounds
    # as the core's kernel does.
    def step(params, state, idx, g):
        dense_g = jax.ops.segment_sum(g, idx, num_segments=V)
        updates, state = tx.update(dense_g, state, params)
        return optax.apply_updates(params, updates), state

    for lr, (idx, g) in zip(lrs, _batches(duplicates=duplicates)):
        state.hyperparams["learning_rate"] = jnp.asarray(lr, jnp.float32)
        params, state = step(params, state, jnp.asarray(idx), jnp.asarray(g))
    return np.asarray(params)


def _train_injected(opt, lrs, duplicates=4):
    t = _new_table(opt)
    init = np.asarray(dej.lookup(t, KEYS))

    @jax.jit
    def step(t, ids, g):
        return dej.apply_gradients(t, ids, g)

    for lr, (idx, g) in zip(lrs, _batches(duplicates=duplicates)):
        t = O.set_hyperparams(t, learning_rate=lr)
        t = step(t, dej.ids(KEYS[idx]), g)
    assert step._cache_size() == 1  # the learning rate changed three times, compiled once
    np.testing.assert_array_equal(O.hyperparams(t)["learning_rate"], np.float32(lrs[-1]))
    out = np.asarray(dej.lookup(t, KEYS))
    dej.destroy(t)
    return init, out


# Fused optimizers whose core kernel follows Optax's float32 operations one for one: on batches
# of distinct ids the result equals dense Optax (run op by op) bit for bit. With duplicate ids
# the per-id gradient sums may be added in another order than XLA's segment_sum (an ulp).
# rmsprop and adagrad differ from Optax by an ulp or two (the core's 1/sqrt against Optax's
# rsqrt form): float32 tolerance.
BITWISE = {"sgd": {}, "sgd_momentum": {"momentum": 0.9}, "adam": {},
           "adamw": {"weight_decay": 0.1}, "nadamw": {"weight_decay": 0.1}, "nadam": {},
           "amsgrad": {}, "adamax": {}, "adadelta": {}, "lion": {}}
CLOSE = {"rmsprop": {}, "adagrad": {}}


@pytest.mark.parametrize("case", sorted(BITWISE) + sorted(CLOSE))
def test_injected_learning_rate_changed_mid_run_equals_dense_optax(case, monkeypatch):
    name = case.split("_")[0]
    kwargs = {**BITWISE, **CLOSE}[case]
    opt = O.inject_hyperparams(getattr(optax, name))(learning_rate=LRS[0], **kwargs)
    assert isinstance(opt, O.Optimizer) and opt.injected  # Optax's factory, fused
    for duplicates in (0, 4):
        init, trained = _train_injected(opt, LRS, duplicates)
        expected = _dense_injected(getattr(optax, name), init, LRS, duplicates, **kwargs)
        assert not np.allclose(trained, init)
        np.testing.assert_allclose(trained, expected, rtol=2e-5, atol=2e-6)
        if case in BITWISE and not duplicates:
            # Where XLA rounds Optax's bias correction otherwise than the core (jax >= 0.12.1),
            # bit for bit against Optax rounding that one operation as the core does.
            with monkeypatch.context() as m:
                if optax_rounds_as_the_core(m):
                    expected = _dense_injected(getattr(optax, name), init, LRS, duplicates,
                                               **kwargs)
            np.testing.assert_array_equal(trained, expected)


def test_injected_equals_the_same_constant_rates_run_in_pieces():
    # Changing the rate by hand equals three fused tables' worth of constant rates: the rate is
    # the only thing that changes, the slots and the step count carry on.
    _, injected = _train_injected(O.inject_hyperparams(O.adam)(learning_rate=LRS[0]), LRS)
    t = _new_table(O.adam(LRS[0]))
    for i, (idx, g) in enumerate(_batches()):
        t = t.replace(optimizer=O.adam(LRS[i]))
        t = dej.apply_gradients(t, dej.ids(KEYS[idx]), g)
    np.testing.assert_array_equal(injected, np.asarray(dej.lookup(t, KEYS)))
    dej.destroy(t)


def test_injected_tables_share_one_compiled_step_whatever_their_starting_rate():
    a = _new_table(O.inject_hyperparams(O.adam)(learning_rate=0.1))
    b = _new_table(O.inject_hyperparams(O.adam)(learning_rate=0.001))
    # A function of its own: jit's cache is per function, and other tests jit apply_gradients.
    step = jax.jit(lambda t, ids, g: dej.apply_gradients(t, ids, g))
    ids, g = dej.ids(KEYS), np.ones((V, DIM), np.float32)
    a, b = step(a, ids, g), step(b, ids, g)
    assert step._cache_size() == 1
    assert float(O.hyperparams(a)["learning_rate"]) == np.float32(0.1)
    assert float(O.hyperparams(b)["learning_rate"]) == np.float32(0.001)
    for t in (a, b):
        dej.destroy(t)


def test_set_hyperparams_inside_jit_follows_a_traced_rate():
    t = _new_table(O.inject_hyperparams(O.sgd)(learning_rate=1.0))
    init = np.asarray(dej.lookup(t, KEYS))

    @jax.jit
    def step(t, lr, ids, g):
        return dej.apply_gradients(O.set_hyperparams(t, learning_rate=lr), ids, g)

    g = np.ones((V, DIM), np.float32)
    t = step(t, jnp.float32(0.25), dej.ids(KEYS), g)
    np.testing.assert_array_equal(dej.lookup(t, KEYS), init - np.float32(0.25))
    dej.destroy(t)


def test_what_inject_hyperparams_cannot_do_on_the_fused_path_raises_by_name():
    with pytest.raises(TypeError, match="b1 was given a schedule"):
        O.inject_hyperparams(O.adam)(learning_rate=0.1, b1=lambda c: 0.9)
    with pytest.raises(TypeError, match="inject_hyperparams fuses"):
        O.inject_hyperparams(optax.yogi)(learning_rate=0.1)
    t = _new_table(O.inject_hyperparams(O.adam)(learning_rate=0.1))
    with pytest.raises(TypeError, match="b1 of 'adam' is not injected"):
        O.set_hyperparams(t, b1=0.5)
    plain = _new_table(O.adam(0.1))
    with pytest.raises(TypeError, match="learning_rate of 'adam' is not injected"):
        O.set_hyperparams(plain, learning_rate=0.5)
    # A schedule under injection is evaluated on the step count, as Optax recomputes it.
    sched = O.inject_hyperparams(O.adam)(learning_rate=lambda c: 0.1 / (c + 1))
    assert not sched.injected
    # A sharded table does not carry the value: its step refuses, naming the reason.
    with pytest.raises(TypeError, match="injected"):
        O.inject_hyperparams(O.adam)(learning_rate=0.1).learning_rate_at(0)
    for x in (t, plain):
        dej.destroy(x)


def test_optax_inject_hyperparams_on_the_generic_path_sets_and_reads_by_name():
    # optax.inject_hyperparams of a transformation the core does not fuse: the generic path,
    # with the same hyperparams / set_hyperparams.
    tx = optax.inject_hyperparams(optax.yogi)(learning_rate=LRS[0])
    init, trained = _train_injected(tx, LRS)
    expected = _dense_injected(optax.yogi, init, LRS)
    np.testing.assert_allclose(trained, expected, rtol=2e-5, atol=2e-6)
    t = _new_table(optax.inject_hyperparams(optax.yogi)(learning_rate=0.1,
                                                         b1=optax.linear_schedule(0.9, 0.5, 4)))
    assert set(O.hyperparams(t)) >= {"learning_rate", "b1", "b2", "eps"}
    with pytest.raises(TypeError, match="b1 follows a schedule"):
        O.set_hyperparams(t, b1=0.3)
    with pytest.raises(TypeError, match="nonsense is not injected"):
        O.set_hyperparams(t, nonsense=0.3)
    dej.destroy(t)


# ---- nadamw, mask, mu_dtype -----------------------------------------------------------------

def _train_plain(opt, steps=STEPS):
    t = _new_table(opt)
    init = np.asarray(dej.lookup(t, KEYS))
    step = jax.jit(dej.apply_gradients)
    for idx, g in _batches(steps=steps):
        t = step(t, dej.ids(KEYS[idx]), g)
    return t, init


def _train_dense(tx, init, steps=STEPS):
    params = jnp.asarray(init)
    state = tx.init(params)

    @jax.jit
    def step(params, state, idx, g):
        updates, state = tx.update(jax.ops.segment_sum(g, idx, num_segments=V), state, params)
        return optax.apply_updates(params, updates), state

    for idx, g in _batches(steps=steps):
        params, state = step(params, state, jnp.asarray(idx), jnp.asarray(g))
    return np.asarray(params)


@pytest.mark.parametrize("ours,theirs", [
    (O.nadamw(0.01, weight_decay=0.1), optax.nadamw(0.01, weight_decay=0.1)),
    (O.adamw(0.01, weight_decay=0.1, mask=False),
     optax.adamw(0.01, weight_decay=0.1, mask=lambda p: False)),
    (O.adamw(0.01, weight_decay=0.1, mask=True),
     optax.adamw(0.01, weight_decay=0.1, mask=lambda p: True)),
    (O.lion(0.01, weight_decay=0.1, mask=np.bool_(False)),
     optax.lion(0.01, weight_decay=0.1, mask=lambda p: False)),
    (O.adadelta(0.5, weight_decay=0.1, weight_decay_mask=False),
     optax.adadelta(0.5, weight_decay=0.1, weight_decay_mask=lambda p: False)),
], ids=["nadamw", "adamw_mask_false", "adamw_mask_true", "lion_mask_false", "adadelta_mask"])
def test_nadamw_and_masks_are_fused_and_equal_dense_optax(ours, theirs):
    assert isinstance(ours, O.Optimizer)
    t, init = _train_plain(ours)
    np.testing.assert_allclose(dej.lookup(t, KEYS), _train_dense(theirs, init), rtol=2e-5,
                               atol=2e-6)
    dej.destroy(t)


def test_a_callable_mask_is_refused_by_name():
    with pytest.raises(TypeError, match="mask=.*a dynamic table is one parameter"):
        O.adamw(0.01, mask=lambda p: True)
    with pytest.raises(TypeError, match="weight_decay_mask=.*one parameter"):
        O.adadelta(0.5, weight_decay=0.1, weight_decay_mask=lambda p: True)


@pytest.mark.parametrize("name", ["adam", "adamw", "nadamw", "lion"])
def test_mu_dtype_runs_on_the_generic_path_with_bfloat16_moments(name):
    opt = getattr(O, name)(0.01, mu_dtype=jnp.bfloat16)
    assert isinstance(opt, GenericOptimizer)
    t, init = _train_plain(opt)
    expected = _train_dense(getattr(optax, name)(0.01, mu_dtype=jnp.bfloat16), init)
    np.testing.assert_allclose(dej.lookup(t, KEYS), expected, rtol=2e-5, atol=2e-6)
    # The first moment's companion table stores bfloat16 rows, as Optax's state does.
    from dualemb.core.table import Table as CoreTable
    dtypes = sorted(str(CoreTable.attach(i).value_dtype) for i in t.slot_ids)
    assert "bfloat16" in dtypes, dtypes
    dej.destroy(t)


def test_float32_mu_dtype_stays_fused():
    assert isinstance(O.adam(0.01, mu_dtype=jnp.float32), O.Optimizer)
    assert isinstance(O.sgd(0.1, momentum=0.9, accumulator_dtype=jnp.float32), O.Optimizer)
    assert isinstance(O.sgd(0.1, momentum=0.9, accumulator_dtype=jnp.bfloat16),
                      GenericOptimizer)


# ---- every Optax alias: fused, generic, or refused by name (the table in docs/jax.md) ------------

def _doc_rows():
    """{optax alias: (dualemb path, keras counterpart)} from the table in docs/jax.md."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "jax.md").read_text()
    section = text.split("## Optax optimizers on a table", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\|\s*`optax\.(\w+)`\s*\|([^|]*)\|([^|]*)\|", line)
        if m:
            rows[m.group(1)] = (m.group(2).strip(), m.group(3).strip())
    return rows


def _aliases():
    from optax._src import alias
    import inspect
    return sorted(n for n, f in inspect.getmembers(alias, inspect.isfunction)
                  if f.__module__ == alias.__name__ and not n.startswith("_"))


def test_the_docs_table_names_every_optax_alias_and_every_fused_one():
    rows = _doc_rows()
    missing = sorted(set(_aliases()) - set(rows))
    assert not missing, f"docs/jax.md's Optax table lacks {missing}"
    fused = {n for n, (path, _) in rows.items() if path.startswith("fused")}
    assert fused == set(O.FUSED), (fused, O.FUSED)


def _construct(name):
    factory = getattr(optax, name)
    if name == "lbfgs":
        return factory()
    if name == "polyak_sgd":
        return factory(max_learning_rate=0.1)
    if name == "noisy_sgd":
        return factory(0.01, key=0) if "key" in str(__import__("inspect").signature(factory)) \
            else factory(0.01)
    return factory(0.01)


@pytest.mark.parametrize("name", [n for n in _aliases()])
def test_each_optax_alias_is_fused_generic_equal_to_dense_or_refused(name):
    path = _doc_rows().get(name, ("", ""))[0]
    if path.startswith("fused"):
        # Fused: dualemb.jax.optimizers has the same name; parity in test_jax_optimizers.
        assert name in O.FUSED and callable(getattr(O, name))
        return
    tx = _construct(name)
    if path.startswith("refused"):
        with pytest.raises(TypeError, match="generic optimizer path cannot"):
            t = dej.create(DIM, optimizer=tx)
            try:
                dej.apply_gradients(t, dej.ids(KEYS), np.ones((V, DIM), np.float32))
            finally:
                dej.destroy(t)
        return
    assert path.startswith("generic"), f"{name}: docs say {path!r}"
    t, init = _train_plain(tx, steps=4)
    expected = _train_dense(_construct(name), init, steps=4)
    np.testing.assert_allclose(dej.lookup(t, KEYS), expected, rtol=1e-4, atol=1e-5)
    dej.destroy(t)

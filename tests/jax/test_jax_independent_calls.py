"""Calls on different tables stay independent in XLA's schedule (the CPU platform).

XLA's CPU runtime runs two operations one after the other when they touch the same buffer, and
its buffer assignment gives results that nothing reads (dead results) one shared slot. So a
custom call with a result nobody reads is ordered after every other such call: before this was
fixed, a training step's per-table lookups (``find`` with its unwanted ``exists`` result) ran in
one chain, one table after another, instead of side by side (docs/benchmarks.md, "Lookups of
different tables in one chain"). These tests read the compiled HLO: every result of every
dualemb custom call in a training step is read by something. (The values of these calls are
checked against the core and dense references elsewhere: test_jax_ops, test_jax_optax_habits.)
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dualemb.jax as dej

FEATURES, BATCH, DIM = 3, 64, 4

# "%name = <shape> custom-call(...), custom_call_target="dualemb_..."" in HLO text.
_CALL = re.compile(r"^\s*(?:ROOT\s+)?%(\S+)\s*=\s*(.*?)\s+custom-call\(.*custom_call_target=\"(dualemb_\w+)\"")


def _tuple_arity(shape: str) -> int:
    """Elements of an HLO result shape: 1 for an array, n for a flat tuple of n arrays."""
    if not shape.startswith("("):
        return 1
    depth, count = 0, 1
    for ch in shape[1:-1]:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            count += 1
    return count


def unread_results(hlo: str) -> list[str]:
    """'target result i' for each result of a dualemb custom call that no instruction reads."""
    lines = hlo.splitlines()
    unread = []
    for line in lines:
        m = _CALL.match(line)
        if not m:
            continue
        name, shape, target = m.groups()
        users = [u for u in lines if u is not line and re.search(rf"%{re.escape(name)}\b", u)]
        if not shape.startswith("("):
            if not users and not line.lstrip().startswith("ROOT"):
                unread.append(f"{target} result 0")
            continue
        for i in range(_tuple_arity(shape)):
            read = any(re.search(rf"get-tuple-element\(%{re.escape(name)}\), index={i}\b", u)
                       for u in users)
            if not read:
                unread.append(f"{target} result {i}")
    return unread


def _ids(seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 40, (BATCH, FEATURES)).astype(np.int64)


def _loss(rows, w):
    x = jnp.concatenate(rows, axis=1)
    return jnp.mean(jnp.tanh(x @ w) ** 2)


def _step(tables, ids, w):
    cols = [ids[:, f] for f in range(FEATURES)]
    rows = [dej.lookup(t, c) for t, c in zip(tables, cols)]
    loss, grads = jax.value_and_grad(_loss)(rows, w)
    return [dej.apply_gradients(t, c, g) for t, c, g in zip(tables, cols, grads)], loss


def _tables(optimizer):
    return [dej.create(DIM, optimizer=optimizer,
                       initializer=dej.initializers.normal(0.0, 0.1, seed=f + 1))
            for f in range(FEATURES)]


@pytest.fixture(autouse=True)
def _cpu():
    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.mark.parametrize("optimizer, update_target", [
    pytest.param(lambda: dej.optimizers.adam(0.05), "dualemb_apply_gradients", id="fused_adam"),
    # Optax transformations without a fused kernel read rows through find_or_insert.
    pytest.param(lambda: optax.lion(0.05), "dualemb_find_or_insert", id="generic_lion"),
])
def test_a_training_steps_table_calls_have_no_unread_results(optimizer, update_target):
    tables = _tables(optimizer())
    ids = dej.ids(_ids())
    w = jnp.ones((FEATURES * DIM, 1), jnp.float32) * 0.1
    hlo = jax.jit(_step).lower(tables, ids, w).compile().as_text()
    for target in ("dualemb_find", update_target):  # the calls are custom calls on this platform
        assert f'custom_call_target="{target}"' in hlo
    assert unread_results(hlo) == []
    for t in tables:
        dej.destroy(t)


def test_a_multi_table_steps_calls_have_no_unread_results():
    # lookup_many asks find_many for rows only; its exists results would be unread.
    tables = _tables(dej.optimizers.adam(0.05))
    ids = dej.ids(_ids())
    w = jnp.ones((FEATURES * DIM, 1), jnp.float32) * 0.1

    def step(tables, ids, w):
        cols = [ids[:, f] for f in range(FEATURES)]
        loss, grads = jax.value_and_grad(_loss)(dej.lookup_many(tables, cols), w)
        return dej.apply_gradients_many(tables, cols, grads), loss

    hlo = jax.jit(step).lower(tables, ids, w).compile().as_text()
    for target in ("dualemb_find_many", "dualemb_apply_gradients_many"):
        assert f'custom_call_target="{target}"' in hlo
    assert unread_results(hlo) == []
    for t in tables:
        dej.destroy(t)


def test_the_checker_finds_an_unread_result():
    # find's exists, asked for and then dropped, is such a result: the check above can fail.
    tables = _tables(None)
    ids = dej.ids(_ids())
    hlo = jax.jit(lambda ts, i: [dej.find(t, i[:, f])[0] for f, t in enumerate(ts)]).lower(
        tables, ids).compile().as_text()
    assert unread_results(hlo) == ["dualemb_find result 1"] * FEATURES
    for t in tables:
        dej.destroy(t)

"""JAX writes report evictions through the table's cumulative counter (dej.evicted_total), the
same counter the core and TF read: checked against the keys that really left the table, for
every kind of write, jitted."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dualemb.jax as dej
from dualemb.core import Table as CoreTable


def _ids(lo, hi):
    return dej.ids(np.arange(lo, hi, dtype=np.int64))


def test_every_write_is_counted():
    t = dej.create(2, capacity=8, optimizer=dej.optimizers.sgd(0.1))
    ins = jax.jit(dej.insert)
    t = ins(t, _ids(0, 12), jnp.ones((12, 2), jnp.float32))
    assert dej.evicted_total(t) == 4 and int(dej.size(t)) == 8
    t = jax.jit(dej.apply_gradients)(t, _ids(100, 103),
                                     jnp.ones((3, 2), jnp.float32))
    assert dej.evicted_total(t) == 7 and int(dej.size(t)) == 8
    _, _, t = jax.jit(dej.find_or_insert)(t, _ids(200, 205))
    assert dej.evicted_total(t) == 12 and int(dej.size(t)) == 8
    t = jax.jit(dej.accum)(t, _ids(300, 302), jnp.ones((2, 2)),
                           jnp.zeros(2, bool))
    assert dej.evicted_total(t) == 14 and int(dej.size(t)) == 8
    # The same counter as the core's view of the table.
    assert CoreTable.attach(t.id).evicted_total == 14


def test_evicted_total_refuses_a_non_table_and_a_destroyed_one():
    with pytest.raises(TypeError):
        dej.evicted_total(np.zeros(3))
    t = dej.create(2)
    dej.destroy(t)
    with pytest.raises(KeyError):
        dej.evicted_total(t)

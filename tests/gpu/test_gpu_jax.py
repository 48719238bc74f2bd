"""JAX on a GPU table (dualemb.jax.create(..., placement="gpu")): the CUDA XLA FFI handlers
against the CPU core on the same inputs, bit for bit — jitted training steps of each fused
optimizer, find / find_or_insert, vmap, and the version-token ordering.

Skipped, naming why, where no GPU table can be made from JAX (no GPU backend, a build without
the GPU table or its CUDA FFI module). Run on an H200, 2026-11-28
(docs/bench/gpu_2026-11-28_h200.json).
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import dualemb.jax as dej  # noqa: E402
from dualemb.core import Table  # noqa: E402
from dualemb.jax import gpu as dej_gpu  # noqa: E402

_OK, _WHY = dej_gpu.available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"no GPU table from JAX: {_WHY}")

DIM = 8
INIT = {"initializer": "normal", "seed": 3, "mean": 0.0, "stddev": 0.1}

OPTIMIZERS = [
    ("sgd", lambda: dej.optimizers.sgd(0.05, momentum=0.9, nesterov=True)),
    ("adagrad", lambda: dej.optimizers.adagrad(0.05)),
    ("adam", lambda: dej.optimizers.adam(0.01)),
    ("amsgrad", lambda: dej.optimizers.amsgrad(0.01)),
    ("adamw", lambda: dej.optimizers.adamw(0.01, weight_decay=0.01)),
    ("nadamw", lambda: dej.optimizers.nadamw(0.01)),
    ("adamax", lambda: dej.optimizers.adamax(0.01)),
    ("nadam", lambda: dej.optimizers.nadam(0.01)),
    ("rmsprop", lambda: dej.optimizers.rmsprop(0.01, centered=True, momentum=0.5)),
    ("adadelta", lambda: dej.optimizers.adadelta(1.0)),
    ("lion", lambda: dej.optimizers.lion(0.001)),
    ("ftrl", lambda: dej.optimizers.ftrl(0.05)),
]


def _bits(a):
    return np.ascontiguousarray(np.asarray(a), np.float32).view(np.int32)


def _ids(keys):
    return dej.ids(np.asarray(keys, np.int64))


@pytest.mark.parametrize("name,make", OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
def test_ten_jitted_steps_equal_cpu(name, make):
    opt = make()
    table = dej.create(DIM, initializer=dej.initializers.normal(0.0, 0.1, seed=3),
                       optimizer=opt, placement="gpu")
    cpu = Table(dim=DIM, initializer=INIT, optimizer=opt.spec)
    try:
        assert table.placement == "gpu"

        @jax.jit
        def step(t, ids, target):
            def loss(rows):
                return jnp.sum((rows - target) ** 2)
            rows = dej.lookup(t, ids)
            g = jax.grad(loss)(rows)
            return dej.apply_gradients(t, ids, g), rows, g

        rng = np.random.RandomState(0)
        for t in range(1, 11):
            keys = rng.randint(0, 500, size=256).astype(np.int64)  # duplicates, new keys
            target = rng.randn(256, DIM).astype(np.float32)
            rows_cpu, _ = cpu.find(keys)
            table, rows, g = step(table, _ids(keys), jnp.asarray(target))
            assert np.array_equal(_bits(rows), _bits(rows_cpu))
            cpu.apply_gradients(keys, np.asarray(g), lr=float(opt.learning_rate), step=t)
        host = dej_gpu.host_table(table)
        c, h = cpu.export(), host.export()
        ci, hi = np.argsort(c["keys"]), np.argsort(h["keys"])
        assert np.array_equal(c["keys"][ci], h["keys"][hi])
        assert np.array_equal(_bits(c["values"][ci]), _bits(h["values"][hi]))
        assert np.array_equal(_bits(c["slots"][ci]), _bits(h["slots"][hi]))
        assert int(table.step) == 10
    finally:
        dej.destroy(table)
        cpu.destroy()


def test_find_and_find_or_insert_under_jit_and_vmap():
    table = dej.create(DIM, initializer=dej.initializers.normal(0.0, 0.1, seed=3),
                       placement="gpu")
    cpu = Table(dim=DIM, initializer=INIT)
    try:
        keys = np.array([[5, 9, 5, 2**40], [7, 9, 1, 3]], np.int64)
        rows, exists = jax.jit(dej.find)(table, _ids(keys))
        crow, cex = cpu.find(keys.reshape(-1))
        assert np.array_equal(_bits(rows).reshape(-1, DIM), _bits(crow))
        assert not np.asarray(exists).any()
        rows, exists, table = jax.jit(dej.find_or_insert)(table, _ids(keys))
        crow, cex = cpu.find_or_insert(keys.reshape(-1))
        assert np.array_equal(_bits(rows).reshape(-1, DIM), _bits(crow))
        assert np.array_equal(np.asarray(exists).reshape(-1), cex)
        # vmap: one call for the whole batch (expand_dims), the same rows as a plain call.
        vrows = jax.jit(jax.vmap(dej.lookup, in_axes=(None, 0)))(table, _ids(keys))
        assert np.array_equal(_bits(vrows).reshape(-1, DIM), _bits(crow))
        assert dej_gpu.host_table(table).size() == cpu.size() == 6
    finally:
        dej.destroy(table)
        cpu.destroy()


def test_reads_see_the_writes_they_were_given():
    # The version token orders the calls: a lookup given the table a write returned reads
    # after it, inside one jitted function; a write that does not depend on an earlier read
    # runs after it only through dej.after (XLA's GPU scheduler did run it first: H200,
    # 2026-11-28; tests/jax/test_jax_ordering.py).
    opt = dej.optimizers.sgd(1.0)
    table = dej.create(DIM, optimizer=opt, placement="gpu")
    try:
        ids = _ids([1, 2, 3])

        @jax.jit
        def f(t):
            before = dej.lookup(t, ids)
            t = dej.apply_gradients(dej.after(t, before), ids, jnp.ones((3, DIM), jnp.float32))
            after = dej.lookup(t, ids)
            return t, before, after

        table, before, after = f(table)
        assert np.array_equal(np.asarray(before), np.zeros((3, DIM), np.float32))
        assert np.array_equal(np.asarray(after), -np.ones((3, DIM), np.float32))
    finally:
        dej.destroy(table)


def test_other_ops_refuse_a_gpu_table_and_destroy_is_final():
    table = dej.create(DIM, placement="gpu")
    tid = table.id
    with pytest.raises(NotImplementedError, match="GPU table"):
        dej.size(table)
    with pytest.raises(NotImplementedError, match="GPU table"):
        dej.insert(table, _ids([1]), jnp.zeros((1, DIM)))
    dej.destroy(table)
    with pytest.raises(KeyError, match=str(tid)):
        dej.lookup(table, _ids([1]))

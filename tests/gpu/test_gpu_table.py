"""The GPU table (libdualemb_cuda.so) against the CPU core on the same inputs, bit for bit.

Skipped, naming why, where no GPU table can be made (library not built, no CUDA driver, no
device): dualemb.core._cuda.available() says which. Not yet run on a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest

from dualemb.core import Table
from dualemb.core import _cuda

_OK, _WHY = _cuda.available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"no GPU table: {_WHY}")

DIM = 8
INITIALIZERS = [
    {"initializer": "zeros"},
    {"initializer": "constant", "value": 0.5},
    {"initializer": "normal", "seed": 7, "mean": 0.1, "stddev": 2.0},
    {"initializer": "truncated_normal", "seed": 3, "stddev": 0.5},
    {"initializer": "uniform", "seed": 11, "minval": -0.2, "maxval": 0.4},
]

OPTIMIZERS = [
    {"name": "sgd", "flavor": "keras", "momentum": 0.9, "nesterov": True},
    {"name": "sgd", "flavor": "optax"},
    {"name": "adagrad", "flavor": "keras"},
    {"name": "adagrad", "flavor": "optax"},
    {"name": "adam", "flavor": "keras", "amsgrad": True},
    {"name": "adamw", "flavor": "keras"},
    {"name": "adam", "flavor": "optax"},
    {"name": "adamw", "flavor": "optax", "nesterov": True},
    {"name": "adamax", "flavor": "keras"},
    {"name": "adamax", "flavor": "optax"},
    {"name": "nadam", "flavor": "keras"},
    {"name": "nadam", "flavor": "optax"},
    {"name": "rmsprop", "flavor": "keras", "centered": True, "momentum": 0.5},
    {"name": "rmsprop", "flavor": "optax", "centered": True, "momentum": 0.9},
    {"name": "ftrl", "flavor": "keras", "l1_regularization_strength": 0.01},
    {"name": "adadelta", "flavor": "keras"},
    {"name": "adadelta", "flavor": "optax", "weight_decay": 0.01},
    {"name": "lion", "flavor": "keras", "weight_decay": 0.1},
    {"name": "lion", "flavor": "optax"},
]


def _bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.int32)


def _pair(init=None, optimizer=None):
    init = init or {"initializer": "zeros"}
    cpu = Table(dim=DIM, optimizer=optimizer, initializer=init)
    gpu = _cuda.GpuTable(DIM, optimizer=optimizer, **init)
    return cpu, gpu


def _sorted_export(cpu, gpu):
    c = cpu.export()
    g = gpu.export()
    ci, gi = np.argsort(c["keys"]), np.argsort(g["keys"])
    assert np.array_equal(c["keys"][ci], g["keys"][gi])
    assert np.array_equal(_bits(c["values"][ci]), _bits(g["values"][gi]))
    if cpu.slot_names:
        assert np.array_equal(_bits(c["slots"][ci]), _bits(g["slots"][gi]))
    return c, g


@pytest.mark.parametrize("init", INITIALIZERS, ids=[i["initializer"] for i in INITIALIZERS])
def test_find_and_find_or_insert_equal_cpu(init):
    cpu, gpu = _pair(init)
    try:
        keys = np.array([5, -3, 2**62, 5, 0, -(2**63), 17, 17], np.int64)
        cv, ce = cpu.find(keys)
        gv, ge = gpu.find(keys)
        assert np.array_equal(_bits(cv), _bits(gv)) and np.array_equal(ce, ge)
        assert gpu.size() == 0  # find does not insert
        cv, ce = cpu.find_or_insert(keys)
        gv, ge = gpu.find_or_insert(keys)
        assert np.array_equal(_bits(cv), _bits(gv)) and np.array_equal(ce, ge)
        assert gpu.size() == cpu.size() == 6
        _sorted_export(cpu, gpu)
    finally:
        cpu.destroy()
        gpu.destroy()


def test_insert_or_assign_erase_clear_and_growth():
    cpu, gpu = _pair()
    try:
        rng = np.random.RandomState(0)
        for _ in range(3):  # 60,000 distinct keys: several rehashes from the default capacity
            keys = rng.randint(-(2**40), 2**40, size=30000).astype(np.int64)
            keys[::7] = keys[1::7][: len(keys[::7])]  # duplicates: the last occurrence wins
            vals = rng.randn(len(keys), DIM).astype(np.float32)
            cpu.insert_or_assign(keys, vals)
            gpu.insert_or_assign(keys, vals)
            assert gpu.size() == cpu.size()
        c, g = _sorted_export(cpu, gpu)
        ci, gi = np.argsort(c["keys"]), np.argsort(g["keys"])
        assert np.array_equal(c["update_count"][ci], g["update_count"][gi])
        gone = c["keys"][::3]
        cpu.erase(gone)
        gpu.erase(np.concatenate([gone, gone[:5]]))  # duplicates erase once
        assert gpu.size() == cpu.size()
        _sorted_export(cpu, gpu)
        gpu.clear()
        assert gpu.size() == 0 and not gpu.find(gone[:10])[1].any()
    finally:
        cpu.destroy()
        gpu.destroy()


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=[f"{o['name']}-{o['flavor']}" for o in OPTIMIZERS])
def test_ten_training_steps_equal_cpu(opt):
    cpu, gpu = _pair({"initializer": "normal", "seed": 1, "stddev": 0.1}, opt)
    try:
        rng = np.random.RandomState(42)
        base = rng.randint(0, 1000, size=300).astype(np.int64)
        for t in range(1, 11):
            keys = np.concatenate([base[: 100 + 20 * t], rng.choice(base, 64)])  # new + duplicate
            rng.shuffle(keys)
            grads = (rng.randn(len(keys), DIM) * rng.choice([0.01, 1.0, 30.0])).astype(np.float32)
            lr = 0.05 * (1.0 + 0.3 * np.sin(t))
            cpu.apply_gradients(keys, grads, lr=lr, step=t)
            gpu.apply_gradients(keys, grads, lr=lr, step=t)
        assert gpu.size() == cpu.size()
        _sorted_export(cpu, gpu)
    finally:
        cpu.destroy()
        gpu.destroy()


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="dim"):
        _cuda.GpuTable(0)
    gpu = _cuda.GpuTable(DIM)
    try:
        with pytest.raises(ValueError, match="optimizer"):
            gpu.apply_gradients(np.array([1]), np.zeros((1, DIM), np.float32), lr=0.1, step=1)
        with pytest.raises(ValueError, match="shape"):
            gpu.insert_or_assign(np.array([1, 2]), np.zeros((1, DIM), np.float32))
    finally:
        gpu.destroy()


def test_out_of_gpu_memory_is_a_clear_error():
    with pytest.raises(MemoryError, match="out of GPU memory"):
        _cuda.GpuTable(4096, capacity_hint=1 << 40)

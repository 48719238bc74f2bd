"""The GPU table (libdualemb_cuda.so) against the CPU core on the same inputs, bit for bit.

Skipped, naming why, where no GPU table can be made (library not built, no CUDA driver, no
device): dualemb.core._cuda.available() says which. Run on an H200, 2026-11-28
(docs/bench/gpu_2026-11-28_h200.json).
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


def _sorted_export(cpu, gpu, stamps=True, clock=True):
    """Both tables' rows, slots and metadata (counts; stamps and clock unless told not to: a
    loaded table's clock depends on how it was loaded) equal, bit for bit."""
    c = cpu.export()
    g = gpu.export()
    ci, gi = np.argsort(c["keys"]), np.argsort(g["keys"])
    assert np.array_equal(c["keys"][ci], g["keys"][gi])
    assert np.array_equal(_bits(c["values"][ci]), _bits(g["values"][gi]))
    if cpu.slot_names:
        assert np.array_equal(_bits(c["slots"][ci]), _bits(g["slots"][gi]))
    if stamps:
        assert np.array_equal(c["last_update"][ci], g["last_update"][gi])
    assert np.array_equal(c["update_count"][ci], g["update_count"][gi])
    if clock:
        assert cpu.clock == gpu.clock
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


def test_out_of_gpu_memory_in_a_write_leaves_the_table_unchanged():
    # A table whose next rehash cannot fit: the write that needs it fails, naming the memory,
    # and every row stays as it was.
    import ctypes

    lib = _cuda.library()
    gpu = _cuda.GpuTable(1024, capacity_hint=1024)
    try:
        keys = np.arange(700, dtype=np.int64)
        vals = np.random.RandomState(1).randn(700, 1024).astype(np.float32)
        gpu.insert_or_assign(keys, vals)
        before = gpu.export()
        # Take nearly all free memory, so that the rehash's new layout cannot be allocated.
        step = 1 << 30
        held = []
        while True:
            p = ctypes.c_void_p()
            if lib.dec_malloc(ctypes.byref(p), step) != 0:
                if step <= (64 << 20):
                    break
                step //= 2
                continue
            held.append(p)
        try:
            with pytest.raises(MemoryError, match="out of GPU memory"):
                gpu.insert_or_assign(np.arange(700, 5000, dtype=np.int64),
                                     np.zeros((4300, 1024), np.float32))
        finally:
            for p in held:
                lib.dec_free(p)
        after = gpu.export()
        assert gpu.size() == 700
        for k in before:
            assert np.array_equal(before[k], after[k])
    finally:
        gpu.destroy()


def test_accum_follows_tfra_rule_in_batch_order():
    cpu, gpu = _pair({"initializer": "uniform", "seed": 5, "minval": -1.0, "maxval": 1.0})
    try:
        rng = np.random.RandomState(3)
        base = np.arange(0, 400, dtype=np.int64) * 7919
        start = rng.randn(200, DIM).astype(np.float32)
        cpu.insert_or_assign(base[:200], start)
        gpu.insert_or_assign(base[:200], start)
        for _ in range(4):
            # Present and absent keys, each repeated, with exists flags of both kinds: the
            # action of a position depends on whether an earlier one inserted the key.
            keys = rng.choice(base, 600)
            deltas = (rng.randn(600, DIM) * 3).astype(np.float32)
            exists = rng.rand(600) < 0.5
            assert cpu.accum(keys, deltas, exists) == gpu.accum(keys, deltas, exists) == 0
            old = rng.randn(600, DIM).astype(np.float32)
            cpu.accum_rows(keys, old, deltas, exists)
            gpu.accum_rows(keys, old, deltas, exists)
            assert gpu.size() == cpu.size()
        _sorted_export(cpu, gpu)
    finally:
        cpu.destroy()
        gpu.destroy()


def test_import_pages_and_clock_equal_cpu():
    opt = {"name": "adam", "flavor": "optax"}
    cpu, gpu = _pair({"initializer": "normal", "seed": 2, "stddev": 0.3}, opt)
    try:
        rng = np.random.RandomState(8)
        for _ in range(3):
            keys = rng.randint(-5000, 5000, size=700).astype(np.int64)  # duplicates: last wins
            values = rng.randn(700, DIM).astype(np.float32)
            slots = rng.randn(700, 2, DIM).astype(np.float32)
            # Adam's second moment is >= 0. A negative one makes the step's sqrt a NaN, and NaN
            # payloads differ (x86 gives 0xFFC00000, CUDA 0x7FFFFFFF; seen on an H200,
            # 2026-11-28): NaN rows are not comparable bit for bit, and no real state has them.
            slots[:, 1] = np.abs(slots[:, 1])
            lu = rng.randint(0, 10**6, size=700).astype(np.int64)
            uc = rng.randint(-3, 2**33, size=700).astype(np.int64)  # clamped to [0, 2**32-1]
            cpu.import_rows(keys, values, slots, lu, uc)
            gpu.import_rows(keys, values, slots, lu, uc)
            more = rng.randint(-5000, 5000, size=100).astype(np.int64)
            v2 = rng.randn(100, DIM).astype(np.float32)
            cpu.import_rows(more, v2)  # no slots, no metadata: stamp, count 0, slots kept
            gpu.import_rows(more, v2)
        _sorted_export(cpu, gpu)
        # Training on imported rows continues the same way.
        keys = rng.randint(-5000, 5000, size=300).astype(np.int64)
        grads = rng.randn(300, DIM).astype(np.float32)
        cpu.apply_gradients(keys, grads, lr=0.01, step=4)
        gpu.apply_gradients(keys, grads, lr=0.01, step=4)
        _sorted_export(cpu, gpu)
    finally:
        cpu.destroy()
        gpu.destroy()


@pytest.mark.parametrize("by", ["recency", "frequency", "custom"])
def test_restrict_keeps_the_same_rows(by):
    cpu, gpu = _pair({"initializer": "normal", "seed": 4, "stddev": 1.0})
    try:
        rng = np.random.RandomState(11)
        for _ in range(6):  # stamps and counts with many ties
            keys = rng.randint(0, 3000, size=500).astype(np.int64)
            cpu.find_or_insert(keys)
            gpu.find_or_insert(keys)
        kw = {}
        if by == "custom":
            ks = rng.randint(0, 3000, size=1500).astype(np.int64)
            sc = rng.choice([0.5, 1.0, 2.0, -np.inf, np.inf], size=1500).astype(np.float32)
            kw = {"keys": ks, "scores": sc}
        assert cpu.restrict(700, by, **kw) == gpu.restrict(700, by, **kw)
        assert gpu.size() == cpu.size() == 700
        _sorted_export(cpu, gpu)
        # Rows erased by restrict make tombstones that later inserts reuse.
        more = rng.randint(0, 6000, size=2000).astype(np.int64)
        cpu.find_or_insert(more)
        gpu.find_or_insert(more)
        _sorted_export(cpu, gpu)
        if by == "custom":  # a NaN score is refused, the table unchanged
            with pytest.raises(ValueError, match="NaN"):
                gpu.restrict(10, "custom", keys=[1], scores=[np.nan])
            assert gpu.size() == cpu.size()
    finally:
        cpu.destroy()
        gpu.destroy()


@pytest.mark.parametrize("policy", ["recency", "frequency"])
def test_capacity_evicts_the_same_keys_and_reports_them(policy):
    opt = {"name": "adagrad", "flavor": "keras"}
    init = {"initializer": "normal", "seed": 9, "stddev": 0.2}
    cpu = Table(dim=DIM, optimizer=opt, initializer=init, capacity=500, evict_policy=policy)
    gpu = _cuda.GpuTable(DIM, optimizer=opt, capacity=500, evict_policy=policy, **init)
    try:
        rng = np.random.RandomState(21)
        total = 0
        for t in range(1, 9):
            keys = rng.randint(0, 2000, size=400).astype(np.int64)
            grads = rng.randn(400, DIM).astype(np.float32)
            c = cpu.apply_gradients(keys, grads, lr=0.1, step=t)
            g = gpu.apply_gradients(keys, grads, lr=0.1, step=t)
            assert c == g
            total += g
            ins = rng.randint(0, 2000, size=300).astype(np.int64)
            vals = rng.randn(300, DIM).astype(np.float32)
            assert cpu.insert_or_assign(ins, vals) == gpu.insert_or_assign(ins, vals)
            total += gpu.last_evicted
            cpu.find_or_insert(ins[:50])
            gpu.find_or_insert(ins[:50])
            assert cpu.last_evicted == gpu.last_evicted
            total += gpu.last_evicted
            assert gpu.size() == cpu.size() <= 500
        assert total > 0 and gpu.evicted_total == cpu.evicted_total == total
        _sorted_export(cpu, gpu)
    finally:
        cpu.destroy()
        gpu.destroy()


def test_set_optimizer_on_rows_equals_cpu():
    cpu, gpu = _pair({"initializer": "constant", "value": 0.25})
    try:
        keys = np.arange(100, dtype=np.int64)
        cpu.find_or_insert(keys)
        gpu.find_or_insert(keys)
        opt = {"name": "rmsprop", "flavor": "keras", "centered": True}
        cpu.set_optimizer(opt)
        gpu.set_optimizer(opt)
        assert gpu.slot_names == cpu.slot_names and gpu.num_slots == cpu.num_slots
        g = np.random.RandomState(0).randn(100, DIM).astype(np.float32)
        cpu.apply_gradients(keys, g, lr=0.01, step=1)
        gpu.apply_gradients(keys, g, lr=0.01, step=1)
        _sorted_export(cpu, gpu)
    finally:
        cpu.destroy()
        gpu.destroy()


def test_checkpoint_gpu_to_cpu_and_back(tmp_path):
    from dualemb.core import checkpoint

    opt = {"name": "adam", "flavor": "keras"}
    init = {"initializer": "truncated_normal", "seed": 6, "stddev": 0.05}
    cpu, gpu = _pair(init, opt)
    rng = np.random.RandomState(5)

    def step(tables, t):
        keys = rng.randint(0, 5000, size=800).astype(np.int64)
        grads = rng.randn(800, DIM).astype(np.float32)
        for table in tables:
            table.apply_gradients(keys, grads, lr=0.01, step=t)

    loaded = []
    try:
        for t in range(1, 4):
            step([cpu, gpu], t)
        path = str(tmp_path / "gpu_ckpt")
        checkpoint.save(path, {"emb": gpu}, steps=3, page_rows=1000)  # several pages
        # GPU -> CPU: the checkpoint loads into a fresh CPU table equal to never stopping.
        on_cpu = checkpoint.load(path).tables["emb"]
        loaded.append(on_cpu)
        assert checkpoint.read_manifest(path)["tables"][0]["optimizer"] == cpu.optimizer
        _sorted_export(on_cpu, gpu, clock=False)  # the saved stamps and counts come back
        assert on_cpu.clock >= gpu.clock  # later writes rank above every restored row
        # ... and back onto a GPU table; all of them continue training identically.
        gpu2 = _cuda.GpuTable(DIM, optimizer=opt, **init)
        loaded.append(gpu2)
        checkpoint.load(path, {"emb": gpu2})
        _sorted_export(on_cpu, gpu2, clock=False)
        for t in range(4, 7):
            step([cpu, gpu, on_cpu, gpu2], t)
        _sorted_export(cpu, gpu)
        _sorted_export(on_cpu, gpu2, stamps=False, clock=False)
        _sorted_export(cpu, gpu2, stamps=False, clock=False)
        # CPU -> GPU: a CPU checkpoint loads onto the GPU.
        path2 = str(tmp_path / "cpu_ckpt")
        checkpoint.save(path2, {"emb": cpu}, steps=6)
        gpu3 = _cuda.GpuTable(DIM, optimizer=opt, **init)
        loaded.append(gpu3)
        checkpoint.load(path2, {"emb": gpu3})
        _sorted_export(cpu, gpu3, clock=False)
    finally:
        for t in [cpu, gpu] + loaded:
            t.destroy()

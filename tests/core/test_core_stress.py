"""Several Python threads hammer one table with every kind of operation for a bounded time;
afterwards the table's invariants hold."""

import threading
import time

import numpy as np

from dualemb.core import Table

DIM = 8
REGION = 1_000_000  # writer w owns keys [REGION*(w+1), REGION*(w+1) + 5000)
SHARED = 20_000     # keys [0, SHARED) are churned by everyone else


def test_concurrent_operations_keep_invariants():
    t = Table(dim=DIM, initializer={"initializer": "normal", "stddev": 0.1, "seed": 1},
              optimizer={"name": "adam", "flavor": "keras"})
    deadline = time.monotonic() + 4.0
    errors = []
    writers = 3
    models = [dict() for _ in range(writers)]

    def guard(fn):
        def run(*a):
            try:
                fn(*a)
            except Exception as e:  # surfaced after join
                errors.append(e)
        return run

    @guard
    def writer(w):
        rng = np.random.default_rng(w)
        it = 0
        while time.monotonic() < deadline:
            keys = REGION * (w + 1) + rng.integers(0, 5000, 3000)
            vals = (it * 10_000 + np.arange(3000, dtype=np.float32))[:, None].repeat(DIM, 1)
            t.insert_or_assign(keys, vals)
            for k, v in zip(keys.tolist(), vals[:, 0].tolist()):
                models[w][k] = v
            gone = REGION * (w + 1) + rng.integers(0, 5000, 300)
            t.erase(gone)
            for k in gone.tolist():
                models[w].pop(k, None)
            it += 1

    @guard
    def churn(seed):
        rng = np.random.default_rng(seed)
        step = 1
        while time.monotonic() < deadline:
            keys = rng.integers(0, SHARED, 4096)
            g = rng.normal(size=(4096, DIM)).astype(np.float32)
            t.apply_gradients(keys, g, lr=0.01, step=step)
            t.accum(keys, g, rng.random(4096) < 0.5)
            t.find_or_insert(rng.integers(0, SHARED, 2048))
            t.erase(rng.integers(0, SHARED, 512))
            step += 1

    @guard
    def reader():
        rng = np.random.default_rng(7)
        while time.monotonic() < deadline:
            v, e = t.find(rng.integers(0, 5 * REGION, 8192))
            assert v.shape == (8192, DIM)
            for page in t.export_pages(5000):
                assert page["values"].shape == (len(page["keys"]), DIM)
                assert page["slots"].shape == (len(page["keys"]), 2, DIM)

    @guard
    def restricter():
        # Writers' regions score highest, so restrict only ever removes shared keys.
        region_keys = np.concatenate([REGION * (w + 1) + np.arange(5000) for w in range(writers)])
        scores = np.ones(region_keys.size, np.float32)
        while time.monotonic() < deadline:
            t.restrict(region_keys.size + 1000, by="custom", keys=region_keys, scores=scores)
            time.sleep(0.05)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    threads += [threading.Thread(target=churn, args=(s,)) for s in (11, 12)]
    threads += [threading.Thread(target=reader), threading.Thread(target=restricter)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
        assert not th.is_alive(), "a thread did not finish: deadlock?"
    assert not errors, errors

    out = t.export()
    assert t.size() == len(out["keys"]) == len(set(out["keys"].tolist()))
    shared = out["keys"] < SHARED
    t.erase(out["keys"][shared])
    out = t.export()
    expected = {}
    for m in models:
        expected.update(m)
    assert t.size() == len(expected)
    got = dict(zip(out["keys"].tolist(), out["values"][:, 0].tolist()))
    assert got == expected
    assert (out["values"] == out["values"][:, :1]).all()

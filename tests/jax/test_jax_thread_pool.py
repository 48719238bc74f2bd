"""The core's helper threads inside XLA calls run on XLA's own thread pool
(csrc/jax/ffi_common.h, ScopedXlaPool), not beside it on the core's workers.

How it is seen: the core names its worker threads "dualemb-worker" (csrc/core/thread_pool.cc);
the CPU time each thread of this process used is read from /proc. A control shows the counter
works: the same work through the core's Python API (no XLA) does run on those workers. The
results of the XLA calls are checked against the core's own calls on a twin table (bit for bit),
since the work now runs on other threads.
"""

from __future__ import annotations

import glob
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dualemb.jax as dej

DIM = 64
N = 1 << 16  # keys per call: far above the size where the core fans a batch out
CALLS = 12   # training steps (each draws N of the same 2N keys: the tables stay small)

pytestmark = [
    pytest.mark.skipif(not os.path.isdir("/proc/self/task"),
                       reason="per-thread CPU times are read from Linux's /proc"),
    pytest.mark.skipif((os.cpu_count() or 1) < 2,
                       reason="one core: the core runs every call on the calling thread"),
]


@pytest.fixture(autouse=True)
def _cpu():
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def _worker_ticks() -> int:
    """CPU clock ticks (user + system) used so far by the core's worker threads."""
    total = 0
    for task in glob.glob(f"/proc/{os.getpid()}/task/*"):
        try:
            with open(os.path.join(task, "comm")) as f:
                if f.read().strip() != "dualemb-worker":
                    continue
            with open(os.path.join(task, "stat")) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
    return total


POOL = np.random.default_rng(0).choice(1 << 40, 2 * N, replace=False).astype(np.int64)


def _keys(seed):
    return np.random.default_rng(seed).choice(POOL, N, replace=False)


def _pair():
    def make():
        return dej.create(DIM, optimizer=dej.optimizers.adam(0.01),
                          initializer=dej.initializers.normal(0.0, 0.1, seed=3))
    return make(), make()


def test_the_core_api_runs_big_calls_on_its_workers():
    # The control: without XLA, a big find fans out onto the core's own workers, and this
    # test's counter sees them. (Otherwise the next test could not fail.)
    t = dej.create(DIM, initializer=dej.initializers.normal(0.0, 0.1, seed=3))
    core, keys = t.core(), _keys(0)
    core.insert_or_assign(keys, np.ones((N, DIM), np.float32))
    core.find(keys)
    before = _worker_ticks()
    for _ in range(100):
        core.find(keys)
    assert _worker_ticks() > before
    dej.destroy(t)


def test_xla_calls_run_the_cores_helpers_on_xla_threads_with_the_cores_results():
    t, ref = _pair()
    t2, ref2 = _pair()
    keys = [_keys(s) for s in range(CALLS)]
    grads = [np.random.default_rng(100 + s).standard_normal((N, DIM)).astype(np.float32)
             for s in range(CALLS)]

    @jax.jit
    def step(t, t2, ids, g):
        rows = dej.lookup(t, ids)
        rows2 = dej.lookup_many([t2], [ids])[0]
        t = dej.apply_gradients(t, ids, g + 0 * rows)
        t2 = dej.apply_gradients_many([t2], [ids], [g + 0 * rows2])[0]
        return t, t2, rows, rows2

    t, t2, _, _ = step(t, t2, dej.ids(keys[0]), jnp.asarray(grads[0]))  # compiles
    jax.block_until_ready((t.version, t2.version))
    ref.core().apply_gradients(keys[0], grads[0], 0.01, 1)
    ref2.core().apply_gradients(keys[0], grads[0], 0.01, 1)
    before = _worker_ticks()
    looked_up = []
    for s in range(1, CALLS):
        t, t2, rows, rows2 = step(t, t2, dej.ids(keys[s]), jnp.asarray(grads[s]))
        looked_up.append((np.asarray(rows), np.asarray(rows2)))
    jax.block_until_ready((t.version, t2.version))
    ticks = _worker_ticks() - before
    # Not one tick on the core's workers: every helper ran on XLA's threads.
    assert ticks == 0, f"the core's workers ran {ticks} ticks during XLA calls"

    # The same lookups and Adam steps through the core's own calls, on the twins.
    for s in range(1, CALLS):
        want, _ = ref.core().find(keys[s])
        want2, _ = ref2.core().find(keys[s])
        np.testing.assert_array_equal(looked_up[s - 1][0], want)
        np.testing.assert_array_equal(looked_up[s - 1][1], want2)
        ref.core().apply_gradients(keys[s], grads[s], 0.01, s + 1)
        ref2.core().apply_gradients(keys[s], grads[s], 0.01, s + 1)
    for got, want in ((t, ref), (t2, ref2)):
        a, b = got.core().export(), want.core().export()
        oa, ob = np.argsort(a["keys"]), np.argsort(b["keys"])
        for col in ("keys", "values", "slots"):
            np.testing.assert_array_equal(np.asarray(a[col])[oa], np.asarray(b[col])[ob])
    for x in (t, ref, t2, ref2):
        dej.destroy(x)

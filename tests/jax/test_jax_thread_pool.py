"""The core's helper threads inside XLA calls run on XLA's own thread pool
(csrc/jax/ffi_common.h, ScopedXlaPool), not beside it on the core's workers.

How it is seen: the core names its worker threads "dualemb-worker" (csrc/core/thread_pool.cc);
the CPU time each thread of this process used is read from /proc. A control shows the counter
works: the same work through the core's Python API (no XLA) does run on those workers. The
results of the XLA calls are checked against the core's own calls on a twin table (bit for bit),
since the work now runs on other threads. Each case runs in a fresh interpreter (this file run as
a script), so that nothing another test left behind in a shared worker process can wake the
core's workers during the measurement.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

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


def _core_api_ticks() -> int:
    """Ticks of the core's workers during big finds through the core's Python API."""
    t = dej.create(DIM, initializer=dej.initializers.normal(0.0, 0.1, seed=3))
    core, keys = t.core(), _keys(0)
    core.insert_or_assign(keys, np.ones((N, DIM), np.float32))
    core.find(keys)
    before = _worker_ticks()
    for _ in range(100):
        core.find(keys)
    ticks = _worker_ticks() - before
    dej.destroy(t)
    return ticks


def _xla_ticks() -> int:
    """Ticks of the core's workers during jitted lookups and Adam steps (per-table and
    multi-table); fails unless their rows and slots equal the core's own calls on twins."""
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
    return ticks


def _in_child(case: str) -> int:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, os.path.abspath(__file__), case], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])["ticks"]


def test_the_core_api_runs_big_calls_on_its_workers():
    # The control: without XLA, a big find fans out onto the core's own workers, and this
    # test's counter sees them. (Otherwise the next test could not fail.)
    assert _in_child("core_api") > 0


def test_xla_calls_run_the_cores_helpers_on_xla_threads_with_the_cores_results():
    # Not one tick on the core's workers: every helper ran on XLA's threads (36 ticks when the
    # handlers left the core on its own pool). The child fails if a result differs.
    ticks = _in_child("xla")
    assert ticks == 0, f"the core's workers ran {ticks} ticks during XLA calls"


if __name__ == "__main__":
    with jax.default_device(jax.devices("cpu")[0]):
        fn = {"core_api": _core_api_ticks, "xla": _xla_ticks}[sys.argv[1]]
        print(json.dumps({"ticks": fn()}))

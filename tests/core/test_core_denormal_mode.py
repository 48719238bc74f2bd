"""The core's helper threads compute in the floating-point mode of the calling thread.

Threads inherit the MXCSR of the thread that creates them, and XLA runs its computations on
threads that flush denormals (FTZ/DAZ). If the core's worker pool is first started from such a
thread (a large JAX lookup), its workers must not keep flushing subnormals for later calls made
from an ordinary thread: a row's result would then depend on which thread took its shard.
Runs in a fresh interpreter, so that the pool is created inside the JAX call."""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("jax")

SCRIPT = textwrap.dedent("""
    import numpy as np
    import jax
    import jax.numpy as jnp
    import dualemb.jax as dej
    from dualemb.core import Table

    # 1. Start the core's pool from an XLA thread: a batch large enough to be split.
    table = dej.create(8)
    ids = dej.ids(np.arange(200_000, dtype=np.int64))
    jax.block_until_ready(jax.jit(dej.lookup)(table, ids))

    # 2. From this (non-flushing) thread: subnormal float32 sums, split over the workers.
    n = 200_000
    t = Table(dim=4)
    keys = np.arange(n)
    rows = np.full((n, 4), 1e-39, np.float32)      # subnormal
    t.insert_or_assign(keys, rows)
    t.accum(keys, rows, np.ones(n, bool))
    got = t.find(keys)[0]
    want = rows + rows                                  # numpy, IEEE: 2e-39, not 0
    assert want[0, 0] != 0
    bad = int((got != want).any(axis=1).sum())
    print("rows differing:", bad)
    raise SystemExit(1 if bad else 0)
""")


def test_workers_started_by_xla_do_not_flush_subnormals_of_later_calls():
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]

"""dualemb.host_memory.tune_malloc: with it, a jitted step whose results are big host buffers
stops faulting their pages in afresh every step (the reason it exists), and results are the same.

Measured in a fresh process each (mallopt changes the whole process): minor page faults per
step of a jitted step of 26 lookups of 4,096 keys at dim 64 (27 MB of rows), with and without
the call. Page faults are counted by the kernel, not timed, so load does not change them.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("jax")

from _paths import ROOT  # noqa: E402

from dualemb.host_memory import tune_malloc  # noqa: E402

_CHILD = r"""
import json, resource, sys
import numpy as np, jax
import dualemb.jax as dej
from dualemb.host_memory import tune_malloc
applied = tune_malloc() if sys.argv[1] == "tuned" else None
rng = np.random.default_rng(0)
tables, ids, want = [], [], []
for f in range(26):
    keys = rng.integers(0, 1 << 40, 4096)
    rows = rng.standard_normal((4096, 64)).astype(np.float32)
    tables.append(dej.insert(dej.create(64), dej.ids(keys), rows))
    ids.append(dej.ids(keys))
    want.append(rows)
step = jax.jit(lambda ts, ids: [dej.lookup(t, i) for t, i in zip(ts, ids)])
out = jax.block_until_ready(step(tables, ids))
exact = all(np.array_equal(np.asarray(o), w) for o, w in zip(out, want))
del out
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    out = jax.block_until_ready(step(tables, ids))
    del out
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20
print(json.dumps({"applied": applied, "faults": faults, "exact": exact}))
"""


def _run(mode: str) -> dict:
    p = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_tune_malloc_stops_refaulting_a_steps_result_buffers():
    plain, tuned = _run("plain"), _run("tuned")
    assert tuned["applied"] is True
    assert plain["exact"] and tuned["exact"]
    # 27 MB of rows = 6,656 pages: without the settings most are faulted in every step
    # (measured 4,400/step), with them they stay mapped (measured 420/step).
    assert plain["faults"] > 2000, plain
    assert tuned["faults"] < plain["faults"] / 4, (plain, tuned)


@pytest.mark.parametrize("kwargs", [{"mmap_threshold": 0}, {"trim_threshold": -1},
                                    {"mmap_threshold": 64 << 20}, {"trim_threshold": 1.5},
                                    {"mmap_threshold": True}])
def test_tune_malloc_refuses_bad_thresholds(kwargs):
    with pytest.raises(ValueError, match="tune_malloc"):
        tune_malloc(**kwargs)

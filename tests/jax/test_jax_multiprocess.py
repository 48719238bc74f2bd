"""Sharded tables across processes (jax.distributed on 127.0.0.1, gloo collectives): training
with 2 and 4 processes equals the single-device table on the same global batches; a process
that dies makes the others fail within a bounded time."""

from __future__ import annotations

import time

import pytest

import _scale_util as U
from test_jax_sharded import assert_same_state, reference


@pytest.mark.parametrize("processes", [2, 4])
def test_multiprocess_training_equals_single_process(tmp_path, processes):
    extra = ["--unique-per-device", "--steps", "3"]
    want = reference(tmp_path, extra, processes)
    U.check_ok(U.run_processes(tmp_path, processes, extra))
    got = U.load_state(tmp_path, processes)
    assert len(got["keys"]) > 50
    assert_same_state(got, want, exact=True)


def test_multiprocess_training_with_repeated_ids(tmp_path):
    want = reference(tmp_path, ["--steps", "3"])
    U.check_ok(U.run_processes(tmp_path, 2, ["--steps", "3"]))
    assert_same_state(U.load_state(tmp_path, 2), want, exact=False)


def test_a_dead_process_makes_the_others_fail_in_bounded_time(tmp_path):
    # The last process exits abruptly right after joining; the others must not hang in the
    # first collective. The heartbeat timeout (10 s in the worker) bounds the wait.
    t0 = time.monotonic()
    outs = U.run_processes(tmp_path, 2, ["--steps", "3", "--die-after-init"], timeout=150)
    elapsed = time.monotonic() - t0
    assert outs[1][0] == 3, outs[1][1][-2000:]
    rc, out = outs[0]
    assert rc is not None, f"process 0 still running after {elapsed:.0f}s (hang):\n{out[-2000:]}"
    assert rc != 0, out[-2000:]
    assert "another task died" in out or "unhealthy" in out, out[-2000:]

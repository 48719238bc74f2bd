"""Sharded tables across processes (jax.distributed on 127.0.0.1, gloo collectives): training
with 2 and 4 processes equals the single-device table on the same global batches; a process
that dies makes the others fail within a bounded time; and, from the same 2-process job that
trains with repeated ids, online checkpoints: a base, 5 deltas (erases, capacity evictions,
restricts; one written in the background while training goes on) and a full save at the last
step, the chain loading bit for bit equal to the full save into 1 and 3 shards and into one
``dualemb.jax`` table."""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
import pytest

import _scale_util as U
from table_rows import assert_same, snapshot
from test_jax_sharded import assert_same_state, reference


@pytest.mark.parametrize("processes", [2, 4])
def test_multiprocess_training_equals_single_process(tmp_path, processes):
    extra = ["--unique-per-device", "--steps", "3"]
    want = reference(tmp_path, extra, processes)
    U.check_ok(U.run_processes(tmp_path, processes, extra))
    got = U.load_state(tmp_path, processes)
    assert len(got["keys"]) > 50
    assert_same_state(got, want, exact=True)


@pytest.fixture(scope="module")
def repeated_ids_job(tmp_path_factory):
    """One 2-process job: 3 steps with repeated ids (its state written), then online() of
    tests/jax/jax_scale_worker.py into <dir>/online. The capacity (40 rows per shard) is above
    the 30 ids per shard of the first 3 steps: it evicts only in the online part."""
    tmp = tmp_path_factory.mktemp("repeated")
    online = tmp / "online"
    online.mkdir()
    U.check_ok(U.run_processes(tmp, 2, ["--steps", "3", "--online", str(online),
                                        "--table-capacity", "40"], timeout=300))
    return tmp


def test_multiprocess_training_with_repeated_ids(repeated_ids_job, tmp_path):
    want = reference(tmp_path, ["--steps", "3"])
    assert_same_state(U.load_state(repeated_ids_job, 2), want, exact=False)


def _npz_state(paths):
    parts = [np.load(p) for p in paths]
    out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0].files}
    order = np.argsort(out["keys"], kind="stable")
    return {k: v[order] for k, v in out.items()}


def _loaded(path, num_shards):
    """(snapshot, step, rows per shard) of the checkpoint loaded into `num_shards` live tables
    without a capacity (the job's 40 rows per shard would refuse fewer shards)."""
    from dualemb.core import Table, checkpoint
    live = [Table(4) for _ in range(num_shards)]
    try:
        ck = checkpoint.load(path, {"table": live})
        return snapshot(live), ck.steps["table"], [int(t.size()) for t in live]
    finally:
        for t in live:
            t.destroy()


def test_multiprocess_delta_chain_loads_equal_to_the_full_save(repeated_ids_job):
    from dualemb.core import checkpoint
    d = repeated_ids_job / "online"
    steps = {int((d / f"steps{i}.txt").read_text()) for i in range(2)}
    assert len(steps) == 1
    step = steps.pop()
    final = _npz_state([d / f"final-state{i}.npz" for i in range(2)])
    full, full_step, _ = _loaded(str(d / "full"), 1)
    assert full_step == step
    assert_same(full, final)  # the reference is the job's own state at the end
    # The deltas are deltas, with tombstones where keys went (erase, eviction, restrict).
    for name, base in (("d1", "base"), ("d2", "d1"), ("d3", "d2"), ("d4", "d3"), ("d5", "d4")):
        m = checkpoint.read_manifest(str(d / name))
        (t,) = m["tables"]
        assert m["version"] == 3 and m["base"]["path"] == os.path.join("..", base), m["base"]
        assert 0 < t["rows"] <= t["total_rows"], (name, t["rows"], t["total_rows"])
        if name != "d2":  # d2 follows steps over many new ids: its rows may all be new
            assert t["rows"] < t["total_rows"], (name, t["rows"], t["total_rows"])
        assert t["tombstones"]["rows"] > 0, name
        assert [s["rows"] for s in t["shards"]] and len(t["shards"]) == 2
    for shards in (1, 3):
        chain, chain_step, sizes = _loaded(str(d / "d5"), shards)
        # (the worker's ids are multiples of 2**33 + 1, itself a multiple of 3: 3 shards route
        # them all to shard 0; tests/checkpoint/test_checkpoint_parts_delta.py spreads them)
        assert chain_step == step and len(sizes) == shards and sum(sizes) == len(full["keys"])
        assert_same(chain, full)
    # one dualemb.jax table
    import dualemb.jax as dej
    t = dej.load(str(d / "d5"), into=dej.create(4))  # no capacity (see _loaded)
    try:
        assert int(t.step) == step
        assert_same(snapshot(t.core()), full)
    finally:
        dej.destroy(t)
    # The background delta (d3) holds the state of its call, not the two steps trained while it
    # was written (its write was held until they had run).
    bg = _npz_state([d / f"bg-state{i}.npz" for i in range(2)])
    at_d3, _, _ = _loaded(str(d / "d3"), 3)
    assert_same(at_d3, bg)
    with pytest.raises(AssertionError):
        assert_same(bg, final)  # the comparison above can tell states apart


def test_multiprocess_delta_chain_with_a_broken_base_is_refused(repeated_ids_job, tmp_path):
    from dualemb.core import checkpoint
    src = repeated_ids_job / "online"
    d = tmp_path / "online"
    shutil.copytree(src, d)
    from dualemb.core import Table
    live = Table(4)
    checkpoint.load(str(d / "d2"), {"table": live})
    before = snapshot(live)
    # d1 replaced by another checkpoint (the full save): d5's chain is refused, naming d1
    shutil.rmtree(d / "d1")
    shutil.copytree(src / "full", d / "d1")
    with pytest.raises(checkpoint.CheckpointError, match="is not the one it was written on"):
        checkpoint.load(str(d / "d5"), {"table": live})
    assert_same(snapshot(live), before)  # the table is left as it was
    shutil.rmtree(d / "d1")
    with pytest.raises(checkpoint.CheckpointError, match="d1 is missing"):
        checkpoint.load(str(d / "d5"), {"table": live})
    assert_same(snapshot(live), before)
    live.destroy()


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


def test_an_unobserved_background_failure_fails_the_next_save_on_every_process(
        repeated_ids_job):
    # The job's last background save failed in process 1 and was never waited for; the next
    # sharded.save raised on both processes (none hung at a barrier) and published nothing.
    d = repeated_ids_job / "online"
    outcomes = [(d / f"after-failure{i}.txt").read_text() for i in range(2)]
    assert "injected write failure" in outcomes[1] and "never waited for" in outcomes[1], outcomes
    assert outcomes[0].startswith("raised:") and "failed" in outcomes[0], outcomes
    assert not (d / "bad").exists() and not (d / "after-failure").exists()

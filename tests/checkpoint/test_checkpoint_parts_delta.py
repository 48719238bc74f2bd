"""Delta checkpoints written by several writers (``checkpoint.parts.save(..., base=...)``),
in-process: the writers are threads running the real protocol (``ThreadSync``), each holding
shards routed by ``shard_of``. The reference is a full single-writer save of the same live shards
at the same step: the chain loads to it bit for bit (keys, rows, slots, stepped marks, metadata,
step), into 1 and 3 shards. The 2-process JAX job (tests/jax/test_jax_multiprocess.py) runs the
same protocol over jax.distributed."""

import numpy as np
import pytest

from dualemb.core import Table, checkpoint
from dualemb.core.checkpoint import CheckpointError
from dualemb.core.routing import shard_of
from table_rows import assert_same, snapshot
from test_checkpoint_parts import run_writers

DIM = 4
ADAM = {"name": "adam", "flavor": "keras"}
N = 3  # shards; writer 0 holds shards 0 and 1, writer 1 holds shard 2


def train(shards, rng, keys, step):
    keys = np.unique(np.asarray(keys, np.int64))
    for j, t in enumerate(shards):
        k = keys[shard_of(keys, N) == j]
        t.apply_gradients(k, rng.standard_normal((len(k), DIM)).astype(np.float32), 0.01, step)


def save_parts(path, shards, step, **kwargs):
    held = [[(0, shards[0]), (1, shards[1])], [(2, shards[2])]]
    errors = run_writers(str(path), [{"t": h} for h in held], steps=step,
                         num_shards={"t": N}, **kwargs)
    return errors


def loaded(path, num_shards):
    """(snapshot, step) of the checkpoint loaded into `num_shards` live tables without a capacity
    (the saved shards' capacity would refuse fewer shards)."""
    live = [Table(DIM) for _ in range(num_shards)]
    try:
        ck = checkpoint.load(str(path), {"t": live})
        return snapshot(live), ck.steps["t"]
    finally:
        for s in live:
            s.destroy()


def test_multi_writer_chain_equals_a_full_save_in_1_and_3_shards(tmp_path):
    rng = np.random.default_rng(3)
    shards = [Table(DIM, optimizer=ADAM, capacity=60) for _ in range(N)]
    train(shards, rng, np.arange(-90, 90), 1)
    assert save_parts(tmp_path / "base", shards, 1, mark_changes=True) == [None, None]
    prev, tombstones = tmp_path / "base", []
    for step in range(2, 7):
        train(shards, rng, rng.integers(-300, 300, 50), step)  # rewrites, inserts, evictions
        if step == 3:
            for t in shards:
                t.erase(np.arange(-90, 90, 4))
        if step == 5:
            for t in shards:
                t.restrict(40, by="recency")
        d = tmp_path / f"d{step}"
        assert save_parts(d, shards, step, base=prev) == [None, None]
        m = checkpoint.read_manifest(str(d))
        assert m["version"] == 3 and len(m["tables"][0]["shards"]) == N
        tombstones.append(m["tables"][0]["tombstones"]["rows"])
        prev = d
    # evictions (steps 2-5), the erase (3), the restrict (5); step 6 only rewrites and inserts
    assert sum(t.evicted_total for t in shards) > 0 and min(tombstones[:4]) > 0
    checkpoint.save(tmp_path / "full", {"t": shards}, steps=6)
    want, _ = loaded(tmp_path / "full", 1)
    assert_same(want, snapshot(shards))
    for n in (1, 3):
        got, step = loaded(prev, n)
        assert step == 6
        assert_same(got, want)


def test_multi_writer_delta_refuses_a_table_not_marked_on_the_base(tmp_path):
    rng = np.random.default_rng(4)
    shards = [Table(DIM, optimizer=ADAM) for _ in range(N)]
    train(shards, rng, np.arange(30), 1)
    # a full save without marks: no delta may follow it
    assert save_parts(tmp_path / "base", shards, 1) == [None, None]
    errors = save_parts(tmp_path / "d", shards, 2, base=tmp_path / "base")
    assert isinstance(errors[0], CheckpointError) and "tracks its changes since" in str(errors[0])
    assert isinstance(errors[1], CheckpointError)  # every writer raises; nothing published
    assert not (tmp_path / "d").exists()


def test_multi_writer_delta_refuses_shards_not_routed_by_shard_of(tmp_path):
    shards = [Table(DIM) for _ in range(N)]
    for t in shards:
        t.insert_or_assign(np.array([3, 4, 5]), np.ones((3, DIM), np.float32))  # in every shard
    assert save_parts(tmp_path / "base", shards, 0, mark_changes=True) == [None, None]
    errors = save_parts(tmp_path / "d", shards, 0, base=tmp_path / "base")
    assert any(isinstance(e, CheckpointError) and "routes to shard" in str(e) for e in errors)
    assert all(e is not None for e in errors)
    assert not (tmp_path / "d").exists()


def test_multi_writer_delta_needs_the_shard_counts(tmp_path):
    with pytest.raises(ValueError, match="num_shards"):
        checkpoint.parts.save(str(tmp_path / "d"), {"t": []}, names=["t"], base=tmp_path)

"""Live serving updates (issue 21): a ``checkpoint.Follower`` keeps serving tables at the newest
checkpoint a ``checkpoint.Publisher`` writes into a directory, applying deltas and full
checkpoints in place. References: the trainer's own rows (numpy on ``export``) at each step;
for concurrent lookups, rows whose elements all equal the version that wrote them."""
import os
import shutil
import threading
import time

import numpy as np
import pytest

from table_rows import ROW_FIELDS, rows_by_key  # noqa: E402  (tests/ helper)
from dualemb.core import Table, checkpoint
from dualemb.core.checkpoint import CheckpointError

DIM = 4
ADAM = {"name": "adam", "flavor": "keras"}


def state(tables):
    """{key: (value bytes, slots bytes, last_update, update_count, stepped)} over live shards."""
    return rows_by_key(tables, ROW_FIELDS + ("stepped",))


def train_step(t, rng, step):
    """Steps, inserts, erases and capacity evictions: every kind of change a delta carries."""
    keys = rng.integers(0, 400, 50).astype(np.int64)
    grads = rng.standard_normal((50, DIM)).astype(np.float32)
    grads[:5] = 0  # stepped with an all-zero gradient: only the stepped mark tells
    t.apply_gradients(keys, grads, 0.01, step)
    if step % 3 == 0:
        t.erase(rng.integers(0, 400, 20).astype(np.int64))
    if step % 4 == 0:
        t.insert_or_assign(np.array([1000 + step]), np.full((1, DIM), step, np.float32))


def test_follower_answers_the_trainers_rows_after_each_checkpoint(tmp_path):
    rng = np.random.default_rng(1)
    trainer = Table(DIM, optimizer=ADAM, capacity=200)
    pub = checkpoint.Publisher(tmp_path, {"emb": trainer}, full_every=3)
    serving = [Table(DIM), Table(DIM)]  # empty, no optimizer yet, another shard count
    follower = checkpoint.Follower(tmp_path, {"emb": serving})
    assert follower.poll() == [] and follower.held == ""
    applied_kinds = []
    for step in range(1, 11):
        train_step(trainer, rng, step)
        pub.publish(step)
        if step in (2, 5, 6):
            continue  # the next poll applies two checkpoints (or skips deltas for a full one)
        applied = follower.poll()
        applied_kinds.append([(a.steps["emb"], a.delta) for a in applied])
        assert state(serving) == state(trainer), step
        assert follower.held == applied[-1].digest
        assert follower.poll() == []  # nothing newer
    # Full checkpoints at 1, 4, 7, 10 (every 3 publishes); a full one replaces the chain the
    # tables hold (deltas 5 and 6 are never applied).
    assert applied_kinds == [[(1, False)], [(2, True), (3, True)], [(4, False)], [(7, False)],
                             [(8, True)], [(9, True)], [(10, False)]]
    assert trainer.evicted_total > 0
    # The trainer can save a delta on the checkpoint the server holds, and vice versa the
    # server's label names it: the same identity on both sides.
    assert trainer.changes_label == serving[0].changes_label == serving[1].changes_label


def test_concurrent_lookups_never_see_a_mixed_or_missing_row(tmp_path):
    """Every row the trainer writes at version v has all elements equal to v, so a lookup
    that saw a half-written row would find two versions in it. Stable keys are never erased,
    so they must exist in every lookup (a full checkpoint is applied without clearing)."""
    dim, stable, churn = 16, np.arange(200), np.arange(200, 300)
    trainer = Table(dim)
    pub = checkpoint.Publisher(tmp_path, {"emb": trainer}, full_every=4)
    serving = Table(dim)
    follower = checkpoint.Follower(tmp_path, {"emb": serving})
    keys = np.concatenate([stable, churn])
    trainer.insert_or_assign(keys, np.zeros((len(keys), dim), np.float32))
    pub.publish(0)
    follower.poll()
    stop = threading.Event()
    problems, reads = [], [0]

    def reader():
        last = np.zeros(len(keys))
        while not stop.is_set():
            rows, exists = serving.find(keys)
            reads[0] += 1
            mixed = np.flatnonzero(rows.min(axis=1) != rows.max(axis=1))
            if len(mixed):
                problems.append(f"mixed rows {keys[mixed][:5]}: {rows[mixed[0]]}")
            if not exists[:len(stable)].all():
                problems.append(f"stable keys missing: {stable[~exists[:len(stable)]][:5]}")
            v = rows[:, 0]
            if (v[:len(stable)] < last[:len(stable)]).any():
                problems.append("a stable row went back to an older version")
            last = v
            if len(problems) > 5:
                return

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        rng = np.random.default_rng(2)
        for version in range(1, 13):
            pick = rng.choice(len(stable), 120, replace=False)
            trainer.insert_or_assign(stable[pick], np.full((120, dim), version, np.float32))
            gone = churn[rng.random(len(churn)) < 0.3]
            trainer.erase(gone)
            back = np.setdiff1d(churn, trainer.export_keys())[:10]
            trainer.insert_or_assign(back, np.full((len(back), dim), version, np.float32))
            pub.publish(version)
            assert [a.steps["emb"] for a in follower.poll()] == [version]
            ref = trainer.export()
            got = dict(zip(serving.export()["keys"].tolist(), serving.export()["values"]))
            assert sorted(got) == sorted(ref["keys"].tolist())
            for k, row in zip(ref["keys"].tolist(), ref["values"]):
                np.testing.assert_array_equal(got[k], row)
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    assert problems == []
    assert reads[0] > 0


def test_broken_chain_is_refused_with_the_tables_unchanged(tmp_path):
    rng = np.random.default_rng(3)
    trainer = Table(DIM, optimizer=ADAM)
    pub = checkpoint.Publisher(tmp_path, {"emb": trainer}, full_every=100)
    serving = Table(DIM, optimizer=ADAM)
    follower = checkpoint.Follower(tmp_path, {"emb": serving})
    for step in (1, 2, 3):
        train_step(trainer, rng, step)
        pub.publish(step)
        if step == 1:
            follower.poll()
    at_1, held_1 = state(serving), follower.held
    # The delta of step 2 gone: step 3's chain no longer reaches what the server holds.
    os.rename(tmp_path / "step-000000000002", tmp_path / "moved-away")
    shutil.move(str(tmp_path / "moved-away"), str(tmp_path.parent / f"{tmp_path.name}-d2"))
    with pytest.raises(CheckpointError, match="broken chain"):
        follower.poll()
    assert state(serving) == at_1 and follower.held == held_1
    # Applying a delta by hand on the wrong checkpoint is refused the same way.
    with pytest.raises(CheckpointError, match="holds checkpoint .* but the delta .* is on"):
        checkpoint.apply(tmp_path / "step-000000000003", {"emb": serving})
    assert state(serving) == at_1
    # A corrupt delta is refused before anything changes.
    shutil.move(str(tmp_path.parent / f"{tmp_path.name}-d2"), str(tmp_path / "step-000000000002"))
    m = checkpoint.read_manifest(tmp_path / "step-000000000002")["tables"][0]["shards"][0]
    f = tmp_path / "step-000000000002" / m["file"]
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        follower.poll()
    assert state(serving) == at_1 and follower.held == held_1
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    assert [a.steps["emb"] for a in follower.poll()] == [2, 3]
    assert state(serving) == state(trainer)


def test_an_uncommitted_checkpoint_is_not_picked_up(tmp_path, monkeypatch):
    rng = np.random.default_rng(4)
    trainer = Table(DIM, optimizer=ADAM)
    pub = checkpoint.Publisher(tmp_path, {"emb": trainer})
    serving = Table(DIM, optimizer=ADAM)
    follower = checkpoint.Follower(tmp_path, {"emb": serving})
    train_step(trainer, rng, 1)
    pub.publish(1)
    follower.poll()
    before, held = state(serving), follower.held
    # A save that dies before its commit: nothing visible, the server stays where it was.
    train_step(trainer, rng, 2)
    import dualemb.core.checkpoint._delta as delta_mod

    def dies(*a, **k):
        raise OSError("killed (test)")
    monkeypatch.setattr(delta_mod, "write_shard", dies)
    with pytest.raises(OSError, match="killed"):
        pub.publish(2)
    monkeypatch.undo()
    # What a kill -9 leaves: a staging directory (complete files, not renamed into place), and
    # a directory still being copied in (no manifest yet).
    shutil.copytree(tmp_path / "step-000000000001", tmp_path / ".step-000000000009.tmp-123-x")
    (tmp_path / "step-000000000008").mkdir()
    assert follower.poll() == []
    assert state(serving) == before and follower.held == held
    pub.publish(3)  # after the failed publish: a full checkpoint starts a new chain
    assert [(a.steps["emb"], a.delta) for a in follower.poll()] == [(3, False)]
    assert state(serving) == state(trainer)


def test_background_follower_thread(tmp_path):
    trainer = Table(DIM)
    pub = checkpoint.Publisher(tmp_path, {"emb": trainer})
    serving = Table(DIM)
    with checkpoint.Follower(tmp_path, {"emb": serving}).start(interval=0.01) as follower:
        for step in (1, 2, 3):
            trainer.insert_or_assign(np.arange(10 * step), np.full((10 * step, DIM), step,
                                                                   np.float32))
            pub.publish(step)
        deadline = time.monotonic() + 30
        while follower.held != trainer.changes_label and time.monotonic() < deadline:
            time.sleep(0.01)
        assert follower.error is None
    assert follower.held == trainer.changes_label
    assert state_values(serving) == state_values(trainer)


def state_values(t):
    p = t.export()
    return {k: v.tobytes() for k, v in zip(p["keys"].tolist(), p["values"])}


def test_a_delta_that_could_overflow_a_serving_capacity_is_refused(tmp_path):
    trainer = Table(DIM)
    pub = checkpoint.Publisher(tmp_path, {"emb": trainer})
    trainer.insert_or_assign(np.arange(8), np.ones((8, DIM), np.float32))
    pub.publish(1)
    serving = Table(DIM, capacity=10)
    follower = checkpoint.Follower(tmp_path, {"emb": serving})
    follower.poll()
    trainer.insert_or_assign(np.arange(8, 12), np.ones((4, DIM), np.float32))
    pub.publish(2)
    before = state_values(serving)
    with pytest.raises(CheckpointError, match="more than its capacity 10"):
        follower.poll()
    assert state_values(serving) == before and serving.evicted_total == 0


def test_an_apply_that_fails_part_way_is_repaired_by_the_next_full_checkpoint(tmp_path,
                                                                             monkeypatch):
    rng = np.random.default_rng(5)
    trainer = Table(DIM, optimizer=ADAM)
    pub = checkpoint.Publisher(tmp_path, {"emb": trainer}, full_every=2)
    serving = Table(DIM, optimizer=ADAM)
    follower = checkpoint.Follower(tmp_path, {"emb": serving})
    train_step(trainer, rng, 1)
    pub.publish(1)
    follower.poll()
    train_step(trainer, rng, 3)  # erases rows: the tombstones go before the failure
    pub.publish(2)
    from dualemb.core.checkpoint import _load

    def out_of_memory(*a, **k):
        raise MemoryError("test")
    monkeypatch.setattr(_load, "_import", out_of_memory)
    with pytest.raises(MemoryError):
        follower.poll()
    monkeypatch.undo()
    assert follower.held == ""  # no checkpoint: a delta must not apply on this state
    train_step(trainer, rng, 4)
    pub.publish(3)  # full (every 2 publishes)
    assert [(a.steps["emb"], a.delta) for a in follower.poll()] == [(3, False)]
    assert state(serving) == state(trainer)

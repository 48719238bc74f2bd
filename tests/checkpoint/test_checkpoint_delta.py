"""Delta checkpoints: a chain of deltas loads to exactly the state a full save at the same step
gives (keys, rows, slots, last_update, update_count, step), into any shard count; compaction;
broken chains refused with the table unchanged; a failed save loses no change; size follows the
changed rows. The reference is a full save of the same live table (and numpy on its rows)."""
import os

import numpy as np
import pytest

import _numpy_shard_reader as shard_reader  # noqa: E402  (tests/ helper)
from table_rows import rows_by_key  # noqa: E402  (tests/ helper)
from dualemb.core import Table, checkpoint
from dualemb.core.checkpoint import CheckpointError

DIM = 4
ADAM = {"name": "adam", "flavor": "keras"}


def state(tables):
    """{key: (value bytes, slots bytes, last_update, update_count)} over live shards."""
    return rows_by_key(tables)


def train(t, rng, keys, step):
    keys = np.asarray(keys, np.int64)
    t.apply_gradients(keys, rng.standard_normal((len(keys), DIM)).astype(np.float32), 0.01, step)


def test_chain_equals_full_save_in_1_and_3_shards(tmp_path):
    rng = np.random.default_rng(1)
    t = Table(DIM, optimizer=ADAM, capacity=270)
    train(t, rng, np.arange(250), 1)
    checkpoint.save(tmp_path / "full", {"emb": t}, steps=1)
    prev = tmp_path / "full"
    removed_total = 0
    for step in range(2, 7):
        train(t, rng, rng.integers(0, 600, 60), step)  # rewrites, inserts, capacity evictions
        if step == 3:
            t.erase(np.arange(0, 40, 3))
        if step == 4:
            removed_total += t.restrict(200, by="frequency")
        if step == 5:
            t.insert_or_assign(np.array([1000, 1001]), np.ones((2, DIM), np.float32))
        d = tmp_path / f"d{step}"
        checkpoint.save(d, {"emb": t}, steps=step, base=prev)
        prev = d
    assert t.evicted_total > 0 and removed_total > 0
    expected = state(t)
    for shards in (None, 3):
        ck = checkpoint.load(prev, num_shards=shards)
        got = ck.tables["emb"]
        assert state(got) == expected
        assert ck.steps == {"emb": 6}
        for s in got if isinstance(got, list) else [got]:
            assert s.clock >= max(v[2] for v in expected.values())
            s.destroy()
    # Into live tables of another shard count, by name, as a front end loads.
    live = [Table(DIM, optimizer=ADAM) for _ in range(3)]
    live[0].insert_or_assign(np.array([99999]), np.zeros((1, DIM), np.float32))  # replaced
    checkpoint.load(prev, {"emb": live})
    assert state(live) == expected
    # Compaction writes the chain as one full checkpoint with the same state.
    checkpoint.compact(prev, tmp_path / "compact")
    m = checkpoint.read_manifest(tmp_path / "compact")
    assert m["version"] == 2 and "base" not in m and m["tables"][0]["step"] == 6
    ck = checkpoint.load(tmp_path / "compact")
    assert state(ck.tables["emb"]) == expected


def test_delta_holds_only_changed_rows_and_tombstones(tmp_path):
    t = Table(DIM, optimizer=ADAM)
    keys = np.arange(1000)
    t.insert_or_assign(keys, np.zeros((1000, DIM), np.float32))
    checkpoint.save(tmp_path / "full", {"emb": t}, steps=0)
    sizes = {}
    for frac in (0.01, 0.1):
        changed = keys[:int(1000 * frac)]
        train(t, np.random.default_rng(2), changed, 1)
        t.erase(np.array([999]))
        d = tmp_path / f"d{frac}"
        checkpoint.save(d, {"emb": t}, steps=1, base=tmp_path / "full")
        m = checkpoint.read_manifest(d)
        e = m["tables"][0]
        assert m["version"] == 3 and m["base"]["path"] == "../full"
        assert e["rows"] == len(changed) and e["total_rows"] == 999
        assert e["tombstones"]["rows"] == 1
        # Shard data bytes: exactly the changed rows (keys, metadata, values, 2 Adam slots, the
        # stepped mark).
        sizes[frac] = sum(s["bytes"] - s["header_bytes"] for s in e["shards"])
        assert sizes[frac] == len(changed) * (3 * 8 + 3 * DIM * 4 + 1)
        # Back to the base's mark for the next fraction: load the base.
        checkpoint.load(tmp_path / "full", {"emb": t})
    full = sum(s["bytes"] - s["header_bytes"]
               for s in checkpoint.read_manifest(tmp_path / "full")["tables"][0]["shards"])
    assert sizes[0.01] * 100 == full and sizes[0.1] * 10 == full


def stepped_marks(tables):
    """{key: stepped} over live shards (the core's marks, as export gives them)."""
    out = {}
    for t in tables if isinstance(tables, list) else [tables]:
        p = t.export()
        out.update(zip(p["keys"].tolist(), p["stepped"].tolist()))
    return out


def test_delta_carries_the_stepped_marks_of_a_full_save(tmp_path):
    """A row stepped with an all-zero gradient keeps Adam's initial (zero) slots, so the
    format's fallback rule (stepped where the slots differ from the initial ones) would load it
    unmarked: the delta must carry the mark. Reference: a full save of the same live table."""
    t = Table(DIM, optimizer=ADAM)
    t.insert_or_assign(np.arange(40), np.ones((40, DIM), np.float32))  # not stepped
    train(t, np.random.default_rng(8), np.arange(10), 1)               # stepped, slots != 0
    checkpoint.save(tmp_path / "full", {"emb": t}, steps=1)
    zero = np.array([20, 21, 100], np.int64)  # two old rows and a new one, all-zero gradient
    t.apply_gradients(zero, np.zeros((3, DIM), np.float32), 0.01, 2)
    t.insert_or_assign(np.array([30, 101]), np.ones((2, DIM), np.float32))  # written, unstepped
    train(t, np.random.default_rng(9), np.array([5]), 2)
    checkpoint.save(tmp_path / "d", {"emb": t}, steps=2, base=tmp_path / "full")
    checkpoint.save(tmp_path / "full2", {"emb": t}, steps=2)
    marks = stepped_marks(t)
    assert all(marks[k] for k in zero.tolist())
    assert not marks[30] and not marks[101] and marks[5] and not marks[35]
    assert not t.export()["slots"][np.isin(t.export()["keys"], zero)].any()  # the hard case
    full = stepped_marks(checkpoint.load(tmp_path / "full2").tables["emb"])
    assert full == marks
    for shards in (None, 3):
        assert stepped_marks(checkpoint.load(tmp_path / "d", num_shards=shards).tables["emb"]) \
            == full
    e = checkpoint.read_manifest(tmp_path / "d")["tables"][0]
    assert all("stepped" in s["tensors"] for s in e["shards"])
    checkpoint.compact(tmp_path / "d", tmp_path / "compact")
    assert stepped_marks(checkpoint.load(tmp_path / "compact").tables["emb"]) == full


def test_delta_on_a_loaded_checkpoint_and_after_a_failed_save(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    t = Table(DIM, optimizer=ADAM)
    train(t, rng, np.arange(100), 1)
    checkpoint.save(tmp_path / "full", {"emb": t}, steps=1)
    u = Table(DIM, optimizer=ADAM)
    checkpoint.load(tmp_path / "full", {"emb": u})  # u now tracks changes since "full"
    assert u.count_changed() == 0
    train(u, rng, np.arange(10), 2)
    assert u.count_changed() == 10

    from dualemb.core.checkpoint import _write
    real = _write.write_shard

    def broken(*a, **k):
        raise OSError("disk full (test)")
    monkeypatch.setattr(_write, "write_shard", broken)
    import dualemb.core.checkpoint._delta as delta_mod
    monkeypatch.setattr(delta_mod, "write_shard", broken)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save(tmp_path / "d1", {"emb": u}, steps=2, base=tmp_path / "full")
    monkeypatch.setattr(delta_mod, "write_shard", real)
    assert not (tmp_path / "d1").exists()
    train(u, rng, np.arange(50, 55), 3)
    checkpoint.save(tmp_path / "d1", {"emb": u}, steps=3, base=tmp_path / "full")
    assert checkpoint.read_manifest(tmp_path / "d1")["tables"][0]["rows"] == 15
    assert u.count_changed() == 0
    assert state(checkpoint.load(tmp_path / "d1").tables["emb"]) == state(u)


def test_broken_chain_is_refused_with_the_table_unchanged(tmp_path):
    rng = np.random.default_rng(4)
    t = Table(DIM, optimizer=ADAM)
    train(t, rng, np.arange(50), 1)
    checkpoint.save(tmp_path / "full", {"emb": t}, steps=1)
    train(t, rng, np.arange(5), 2)
    checkpoint.save(tmp_path / "d1", {"emb": t}, steps=2, base=tmp_path / "full")
    live = Table(DIM, optimizer=ADAM)
    live.insert_or_assign(np.array([7]), np.full((1, DIM), 3, np.float32))
    before = state(live)
    # The base replaced by another checkpoint (same path, other content).
    other = Table(DIM, optimizer=ADAM)
    train(other, rng, np.arange(50), 1)
    os.rename(tmp_path / "full", tmp_path / "full.orig")
    checkpoint.save(tmp_path / "full", {"emb": other}, steps=1)
    with pytest.raises(CheckpointError, match="not the one it was written on"):
        checkpoint.load(tmp_path / "d1", {"emb": live})
    assert state(live) == before
    # The base missing.
    os.rename(tmp_path / "full", tmp_path / "full.other")
    with pytest.raises(CheckpointError, match="is missing"):
        checkpoint.load(tmp_path / "d1", {"emb": live})
    assert state(live) == before
    os.rename(tmp_path / "full.orig", tmp_path / "full")
    checkpoint.load(tmp_path / "d1", {"emb": live})
    assert state(live) == state(t)


def test_delta_on_a_checkpoint_the_table_was_not_saved_to_is_refused(tmp_path):
    other = Table(DIM, optimizer=ADAM)
    checkpoint.save(tmp_path / "a", {"emb": other}, steps=0)
    t = Table(DIM, optimizer=ADAM)
    t.insert_or_assign(np.arange(5), np.zeros((5, DIM), np.float32))
    with pytest.raises(CheckpointError, match="tracks its changes since no checkpoint"):
        checkpoint.save(tmp_path / "d", {"emb": t}, steps=0, base=tmp_path / "a")
    checkpoint.save(tmp_path / "b", {"emb": t}, steps=0)
    with pytest.raises(CheckpointError, match="not since the base"):
        checkpoint.save(tmp_path / "d", {"emb": t}, steps=0, base=tmp_path / "a")
    assert not (tmp_path / "d").exists()


def test_string_keys_delta(tmp_path):
    t = Table(DIM, key_dtype="string", optimizer=ADAM)
    keys = np.array([f"k{i}".encode() for i in range(30)], object)
    t.insert_or_assign(keys, np.ones((30, DIM), np.float32))
    checkpoint.save(tmp_path / "full", {"emb": t})
    t.erase(keys[:3])
    t.insert_or_assign(keys[10:12], np.full((2, DIM), 5, np.float32))
    t.insert_or_assign(np.array([b"new"], object), np.zeros((1, DIM), np.float32))
    checkpoint.save(tmp_path / "d", {"emb": t}, base=tmp_path / "full")
    e = checkpoint.read_manifest(tmp_path / "d")["tables"][0]
    assert e["rows"] == 3 and e["tombstones"]["rows"] == 3
    got = checkpoint.load(tmp_path / "d").tables["emb"]
    assert state(got) == state(t)


def test_evicted_rows_are_handed_over():
    t = Table(DIM, optimizer=ADAM, capacity=10)
    t.capture_evicted(rows=True)
    t.insert_or_assign(np.arange(10), np.arange(40, dtype=np.float32).reshape(10, DIM))
    before = {k: v for k, v in zip(np.arange(10).tolist(), t.find(np.arange(10))[0])}
    n = t.insert_or_assign(np.arange(10, 14), np.zeros((4, DIM), np.float32))
    ev = t.take_evicted()
    assert n == 4 and len(ev["keys"]) == 4
    assert set(ev["keys"].tolist()) | set(t.export()["keys"].tolist()) == set(range(14))
    for k, row in zip(ev["keys"].tolist(), ev["values"]):
        np.testing.assert_array_equal(row, before[k])
    assert ev["slots"].shape == (4, 2, DIM)
    assert len(t.take_evicted()["keys"]) == 0
    t.capture_evicted(rows=False)
    t.restrict(5)
    ev = t.take_evicted()
    assert len(ev["keys"]) == 5 and "values" not in ev
    t.capture_evicted(False)
    t.restrict(1)
    assert len(t.take_evicted()["keys"]) == 0


def test_numpy_reader_follows_the_chain(tmp_path):
    """The spec (§10) is enough: numpy alone reads a chain to the table's rows."""
    rng = np.random.default_rng(5)
    t = Table(DIM)  # no optimizer: one shard file per layer
    t.insert_or_assign(np.arange(40), rng.standard_normal((40, DIM)).astype(np.float32))
    checkpoint.save(tmp_path / "full", {"emb": t})
    t.erase(np.arange(5))
    t.insert_or_assign(np.array([7, 50]), np.ones((2, DIM), np.float32))
    checkpoint.save(tmp_path / "d1", {"emb": t}, base=tmp_path / "full")
    t.restrict(30)
    t.accum(np.array([8]), np.ones((1, DIM), np.float32), np.array([True]))
    checkpoint.save(tmp_path / "d2", {"emb": t}, base=tmp_path / "d1")
    got = shard_reader.chain_rows(tmp_path / "d2")
    p = t.export()
    assert sorted(got) == sorted(p["keys"].tolist())
    for i, k in enumerate(p["keys"].tolist()):
        np.testing.assert_array_equal(got[k][0], p["values"][i])
        assert got[k][1:] == (int(p["last_update"][i]), int(p["update_count"][i]))


def test_corrupt_tombstones_are_refused_with_the_table_unchanged(tmp_path):
    t = Table(DIM)
    t.insert_or_assign(np.arange(20), np.zeros((20, DIM), np.float32))
    checkpoint.save(tmp_path / "full", {"emb": t})
    t.erase(np.arange(4))
    checkpoint.save(tmp_path / "d", {"emb": t}, base=tmp_path / "full")
    tomb = checkpoint.read_manifest(tmp_path / "d")["tables"][0]["tombstones"]
    path = tmp_path / "d" / tomb["file"]
    data = bytearray(path.read_bytes())
    data[tomb["header_bytes"]] ^= 1  # a tombstone key: one bit
    path.write_bytes(bytes(data))
    live = Table(DIM)
    live.insert_or_assign(np.array([77]), np.ones((1, DIM), np.float32))
    with pytest.raises(CheckpointError, match="checksum mismatch in tensor 'keys'"):
        checkpoint.load(tmp_path / "d", {"emb": live})
    assert live.export()["keys"].tolist() == [77]


def test_background_delta_chain_equals_full_saves_and_misses_no_concurrent_write(tmp_path):
    """Background saves (``blocking=False``) in a delta chain: each holds the state as of its
    call; rows written while it runs (after the snapshot) are in the next delta; the live table
    takes each published mark, so the next delta builds on it. Reference: blocking full saves
    of the same live table at each step."""
    rng = np.random.default_rng(7)
    t = Table(DIM, optimizer=ADAM)
    train(t, rng, np.arange(200), 1)
    checkpoint.save(tmp_path / "full", {"emb": t}, steps=1, blocking=False).wait()
    prev, expected = tmp_path / "full", {}
    for step in range(2, 5):
        train(t, rng, rng.integers(0, 400, 50), step)
        if step == 3:
            t.erase(np.arange(0, 30, 2))
        expected[step] = state(t)
        handle = checkpoint.save(tmp_path / f"d{step}", {"emb": t}, steps=step, base=prev,
                                 blocking=False)
        # Written while the save runs: not in this delta, in the next one.
        train(t, rng, rng.integers(0, 400, 20), step)
        handle.wait()
        expected[step] = (expected[step], state(t))
        prev = tmp_path / f"d{step}"
    for step in range(2, 5):
        ck = checkpoint.load(tmp_path / f"d{step}")
        assert state(ck.tables["emb"]) == expected[step][0], f"delta of step {step}"
        ck.tables["emb"].destroy()
    # The writes after the last snapshot go into one more (blocking) delta on top of the chain.
    checkpoint.save(tmp_path / "last", {"emb": t}, steps=5, base=prev)
    ck = checkpoint.load(tmp_path / "last")
    assert state(ck.tables["emb"]) == expected[4][1] == state(t)


def test_training_continues_from_a_chain_as_from_a_full_save_and_as_never_stopping(tmp_path):
    """The clock too: a chain of many small layers (each import call used to tick the clock once)
    and the full save load to the trainer's clock, so the rows written next get the same
    last_update stamps whichever checkpoint training continued from, and as if it never stopped."""
    rng = np.random.default_rng(7)
    t = Table(DIM, optimizer=ADAM)
    train(t, rng, np.arange(120), 1)
    checkpoint.save(tmp_path / "base", {"emb": t}, steps=1, page_rows=8)
    prev = tmp_path / "base"
    for step in range(2, 6):
        train(t, rng, rng.integers(0, 200, 30), step)
        t.erase(rng.integers(0, 200, 5))
        train(t, rng, rng.integers(0, 200, 10), step)  # the newest stamp == the clock
        d = tmp_path / f"d{step}"
        checkpoint.save(d, {"emb": t}, steps=step, base=prev, page_rows=8)
        prev = d
    checkpoint.save(tmp_path / "full", {"emb": t}, steps=5, page_rows=8)
    chain = checkpoint.load(prev).tables["emb"]
    full = checkpoint.load(tmp_path / "full").tables["emb"]
    assert chain.clock == full.clock == t.clock
    keys = rng.integers(0, 260, 40)
    grads = rng.standard_normal((len(keys), DIM)).astype(np.float32)
    for table in (t, chain, full):
        table.apply_gradients(np.asarray(keys, np.int64), grads, 0.01, 6)
    assert state(chain) == state(full) == state(t)
    chain.destroy()
    full.destroy()


def test_key_sets_agree_with_python_sets():
    """The chain's key sets (merged by one sort when read, membership by binary search) against
    Python sets: duplicates, negative keys, keys past both ends, empty sets and queries."""
    from dualemb.core.checkpoint._delta import KeySet, sorted_member

    rng = np.random.default_rng(3)
    ks = KeySet(string=False)
    added = set()
    for _ in range(4):
        part = rng.integers(-50, 50, 30)
        ks.add(part)
        added.update(part.tolist())
        query = rng.integers(-80, 80, 200)
        assert ks.contains(query).tolist() == [q in added for q in query.tolist()]
    assert ks.ints.tolist() == sorted(added) and len(ks) == len(added)
    assert sorted_member(np.empty(0, np.int64), np.array([1, 2])).tolist() == [False, False]
    assert sorted_member(np.array([1, 2]), np.empty(0, np.int64)).tolist() == []

"""The delta rows of a parameter-server shard (dualemb/tf/saving/gathered_shards.py), without a
cluster: a shard on a PS task is saved from a fresh copy gathered in the chief, which knows
nothing of the base, so its changed rows are found by comparing with the base's rows. Here the
"PS shard" is a core table and its gathered copy a fresh table imported from its export, as
remote_shards.staged_core_shards makes it. Reference: the live table's own rows (numpy), and the
rows that really differ from the base, computed independently."""

import numpy as np
import pytest

from table_rows import rows_by_key  # noqa: E402  (tests/ helper)
from dualemb.core import Table, checkpoint
from dualemb.core.checkpoint import CheckpointError
from dualemb.tf.saving import gathered_shards

DIM = 4
ADAM = {"name": "adam", "flavor": "keras"}
FIELDS = ("values", "slots", "last_update", "update_count", "stepped")


def gathered(t, capacity=0):
    """A fresh copy of ``t`` (the chief's scratch copy of a PS shard)."""
    c = Table(DIM, key_dtype=t.key_dtype_name, optimizer=ADAM, capacity=capacity)
    p = t.export()
    c.import_rows(p["keys"], p["values"], p["slots"], p["last_update"], p["update_count"],
                  p["stepped"])
    return c


def save_delta(t, path, base):
    copy = gathered(t)
    try:
        gathered_shards.mark_changes_since(str(base), {"emb": ([copy], [True])})
        checkpoint.save(path, {"emb": copy}, steps=2, base=base)
    finally:
        copy.destroy()


def loaded_rows(path, num_shards=None):
    ck = checkpoint.load(path, num_shards=num_shards)
    tables = ck.tables["emb"]
    try:
        return rows_by_key(tables, FIELDS)
    finally:
        for t in tables if isinstance(tables, list) else [tables]:
            t.destroy()


def test_delta_of_a_gathered_copy_holds_exactly_the_rows_that_differ(tmp_path):
    rng = np.random.default_rng(3)
    t = Table(DIM, optimizer=ADAM)
    keys = np.arange(200, dtype=np.int64)
    t.apply_gradients(keys, rng.standard_normal((200, DIM)).astype(np.float32), 0.01, 1)
    # -0.0 against 0.0 and NaN payloads differ only in bits: compared bit for bit.
    t.insert_or_assign(np.array([500, 501]), np.array([[0.0] * DIM, [np.nan] * DIM], np.float32))
    checkpoint.save(tmp_path / "base", {"emb": gathered(t)}, steps=1)
    before = rows_by_key(t, FIELDS)
    t.apply_gradients(np.arange(0, 60, 3), rng.standard_normal((20, DIM)).astype(np.float32),
                      0.01, 2)
    t.erase(np.arange(100, 110))
    p = t.export()
    # Written again with the same content (NaN row included): not changed.
    same = np.isin(p["keys"], np.r_[150:160, 501])
    t.import_rows(p["keys"][same], p["values"][same], p["slots"][same],
                  p["last_update"][same], p["update_count"][same], p["stepped"][same])
    # Only the sign of its zeros differs (metadata kept): changed.
    zero = p["keys"] == 500
    t.import_rows(p["keys"][zero], -p["values"][zero], p["slots"][zero],
                  p["last_update"][zero], p["update_count"][zero], p["stepped"][zero])
    t.insert_or_assign(np.array([600]), np.ones((1, DIM), np.float32))
    after = rows_by_key(t, FIELDS)
    differ = {k for k, row in after.items() if before.get(k) != row}
    assert {500, 600} <= differ and not differ & {*range(150, 160), 501}

    save_delta(t, tmp_path / "d1", tmp_path / "base")
    entry = checkpoint.read_manifest(tmp_path / "d1")["tables"][0]
    assert sum(s["rows"] for s in entry["shards"]) == len(differ)
    assert entry["tombstones"]["rows"] == 10
    assert loaded_rows(tmp_path / "d1") == after

    # A second delta on the first: only what changed since it.
    t.apply_gradients(np.array([7, 8]), np.ones((2, DIM), np.float32), 0.01, 3)
    save_delta(t, tmp_path / "d2", tmp_path / "d1")
    entry = checkpoint.read_manifest(tmp_path / "d2")["tables"][0]
    assert sum(s["rows"] for s in entry["shards"]) == 2 and entry["tombstones"]["rows"] == 0
    assert loaded_rows(tmp_path / "d2") == rows_by_key(t, FIELDS)


def test_string_keys(tmp_path):
    t = Table(DIM, key_dtype="string", optimizer=ADAM)
    keys = np.array([b"a", b"b\x00", b"\xffc", b"d"], object)
    t.apply_gradients(keys, np.ones((4, DIM), np.float32), 0.01, 1)
    checkpoint.save(tmp_path / "base", {"emb": gathered(t)}, steps=1)
    t.apply_gradients(keys[:1], np.ones((1, DIM), np.float32), 0.01, 2)
    t.erase(keys[1:2])
    save_delta(t, tmp_path / "d1", tmp_path / "base")
    entry = checkpoint.read_manifest(tmp_path / "d1")["tables"][0]
    assert sum(s["rows"] for s in entry["shards"]) == 1 and entry["tombstones"]["rows"] == 1
    assert loaded_rows(tmp_path / "d1") == rows_by_key(t, FIELDS)


def test_broken_base_is_refused_before_the_copy_changes(tmp_path):
    t = Table(DIM, optimizer=ADAM)
    t.apply_gradients(np.arange(10), np.ones((10, DIM), np.float32), 0.01, 1)
    checkpoint.save(tmp_path / "base", {"emb": t}, steps=1)
    copy = gathered(t)
    before = rows_by_key(copy, FIELDS)
    label = copy.changes_label
    (tmp_path / "base" / "manifest.json").write_text("{}")
    with pytest.raises(CheckpointError):
        gathered_shards.mark_changes_since(str(tmp_path / "base"), {"emb": ([copy], [True])})
    assert rows_by_key(copy, FIELDS) == before and copy.changes_label == label
    copy.destroy()


def test_shards_with_a_capacity_smaller_than_the_table(tmp_path):
    """Two PS shards of capacity 60 holding 100 rows together: the base's rows are read
    whole (into a table without that capacity), never refused or evicted."""
    shards = [Table(DIM, optimizer=ADAM, capacity=60) for _ in range(2)]
    keys = np.arange(100, dtype=np.int64)
    for i, t in enumerate(shards):
        own = keys[keys % 2 == i]
        t.apply_gradients(own, np.ones((len(own), DIM), np.float32), 0.01, 1)
    copies = [gathered(t, capacity=60) for t in shards]
    checkpoint.save(tmp_path / "base", {"emb": copies}, steps=1)
    shards[1].apply_gradients(np.array([1, 3]), np.ones((2, DIM), np.float32), 0.01, 2)
    shards[0].erase(np.array([0]))
    copies = [gathered(t, capacity=60) for t in shards]
    gathered_shards.mark_changes_since(str(tmp_path / "base"), {"emb": (copies, [True, True])})
    checkpoint.save(tmp_path / "d1", {"emb": copies}, steps=2, base=tmp_path / "base")
    entry = checkpoint.read_manifest(tmp_path / "d1")["tables"][0]
    assert [s["rows"] for s in entry["shards"]] == [0, 2] and entry["tombstones"]["rows"] == 1
    assert loaded_rows(tmp_path / "d1", num_shards=2) == rows_by_key(shards, FIELDS)

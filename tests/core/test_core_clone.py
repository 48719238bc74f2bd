"""Table.clone(): a copy of the whole table as of the call (rows, slots, metadata, optimizer,
initializer, capacity, clock), independent afterwards. The references are numpy arrays exported
before the clone, and the original table trained with the same gradients as the copy."""

import threading

import numpy as np
import pytest

from dualemb.core import Table
from table_rows import assert_same, snapshot  # tests/ helper

DIM = 8


def trained_table(**kwargs):
    t = Table(DIM, initializer={"initializer": "normal", "seed": 3, "stddev": 0.1},
              optimizer={"name": "adam", "beta_1": 0.8}, **kwargs)
    rng = np.random.default_rng(0)
    for step in range(1, 6):
        keys = rng.integers(0, 3000, 500)
        t.apply_gradients(keys, rng.standard_normal((500, DIM)).astype(np.float32), 0.01, step)
    return t


def test_clone_copies_everything_and_is_independent():
    t = trained_table(capacity=2000, evict_policy="frequency")
    t.erase(np.arange(0, 300))
    before = snapshot(t)
    c = t.clone()
    try:
        assert c.id != t.id
        assert c.describe() == t.describe() and c.slot_names == t.slot_names == ["momentum", "velocity"]
        assert c.clock == t.clock and c.size() == t.size()
        assert_same(snapshot(c), before)
        # independent: writes to either leave the other as it was
        t.insert_or_assign([5, 6], np.ones((2, DIM), np.float32))
        c.erase(before["keys"][:10])
        assert_same(snapshot(t.clone()), snapshot(t))
        assert c.size() == len(before["keys"]) - 10
        assert t.find(before["keys"][:10])[1].all()
        # the optimizer state (slots, counts, clock) came along: the same steps on the copy and
        # on a second copy of the original give the same bits
        c2 = t.clone()
        rng = np.random.default_rng(9)
        keys = rng.integers(0, 3000, 400)
        g = rng.standard_normal((400, DIM)).astype(np.float32)
        t.apply_gradients(keys, g, 0.01, 6)
        c2.apply_gradients(keys, g, 0.01, 6)
        assert_same(snapshot(c2), snapshot(t))
        assert c2.clock == t.clock
        c2.destroy()
        # the capacity (2000, by frequency) is the copy's too
        c.insert_or_assign(np.arange(10**5, 10**5 + 5000), np.zeros((5000, DIM), np.float32))
        assert c.size() == 2000
    finally:
        c.destroy()


@pytest.mark.parametrize("key_dtype,value_dtype", [("int32", "bfloat16"), ("string", "float32"),
                                                   ("int64", "string"), ("string", "int8")])
def test_clone_of_other_key_and_value_dtypes(key_dtype, value_dtype):
    t = Table(3, key_dtype=key_dtype, value_dtype=value_dtype)
    if key_dtype == "string":
        keys = np.array([f"k{i}".encode() for i in range(200)] + [b"", b"\x00x"], object)
    else:
        keys = np.arange(202) * 5 - 300
    if value_dtype == "string":
        vals = np.array([[f"v{i}-{j}".encode() * (i % 7) for j in range(3)]
                         for i in range(len(keys))], object)
    else:
        vals = (np.arange(len(keys) * 3).reshape(-1, 3) % 100).astype(t.value_dtype)
    t.insert_or_assign(keys, vals)
    t.erase(keys[:20])
    c = t.clone()
    try:
        before = t.export()
        got = c.export()
        as_map = lambda e: {k: tuple(v) for k, v in zip(e["keys"].tolist(), e["values"].tolist())}
        assert as_map(got) == as_map(before)
        # independent, also in the string-key map and the string pool
        t.insert_or_assign(keys[:20], vals[:20])
        c.erase(keys[20:40])
        rows, exists = c.find(keys[:40])
        assert not exists.any()
        rows, exists = t.find(keys[20:])
        assert exists.all()
        np.testing.assert_array_equal(rows, vals[20:])
    finally:
        c.destroy()


def test_clone_under_concurrent_training_is_one_consistent_state():
    """Each copy taken while another thread trains equals the state after some whole number of
    steps (never a half-applied batch): every copy's row of key 0, a key in every batch, tells
    its step, and the other rows must match a reference replay up to that step."""
    t = Table(DIM, optimizer="sgd")
    rng = np.random.default_rng(1)
    batches = [(np.concatenate([[0], rng.integers(1, 400, 300)]),
                np.full((301, DIM), 1.0, np.float32)) for _ in range(40)]
    done = threading.Event()

    def train():
        for step, (k, g) in enumerate(batches, 1):
            t.apply_gradients(k, g, 1.0, step)
        done.set()

    th = threading.Thread(target=train)
    th.start()
    copies = []
    while not done.is_set() and len(copies) < 8:
        copies.append(t.clone())
    th.join()
    try:
        for c in copies:
            e = snapshot(c)
            steps_done = 0 if e["keys"].size == 0 else int(round(-float(
                c.find([0])[0][0, 0])))
            ref = Table(DIM, optimizer="sgd")
            for step, (k, g) in enumerate(batches[:steps_done], 1):
                ref.apply_gradients(k, g, 1.0, step)
            r = snapshot(ref)
            np.testing.assert_array_equal(e["keys"], r["keys"])
            np.testing.assert_array_equal(e["values"], r["values"])
    finally:
        for c in copies:
            c.destroy()


def test_clone_memory_is_one_table():
    t = trained_table()
    c = t.clone()
    try:
        # the copy holds what the table holds, less the spare chunks and index slack at most
        assert 0.5 * t.memory_bytes() <= c.memory_bytes() <= t.memory_bytes()
    finally:
        c.destroy()


def test_clone_of_unknown_table_raises():
    t = Table(2)
    t.destroy()
    with pytest.raises(KeyError, match="unknown table id"):
        t.clone()


def test_clone_of_many_chunks_per_shard_then_every_row_written():
    """The shards are copied in parallel (one pool task per shard, into prefaulted chunks): a
    table with more than one row chunk in every shard (128-wide Adam rows: 128 rows a chunk; ~156
    rows a shard) copied by two threads at once gives two whole copies, and writing every row of
    the live table, then destroying it, leaves both as they were (numpy references exported
    before); a copy stepped like the live table gives its bits."""
    n, dim = 10_000, 128
    t = Table(dim, optimizer="adam")
    keys = np.arange(n, dtype=np.int64) * 7919 - 5
    rng = np.random.default_rng(4)
    t.apply_gradients(keys, rng.standard_normal((n, dim)).astype(np.float32), 0.01, 1)
    before = snapshot(t)
    copies = [None, None]

    def copy_into(i):
        copies[i] = t.clone()

    threads = [threading.Thread(target=copy_into, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    try:
        g = rng.standard_normal((n, dim)).astype(np.float32)
        t.apply_gradients(keys, g, 0.01, 2)  # every row of every chunk of the live table
        after = snapshot(t)
        assert not np.array_equal(after["values"], before["values"])
        t.destroy()
        for c in copies:
            assert_same(snapshot(c), before)
        copies[0].apply_gradients(keys, g, 0.01, 2)
        assert_same(snapshot(copies[0]), after)
        assert_same(snapshot(copies[1]), before)
    finally:
        for c in copies:
            if c is not None:
                c.destroy()

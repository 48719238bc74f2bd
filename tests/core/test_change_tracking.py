"""Change tracking in the core: every kind of write marks the rows it writes as changed since the
mark, reads do not, the mark moves only on commit, and the label names the mark's checkpoint.
The reference is the set of keys each step wrote (Python sets)."""
import numpy as np
import pytest

from dualemb.core import Table

DIM = 3


def changed(t):
    keys, cursor = [], 0
    while True:
        page, cursor = t.export_changed(cursor, 4)  # small pages: the cursor must carry on
        if len(page["keys"]) == 0:
            break
        keys += page["keys"].tolist()
    assert len(keys) == len(set(keys)) == t.count_changed()
    return set(keys)


def mark(t, label="ck"):
    t.changes_commit(t.changes_begin(), label)


@pytest.mark.parametrize("key_dtype", ["int64", "int32"])
def test_every_write_marks_its_rows(key_dtype):
    t = Table(DIM, key_dtype=key_dtype, optimizer={"name": "sgd"})
    kd = np.dtype(key_dtype)
    t.insert_or_assign(np.arange(100, dtype=kd), np.zeros((100, DIM), np.float32))
    assert t.changes_label == "" and changed(t) == set(range(100))
    mark(t, "a")
    assert t.changes_label == "a" and changed(t) == set()
    t.find(np.arange(100, dtype=kd))
    t.find_or_insert(np.array([1, 200], kd))  # only the new key is written
    assert changed(t) == {200}
    t.insert_or_assign(np.array([2], kd), np.ones((1, DIM), np.float32))
    t.accum(np.array([3, 300], kd), np.ones((2, DIM), np.float32), np.array([True, True]))
    t.apply_gradients(np.array([4, 4, 400], kd), np.ones((3, DIM), np.float32), 0.1, 1)
    t.import_rows(np.array([5], kd), np.ones((1, DIM), np.float32))
    t.erase(np.array([6, 2], kd))  # erasing writes no row (the delta writer finds gone keys)
    assert changed(t) == {200, 3, 4, 400, 5}  # 300: accum with exists=True ignores absent keys
    mark(t, "b")
    t.set_optimizer({"name": "adagrad"})  # every row's slots are new
    assert changed(t) == set(t.export()["keys"].tolist())


def test_a_save_that_never_commits_keeps_its_changes():
    t = Table(DIM)
    t.insert_or_assign(np.arange(10), np.zeros((10, DIM), np.float32))
    mark(t)
    t.insert_or_assign(np.arange(3), np.ones((3, DIM), np.float32))
    token = t.changes_begin()  # a save starts ... and fails: no commit
    t.insert_or_assign(np.array([7]), np.ones((1, DIM), np.float32))
    assert changed(t) == {0, 1, 2, 7}
    later = t.changes_begin()
    t.changes_commit(later, "x")
    assert changed(t) == set()
    with pytest.raises(ValueError, match="not handed out"):
        t.changes_commit(later + 5, "y")
    assert token < later


def test_string_keys_track_changes():
    t = Table(DIM, key_dtype="string")
    t.insert_or_assign(np.array([b"a", b"b" * 5000, b"c"], object), np.zeros((3, DIM), np.float32))
    mark(t)
    t.insert_or_assign(np.array([b"b" * 5000, b"d"], object), np.ones((2, DIM), np.float32))
    assert changed(t) == {b"b" * 5000, b"d"}


@pytest.mark.parametrize("key_dtype", ["int64", "string"])
def test_changed_pages_carry_the_stepped_marks_of_export(key_dtype):
    """export_changed gives each changed row the same stepped mark as export (the rows of a
    delta checkpoint load as marked as a full save's); reference: export's own column."""
    t = Table(DIM, key_dtype=key_dtype, optimizer={"name": "adam", "flavor": "keras"})
    keys = (np.arange(12) if key_dtype == "int64"
            else np.array([f"k{i}".encode() for i in range(12)], object))
    t.insert_or_assign(keys, np.ones((12, DIM), np.float32))
    t.apply_gradients(keys[:4], np.ones((4, DIM), np.float32), 0.1, 1)
    mark(t)
    t.apply_gradients(keys[2:6], np.zeros((4, DIM), np.float32), 0.1, 2)  # all-zero gradient
    t.insert_or_assign(keys[8:10], np.ones((2, DIM), np.float32))
    full = t.export()
    want = {k: s for k, s in zip(full["keys"].tolist(), full["stepped"].tolist())}
    got, cursor = {}, 0
    while True:
        page, cursor = t.export_changed(cursor, 3)
        if len(page["keys"]) == 0:
            break
        got.update(zip(page["keys"].tolist(), page["stepped"].tolist()))
    assert set(got) == set(keys[2:6].tolist()) | set(keys[8:10].tolist())
    assert got == {k: want[k] for k in got}
    assert [got[k] for k in keys[2:6].tolist()] == [True] * 4
    assert [got[k] for k in keys[8:10].tolist()] == [False] * 2

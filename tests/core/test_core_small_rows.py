"""Small rows (issue 22): the row sizes whose copies are compiled for a fixed size (16-128
bytes) and the rows padded to a whole cache line (56 -> 64 bytes: float32 dim 7-8, float16
dim 13-16, float64 dim 4), next to neighbours that are neither, checked against a dict of numpy
rows through every operation that reads or moves rows: writes, reads, erase (the last row moves
into the hole), export, clone, import, and adding an optimizer's slots (the rows are rebuilt at
the wider stride)."""

import numpy as np
import pytest

from dualemb.core import Table

CASES = [("float32", d) for d in (1, 2, 3, 4, 6, 7, 8, 9, 16, 32, 33)] + [
    ("float16", 13), ("float16", 16), ("float64", 4), ("float64", 3), ("int8", 32)]


def rows_of(vd, n, dim, rng):
    if vd == "int8":
        return rng.integers(-128, 128, (n, dim)).astype(np.int8)
    return rng.normal(size=(n, dim)).astype(vd)


def check_against(t, ref):
    keys = np.array(sorted(ref), np.int64)
    got, exists = t.find(keys)
    assert exists.all()
    np.testing.assert_array_equal(got, np.stack([ref[k] for k in keys]))
    page = t.export()
    assert sorted(page["keys"].tolist()) == keys.tolist()
    for k, v in zip(page["keys"], page["values"]):
        np.testing.assert_array_equal(v, ref[int(k)])
    assert t.size() == len(ref)


@pytest.mark.parametrize("vd,dim", CASES)
def test_small_rows_through_every_row_operation(vd, dim):
    rng = np.random.default_rng(dim)
    n = 600  # ~10 rows per shard: erasing moves rows inside a shard's store
    keys = rng.choice(1 << 40, n, replace=False).astype(np.int64)
    vals = rows_of(vd, n, dim, rng)
    t = Table(dim=dim, value_dtype=vd, num_threads=1)
    t.insert_or_assign(keys, vals)
    ref = {int(k): v for k, v in zip(keys, vals)}
    # Overwrite some, erase some (the last rows of shards move into the holes), add new ones.
    over = keys[::3]
    new_vals = rows_of(vd, over.size, dim, rng)
    t.insert_or_assign(over, new_vals)
    ref.update({int(k): v for k, v in zip(over, new_vals)})
    gone = keys[1::4]
    t.erase(gone)
    for k in gone:
        ref.pop(int(k), None)
    more = rng.choice(1 << 40, 50, replace=False).astype(np.int64) + (1 << 41)
    more_vals = rows_of(vd, more.size, dim, rng)
    t.insert_or_assign(more, more_vals)
    ref.update({int(k): v for k, v in zip(more, more_vals)})
    check_against(t, ref)
    # Missing keys read as the initializer's row (zeros) and report missing.
    got, exists = t.find(np.array([-1, int(more[0]), -2], np.int64))
    assert exists.tolist() == [False, True, False]
    np.testing.assert_array_equal(got[[0, 2]], np.zeros((2, dim), vd))
    c = t.clone()
    check_against(c, ref)
    c.destroy()
    page = t.export()
    fresh = Table(dim=dim, value_dtype=vd)
    fresh.import_rows(page["keys"], page["values"])
    check_against(fresh, ref)
    fresh.destroy()
    if vd in ("float32", "float16"):
        t.set_optimizer({"name": "adam", "flavor": "keras"})  # rows rebuilt with two slots
        check_against(t, ref)
    t.destroy()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 31, 32, 33, 48, 100, 4095, 20000])
def test_find_every_batch_length(n, threads):
    # find prefetches and probes in blocks of 16 keys (the last block is partial; a parallel
    # find runs the blocks of each range of 4,096 keys): every batch length around those sizes,
    # present and missing keys interleaved, against a dict of numpy rows.
    rng = np.random.default_rng(n)
    dim = 8
    present = rng.choice(1 << 40, 3000, replace=False).astype(np.int64)
    vals = rng.normal(size=(present.size, dim)).astype(np.float32)
    t = Table(dim=dim, num_threads=threads)
    t.insert_or_assign(present, vals)
    ref = {int(k): v for k, v in zip(present, vals)}
    missing = rng.choice(1 << 40, n, replace=False).astype(np.int64) + (1 << 41)
    pick = rng.random(n) < 0.7
    query = np.where(pick, present[rng.integers(0, present.size, n)], missing)
    got, exists = t.find(query)
    assert got.shape == (n, dim)
    np.testing.assert_array_equal(exists, pick)
    want = np.stack([ref.get(int(k), np.zeros(dim, np.float32)) for k in query]) if n else got
    np.testing.assert_array_equal(got, want)
    t.destroy()

"""Tables of value dtype string (dualemb_core.h "String values"): every operation against a
Python dict reference, exactly (bytes for bytes), including the default row of missing keys,
removal, capacity evictions, restrict, memory accounting and the refusals (accum, training,
string keys, Redis)."""

import numpy as np
import pytest

from dualemb.core import Table

DIM = 3
# Bytes a string table must keep exactly: NULs (inside and trailing), empty, non-UTF-8, long
# strings beyond the small-string buffer.
WEIRD = [b"", b"\x00", b"a\x00b", b"x\x00", b"\xff\xfe\x80", "é日本".encode(), b"L" * 1000]


def _rows(rng, n):
    """n rows of DIM random byte strings (weird ones mixed in), as an object array."""
    out = np.empty((n, DIM), object)
    for i in range(n):
        for j in range(DIM):
            if rng.random() < 0.3:
                out[i, j] = WEIRD[rng.integers(len(WEIRD))]
            else:
                out[i, j] = bytes(rng.integers(0, 256, rng.integers(0, 40), dtype=np.uint8))
    return out


def _as_dict(table):
    p = table.export()
    return {int(k): tuple(v) for k, v in zip(p["keys"], p["values"])}


def _check(table, ref, default):
    assert table.size() == len(ref)
    assert _as_dict(table) == ref
    probe = list(ref)[:50] + [2**31 - 1, -5000]
    rows, exists = table.find(probe)
    assert rows.dtype == object and rows.shape == (len(probe), DIM)
    for k, row, e in zip(probe, rows, exists):
        assert bool(e) == (k in ref)
        assert tuple(row) == ref.get(k, default)
        assert all(type(x) is bytes for x in row)


@pytest.mark.parametrize("key_dtype", ["int64", "int32"])
@pytest.mark.parametrize("initializer,default", [
    (None, (b"", b"", b"")),
    ("default", (b"default",) * DIM),
    (["a", "\u00e9", ""], (b"a", "\u00e9".encode(), b"")),
])
def test_random_operations_match_a_dict(key_dtype, initializer, default):
    rng = np.random.default_rng(1)
    t = Table(DIM, key_dtype=key_dtype, value_dtype="string", initializer=initializer)
    assert t.value_dtype == np.dtype(object)
    ref = {}
    for step in range(40):
        n = int(rng.integers(1, 200))
        keys = rng.integers(-300, 300, n).astype(key_dtype)
        op = rng.integers(4)
        if op <= 1:  # upsert, duplicates included: the last of a repeated key wins
            rows = _rows(rng, n)
            t.insert_or_assign(keys, rows)
            for k, r in zip(keys.tolist(), rows):
                ref[k] = tuple(r)
        elif op == 2:
            t.erase(keys[: n // 3])
            for k in keys[: n // 3].tolist():
                ref.pop(k, None)
        else:
            rows, exists = t.find_or_insert(keys)
            for k, r, e in zip(keys.tolist(), rows, exists):
                assert tuple(r) == ref.get(k, default)
                assert bool(e) == (k in ref)  # existed before the call (repeats included)
            for k in keys.tolist():
                ref.setdefault(k, default)
        if step % 10 == 9:
            _check(t, ref, default)
    _check(t, ref, default)
    np.testing.assert_array_equal(t.initial_values([1, 2]),
                                  np.array([default, default], object))
    t.clear()
    assert t.size() == 0 and t.find([1])[0][0].tolist() == list(default)


def test_find_or_insert_reports_existence_and_inserts_the_default():
    t = Table(DIM, value_dtype="string", initializer="d")
    t.insert_or_assign([1], [[b"x", b"y", b"z"]])
    rows, exists = t.find_or_insert([1, 2, 2])
    assert exists.tolist() == [True, False, False]
    assert rows.tolist() == [[b"x", b"y", b"z"], [b"d"] * 3, [b"d"] * 3]
    assert _as_dict(t) == {1: (b"x", b"y", b"z"), 2: (b"d",) * 3}


def test_weird_bytes_round_trip_exactly_from_lists_and_arrays():
    t = Table(len(WEIRD), value_dtype="string")
    # A list keeps trailing NULs (numpy's S dtype would drop them).
    t.insert_or_assign([7], [WEIRD])
    arr = np.empty((1, len(WEIRD)), object)
    arr[0, :] = WEIRD[::-1]
    t.insert_or_assign([8], arr)
    t.insert_or_assign([9], [["é", "b\x00", "", "c", "d", "e", "f"]])  # str -> UTF-8
    rows, _ = t.find([7, 8, 9])
    assert rows[0].tolist() == WEIRD
    assert rows[1].tolist() == WEIRD[::-1]
    assert rows[2].tolist() == ["é".encode(), b"b\x00", b"", b"c", b"d", b"e", b"f"]


def test_export_after_many_upserts_and_paged_export():
    t = Table(2, value_dtype="string")
    ref = {}
    for r in range(30):  # the same keys overwritten again and again
        keys = np.arange(500, dtype=np.int64)
        vals = np.array([[f"{k}-{r}".encode(), b"\x00" * (r % 3)] for k in keys], object)
        t.insert_or_assign(keys, vals)
        ref.update({int(k): tuple(v) for k, v in zip(keys, vals)})
    assert _as_dict(t) == ref
    paged = {}
    for page in t.export_pages(page_size=37):
        paged.update({int(k): tuple(v) for k, v in zip(page["keys"], page["values"])})
    assert paged == ref


def test_memory_is_counted_and_given_back():
    t = Table(4, value_dtype="string")
    empty = t.memory_bytes()
    keys = np.arange(2000, dtype=np.int64)
    big = np.full((2000, 4), b"v" * 500, object)
    t.insert_or_assign(keys, big)
    full = t.memory_bytes()
    assert full - empty >= 2000 * 4 * 500  # the strings' bytes are counted
    for _ in range(5):  # overwriting frees the strings it replaces
        t.insert_or_assign(keys, big)
    assert t.memory_bytes() < full * 1.2
    t.erase(keys[:1000])
    assert full - t.memory_bytes() >= 0.75 * 1000 * 4 * 500  # erased rows' strings are freed
    t.clear()
    assert t.memory_bytes() < empty + 4096


def test_capacity_evictions_keep_the_right_strings_and_free_the_rest():
    t = Table(1, value_dtype="string", capacity=50)
    same = Table(1, value_dtype="int64", capacity=50)  # the same rows without strings
    ref = {}
    for r in range(200):
        keys = np.arange(r * 20, r * 20 + 20, dtype=np.int64)
        vals = np.array([[f"k{k:06d}".encode() * 60] for k in keys], object)  # 480 bytes
        t.insert_or_assign(keys, vals)
        same.insert_or_assign(keys, keys[:, None])
        ref.update({int(k): (v[0],) for k, v in zip(keys, vals)})
    got = _as_dict(t)
    assert len(got) == 50
    assert all(got[k] == ref[k] for k in got)  # survivors hold their own strings
    # 4,000 strings (1.9 MB) were written; evicted rows' strings leave the pool in amortised
    # passes (once it holds 2 * size + 1024), so at most ~1,150 of them (0.6 MB) remain.
    assert t.memory_bytes() - same.memory_bytes() < 800_000


def test_restrict_keeps_the_best_rows_with_their_strings():
    t = Table(1, value_dtype="string")
    keys = np.arange(100, dtype=np.int64)
    t.insert_or_assign(keys, np.array([[str(k).encode()] for k in keys], object))
    removed = t.restrict(10, by="custom", keys=keys, scores=keys.astype(np.float32))
    assert removed == 90
    assert _as_dict(t) == {k: (str(k).encode(),) for k in range(90, 100)}
    t.insert_or_assign([5], [[b"back"]])
    assert _as_dict(t)[5] == (b"back",)


def test_import_and_initial_values():
    t = Table(2, value_dtype="string", initializer=[b"p", b"q"])
    t.import_rows([3, 4], [[b"a", b""], [b"\x00", b"z"]], last_update=[5, 6],
                  update_count=[1, 2])
    p = t.export()
    got = {int(k): (tuple(v), int(lu), int(c)) for k, v, lu, c in
           zip(p["keys"], p["values"], p["last_update"], p["update_count"])}
    assert got == {3: ((b"a", b""), 5, 1), 4: ((b"\x00", b"z"), 6, 2)}
    assert p["slots"].shape == (2, 0, 2)
    assert t.initial_values([9]).tolist() == [[b"p", b"q"]]
    assert t.describe()[0]["values"] == ["p", "q"]


def test_refusals_name_the_dtype_and_leave_the_table_unchanged():
    t = Table(2, value_dtype="string")
    t.insert_or_assign([1], [[b"a", b"b"]])
    before = _as_dict(t)
    with pytest.raises(ValueError, match="accum.*string"):
        t.accum([1, 2], [[b"x", b"y"]] * 2, [True, False])
    with pytest.raises(ValueError, match="string"):
        t.apply_gradients([1], np.ones((1, 2), np.float32), 0.1, 1)
    with pytest.raises(ValueError, match="value dtype string cannot be trained"):
        t.set_optimizer("adam")
    with pytest.raises(TypeError, match="element 1 is int"):
        t.insert_or_assign([1], [[b"x", 3]])
    with pytest.raises(ValueError, match="shape"):
        t.insert_or_assign([1, 2], [[b"x", b"y"]])
    with pytest.raises(ValueError, match="no optimizer slots"):
        t.import_rows([1], [[b"x", b"y"]], slots=np.empty((1, 1, 2), object))
    assert _as_dict(t) == before
    with pytest.raises(ValueError, match="value dtype string cannot be trained"):
        Table(2, value_dtype="string", optimizer="sgd")
    with pytest.raises(ValueError, match="string keys with string values"):
        Table(2, key_dtype="string", value_dtype="string")
    with pytest.raises(ValueError, match="backend 'redis' does not support value_dtype 'string'"):
        Table(2, value_dtype="string", backend={"redis": {"name": "x"}})
    with pytest.raises(ValueError, match="not valid UTF-8"):
        Table(2, value_dtype="string", initializer=b"\xff")
    with pytest.raises(ValueError, match="initializer"):
        Table(2, value_dtype="string", initializer={"initializer": "normal"})
    # A numeric table refuses strings, a string table numbers.
    with pytest.raises(TypeError):
        Table(2).insert_or_assign([1], [[b"a", b"b"]])
    with pytest.raises(TypeError):
        t.insert_or_assign([1], np.ones((1, 2), np.float32))
    assert _as_dict(t) == before


def test_concurrent_writers_and_readers_see_only_whole_rows():
    # Handles are reused as soon as a write frees them: a reader must never see a string that
    # belongs to another key or a half-written row.
    import threading

    t = Table(2, value_dtype="string", initializer="none")
    keys = np.arange(64, dtype=np.int64)
    errors = []

    def writer(w):
        for it in range(60):
            vals = np.array([[f"{k}:{w}:{it}".encode(), f"{k}:{w}:{it}".encode()] for k in keys],
                            object)
            t.insert_or_assign(keys[(w + it) % 2::2], vals[(w + it) % 2::2])
            if it % 7 == 0:
                t.erase(keys[it % 64: it % 64 + 3])

    def reader():
        for _ in range(150):
            rows, exists = t.find(keys)
            for k, row, e in zip(keys.tolist(), rows.tolist(), exists):
                if not e:
                    ok = row == [b"none", b"none"]
                else:
                    ok = row[0] == row[1] and row[0].startswith(f"{k}:".encode())
                if not ok:
                    errors.append((k, row))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)] + \
        [threading.Thread(target=reader) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    p = t.export()
    assert all(v[0] == v[1] and v[0].startswith(f"{k}:".encode())
               for k, v in zip(p["keys"].tolist(), p["values"].tolist()))

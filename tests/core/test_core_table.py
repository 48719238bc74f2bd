"""Behaviour of dualemb.core.Table against plain-Python references (dicts of numpy rows).

The behavioural tests run on both storage backends: in memory and in a Redis server started for
this module (tests/redis_server.py; skipped, naming the package, without redis-server)."""

import itertools
import threading

import numpy as np
import pytest

from dualemb.core import Table, initializers


@pytest.fixture(scope="module")
def redis_server():
    from redis_server import RedisServer
    server = RedisServer()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture(params=["memory", "redis"])
def make(request):
    """A Table factory for one backend; every Redis table gets a name of its own."""
    if request.param == "memory":
        return Table
    server = request.getfixturevalue("redis_server")
    names = itertools.count()

    def make_table(**kwargs):
        name = f"{request.node.name}-{next(names)}"
        return Table(**kwargs, backend={"redis": {"name": name, "addresses": [server.address]}})
    return make_table


def as_dict(table):
    out = table.export()
    return {int(k): v for k, v in zip(out["keys"], out["values"])}


def test_find_missing_reads_initializer_and_does_not_insert(make):
    t = make(dim=3, initializer=7.5)
    values, exists = t.find(np.array([1, 2, 3]))
    np.testing.assert_array_equal(values, np.full((3, 3), 7.5, np.float32))
    assert not exists.any()
    assert t.size() == 0


def test_insert_find_any_key_shape(make):
    t = make(dim=2)
    keys = np.array([[10, 20, 30], [40, 50, 60]])
    vals = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    t.insert_or_assign(keys, vals)
    got, exists = t.find(keys[::-1])
    assert got.shape == (2, 3, 2) and exists.shape == (2, 3)
    np.testing.assert_array_equal(got, vals[::-1])
    assert exists.all()


def test_last_duplicate_wins_on_insert(make):
    t = make(dim=1)
    t.insert_or_assign(np.array([5, 5, 5]), np.array([[1.0], [2.0], [3.0]], np.float32))
    assert as_dict(t) == {5: np.float32(3.0)} or as_dict(t)[5][0] == 3.0
    assert t.size() == 1


def test_find_or_insert_inserts_initializer_rows(make):
    t = make(dim=4, initializer=initializers.normal(0, 1, seed=9))
    expected = t.initial_values(np.array([1, 2]))
    values, exists = t.find_or_insert(np.array([1, 2, 1]))
    assert not exists.any()  # the repeated key did not exist before the call either
    np.testing.assert_array_equal(values[:2], expected)
    np.testing.assert_array_equal(values[2], expected[0])
    assert t.size() == 2
    np.testing.assert_array_equal(t.find(np.array([2]))[0][0], expected[1])


def test_accum_follows_tfra_rule(make):
    t = make(dim=2)
    t.insert_or_assign(np.array([1, 2]), np.ones((2, 2), np.float32))
    keys = np.array([1, 2, 3, 4])
    deltas = np.full((4, 2), 0.5, np.float32)
    exists = np.array([True, False, False, True])
    t.accum(keys, deltas, exists)
    d = as_dict(t)
    np.testing.assert_array_equal(d[1], [1.5, 1.5])  # present & exists -> add
    np.testing.assert_array_equal(d[2], [1.0, 1.0])  # present & !exists -> ignored
    np.testing.assert_array_equal(d[3], [0.5, 0.5])  # absent & !exists -> inserted
    assert 4 not in d                                # absent & exists -> ignored


def test_accum_rows_is_accum_of_new_minus_old(make):
    """accum_rows(keys, old, new, exists) (TFRA's Variable.accum) equals accum of the deltas
    numpy computes (new - old where exists, else new), on the TFRA rule's four cases."""
    rng = np.random.default_rng(3)
    start = rng.normal(size=(2, 3)).astype(np.float32)
    keys = np.array([1, 2, 3, 4, 1])  # 1 twice: both deltas are added
    old = rng.normal(size=(5, 3)).astype(np.float32)
    new = rng.normal(size=(5, 3)).astype(np.float32)
    exists = np.array([True, False, False, True, True])
    t, ref = make(dim=3), make(dim=3)
    for table in (t, ref):
        table.insert_or_assign(np.array([1, 2]), start)
    t.accum_rows(keys, old, new, exists)
    ref.accum(keys, np.where(exists[:, None], new - old, new), exists)
    got, want = as_dict(t), as_dict(ref)
    assert sorted(got) == sorted(want) == [1, 2, 3]
    for k in got:
        np.testing.assert_array_equal(got[k], want[k])
    np.testing.assert_array_equal(got[2], start[1])  # present & !exists: ignored
    np.testing.assert_array_equal(got[3], new[2])    # absent & !exists: inserted as new
    with pytest.raises(ValueError, match="old_values"):
        t.accum_rows(keys, old[:2], new, exists)
    assert as_dict(t).keys() == got.keys()


def test_accum_rows_integer_and_string_keys():
    """int8 rows wrap around as integers do; string keys take the same route."""
    t = Table(dim=2, value_dtype="int8", key_dtype="string")
    t.insert_or_assign(np.array([b"a", b"b"], object), np.array([[120, -120], [5, 5]], np.int8))
    old = np.array([[0, 0], [5, 6]], np.int8)
    new = np.array([[10, -10], [7, 7]], np.int8)
    t.accum_rows(np.array([b"a", b"b"], object), old, new, np.array([True, True]))
    want = np.array([[120, -120], [5, 5]], np.int8).astype(np.int64) + (new - old).astype(np.int64)
    want = ((want + 128) % 256 - 128).astype(np.int8)  # two's complement wrap
    np.testing.assert_array_equal(t.find(np.array([b"a", b"b"], object))[0], want)


def test_erase_clear_size_and_reinsert(make):
    t = make(dim=2)
    rng = np.random.default_rng(0)
    keys = rng.choice(1 << 40, 5000, replace=False)
    vals = rng.normal(size=(5000, 2)).astype(np.float32)
    t.insert_or_assign(keys, vals)
    t.erase(keys[:2500])
    assert t.size() == 2500
    ref = dict(zip(keys[2500:].tolist(), vals[2500:]))
    got = as_dict(t)
    assert got.keys() == ref.keys()
    for k in ref:
        np.testing.assert_array_equal(got[k], ref[k])
    assert not t.find(keys[:2500])[1].any()
    t.clear()
    assert t.size() == 0 and t.export()["keys"].size == 0
    t.insert_or_assign(keys[:3], vals[:3])
    np.testing.assert_array_equal(t.find(keys[:3])[0], vals[:3])


def test_int32_keys(make):
    t = make(dim=2, key_dtype="int32")
    keys = np.array([-5, 0, 2**31 - 1], np.int32)
    t.insert_or_assign(keys, np.arange(6, dtype=np.float32).reshape(3, 2))
    out = t.export()
    assert out["keys"].dtype == np.int32
    assert sorted(out["keys"].tolist()) == sorted(keys.tolist())
    with pytest.raises(ValueError, match="int32"):
        t.find(np.array([2**40]))


def test_paged_export_covers_every_row_once(make):
    t = make(dim=3)
    keys = np.arange(10_000, dtype=np.int64) * 7919
    t.insert_or_assign(keys, np.repeat(keys[:, None], 3, 1).astype(np.float32))
    pages = list(t.export_pages(page_size=777))
    assert all(len(p["keys"]) <= 777 for p in pages)
    got = np.concatenate([p["keys"] for p in pages])
    assert sorted(got.tolist()) == keys.tolist()
    for p in pages:
        np.testing.assert_array_equal(p["values"][:, 0], p["keys"].astype(np.float32))


def test_import_rows_with_metadata_roundtrip(make):
    src = make(dim=2)
    src.insert_or_assign(np.array([1, 2, 3]), np.ones((3, 2), np.float32))
    src.insert_or_assign(np.array([2]), np.full((1, 2), 2.0, np.float32))
    out = src.export()
    dst = make(dim=2)
    dst.import_rows(out["keys"], out["values"], None, out["last_update"], out["update_count"])
    back = dst.export()
    order = np.argsort(back["keys"]), np.argsort(out["keys"])
    for name in ("keys", "values", "last_update", "update_count"):
        np.testing.assert_array_equal(back[name][order[0]], out[name][order[1]])
    assert dict(zip(out["keys"].tolist(), out["update_count"].tolist())) == {1: 1, 2: 2, 3: 1}


def test_restrict_by_recency_frequency_and_custom(make):
    t = make(dim=1)
    for step in range(5):  # key k last written at step k, written (5 - k) times in total
        keys = np.arange(step, 5)
        t.insert_or_assign(keys, np.zeros((keys.size, 1), np.float32))
    t.insert_or_assign(np.array([0]), np.zeros((1, 1), np.float32))  # key 0: most recent too
    assert t.restrict(3, by="recency") == 2
    assert sorted(as_dict(t)) == [0, 3, 4]

    t2 = make(dim=1)
    for step in range(5):
        keys = np.arange(0, 5 - step)  # key k written 5 - k times
        t2.insert_or_assign(keys, np.zeros((keys.size, 1), np.float32))
    assert t2.restrict(2, by="frequency") == 3
    assert sorted(as_dict(t2)) == [0, 1]

    t3 = make(dim=1)
    t3.insert_or_assign(np.arange(6), np.zeros((6, 1), np.float32))
    removed = t3.restrict(2, by="custom", keys=np.array([4, 1, 2]), scores=np.array([9.0, 8.0, -1.0]))
    assert removed == 4 and sorted(as_dict(t3)) == [1, 4]


def test_capacity_evicts_oldest_and_reports():
    t = Table(dim=1, capacity=100)
    assert t.insert_or_assign(np.arange(100), np.zeros((100, 1), np.float32)) == 0
    evicted = t.insert_or_assign(np.arange(100, 130), np.ones((30, 1), np.float32))
    assert evicted == 30 and t.size() == 100 and t.evicted_total == 30
    keys = set(as_dict(t))
    assert set(range(100, 130)) <= keys


def test_attach_shares_one_table_by_id():
    t = Table(dim=2)
    other = Table.attach(t.id)
    other.insert_or_assign(np.array([42]), np.array([[1.0, 2.0]], np.float32))
    np.testing.assert_array_equal(t.find(np.array([42]))[0], [[1.0, 2.0]])
    same = Table(dim=2, table_id=t.id)  # get-or-create returns the existing table
    assert same.size() == 1


@pytest.mark.parametrize("dim", [1, 7, 1024])
def test_dims(dim):
    t = Table(dim=dim, initializer=initializers.uniform(-1, 1, seed=2))
    keys = np.arange(50)
    vals = np.random.default_rng(dim).normal(size=(50, dim)).astype(np.float32)
    t.insert_or_assign(keys, vals)
    np.testing.assert_array_equal(t.find(keys)[0], vals)


def test_many_python_threads_share_a_table():
    t = Table(dim=4)

    def work(i):
        keys = np.arange(i * 1000, (i + 1) * 1000)
        for _ in range(20):
            t.insert_or_assign(keys, np.full((1000, 4), i, np.float32))
            v, e = t.find(keys)
            assert e.all() and (v == i).all()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert t.size() == 6000

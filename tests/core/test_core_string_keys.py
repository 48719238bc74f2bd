"""String-keyed tables (Table(key_dtype="string")) against a dict reference.

The reference for a missing key's row is the int64 table with the same initializer, read at the
string's fingerprint, computed here independently (FNV-1a 64 + splitmix64 finalizer, masked to
63 bits: the definition in dualemb_core.h)."""

import numpy as np
import pytest

from dualemb._native import load_extension
from dualemb.core import Table

_core = load_extension("_core")
M64 = (1 << 64) - 1
INIT = {"initializer": "normal", "seed": 7}
KEYS = ["a", "", "é", "日本語", b"x\x00y", b"x\x00", b"\x00", b"\xff\xfe", "a" * 300]


def fingerprint(b: bytes) -> int:
    h = 0xCBF29CE484222325
    for c in b:
        h = ((h ^ c) * 0x100000001B3) & M64
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & M64
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & M64
    return (h ^ (h >> 31)) & ((1 << 63) - 1)


def as_bytes(k):
    return k.encode() if isinstance(k, str) else k


def initial_rows(keys, dim=4, init=INIT):
    ref = Table(dim, initializer=init)
    try:
        return ref.find(np.array([fingerprint(as_bytes(k)) for k in keys], np.int64))[0]
    finally:
        ref.destroy()


@pytest.fixture
def id_bits():
    """Sets the testing hook that narrows string ids (forcing collisions); restores 63."""
    def set_bits(bits):
        _core._testing_string_id_bits(bits)
    yield set_bits
    _core._testing_string_id_bits(63)


def test_fingerprint_matches_the_documented_definition():
    for k in KEYS:
        assert _core.string_fingerprint(as_bytes(k)) == fingerprint(as_bytes(k))


@pytest.mark.parametrize("bits", [63, 1])
def test_operations_match_a_dict(bits, id_bits):
    # bits=1: every string's id starts at 0 or 1, so nearly all of them collide and probe; the
    # results must not change.
    id_bits(bits)
    t = Table(4, key_dtype="string", initializer=INIT, optimizer="sgd")
    ref = {}
    init = dict(zip(map(as_bytes, KEYS), initial_rows(KEYS)))

    vals, ex = t.find(KEYS)
    np.testing.assert_array_equal(vals, initial_rows(KEYS))
    assert not ex.any() and t.string_keys_stats() == (0, 0)  # find adds nothing

    vals, ex = t.find_or_insert(KEYS[:5])
    np.testing.assert_array_equal(vals, initial_rows(KEYS[:5]))
    assert not ex.any()
    ref.update({as_bytes(k): init[as_bytes(k)].copy() for k in KEYS[:5]})

    new = np.arange(8, dtype=np.float32).reshape(2, 4)
    t.insert_or_assign([KEYS[5], KEYS[0]], new)
    ref[as_bytes(KEYS[5])] = new[0]
    ref[as_bytes(KEYS[0])] = new[1]

    d = np.full((3, 4), 0.5, np.float32)
    t.accum([KEYS[1], KEYS[6], KEYS[7]], d, [True, False, True])  # add, insert, ignore
    ref[as_bytes(KEYS[1])] = ref[as_bytes(KEYS[1])] + 0.5
    ref[as_bytes(KEYS[6])] = d[1]

    g = np.ones((3, 4), np.float32)
    t.apply_gradients([KEYS[2], KEYS[2], KEYS[8]], g, lr=0.1, step=1)  # dup summed; new key
    ref[as_bytes(KEYS[2])] = ref[as_bytes(KEYS[2])] - np.float32(0.1) * 2
    ref[as_bytes(KEYS[8])] = init[as_bytes(KEYS[8])] - np.float32(0.1)

    t.erase([KEYS[3], "never seen"])
    del ref[as_bytes(KEYS[3])]

    vals, ex = t.find(KEYS)
    for k, v, e in zip(KEYS, vals, ex):
        b = as_bytes(k)
        assert e == (b in ref)
        np.testing.assert_allclose(v, ref.get(b, init[b]), rtol=1e-6)
    assert t.size() == len(ref) and t.string_keys_stats()[0] == len(ref)

    page = t.export()
    assert sorted(page["keys"].tolist()) == sorted(ref)
    for k, v in zip(page["keys"], page["values"]):
        np.testing.assert_allclose(v, ref[k], rtol=1e-6)
    t.destroy()


def test_colliding_strings_stay_distinct(id_bits):
    id_bits(1)  # two possible base ids: among three strings two share one
    t = Table(2, key_dtype="string", initializer=INIT)
    keys = ["p", "q", "r"]
    t.insert_or_assign(keys, np.array([[1, 1], [2, 2], [3, 3]], np.float32))
    np.testing.assert_array_equal(t.find(keys)[0], [[1, 1], [2, 2], [3, 3]])
    t.erase(["q"])
    vals, ex = t.find(keys)
    assert ex.tolist() == [True, False, True]
    np.testing.assert_array_equal(vals[[0, 2]], [[1, 1], [3, 3]])
    np.testing.assert_array_equal(vals[1], initial_rows(["q"], 2)[0])
    # A new string may take the freed id; the others keep their rows.
    t.insert_or_assign(["s"], np.array([[9, 9]], np.float32))
    np.testing.assert_array_equal(t.find(["p", "r", "s"])[0], [[1, 1], [3, 3], [9, 9]])
    assert sorted(t.export()["keys"].tolist()) == [b"p", b"r", b"s"]
    t.destroy()


def test_initial_rows_follow_the_string_not_the_insertion_order(id_bits):
    id_bits(2)
    a = Table(3, key_dtype="string", initializer=INIT)
    b = Table(3, key_dtype="string", initializer=INIT)
    keys = [f"k{i}" for i in range(40)]
    va = a.find_or_insert(keys)[0]
    vb = b.find_or_insert(keys[::-1])[0][::-1]
    np.testing.assert_array_equal(va, vb)
    np.testing.assert_array_equal(va, initial_rows(keys, 3))
    np.testing.assert_array_equal(a.initial_values(keys), va)
    a.destroy()
    b.destroy()


def test_key_forms_are_one_key():
    t = Table(2, key_dtype="string")
    t.insert_or_assign(["é"], np.array([[1, 2]], np.float32))
    for form in ["é", "é".encode(), np.array(["é"]), np.array(["é".encode()], dtype="S"),
                 np.array(["é"], dtype=object), [["é"]]]:
        v, e = t.find(form)
        assert e.all(), form
        np.testing.assert_array_equal(v.reshape(-1, 2)[0], [1, 2])
    assert t.find("é")[0].shape == (2,)
    t.destroy()


def test_wrong_key_types_are_refused_unchanged():
    t = Table(2, key_dtype="string")
    t.insert_or_assign(["a"], np.ones((1, 2), np.float32))
    for bad in [np.array([1, 2]), [1.5], [["a"], [3]], [None]]:
        with pytest.raises(TypeError):
            t.insert_or_assign(bad, np.zeros(np.shape(bad) + (2,), np.float32))
    assert t.size() == 1
    i = Table(2)
    with pytest.raises(TypeError, match="integers"):
        i.find(["a"])
    with pytest.raises(TypeError, match="unsupported key dtype"):
        Table(2, key_dtype="float32")
    t.destroy()
    i.destroy()


def test_capacity_keeps_the_key_map_bounded():
    cap = 100
    t = Table(2, key_dtype="string", capacity=cap)
    for batch in range(60):
        keys = [f"user-{batch}-{i}" for i in range(100)]
        t.find_or_insert(keys)
        entries, nbytes = t.string_keys_stats()
        assert t.size() <= cap
        assert entries <= 2 * t.size() + 1024 + len(keys)
    # 6000 distinct strings went in; far fewer are held.
    assert t.string_keys_stats()[0] < 1500
    # The survivors are exactly the exported rows, each still found.
    page = t.export()
    assert t.find(page["keys"])[1].all()
    t.destroy()


def test_restrict_and_clear_drop_strings():
    t = Table(2, key_dtype="string")
    keys = [f"k{i}" for i in range(10)]
    t.insert_or_assign(keys, np.zeros((10, 2), np.float32))
    removed = t.restrict(3, by="custom", keys=keys + ["unknown"],
                         scores=np.arange(11, dtype=np.float32))
    assert removed == 7 and t.string_keys_stats()[0] == 3
    assert sorted(t.export()["keys"].tolist()) == [b"k7", b"k8", b"k9"]
    with pytest.raises(ValueError, match="NaN"):
        t.restrict(1, by="custom", keys=["k7"], scores=[np.nan])
    assert t.size() == 3
    t.restrict(1, by="recency")
    assert t.size() == 1 and t.string_keys_stats()[0] == 1
    t.clear()
    assert t.size() == 0 and t.string_keys_stats() == (0, 0)
    t.destroy()


def test_export_pages_and_import_round_trip():
    src = Table(3, key_dtype="string", optimizer="adam")
    keys = [b"", b"\x00", "é".encode()] + [("long" * 50 + str(i)).encode() for i in range(200)]
    src.apply_gradients(keys, np.ones((len(keys), 3), np.float32), lr=0.01, step=1)
    pages = list(src.export_pages(page_size=7))
    got = {k: (v, s) for p in pages for k, v, s in zip(p["keys"], p["values"], p["slots"])}
    assert sorted(got) == sorted(keys)
    dst = Table(3, key_dtype="string", optimizer="adam")
    for p in pages:
        dst.import_rows(p["keys"], p["values"], p["slots"], p["last_update"], p["update_count"])
    back = dst.export()
    for k, v, s in zip(back["keys"], back["values"], back["slots"]):
        np.testing.assert_array_equal(v, got[k][0])
        np.testing.assert_array_equal(s, got[k][1])
    src.destroy()
    dst.destroy()


def test_redis_backend_refuses_string_keys():
    with pytest.raises(ValueError, match="does not support key_dtype 'string'"):
        Table(2, key_dtype="string", backend={"redis": {"name": "t"}})


def test_jax_refuses_string_keys_and_names_the_host_helper(tmp_path):
    dej = pytest.importorskip("dualemb.jax", reason="JAX front end not importable")
    from dualemb.core import checkpoint

    t = dej.create(2, initializer={"initializer": "normal", "seed": 7})
    for bad in (["a", "b"], np.array([b"a"]), "a", np.array(["a"], dtype=object)):
        with pytest.raises(TypeError, match="string_ids"):
            dej.lookup(t, bad)
    with pytest.raises(TypeError, match="string_ids"):
        dej.create(2, key_dtype="string")
    core = Table(2, key_dtype="string")
    with pytest.raises(TypeError, match="string keys"):
        dej.attach(core.id)
    core.insert_or_assign(["a"], np.ones((1, 2), np.float32))
    checkpoint.save(tmp_path / "ck", {"emb": core})
    with pytest.raises(TypeError, match="string keys"):
        dej.checkpoint.load(tmp_path / "ck")
    # The documented host-side step: string_ids gives the fingerprints, which JAX takes.
    keys = ["a", "é", b"\x00"]
    got = dej.string_ids(keys)
    assert got.dtype == np.int64
    assert got.tolist() == [fingerprint(as_bytes(k)) for k in keys]
    rows = np.asarray(dej.lookup(t, dej.ids(got)))
    np.testing.assert_array_equal(rows, initial_rows(keys, 2))
    dej.destroy(t)
    core.destroy()


def test_threads_share_a_string_table():
    import threading

    t = Table(4, key_dtype="string", optimizer="sgd", capacity=500)
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(40):
                keys = [f"k{i}" for i in rng.integers(0, 2000, 64)]
                op = rng.integers(0, 5)
                if op == 0:
                    t.find_or_insert(keys)
                elif op == 1:
                    t.apply_gradients(keys, np.ones((64, 4), np.float32), 0.1, 1)
                elif op == 2:
                    t.erase(keys[:8])
                elif op == 3:
                    page = t.export()
                    assert len(set(page["keys"].tolist())) == len(page["keys"])
                else:
                    t.find(keys)
        except Exception as e:  # reported below, with the thread's seed
            errors.append((seed, repr(e)))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    page = t.export()
    assert len(page["keys"]) == t.size() <= 500
    assert t.find(page["keys"])[1].all()
    t.restrict(t.size())  # a restrict drops every string without a row
    assert t.string_keys_stats()[0] == t.size()
    t.destroy()

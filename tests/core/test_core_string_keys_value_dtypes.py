"""String-keyed tables with a value dtype other than float32 (int32, float16): every operation,
export/import and the common checkpoint against a dict reference, exactly (bit for bit).

Rows cross the core as raw bytes of the value dtype; a string table also writes rows itself
(the initializer row of an unknown or probed string), so a row size taken as 4 * dim would put
those rows at the wrong place. Forcing every string onto a colliding id (bits=1) exercises that.
The reference for a new string's row is an int64 table of the same dtype and initializer, read
at the string's fingerprint (dualemb_core.h: a new string starts from that key's row)."""

import json
import os

import numpy as np
import pytest

from dualemb._native import load_extension
from dualemb.core import Table, checkpoint
from dualemb.core._string_keys import fingerprints

_core = load_extension("_core")
KEYS = [b"a", b"", "é".encode(), b"x\x00y", b"x\x00", b"\xff\xfe", b"k" * 300] + \
    [f"user-{i}".encode() for i in range(40)]
DIM = 3
# int tables take constant initializers only (a vector here, so columns differ); float16 a
# random one, converted from the float32 row of (seed, fingerprint).
INITS = {"int32": [5, -6, 7], "float16": {"initializer": "normal", "seed": 11}}


@pytest.fixture
def id_bits():
    """The testing hook that narrows string ids (forcing collisions); restores 63 after."""
    yield _core._testing_string_id_bits
    _core._testing_string_id_bits(63)


def _initial(vd, keys):
    ref = Table(DIM, value_dtype=vd, initializer=INITS[vd])
    try:
        return ref.find(fingerprints(keys))[0]
    finally:
        ref.destroy()


def _rows_for(vd, n, base):
    """n distinct rows of dtype vd that float32 or a 16-bit store would not keep exactly."""
    i = np.arange(n * DIM).reshape(n, DIM)
    if vd == "int32":
        return (2**30 + 7 * i + base).astype(np.int32)  # needs all 4 bytes
    return (0.5 + i / 1024 + base / 8).astype(np.float16)


def _add(vd, a, b):
    # The core's accum: int32 wraps around; float16 adds in float32 and rounds to nearest.
    if vd == "int32":
        return (a.astype(np.int64) + b).astype(np.uint32).astype(np.int32)
    return (a.astype(np.float32) + b.astype(np.float32)).astype(np.float16)


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8).tobytes()


def _check_table(t, vd, ref):
    """t holds exactly the dict ref (key -> row), and reads every other key as its initial row."""
    page = t.export()
    assert page["values"].dtype == np.dtype(vd) and t.size() == len(ref)
    got = dict(zip(page["keys"], page["values"]))
    assert sorted(got) == sorted(ref)
    for k, row in ref.items():
        assert _bits(got[k]) == _bits(row), k
    vals, ex = t.find(KEYS)
    want = np.stack([ref[k] if k in ref else _initial(vd, [k])[0] for k in KEYS])
    assert _bits(vals) == _bits(want)
    np.testing.assert_array_equal(ex, [k in ref for k in KEYS])


@pytest.mark.parametrize("bits", [63, 1])
@pytest.mark.parametrize("vd", ["int32", "float16"])
def test_operations_export_import_and_checkpoint_match_a_dict(vd, bits, id_bits, tmp_path):
    id_bits(bits)  # 1: nearly every string probes past another's id
    t = Table(DIM, key_dtype="string", value_dtype=vd, initializer=INITS[vd])
    assert t.value_dtype == np.dtype(vd)
    ref = {}

    vals, ex = t.find(KEYS)
    assert vals.dtype == np.dtype(vd) and _bits(vals) == _bits(_initial(vd, KEYS))
    assert not ex.any() and t.size() == 0

    rows = _rows_for(vd, 10, 0)
    t.insert_or_assign(KEYS[:10], rows)
    ref.update(zip(KEYS[:10], rows))

    vals, ex = t.find_or_insert(KEYS[8:20])
    want = np.stack([ref[k] if k in ref else _initial(vd, [k])[0] for k in KEYS[8:20]])
    assert _bits(vals) == _bits(want)
    np.testing.assert_array_equal(ex, [k in ref for k in KEYS[8:20]])
    for k, row in zip(KEYS[8:20], want):
        ref.setdefault(k, row)

    # accum: present & exists -> add; absent & not exists -> insert the delta; else ignored.
    keys = KEYS[15:30]
    deltas = _rows_for(vd, len(keys), 3)
    if vd == "int32":
        deltas[0] = 2**31 - 1  # wraps around
    exists = np.array([i % 3 != 0 for i in range(len(keys))])
    t.accum(keys, deltas, exists)
    for k, d, e in zip(keys, deltas, exists):
        if k in ref and e:
            ref[k] = _add(vd, ref[k], d)
        elif k not in ref and not e:
            ref[k] = d
    t.erase([KEYS[0], KEYS[16]])
    ref.pop(KEYS[0]), ref.pop(KEYS[16])
    _check_table(t, vd, ref)

    # export / import_rows into a fresh table of the dtype, in small pages
    dst = Table(DIM, key_dtype="string", value_dtype=vd, initializer=INITS[vd])
    for page in t.export_pages(4):
        dst.import_rows(page["keys"], page["values"], page["slots"], page["last_update"],
                        page["update_count"])
    _check_table(dst, vd, ref)

    # the common checkpoint: values stored in the dtype, restored exactly
    checkpoint.save(tmp_path / "ck", {"emb": t}, page_rows=5)
    with open(os.path.join(tmp_path / "ck", "manifest.json")) as f:
        (entry,) = [e for e in json.load(f)["tables"] if e["name"] == "emb"]
    assert entry["value_dtype"] == vd and entry["key_dtype"] == "string"
    code = {"int32": "I32", "float16": "F16"}[vd]
    assert {s["tensors"]["values"]["dtype"] for s in entry["shards"]} == {code}
    loaded = checkpoint.load(tmp_path / "ck").tables["emb"]
    assert loaded.key_dtype_name == "string"
    _check_table(loaded, vd, ref)
    into = Table(DIM, key_dtype="string", value_dtype=vd, initializer=INITS[vd])
    into.insert_or_assign([b"stale"], _rows_for(vd, 1, 9))  # replaced by the restore
    checkpoint.load(tmp_path / "ck", tables={"emb": into})
    _check_table(into, vd, ref)
    for x in (t, dst, loaded, into):
        x.destroy()


@pytest.mark.parametrize("bits", [63, 1])
def test_float16_training_and_slots_round_trip(bits, id_bits, tmp_path):
    """A float16 string table with Adagrad (slots stored in float16) steps exactly as an int64
    float16 table at the strings' fingerprints, and its checkpoint continues identically."""
    id_bits(bits)
    init = INITS["float16"]
    t = Table(DIM, key_dtype="string", value_dtype="float16", initializer=init,
              optimizer="adagrad")
    ref = Table(DIM, value_dtype="float16", initializer=init, optimizer="adagrad")
    ids = fingerprints(KEYS)
    rng = np.random.default_rng(0)
    for step in (1, 2):
        g = rng.normal(size=(len(KEYS), DIM)).astype(np.float32)
        t.apply_gradients(KEYS, g, 0.1, step)
        ref.apply_gradients(ids, g, 0.1, step)

    def by_key(table, names):
        p = table.export()
        return {k: (_bits(v), _bits(s)) for k, v, s in zip(names(p["keys"]), p["values"],
                                                          p["slots"])}

    fp = dict(zip(ids.tolist(), KEYS))
    want = by_key(ref, lambda keys: [fp[int(k)] for k in keys])
    assert t.export()["slots"].dtype == np.float16
    assert by_key(t, list) == want

    checkpoint.save(tmp_path / "ck", {"emb": t})
    loaded = checkpoint.load(tmp_path / "ck").tables["emb"]
    assert by_key(loaded, list) == want
    g = rng.normal(size=(len(KEYS), DIM)).astype(np.float32)
    loaded.apply_gradients(KEYS, g, 0.1, 3)
    ref.apply_gradients(ids, g, 0.1, 3)
    assert by_key(loaded, list) == by_key(ref, lambda keys: [fp[int(k)] for k in keys])
    for x in (t, ref, loaded):
        x.destroy()

"""TFRA importers (dualemb.tf.migrate) for the value dtypes besides float32 that TFRA 0.8.1's CPU
tables hold: string values (int64 keys -> `value_dtype=tf.string`) and every numeric pair
(int64 keys with float16, bfloat16, float64, int8, int32, int64 values; int32 keys with float32,
int32, float64, bfloat16 values).

The fixtures were written by the real TFRA (tools/tfra/make_fixtures.py, parts `string_values`
and `dtypes`); each expected.json holds TFRA's own per-shard export, every value exact (ints as
JSON ints, floats as JSON floats, which hold float16/bfloat16/float32/float64 exactly, strings
as hex), so the tests compare the migrated rows with it bit for bit.
"""

import json
import os

import ml_dtypes
import numpy as np
import pytest

from dualemb.core import Table
from dualemb.core import checkpoint as core_ckpt
from dualemb.tf import migrate
import _paths

FIX = str(_paths.FIXTURES / "tfra")
STRVAL = "tf2_checkpoint_string_values"
STRVAL_FS = "file_system_string_values"
DTYPES = "tf2_checkpoint_dtypes"
DTYPES_FS = "file_system_dtypes"
NUMPY = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32,
         "float64": np.float64, "int8": np.int8, "int32": np.int32, "int64": np.int64}


def expected(fixture):
    with open(os.path.join(FIX, fixture, "expected.json")) as f:
        return json.load(f)["variables"]


def string_rows(exp):
    """(keys int64 [n], values object [n, dim] of bytes) in TFRA's export order."""
    keys = np.array([k for s in exp["shards"] for k in s["keys"]], np.int64)
    rows = [[bytes.fromhex(x) for x in row] for s in exp["shards"] for row in s["values_hex"]]
    values = np.empty((len(rows), exp["dim"]), object)
    for i, row in enumerate(rows):
        values[i, :] = row
    return keys, values


def numeric_rows(exp):
    """(keys, values) in the variable's own dtypes: the JSON numbers are exact in int64 / float64,
    and every value is representable in its dtype, so the cast is exact."""
    kd, vd = NUMPY[exp["key_dtype"]], NUMPY[exp["value_dtype"]]
    keys = np.array([k for s in exp["shards"] for k in s["keys"]], kd)
    flat = [row for s in exp["shards"] for row in s["values"]]
    wide = np.int64 if np.dtype(vd).kind == "i" else np.float64
    values = np.array(flat, wide).reshape(-1, exp["dim"])
    cast = values.astype(vd)
    np.testing.assert_array_equal(cast.astype(wide), values)  # the fixture values are exact
    return keys, cast


def bits(a):
    """A view that compares floats bit for bit (-0.0 != 0.0; inf, subnormals exact)."""
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.kind != "i" else a


def numeric_names():
    return sorted(expected(DTYPES))


# ---- string values -----------------------------------------------------------------------------

def test_read_string_values_checkpoint_matches_tfra_export():
    pytest.importorskip("tensorflow")
    (name, exp), = expected(STRVAL).items()
    data = migrate.read_tfra_checkpoint(os.path.join(FIX, STRVAL))
    assert sorted(data) == [name]
    entry = data[name]
    keys, values = string_rows(exp)
    assert entry["dim"] == exp["dim"] == 3 and entry["num_shards"] == 2
    np.testing.assert_array_equal(entry["keys"], keys)
    assert entry["values"].dtype == object and entry["values"].shape == values.shape
    assert entry["values"].tolist() == values.tolist()
    # The fixture covers what could be mangled: NULs, non-UTF-8, empty, over 22 bytes.
    flat = set(values.reshape(-1).tolist())
    assert b"" in flat and b"\x00" in flat and b"\xff\xfe\x80" in flat
    assert any(len(v) > 22 and b"\x00" in v for v in flat)
    assert entry["slots"] == {}


def _load_string_entry():
    pytest.importorskip("tensorflow")
    (name, exp), = expected(STRVAL).items()
    return migrate.read_tfra_checkpoint(os.path.join(FIX, STRVAL))[name], exp


def test_load_string_values_into_core_tables_and_common_format(tmp_path):
    entry, exp = _load_string_entry()
    keys, values = string_rows(exp)
    tables = [Table(3, value_dtype="string") for _ in range(3)]
    try:
        report = migrate.load_tfra_into(tables, entry)
        owner = np.mod(keys, 3)
        assert report["rows"] == [int((owner == s).sum()) for s in range(3)]
        for s, t in enumerate(tables):
            got, exists = t.find(keys[owner == s])
            assert exists.all()
            assert got.tolist() == values[owner == s].tolist()
            assert t.size() == int((owner == s).sum())
        # On into the common format with its own writer, and back.
        core_ckpt.save(tmp_path / "common", {"item/tags": tables})
        back = core_ckpt.load(tmp_path / "common").tables["item/tags"]
        back = back if isinstance(back, list) else [back]
    finally:
        for t in tables:
            t.destroy()
    try:
        got = {}
        for t in back:
            page = t.export()
            got.update(zip(page["keys"].tolist(), page["values"].tolist()))
        assert got == dict(zip(keys.tolist(), values.tolist()))
    finally:
        for t in back:
            t.destroy()


def test_load_string_values_into_dualemb_tf_variable():
    tf = pytest.importorskip("tensorflow")
    import dualemb.tf as de
    entry, exp = _load_string_entry()
    keys, values = string_rows(exp)
    var = de.Variable(key_dtype=tf.int64, value_dtype=tf.string, dim=3, devices=["/CPU:0"] * 2,
                      name="migrated_item_tags")
    report = migrate.load_tfra_into(var, {"item/tags": entry})
    assert sum(report["rows"]) == len(keys) == int(var.size())
    got = var.lookup(tf.constant(keys)).numpy()
    assert got.tolist() == values.tolist()


def test_string_numeric_value_mismatch_is_refused_before_writing():
    entry, _ = _load_string_entry()
    numeric = migrate.read_tfra_checkpoint(os.path.join(FIX, DTYPES))["dtypes/int64_float64"]
    # Live tables that already hold a row: a refused load must leave them exactly as they were.
    floats = [Table(3) for _ in range(2)]
    strings = [Table(2, value_dtype="string") for _ in range(2)]
    try:
        for t in floats:
            t.insert_or_assign([7], [[1.0, 2.0, 3.0]])
        for t in strings:
            t.insert_or_assign([7], [[b"a", b"\x00"]])
        with pytest.raises(TypeError, match="string values but live table .* float32 values"):
            migrate.load_tfra_into(floats, entry)
        with pytest.raises(TypeError, match="float64 values but live table .* string values"):
            migrate.load_tfra_into(strings, numeric)
        for t in floats:
            assert t.size() == 1 and t.find([7])[0].tolist() == [[1.0, 2.0, 3.0]]
        for t in strings:
            assert t.size() == 1 and t.find([7])[0].tolist() == [[b"a", b"\x00"]]
    finally:
        for t in floats + strings:
            t.destroy()


@pytest.mark.parametrize("value_dtype", ["string", "tf.string", bytes])
def test_file_system_string_values_are_refused(value_dtype):
    if value_dtype == "tf.string":
        tf = pytest.importorskip("tensorflow")
        value_dtype = tf.string
    with pytest.raises(TypeError, match="string values cannot be read.*tf.train.Checkpoint"):
        migrate.read_tfra_file_system(os.path.join(FIX, STRVAL_FS), value_dtype=value_dtype)


def test_tfra_file_system_string_values_hold_no_long_strings():
    """Why they are refused: TFRA 0.8.1 dumps each value as a raw 24-byte tstring struct, the
    bytes of short strings inline but only a pointer for long ones (checked on the fixture)."""
    (name, exp), = expected(STRVAL_FS).items()
    keys, values = string_rows(exp)
    files = sorted(os.listdir(os.path.join(FIX, STRVAL_FS)))
    blob = b""
    for f in files:
        if f.endswith("-values"):
            blob += open(os.path.join(FIX, STRVAL_FS, f), "rb").read()
    assert len(blob) == values.size * 24
    flat = values.reshape(-1).tolist()
    short = [v for v in flat if 4 < len(v) <= 22]
    long_ = [v for v in flat if len(v) > 22 and b"\x00" not in v]
    assert short and long_
    assert all(v in blob for v in short)
    assert not any(v in blob for v in long_)


# ---- numeric dtypes ----------------------------------------------------------------------------

def test_numeric_fixture_covers_every_tfra_pair():
    pairs = {(e["key_dtype"], e["value_dtype"]) for e in expected(DTYPES).values()}
    assert pairs == {("int64", v) for v in ("float16", "bfloat16", "float64", "int8", "int32",
                                            "int64")} | \
        {("int32", v) for v in ("float32", "int32", "float64", "bfloat16")}


@pytest.mark.parametrize("name", numeric_names())
def test_read_numeric_checkpoint_matches_tfra_export(name):
    pytest.importorskip("tensorflow")
    exp = expected(DTYPES)[name]
    entry = migrate.read_tfra_checkpoint(os.path.join(FIX, DTYPES))[name]
    keys, values = numeric_rows(exp)
    assert entry["dim"] == exp["dim"] and entry["num_shards"] == exp["num_shards"]
    assert entry["keys"].dtype == keys.dtype and entry["values"].dtype == values.dtype
    np.testing.assert_array_equal(entry["keys"], keys)
    np.testing.assert_array_equal(bits(entry["values"]), bits(values))


@pytest.mark.parametrize("name", numeric_names())
def test_read_numeric_file_system_matches_tfra_export(name):
    exp = expected(DTYPES_FS)[name]
    flat = name.replace("/", "_")
    data = migrate.read_tfra_file_system(os.path.join(FIX, DTYPES_FS, flat),
                                         key_dtype=exp["key_dtype"],
                                         value_dtype=exp["value_dtype"])
    entry = data[flat]
    keys, values = numeric_rows(exp)
    assert entry["values"].dtype == values.dtype
    np.testing.assert_array_equal(entry["keys"], keys)
    np.testing.assert_array_equal(bits(entry["values"]), bits(values))


@pytest.mark.parametrize("name", numeric_names())
def test_load_numeric_into_core_tables_of_the_same_dtype(name):
    pytest.importorskip("tensorflow")
    exp = expected(DTYPES)[name]
    entry = migrate.read_tfra_checkpoint(os.path.join(FIX, DTYPES))[name]
    keys, values = numeric_rows(exp)
    tables = [Table(2, key_dtype=exp["key_dtype"], value_dtype=exp["value_dtype"])
              for _ in range(3)]
    try:
        report = migrate.load_tfra_into(tables, entry)
        owner = np.mod(keys.astype(np.int64), 3)
        assert report["rows"] == [int((owner == s).sum()) for s in range(3)]
        for s, t in enumerate(tables):
            got, exists = t.find(keys[owner == s])
            assert exists.all() and t.size() == int((owner == s).sum())
            assert got.dtype == values.dtype
            np.testing.assert_array_equal(bits(got), bits(values[owner == s]))
    finally:
        for t in tables:
            t.destroy()


@pytest.mark.parametrize("name", numeric_names())
def test_load_numeric_into_dualemb_tf_variable(name):
    tf = pytest.importorskip("tensorflow")
    import dualemb.tf as de
    exp = expected(DTYPES)[name]
    entry = migrate.read_tfra_checkpoint(os.path.join(FIX, DTYPES))[name]
    keys, values = numeric_rows(exp)
    var = de.Variable(key_dtype=tf.as_dtype(exp["key_dtype"]),
                      value_dtype=tf.as_dtype(exp["value_dtype"]), dim=2,
                      devices=["/CPU:0"] * 2, name="migrated_" + name.replace("/", "_"))
    migrate.load_tfra_into(var, entry)
    assert int(var.size()) == len(keys)
    got = var.lookup(tf.constant(keys)).numpy()
    np.testing.assert_array_equal(bits(got), bits(values))


def test_float16_rows_widen_exactly_into_float32_tables():
    pytest.importorskip("tensorflow")
    entry = migrate.read_tfra_checkpoint(os.path.join(FIX, DTYPES))["dtypes/int64_float16"]
    t = Table(2)
    try:
        migrate.load_tfra_into(t, entry)
        got, _ = t.find(entry["keys"])
        np.testing.assert_array_equal(bits(got), bits(entry["values"].astype(np.float32)))
    finally:
        t.destroy()


def _route_bad_last(bad_keys):
    """A partitioner that sends `bad_keys` to the last live shard, every other key to shard 0,
    so a loader that writes shard after shard would write shard 0 before meeting them."""
    bad = set(np.asarray(bad_keys).tolist())
    return lambda k, n: np.array([n - 1 if x in bad else 0 for x in np.asarray(k).tolist()])


def test_values_beyond_the_live_dtype_are_refused_before_writing():
    pytest.importorskip("tensorflow")
    entry = migrate.read_tfra_checkpoint(os.path.join(FIX, DTYPES))["dtypes/int64_int64"]
    wide = (np.abs(entry["values"].astype(object)) > 127).any(axis=1)
    assert wide.any() and (~wide).any()
    tables = [Table(2, value_dtype="int8") for _ in range(2)]
    try:
        with pytest.raises(TypeError, match="outside the table's value dtype int8"):
            migrate.load_tfra_into(tables, entry, partitioner=_route_bad_last(entry["keys"][wide]))
        assert [t.size() for t in tables] == [0, 0]
    finally:
        for t in tables:
            t.destroy()


def test_integer_values_into_float_table_and_keys_beyond_int32_are_refused():
    pytest.importorskip("tensorflow")
    data = migrate.read_tfra_checkpoint(os.path.join(FIX, DTYPES))
    ints, floats = data["dtypes/int64_int32"], data["dtypes/int64_float64"]
    t = Table(2)
    try:
        with pytest.raises(TypeError, match="floating point"):
            migrate.load_tfra_into(t, ints)
        assert t.size() == 0
    finally:
        t.destroy()
    big = np.abs(floats["keys"]) > 2 ** 31 - 1
    assert big.any() and (~big).any()
    tables = [Table(2, key_dtype="int32", value_dtype="float64") for _ in range(2)]
    try:
        with pytest.raises(ValueError, match="int32"):
            migrate.load_tfra_into(tables, floats, partitioner=_route_bad_last(floats["keys"][big]))
        assert [t.size() for t in tables] == [0, 0]
    finally:
        for t in tables:
            t.destroy()


def test_checkpoint_with_file_system_saver_reads_the_given_value_dtype():
    """A TF checkpoint written with TFRA's FileSystemSaver keeps only flags; its rows are raw
    files with no dtype, so read_tfra_checkpoint takes the dtype as fs_value_dtype."""
    pytest.importorskip("tensorflow")
    fixture = "fs_saver_checkpoint_float64"
    (name, exp), = expected(fixture).items()
    keys, values = numeric_rows(exp)
    entry = migrate.read_tfra_checkpoint(os.path.join(FIX, fixture),
                                         fs_value_dtype="float64")[name]
    assert entry["format"] == "file_system" and entry["values"].dtype == np.float64
    np.testing.assert_array_equal(entry["keys"], keys)
    np.testing.assert_array_equal(bits(entry["values"]), bits(values))
    # Read with the default float32 the bytes make rows of twice the dim, which a live table
    # of the real dim refuses (nothing written).
    wrong = migrate.read_tfra_checkpoint(os.path.join(FIX, fixture))[name]
    assert wrong["dim"] == 2 * exp["dim"]
    t = Table(exp["dim"], value_dtype="float64")
    try:
        with pytest.raises(ValueError, match="dim"):
            migrate.load_tfra_into(t, wrong)
        assert t.size() == 0
        migrate.load_tfra_into(t, entry)
        np.testing.assert_array_equal(bits(t.find(keys)[0]), bits(values))
    finally:
        t.destroy()

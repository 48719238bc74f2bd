"""TFRA importers (dualemb.tf.migrate) against checkpoints written by the real TFRA 0.8.1.

The fixtures in tests/fixtures/tfra were made by tools/tfra/make_fixtures.py in a TFRA
virtualenv; each has an expected.json with TFRA's own per-shard export of every table. These tests
need only numpy, dualemb's core and (for TF checkpoints) the TensorFlow of the test environment.
"""

import json
import os
import shutil

import numpy as np
import pytest

from dualemb.core import Table
from dualemb.tf import migrate
import _paths

FIX = str(_paths.FIXTURES / "tfra")


def expected(fixture):
    with open(os.path.join(FIX, fixture, "expected.json")) as f:
        return json.load(f)["variables"]


def _cat(shards, dim):
    keys = np.array([k for s in shards for k in s["keys"]], np.int64)
    values = np.array([r for s in shards for r in s["values"]], np.float32).reshape(-1, dim)
    return keys, values


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def _assert_rows_and_adam_slots(page, entry, indices):
    """A live shard's exported `page` holds, bit for bit, the migrated `entry`'s rows at
    `indices`, with TFRA's Adam slots where TFRA had them and zero slots elsewhere."""
    pos = {k: i for i, k in enumerate(page["keys"].tolist())}
    keys = entry["keys"].tolist()
    trained = entry["slot_exists"]["m"]
    for i in indices:
        row = pos[keys[i]]
        np.testing.assert_array_equal(bits(page["values"][row]), bits(entry["values"][i]))
        m, v = page["slots"][row]
        if trained[i]:
            np.testing.assert_array_equal(bits(m), bits(entry["slots"]["m"][i]))
            np.testing.assert_array_equal(bits(v), bits(entry["slots"]["v"][i]))
        else:
            assert not m.any() and not v.any()


def check_entry(entry, exp, has_step=True):
    """The reader's entry equals TFRA's own export, bit for bit, slots included."""
    dim = exp["dim"]
    keys, values = _cat(exp["shards"], dim)
    assert entry["dim"] == dim
    assert entry["num_shards"] == exp["num_shards"]
    assert entry["keys"].dtype == np.int64
    # Same order as TFRA's export (shard after shard), same bits.
    np.testing.assert_array_equal(entry["keys"], keys)
    np.testing.assert_array_equal(bits(entry["values"]), bits(values))
    assert sorted(entry["slots"]) == sorted(exp["slots"])
    pos = {int(k): i for i, k in enumerate(entry["keys"])}
    for slot, sexp in exp["slots"].items():
        skeys, svalues = _cat(sexp["shards"], dim)
        assert len(skeys) > 0
        rows = np.array([pos[int(k)] for k in skeys])
        np.testing.assert_array_equal(bits(entry["slots"][slot][rows]), bits(svalues))
        assert entry["slot_exists"][slot].sum() == len(skeys)
        assert entry["slot_exists"][slot][rows].all()
        others = ~entry["slot_exists"][slot]
        assert not entry["slots"][slot][others].any()
    if has_step:
        assert entry["step"] == exp["step"]
    else:  # raw FileSystemSaver files carry no optimizer state
        assert entry["step"] is None


# ---- readers ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fixture,prefix", [
    ("tf2_checkpoint", "ckpt-1"),
    ("v1_saver", "model-2"),
    ("keras_save_weights", "weights"),
    ("keras_fs_saver", "ckpt-1"),
])
def test_read_checkpoint_matches_tfra_export(fixture, prefix):
    pytest.importorskip("tensorflow")
    exp = expected(fixture)
    data = migrate.read_tfra_checkpoint(os.path.join(FIX, fixture, prefix))
    assert sorted(data) == sorted(exp)
    for name, e in exp.items():
        check_entry(data[name], e)


def test_read_checkpoint_directory_uses_latest():
    pytest.importorskip("tensorflow")
    data = migrate.read_tfra_checkpoint(os.path.join(FIX, "tf2_checkpoint"))
    check_entry(data["user/emb"], expected("tf2_checkpoint")["user/emb"])


def test_checkpoint_formats_and_names():
    pytest.importorskip("tensorflow")
    tf2 = migrate.read_tfra_checkpoint(os.path.join(FIX, "tf2_checkpoint", "ckpt-1"))
    v1 = migrate.read_tfra_checkpoint(os.path.join(FIX, "v1_saver", "model-2"))
    fs = migrate.read_tfra_checkpoint(os.path.join(FIX, "keras_fs_saver", "ckpt-1"))
    assert tf2["user/emb"]["format"] == "tf2_checkpoint"
    assert v1["model/emb"]["format"] == "tf1_saver"  # real name recovered from the name scope
    assert next(iter(fs.values()))["format"] == "file_system"
    assert set(tf2["user/emb"]["slots"]) == {"m", "v"}
    assert tf2["user/emb"]["step"] == 2 and v1["model/emb"]["step"] == 2


def test_read_file_system_matches_tfra_export():
    exp = expected("file_system")["user/emb"]
    data = migrate.read_tfra_file_system(os.path.join(FIX, "file_system"))
    # The files hold only the flat name ("/" -> "_").
    assert list(data) == ["user_emb"]
    check_entry(data["user_emb"], exp, has_step=False)
    named = migrate.read_tfra_file_system(os.path.join(FIX, "file_system"), names=["user/emb"])
    check_entry(named["user/emb"], exp, has_step=False)


def test_read_file_system_finds_step_directory():
    exp = expected("keras_fs_saver")
    data = migrate.read_tfra_file_system(os.path.join(FIX, "keras_fs_saver"))
    assert len(data) == 1
    name, e = next(iter(exp.items()))
    check_entry(data[name.replace("/", "_")], e, has_step=False)


def test_file_system_checkpoint_agrees_with_tf2_checkpoint():
    pytest.importorskip("tensorflow")
    a = migrate.read_tfra_checkpoint(os.path.join(FIX, "tf2_checkpoint"))["user/emb"]
    b = migrate.read_tfra_file_system(os.path.join(FIX, "file_system"))["user_emb"]
    np.testing.assert_array_equal(a["keys"], b["keys"])
    np.testing.assert_array_equal(bits(a["values"]), bits(b["values"]))
    for s in ("m", "v"):
        np.testing.assert_array_equal(bits(a["slots"][s]), bits(b["slots"][s]))


def test_file_system_bad_files(tmp_path):
    d = tmp_path / "fs"
    shutil.copytree(os.path.join(FIX, "file_system"), d)
    with pytest.raises(ValueError, match="expected dim=8"):
        migrate.read_tfra_file_system(d, dim=8)
    # The files have no header: wrong dtypes are caught only through the row length.
    with pytest.raises(ValueError, match="expected dim=4"):
        migrate.read_tfra_file_system(d, dim=4, key_dtype="int32")
    vals = d / "user_emb_mht_1of2_rank0_size1-values"
    vals.write_bytes(vals.read_bytes()[:-4])
    with pytest.raises(ValueError, match="corrupt"):
        migrate.read_tfra_file_system(d)
    (d / "user_emb_mht_1of2_rank0_size1-values").unlink()
    with pytest.raises(ValueError, match="no -values file"):
        migrate.read_tfra_file_system(d)
    with pytest.raises(FileNotFoundError):
        migrate.read_tfra_file_system(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no TFRA FileSystemSaver files"):
        migrate.read_tfra_file_system(tmp_path / "empty")


def test_missing_checkpoint():
    pytest.importorskip("tensorflow")
    with pytest.raises(FileNotFoundError):
        migrate.read_tfra_checkpoint(os.path.join(FIX, "tf2_checkpoint", "ckpt-9"))


# ---- loading into core tables ----------------------------------------------------------------

def _fs_entry():
    return migrate.read_tfra_file_system(os.path.join(FIX, "file_system"))["user_emb"]


def test_load_into_three_shards_routes_by_floor_mod():
    entry = _fs_entry()
    tables = [Table(4) for _ in range(3)]
    try:
        report = migrate.load_tfra_into(tables, entry, slots=False)
        keys, values = entry["keys"], entry["values"]
        assert (keys < 0).any() and (keys > 2 ** 31).any()  # the fixture covers both
        owner = np.mod(keys, 3)
        assert report["rows"] == [int((owner == s).sum()) for s in range(3)]
        for s, t in enumerate(tables):
            mine = keys[owner == s]
            assert t.size() == len(mine)
            got, exists = t.find(mine)
            assert exists.all()
            np.testing.assert_array_equal(bits(got), bits(values[owner == s]))
            _, exists = t.find(keys[owner != s])
            assert not exists.any()
    finally:
        for t in tables:
            t.destroy()


def test_load_with_adam_slots():
    entry = _fs_entry()
    tables = [Table(4, optimizer="adam") for _ in range(3)]
    try:
        report = migrate.load_tfra_into(tables, entry)
        assert "momentum" in report["slots"] and report["step"] is None
        keys = entry["keys"]
        trained = entry["slot_exists"]["m"]
        assert 0 < trained.sum() < len(keys)
        for s, t in enumerate(tables):
            _assert_rows_and_adam_slots(t.export(), entry, np.nonzero(np.mod(keys, 3) == s)[0])
    finally:
        for t in tables:
            t.destroy()


def test_slots_skipped_without_matching_optimizer():
    entry = _fs_entry()
    plain = Table(4)
    try:
        with pytest.warns(UserWarning, match="no optimizer"):
            report = migrate.load_tfra_into(plain, entry)
        assert report["rows"] == [len(entry["keys"])]
    finally:
        plain.destroy()
    ftrl = Table(4, optimizer="ftrl")
    try:
        with pytest.warns(UserWarning, match="no counterpart"):
            migrate.load_tfra_into(ftrl, entry)
        assert ftrl.size() == len(entry["keys"])
    finally:
        ftrl.destroy()


def test_load_through_tables_attribute_and_custom_partitioner():
    class Shard:
        def __init__(self, table):
            self.table_id = table.id

    class Var:
        def __init__(self, tables):
            self.tables = [Shard(t) for t in tables]

    entry = _fs_entry()
    tables = [Table(4) for _ in range(2)]
    try:
        part = lambda k, n: (np.abs(k) // 7) % n  # noqa: E731
        migrate.load_tfra_into(Var(tables), {"user_emb": entry}, partitioner=part, slots=False)
        owner = (np.abs(entry["keys"]) // 7) % 2
        for s, t in enumerate(tables):
            assert t.size() == int((owner == s).sum())
            _, exists = t.find(entry["keys"][owner == s])
            assert exists.all()
    finally:
        for t in tables:
            t.destroy()


def test_load_from_checkpoint_into_core():
    pytest.importorskip("tensorflow")
    data = migrate.read_tfra_checkpoint(os.path.join(FIX, "v1_saver"))
    exp = expected("v1_saver")["model/emb"]
    t = Table(4, optimizer="adam")
    try:
        report = migrate.load_tfra_into(t, data, name="model/emb")
        assert report["step"] == 2
        keys, values = _cat(exp["shards"], 4)
        got, exists = t.find(keys)
        assert exists.all()
        np.testing.assert_array_equal(bits(got), bits(values))
    finally:
        t.destroy()


def test_load_errors():
    entry = _fs_entry()
    t = Table(8)
    try:
        with pytest.raises(ValueError, match="dim 4"):
            migrate.load_tfra_into(t, entry)
        assert t.size() == 0
    finally:
        t.destroy()
    t = Table(4)
    try:
        with pytest.raises(ValueError, match="partitioner"):
            migrate.load_tfra_into([t], entry, partitioner=lambda k, n: k * 0 + 5)
        with pytest.raises(ValueError, match="several"):
            migrate.load_tfra_into(t, {"a": entry, "b": entry})
        with pytest.raises(KeyError):
            migrate.load_tfra_into(t, {"a": entry}, name="zzz")
        with pytest.raises(TypeError):
            migrate.load_tfra_into("nope", entry)
        assert t.size() == 0
    finally:
        t.destroy()


def test_load_into_dualemb_tf_variable():
    tf = pytest.importorskip("tensorflow")
    try:
        import dualemb.tf as de
    except ImportError as e:  # the TF op library is not built in this environment
        pytest.skip(f"dualemb.tf unavailable: {e}")
    data = migrate.read_tfra_checkpoint(os.path.join(FIX, "tf2_checkpoint"))
    entry = data["user/emb"]
    var = de.Variable(key_dtype=tf.int64, value_dtype=tf.float32, dim=4,
                      devices=["/CPU:0"] * 3, name="migrated_user_emb")
    report = migrate.load_tfra_into(var, data, slots=False)
    keys = entry["keys"]
    assert report["rows"] == [int((np.mod(keys, 3) == s).sum()) for s in range(3)]
    assert int(var.size()) == len(keys)
    got = var.lookup(tf.constant(keys)).numpy()
    np.testing.assert_array_equal(bits(got), bits(entry["values"]))


# ---- string keys ---------------------------------------------------------------------------------

STRING_FIX = "tf2_checkpoint_string"


def _cat_hex(shards, dim):
    keys = np.empty(sum(len(s["keys_hex"]) for s in shards), object)
    keys[:] = [bytes.fromhex(k) for s in shards for k in s["keys_hex"]]
    values = np.array([r for s in shards for r in s["values"]], np.float32).reshape(-1, dim)
    return keys, values


def test_read_string_key_checkpoint_matches_tfra_export():
    """A TFRA de.Variable(key_dtype=tf.string) checkpoint: keys are the exact bytes (NULs,
    non-UTF-8, empty), in TFRA's export order, rows and Adam slots bit for bit."""
    pytest.importorskip("tensorflow")
    (name, exp), = expected(STRING_FIX).items()
    data = migrate.read_tfra_checkpoint(os.path.join(FIX, STRING_FIX, "ckpt-1"))
    assert sorted(data) == [name]
    entry = data[name]
    keys, values = _cat_hex(exp["shards"], exp["dim"])
    assert entry["keys"].dtype == object and entry["num_shards"] == exp["num_shards"]
    assert entry["keys"].tolist() == keys.tolist()
    assert {b"", b"\x00", b"a\x00", b"\xff\xfe"} <= set(keys.tolist())
    np.testing.assert_array_equal(bits(entry["values"]), bits(values))
    assert sorted(entry["slots"]) == sorted(exp["slots"]) == ["m", "v"]
    pos = {k: i for i, k in enumerate(entry["keys"].tolist())}
    for slot, sexp in exp["slots"].items():
        skeys, svalues = _cat_hex(sexp["shards"], exp["dim"])
        rows = np.array([pos[k] for k in skeys.tolist()])
        np.testing.assert_array_equal(bits(entry["slots"][slot][rows]), bits(svalues))
        assert entry["slot_exists"][slot].sum() == len(skeys) > 0
    assert entry["step"] == exp["step"]


def test_load_string_keys_with_adam_slots_routes_like_tfra():
    tf = pytest.importorskip("tensorflow")
    (name, _), = expected(STRING_FIX).items()
    entry = migrate.read_tfra_checkpoint(os.path.join(FIX, STRING_FIX))[name]
    tables = [Table(4, key_dtype="string", optimizer="adam") for _ in range(3)]
    try:
        report = migrate.load_tfra_into(tables, entry)
        assert "momentum" in report["slots"] and report["step"] == entry["step"]
        keys = entry["keys"]
        # The default partitioner for strings is TFRA's: to_hash_bucket_fast.
        owner = tf.strings.to_hash_bucket_fast(tf.constant(keys, tf.string), 3).numpy()
        assert report["rows"] == [int((owner == s).sum()) for s in range(3)]
        trained = entry["slot_exists"]["m"]
        assert 0 < trained.sum() < len(keys)
        for s, t in enumerate(tables):
            page = t.export()
            assert len(page["keys"]) == report["rows"][s]
            _assert_rows_and_adam_slots(page, entry, np.nonzero(owner == s)[0])
    finally:
        for t in tables:
            t.destroy()


def test_load_string_keys_into_dualemb_tf_variable_and_common_format(tmp_path):
    tf = pytest.importorskip("tensorflow")
    import dualemb.tf as de
    from dualemb.core import checkpoint as core_ckpt
    (name, _), = expected(STRING_FIX).items()
    data = migrate.read_tfra_checkpoint(os.path.join(FIX, STRING_FIX))
    entry = data[name]
    var = de.Variable(key_dtype=tf.string, dim=4, devices=["/CPU:0"] * 2, name="migrated_names")
    migrate.load_tfra_into(var, data, slots=False)
    keys = tf.constant(entry["keys"], tf.string)
    assert int(var.size()) == len(entry["keys"])
    np.testing.assert_array_equal(bits(var.lookup(keys).numpy()), bits(entry["values"]))
    # ... and on into the common format, which reads back the same strings and rows.
    de.save(var, tmp_path / "common")
    t = core_ckpt.load(tmp_path / "common").tables["migrated_names"]
    try:
        page = t.export()
        got = dict(zip(page["keys"].tolist(), page["values"]))
        assert sorted(got) == sorted(entry["keys"].tolist())
        for k, row in zip(entry["keys"].tolist(), entry["values"]):
            np.testing.assert_array_equal(bits(got[k]), bits(row))
    finally:
        t.destroy()


def test_string_keys_into_integer_table_are_refused():
    (name, _), = expected(STRING_FIX).items()
    pytest.importorskip("tensorflow")
    entry = migrate.read_tfra_checkpoint(os.path.join(FIX, STRING_FIX))[name]
    t = Table(4)
    try:
        with pytest.raises(TypeError, match="string keys but live table .* int64 keys"):
            migrate.load_tfra_into(t, entry, slots=False)
        assert t.size() == 0
    finally:
        t.destroy()


@pytest.mark.parametrize("key_dtype", ["string", object, bytes])
def test_file_system_of_string_keys_is_refused(key_dtype):
    # TFRA dumps string keys as raw tstring structs (pointers for long keys): unreadable.
    with pytest.raises(TypeError, match="tf.train.Checkpoint"):
        migrate.read_tfra_file_system(os.path.join(FIX, "file_system"), key_dtype=key_dtype)

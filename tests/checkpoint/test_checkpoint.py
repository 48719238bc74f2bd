"""The common checkpoint format: round trips, resharding, the spec's plain-safetensors reading,
and every kind of bad checkpoint (clear error, live tables unchanged)."""

import json
import os
import shutil
import warnings
import zlib

import numpy as np
import pytest

from dualemb.core import Table, checkpoint
from dualemb.core.checkpoint import CheckpointError
from dualemb.core.checkpoint import _fs, _write
from table_rows import assert_same, snapshot  # tests/ helper
from _paths import ROOT

safetensors_numpy = pytest.importorskip("safetensors.numpy")


# ---- helpers -------------------------------------------------------------------------------------
def optimizers_available():
    try:
        Table(dim=4, optimizer={"name": "adam", "flavor": "keras"}).destroy()
        return True
    except Exception:
        return False


needs_optimizers = pytest.mark.skipif(not optimizers_available(),
                                      reason="the core's fused optimizers are not built")


def filled(n, dim=4, key_dtype="int64", seed=0, optimizer=None, keys=None, **kw):
    rng = np.random.default_rng(seed)
    t = Table(dim=dim, key_dtype=key_dtype, optimizer=optimizer, **kw)
    if keys is None:
        hi = np.iinfo(key_dtype).max
        keys = rng.choice(np.arange(-n * 5, n * 5), n, replace=False) if n else np.zeros(0)
        keys = np.clip(keys, -hi, hi)
    keys = np.asarray(keys).astype(key_dtype)
    if len(keys):
        t.insert_or_assign(keys, rng.standard_normal((len(keys), dim)).astype(np.float32))
    return t


@pytest.fixture
def ckdir(tmp_path):
    return str(tmp_path / "ckpt")


# ---- round trips ---------------------------------------------------------------------------------
def test_round_trip_values_metadata_steps(ckdir):
    init = {"initializer": "normal", "mean": 0.5, "stddev": 0.25, "seed": 42}
    a = filled(5000, dim=8, initializer=init)
    a.clock = 12345
    b = filled(300, dim=3, seed=1)
    before_a, before_b = snapshot(a), snapshot(b)
    meta = {"framework": "jax", "model": {"layers": [1, 2, 3]}, "note": "ünïcode"}
    checkpoint.save(ckdir, {"user": a, "item": b}, steps={"user": 77}, metadata=meta)

    m = checkpoint.read_manifest(ckdir)
    assert m["format"] == "dualemb-checkpoint" and m["version"] == 2
    assert [t["name"] for t in m["tables"]] == ["user", "item"]
    ua = m["tables"][0]
    assert ua["dim"] == 8 and ua["key_dtype"] == "int64" and ua["value_dtype"] == "float32"
    assert ua["rows"] == 5000 and ua["step"] == 77 and m["tables"][1]["step"] is None
    assert ua["initializer"]["initializer"] == "normal" and ua["initializer"]["seed"] == 42
    assert ua["optimizer"] is None and ua["slot_names"] == []

    a2, b2 = Table(dim=8), Table(dim=3)
    a2.insert_or_assign([999_999], [[1.0] * 8])  # replaced, not merged
    ck = checkpoint.load(ckdir, {"user": a2, "item": b2})
    assert ck.tables["user"] is a2 and ck.tables["item"] is b2
    assert ck.steps == {"user": 77, "item": None}
    assert ck.metadata == meta and ck.manifest["metadata"] == meta and ck.dense == {}
    assert_same(snapshot(a2), before_a)
    assert_same(snapshot(b2), before_b)
    assert a2.clock >= 12345
    # the live table keeps its own config; missing keys still read as ITS initializer
    np.testing.assert_array_equal(a2.find([10**12])[0], np.zeros((1, 8), np.float32))


def test_steps_as_one_int(ckdir):
    checkpoint.save(ckdir, {"a": filled(10), "b": filled(10, seed=3)}, steps=5)
    assert checkpoint.load(ckdir).steps == {"a": 5, "b": 5}
    checkpoint.save(ckdir, {"a": filled(10)}, steps=np.array(2**40, np.int64))
    assert checkpoint.load(ckdir).steps == {"a": 2**40}
    checkpoint.save(ckdir, {"a": filled(10)}, steps={"a": np.int32(3)})
    assert checkpoint.load(ckdir).steps == {"a": 3}
    with pytest.raises(TypeError, match="step"):
        checkpoint.save(ckdir, {"a": filled(10)}, steps=1.5)


def test_any_table_name(ckdir):
    names = ["model/embedding:0", "ünï côdé", "a" * 300, "."]
    tables = {n: filled(5, seed=i) for i, n in enumerate(names)}
    checkpoint.save(ckdir, tables)
    ck = checkpoint.load(ckdir)
    assert list(ck.tables) == names
    for n in names:
        assert_same(snapshot(ck.tables[n]), snapshot(tables[n]))


@needs_optimizers
def test_round_trip_with_optimizer_slots(ckdir):
    opt = {"name": "adam", "flavor": "keras"}
    t = filled(2000, dim=4, optimizer=opt, seed=2)
    rng = np.random.default_rng(0)
    keys = t.export()["keys"]
    for step in range(1, 4):
        t.apply_gradients(keys[: 500 * step], rng.standard_normal((500 * step, 4)), 0.01, step)
    before = snapshot(t)
    assert before["slots"].shape == (2000, len(t.slot_names), 4) and np.abs(before["slots"]).sum()
    checkpoint.save(ckdir, {"emb": t}, steps=3, metadata={"framework": "tf"})
    m = checkpoint.read_manifest(ckdir)["tables"][0]
    assert m["optimizer"] == t.optimizer and m["optimizer"]["flavor"] == "keras"
    assert m["slot_names"] == t.slot_names

    plain = Table(dim=4)  # no optimizer: the saved one is attached and its slots restored
    ck = checkpoint.load(ckdir, {"emb": plain})
    assert plain.optimizer == t.optimizer and ck.steps == {"emb": 3}
    assert_same(snapshot(plain), before)

    other = Table(dim=4, optimizer={"name": "sgd", "flavor": "keras", "momentum": 0.9})
    checkpoint.load(ckdir, {"emb": other})
    assert other.optimizer == t.optimizer
    assert_same(snapshot(other), before)

    fresh = checkpoint.load(ckdir).tables["emb"]
    assert fresh.optimizer == t.optimizer
    assert_same(snapshot(fresh), before)
    # training continues identically from the restored state
    g = rng.standard_normal((100, 4)).astype(np.float32)
    t.apply_gradients(keys[:100], g, 0.01, 4)
    fresh.apply_gradients(keys[:100], g, 0.01, 4)
    np.testing.assert_array_equal(t.find(keys[:100])[0], fresh.find(keys[:100])[0])


@needs_optimizers
def test_live_optimizer_kept_when_checkpoint_has_none(ckdir):
    t = filled(100)
    before = snapshot(t)
    checkpoint.save(ckdir, {"t": t})
    opt = {"name": "adagrad", "flavor": "optax"}
    live = Table(dim=4, optimizer=opt)
    checkpoint.load(ckdir, {"t": live})
    assert live.optimizer["name"] == "adagrad" and live.optimizer["flavor"] == "optax"
    got = snapshot(live)
    for k in ("keys", "values", "last_update", "update_count"):
        np.testing.assert_array_equal(got[k], before[k])
    # rows start from the optimizer's initial slots (initial_accumulator_value)
    np.testing.assert_allclose(got["slots"], live.optimizer["initial_accumulator_value"])


@needs_optimizers
def test_sgd_momentum_slots_reshard(ckdir):
    opt = {"name": "sgd", "flavor": "keras", "momentum": 0.9}
    shards = [filled(400, optimizer=opt, seed=s, keys=np.arange(s, 1200, 3)) for s in range(3)]
    for t in shards:
        k = t.export()["keys"]
        t.apply_gradients(k, np.ones((len(k), 4), np.float32), 0.1, 1)
    before = snapshot(shards)
    checkpoint.save(ckdir, {"e": shards})
    live = [Table(dim=4, optimizer=opt) for _ in range(2)]
    checkpoint.load(ckdir, {"e": live})
    assert_same(snapshot(live), before)
    for i, t in enumerate(live):
        assert (np.mod(t.export()["keys"], 2) == i).all()


def test_int32_keys(ckdir):
    keys = np.array([-2**31, -5, 0, 7, 2**31 - 1], np.int32)
    t = filled(0, dim=2, key_dtype="int32", keys=keys)
    before = snapshot(t)
    assert before["keys"].dtype == np.int32
    checkpoint.save(ckdir, {"ids": t})
    assert checkpoint.read_manifest(ckdir)["tables"][0]["key_dtype"] == "int32"
    live = Table(dim=2, key_dtype="int32")
    checkpoint.load(ckdir, {"ids": live})
    assert_same(snapshot(live), before)
    fresh = checkpoint.load(ckdir, num_shards=3).tables["ids"]
    assert all(t.key_dtype == np.int32 for t in fresh)
    assert_same(snapshot(fresh), before)
    for i, s in enumerate(fresh):
        assert (np.mod(s.export()["keys"], 3) == i).all()


def test_empty_table(ckdir):
    t = Table(dim=5)
    checkpoint.save(ckdir, {"empty": t})
    shard = checkpoint.read_manifest(ckdir)["tables"][0]["shards"][0]
    arrays = safetensors_numpy.load_file(os.path.join(ckdir, shard["file"]))
    assert arrays["keys"].shape == (0,) and arrays["values"].shape == (0, 5)
    live = filled(10, dim=5)
    checkpoint.load(ckdir, {"empty": live})
    assert live.size() == 0
    assert checkpoint.load(ckdir).tables["empty"].size() == 0
    assert [s.size() for s in checkpoint.load(ckdir, num_shards=2).tables["empty"]] == [0, 0]


@pytest.mark.parametrize("dim", [1, 1024])
def test_extreme_dims(ckdir, dim):
    t = filled(3000 if dim == 1 else 700, dim=dim)
    before = snapshot(t)
    checkpoint.save(ckdir, {"t": t}, page_rows=256)
    live = Table(dim=dim)
    checkpoint.load(ckdir, {"t": live})
    assert_same(snapshot(live), before)


# ---- resharding ----------------------------------------------------------------------------------
def modded_shards(n_shards, n=3000, dim=4):
    keys = np.random.default_rng(9).choice(np.arange(-10**6, 10**6), n, replace=False)
    return [filled(0, dim=dim, keys=keys[np.mod(keys, n_shards) == i], seed=i)
            for i in range(n_shards)]


@pytest.mark.parametrize("saved,live", [(3, 1), (1, 2), (3, 2), (2, 5)])
def test_reshard(ckdir, saved, live):
    shards = modded_shards(saved)
    src = shards[0] if saved == 1 else shards
    before = snapshot(shards)
    checkpoint.save(ckdir, {"t": src})
    assert len(checkpoint.read_manifest(ckdir)["tables"][0]["shards"]) == saved
    targets = [Table(dim=4) for _ in range(live)]
    checkpoint.load(ckdir, {"t": targets[0] if live == 1 else targets})
    assert_same(snapshot(targets), before)
    for i, t in enumerate(targets):
        assert (np.mod(t.export()["keys"], live) == i).all()


def test_custom_partitioner_and_fresh_shards(ckdir):
    shards = modded_shards(3)
    before = snapshot(shards)
    checkpoint.save(ckdir, {"t": shards})

    def by_sign(keys, n):
        return (keys >= 0).astype(np.int32) % n

    ck = checkpoint.load(ckdir, num_shards=2, partitioner=by_sign)
    got = ck.tables["t"]
    assert isinstance(got, list) and len(got) == 2
    assert_same(snapshot(got), before)
    assert (got[0].export()["keys"] < 0).all() and (got[1].export()["keys"] >= 0).all()


def test_fresh_tables_from_manifest(ckdir):
    init = {"initializer": "uniform", "minval": -0.5, "maxval": 0.5, "seed": 7}
    t = filled(1000, dim=6, initializer=init, capacity=5000, evict_policy="frequency")
    before = snapshot(t)
    checkpoint.save(ckdir, {"t": t}, steps=11)
    ck = checkpoint.load(ckdir)
    fresh = ck.tables["t"]
    assert isinstance(fresh, Table) and fresh.id != t.id
    assert fresh.describe() == t.describe()
    assert ck.steps == {"t": 11}
    assert_same(snapshot(fresh), before)
    # same initializer: a key neither table holds reads identically
    np.testing.assert_array_equal(fresh.find([123456789])[0], t.find([123456789])[0])
    one = checkpoint.load(ckdir, num_shards=1).tables["t"]
    assert isinstance(one, list) and len(one) == 1


def test_names_subset_and_unknown(ckdir):
    checkpoint.save(ckdir, {"a": filled(10), "b": filled(20, seed=1)})
    ck = checkpoint.load(ckdir, names=["b"])
    assert list(ck.tables) == ["b"] and ck.tables["b"].size() == 20
    with pytest.raises(CheckpointError, match="'zzz'"):
        checkpoint.load(ckdir, names=["zzz"])
    live = Table(dim=4)
    with pytest.raises(CheckpointError, match="not in the checkpoint"):
        checkpoint.load(ckdir, {"nope": live})


# ---- dense parameters and plain readers ----------------------------------------------------------
def test_dense_round_trip(ckdir):
    dense = {"mlp/kernel": np.random.default_rng(0).standard_normal((33, 7)).astype(np.float32),
             "mlp/bias": np.arange(7, dtype=np.float64), "step": np.array(12, np.int64),
             "mask": np.array([True, False, True]), "empty": np.zeros((0, 3), np.float16)}
    checkpoint.save(ckdir, {"t": filled(5)}, dense=dense)
    for got in (checkpoint.load_dense(ckdir), checkpoint.load(ckdir).dense,
                safetensors_numpy.load_file(os.path.join(ckdir, "dense.safetensors"))):
        assert got.keys() == dense.keys()
        for k in dense:
            assert got[k].dtype == dense[k].dtype and got[k].shape == dense[k].shape
            np.testing.assert_array_equal(got[k], dense[k])
    checkpoint.save(ckdir, {"t": filled(5)})
    assert checkpoint.load_dense(ckdir) == {}


def test_dense_bfloat16(ckdir):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    w = np.linspace(-3, 3, 12, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(3, 4)
    checkpoint.save(ckdir, {}, dense={"w": w})
    got = checkpoint.load_dense(ckdir)["w"]
    assert got.dtype == w.dtype and got.shape == (3, 4)
    np.testing.assert_array_equal(got.astype(np.float32), w.astype(np.float32))


def test_readable_with_safetensors_and_json_alone(ckdir):
    shards = modded_shards(3, dim=5)
    checkpoint.save(ckdir, {"t": shards, "u": filled(50, dim=2)})
    expected = {}
    for s in shards:
        e = s.export()
        expected.update({int(k): v for k, v in zip(e["keys"], e["values"])})
    # a reader that knows nothing but the spec
    with open(os.path.join(ckdir, "manifest.json")) as f:
        manifest = json.load(f)
    table = next(t for t in manifest["tables"] if t["name"] == "t")
    rows = {}
    for shard in table["shards"]:
        arrays = safetensors_numpy.load_file(os.path.join(ckdir, shard["file"]))
        assert arrays["values"].shape == (shard["rows"], table["dim"])
        assert arrays["last_update"].dtype == np.int64 and arrays["update_count"].dtype == np.int64
        rows.update({int(k): v for k, v in zip(arrays["keys"], arrays["values"])})
    assert rows.keys() == expected.keys()
    for k in rows:
        np.testing.assert_array_equal(rows[k], expected[k])


def test_the_specs_minimal_reader(ckdir):
    """The reader printed in docs/checkpoint_format.md §8 reads what save writes."""
    import re
    doc = str(ROOT / "docs" / "checkpoint_format.md")
    if not os.path.exists(doc):
        pytest.skip("docs/checkpoint_format.md not found")
    code = re.findall(r"```python\n(.*?)```", open(doc, encoding="utf-8").read(), re.S)[0]
    scope = {}
    exec(code, scope)
    shards = modded_shards(2, dim=3)
    checkpoint.save(ckdir, {"e": shards})
    entry, rows = scope["read_table"](ckdir, "e")
    assert entry["dim"] == 3
    want = snapshot(shards)
    assert sorted(rows) == want["keys"].tolist()
    for k, v in zip(want["keys"], want["values"]):
        np.testing.assert_array_equal(rows[int(k)][0], v)


def test_checksums_are_plain_zlib_crc32(ckdir):
    import zlib
    checkpoint.save(ckdir, {"t": filled(100)})
    shard = checkpoint.read_manifest(ckdir)["tables"][0]["shards"][0]
    with open(os.path.join(ckdir, shard["file"]), "rb") as f:
        data = f.read()
    assert len(data) == shard["bytes"]
    hb = shard["header_bytes"]
    assert zlib.crc32(data[:hb]) == shard["header_crc32"]
    assert int.from_bytes(data[:8], "little") + 8 == hb and hb % 8 == 0
    for t in shard["tensors"].values():
        a, b = t["data_offsets"]
        assert zlib.crc32(data[hb + a:hb + b]) == t["crc32"]


def test_paging_gives_identical_files(tmp_path):
    t = filled(10_000, dim=7, seed=4)
    small, large = str(tmp_path / "small"), str(tmp_path / "large")
    checkpoint.save(small, {"t": t}, page_rows=1000)
    checkpoint.save(large, {"t": t}, page_rows=1 << 20)
    ms, ml = checkpoint.read_manifest(small), checkpoint.read_manifest(large)
    assert ms["tables"] == ml["tables"]
    f = ms["tables"][0]["shards"][0]["file"]
    with open(os.path.join(small, f), "rb") as a, open(os.path.join(large, f), "rb") as b:
        assert a.read() == b.read()


def test_paging_odd_sizes(ckdir, monkeypatch):
    # pages smaller than a write piece and not a divisor of the table size
    monkeypatch.setattr(_write, "CHUNK_BYTES", 1000)
    t = filled(2345, dim=3)
    before = snapshot(t)
    checkpoint.save(ckdir, {"t": t}, page_rows=77)
    assert_same(snapshot(checkpoint.load(ckdir).tables["t"]), before)


# ---- overwrite, atomic replace, concurrency ------------------------------------------------------
def no_leftovers(path):
    parent, base = os.path.split(path)
    return [n for n in os.listdir(parent) if n.startswith("." + base)]


def test_overwrite_replaces_atomically(ckdir):
    checkpoint.save(ckdir, {"t": filled(100, seed=1)})
    t2 = filled(50, seed=2)
    checkpoint.save(ckdir, {"t": t2, "extra": filled(3)})
    assert_same(snapshot(checkpoint.load(ckdir).tables["t"]), snapshot(t2))
    assert no_leftovers(ckdir) == []


def test_overwrite_with_rename_aside_scheme(ckdir, monkeypatch):
    monkeypatch.setattr(_fs, "exchange", lambda a, b: False)
    checkpoint.save(ckdir, {"t": filled(100, seed=1)})
    t2 = filled(50, seed=2)
    checkpoint.save(ckdir, {"t": t2})
    assert_same(snapshot(checkpoint.load(ckdir).tables["t"]), snapshot(t2))
    assert no_leftovers(ckdir) == []


def test_interrupted_swap_falls_back_to_aside_copy(ckdir):
    t = filled(100, seed=1)
    checkpoint.save(ckdir, {"t": t})
    os.rename(ckdir, _fs.aside_path(ckdir))  # the state between the aside scheme's two renames
    with pytest.warns(RuntimeWarning, match="interrupted save"):
        assert_same(snapshot(checkpoint.load(ckdir).tables["t"]), snapshot(t))
    with pytest.warns(RuntimeWarning):
        assert checkpoint.read_manifest(ckdir)["tables"][0]["rows"] == 100
    t2 = filled(10, seed=2)
    checkpoint.save(ckdir, {"t": t2})  # publishes, then removes the aside copy
    assert no_leftovers(ckdir) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(snapshot(checkpoint.load(ckdir).tables["t"]), snapshot(t2))


def test_failed_save_keeps_previous_and_cleans_up(ckdir, monkeypatch):
    t = filled(100, seed=1)
    checkpoint.save(ckdir, {"t": t})
    calls = []

    def modify_midway(table, offset, limit):
        if offset > 0 and not calls:
            calls.append(1)
            table.insert_or_assign([10**9], [[1.0] * 4])
        return table.export(offset, limit)

    monkeypatch.setattr(_write, "_export_page", modify_midway)
    victim = filled(1000, seed=5)
    with pytest.raises(CheckpointError, match="modified while it was being saved"):
        checkpoint.save(ckdir, {"t": victim}, page_rows=100)
    assert_same(snapshot(checkpoint.load(ckdir).tables["t"]), snapshot(t))
    assert no_leftovers(ckdir) == []


def test_refuses_to_overwrite_other_directories(tmp_path):
    other = tmp_path / "precious"
    other.mkdir()
    (other / "data.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match="not a dualemb checkpoint"):
        checkpoint.save(str(other), {"t": filled(3)})
    assert (other / "data.txt").read_text() == "keep me"
    empty = tmp_path / "empty"
    empty.mkdir()
    checkpoint.save(str(empty), {"t": filled(3)})
    assert checkpoint.load(str(empty)).tables["t"].size() == 3


def test_refuses_to_replace_a_symlink(tmp_path):
    target = str(tmp_path / "real")
    checkpoint.save(target, {"t": filled(3)})
    link = str(tmp_path / "link")
    os.symlink(target, link)
    assert checkpoint.load(link).tables["t"].size() == 3  # reading through a link is fine
    with pytest.raises(CheckpointError, match="symbolic link"):
        checkpoint.save(link, {"t": filled(5)})
    assert checkpoint.load(target).tables["t"].size() == 3


def test_bad_save_arguments(ckdir):
    t = filled(3)
    with pytest.raises(ValueError, match="JSON"):
        checkpoint.save(ckdir, {"t": t}, metadata={"x": object()})
    with pytest.raises(ValueError, match="unknown tables"):
        checkpoint.save(ckdir, {"t": t}, steps={"u": 1})
    with pytest.raises(TypeError):
        checkpoint.save(ckdir, {"t": "not a table"})
    with pytest.raises(ValueError, match="shard 1 has dim"):
        checkpoint.save(ckdir, {"t": [t, Table(dim=5)]})
    with pytest.raises(ValueError, match="page_rows"):
        checkpoint.save(ckdir, {"t": t}, page_rows=0)
    with pytest.raises(TypeError, match="'names'"):
        checkpoint.save(ckdir, {"t": t}, dense={"names": np.array(["a", "b"])})
    assert not os.path.exists(ckdir) and no_leftovers(ckdir) == []


# ---- bad checkpoints: clear errors, live tables unchanged -----------------------------------------
@pytest.fixture
def saved(ckdir):
    """A checkpoint of a 4000-row dim-4 table, and a live table with different contents."""
    checkpoint.save(ckdir, {"t": filled(4000, seed=1)}, dense={"w": np.ones(3, np.float32)})
    live = filled(500, seed=2)
    return ckdir, live, snapshot(live)


def shard_path(ckdir):
    return os.path.join(ckdir, checkpoint.read_manifest(ckdir)["tables"][0]["shards"][0]["file"])


def edit_manifest(ckdir, fn):
    """Edits manifest.json and re-seals its checksum file, so what is tested is the validation of
    the edited content (tests/checkpoint/test_checkpoint_manifest.py tests the checksum)."""
    p = os.path.join(ckdir, "manifest.json")
    with open(p) as f:
        m = json.load(f)
    fn(m)
    write_sealed_manifest(ckdir, json.dumps(m).encode())


def write_sealed_manifest(ckdir, data):
    with open(os.path.join(ckdir, "manifest.json"), "wb") as f:
        f.write(data)
    with open(os.path.join(ckdir, "manifest.crc32.json"), "w") as f:
        json.dump({"bytes": len(data), "crc32": zlib.crc32(data), "file": "manifest.json"}, f,
                  sort_keys=True, separators=(",", ":"))
        f.write("\n")


def flip_bit(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


def values_offset(ckdir):
    m = checkpoint.read_manifest(ckdir)["tables"][0]["shards"][0]
    return m["header_bytes"] + m["tensors"]["values"]["data_offsets"][0] + 1234


CORRUPTIONS = {
    "missing shard file": (lambda d: os.unlink(shard_path(d)), "is missing"),
    "missing manifest": (lambda d: os.unlink(os.path.join(d, "manifest.json")),
                         "no manifest.json"),
    "truncated shard": (lambda d: os.truncate(shard_path(d), os.path.getsize(shard_path(d)) - 100),
                        "truncated"),
    "flipped bit in values": (lambda d: flip_bit(shard_path(d), values_offset(d)),
                              "checksum mismatch in tensor 'values'"),
    "flipped bit in header": (lambda d: flip_bit(shard_path(d), 20), "header"),
    "flipped bit in dense": (lambda d: flip_bit(os.path.join(d, "dense.safetensors"),
                                                os.path.getsize(os.path.join(d, "dense.safetensors")) - 2),
                             "checksum mismatch in tensor 'w'"),
    "format version 4": (lambda d: edit_manifest(d, lambda m: m.update(version=4)),
                         "version 4 is newer"),
    "other format": (lambda d: edit_manifest(d, lambda m: m.update(format="tfra")),
                     "not a dualemb checkpoint"),
    "manifest not json": (lambda d: write_sealed_manifest(d, b"{oops"), "not valid JSON"),
    "flipped bit in manifest": (lambda d: flip_bit(os.path.join(d, "manifest.json"), 30),
                                "manifest.json: checksum mismatch"),
    "rows disagree": (lambda d: edit_manifest(d, lambda m: m["tables"][0].update(rows=1)),
                      "rows sum to"),
    "shape disagrees": (lambda d: edit_manifest(
        d, lambda m: m["tables"][0]["shards"][0]["tensors"]["keys"].update(shape=[3])),
        "expected I64"),
    "extra bytes": (lambda d: open(shard_path(d), "ab").write(b"x" * 8), "extra data"),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corrupt_checkpoint_leaves_live_table_unchanged(saved, kind):
    ckdir, live, before = saved
    corrupt, message = CORRUPTIONS[kind]
    corrupt(ckdir)
    with pytest.raises(CheckpointError, match=message):
        checkpoint.load(ckdir, {"t": live})
    assert_same(snapshot(live), before)


def test_error_names_the_file(saved):
    ckdir, live, _ = saved
    flip_bit(shard_path(ckdir), values_offset(ckdir))
    with pytest.raises(ValueError) as e:
        checkpoint.load(ckdir, {"t": live})
    assert os.path.basename(shard_path(ckdir)) in str(e.value) and "'t'" in str(e.value)


def test_fresh_load_of_corrupt_checkpoint_creates_nothing(saved):
    ckdir, _, _ = saved
    flip_bit(shard_path(ckdir), values_offset(ckdir))
    with pytest.raises(CheckpointError):
        checkpoint.load(ckdir)


@pytest.mark.parametrize("make_live,message", [
    (lambda: Table(dim=5), "dim mismatch: the live table has dim 5, the checkpoint has dim 4"),
    (lambda: Table(dim=4, key_dtype="int32"), "key dtype mismatch: the live table has int32"),
    (lambda: [Table(dim=4), Table(dim=3)], "live shard 1: dim mismatch"),
    (lambda: Table(dim=4, capacity=100), "capacity 100"),
])
def test_mismatched_live_table_unchanged(saved, make_live, message):
    ckdir = saved[0]
    live = make_live()
    shards = live if isinstance(live, list) else [live]
    for i, s in enumerate(shards):
        s.insert_or_assign(np.arange(10) + i, np.ones((10, s.dim), np.float32))
    before = [snapshot(s) for s in shards]
    with pytest.raises(CheckpointError, match=message):
        checkpoint.load(ckdir, {"t": live})
    for s, b in zip(shards, before):
        assert_same(snapshot(s), b)


def test_bad_partitioner_leaves_live_unchanged(saved):
    ckdir, live, before = saved
    other = filled(20, seed=3)
    other_before = snapshot(other)
    with pytest.raises(CheckpointError, match="outside"):
        checkpoint.load(ckdir, {"t": [live, other]}, partitioner=lambda k, n: np.full(k.shape, n))
    assert_same(snapshot(live), before)
    assert_same(snapshot(other), other_before)


def test_missing_directory_is_file_not_found(tmp_path):
    for fn in (checkpoint.load, checkpoint.read_manifest, checkpoint.load_dense):
        with pytest.raises(FileNotFoundError):
            fn(str(tmp_path / "nothing_here"))


def test_one_bad_table_leaves_all_tables_unchanged(ckdir):
    checkpoint.save(ckdir, {"a": filled(100, seed=1), "b": filled(100, seed=2)})
    m = checkpoint.read_manifest(ckdir)
    flip_bit(os.path.join(ckdir, m["tables"][1]["shards"][0]["file"]), 300)
    a, b = filled(7, seed=8), filled(9, seed=9)
    sa, sb = snapshot(a), snapshot(b)
    with pytest.raises(CheckpointError, match="table 'b'"):
        checkpoint.load(ckdir, {"a": a, "b": b})
    assert_same(snapshot(a), sa)
    assert_same(snapshot(b), sb)


def test_manifest_written_last_and_tmp_dirs_hidden(ckdir, monkeypatch):
    """While a save runs, its files live in a hidden sibling without a manifest."""
    seen = []

    def spy(table, offset, limit):
        parent, base = os.path.split(ckdir)
        tmps = [n for n in os.listdir(parent) if n.startswith(f".{base}.tmp-")
                and not n.endswith(".lock")]  # the save's lock file sits beside its directory
        seen.append([os.path.exists(os.path.join(parent, n, "manifest.json")) for n in tmps])
        return table.export(offset, limit)

    monkeypatch.setattr(_write, "_export_page", spy)
    checkpoint.save(ckdir, {"t": filled(500)}, page_rows=100)
    assert seen and all(s == [False] for s in seen)
    shutil.rmtree(ckdir)

"""String-keyed tables in the common checkpoint format: round trip, the on-disk encoding read
with numpy alone, and refusal of int <-> string mismatches."""


import numpy as np
import pytest

import _numpy_shard_reader as shard_reader  # noqa: E402  (tests/ helper)
from dualemb.core import Table, checkpoint

KEYS = [b"", b"\x00", b"a\x00b", "é".encode(), "日本".encode(), b"\xff"] + \
    [f"user-{i}".encode() * (i % 5 + 1) for i in range(300)]


def _filled(optimizer="adam"):
    t = Table(3, key_dtype="string", optimizer=optimizer,
              initializer={"initializer": "normal", "seed": 1})
    rows = np.arange(len(KEYS) * 3, dtype=np.float32).reshape(-1, 3)
    if optimizer:
        t.apply_gradients(KEYS, rows, 0.1, 1)
    else:
        t.insert_or_assign(KEYS, rows)
    return t


def _rows(t):
    p = t.export()
    return {k: (v, s, c) for k, v, s, c in zip(p["keys"], p["values"], p["slots"],
                                                p["update_count"])}


def test_round_trip_small_pages(tmp_path):
    src = _filled()
    checkpoint.save(tmp_path / "ck", {"emb": src}, page_rows=7)
    got = checkpoint.load(tmp_path / "ck")
    dst = got.tables["emb"] if hasattr(got, "tables") else got["emb"]
    assert dst.key_dtype_name == "string"
    a, b = _rows(src), _rows(dst)
    assert sorted(a) == sorted(b) == sorted(KEYS)
    for k in a:
        np.testing.assert_array_equal(a[k][0], b[k][0])
        np.testing.assert_array_equal(a[k][1], b[k][1])
        assert a[k][2] == b[k][2]
    # Missing keys still read as the same initializer rows after the load.
    np.testing.assert_array_equal(src.find(["absent"])[0], dst.find(["absent"])[0])
    # Restoring into a live string table works too.
    live = Table(3, key_dtype="string", optimizer="adam")
    checkpoint.load(tmp_path / "ck", {"emb": live})
    assert sorted(_rows(live)) == sorted(KEYS)


def test_encoding_is_readable_with_numpy_alone(tmp_path):
    src = _filled(optimizer=None)
    checkpoint.save(tmp_path / "ck", {"emb": src})
    table, tensor = shard_reader.only_shard(tmp_path / "ck")
    assert table["key_dtype"] == "string"
    assert "keys" not in tensor.names
    offs = tensor("key_offsets", np.int64)
    data = tensor("key_bytes", np.uint8).tobytes()
    values = tensor("values", np.float32).reshape(-1, 3)
    assert offs[0] == 0 and len(offs) == len(KEYS) + 1 and offs[-1] == len(data)
    keys = [data[offs[i]:offs[i + 1]] for i in range(len(KEYS))]
    assert sorted(keys) == sorted(KEYS)
    np.testing.assert_array_equal(values, src.find(keys)[0])


def test_int_and_string_checkpoints_do_not_mix(tmp_path):
    checkpoint.save(tmp_path / "s", {"emb": _filled()})
    ints = Table(3, optimizer="adam")
    ints.insert_or_assign([1, 2], np.ones((2, 3), np.float32))
    checkpoint.save(tmp_path / "i", {"emb": ints})
    with pytest.raises(checkpoint.CheckpointError, match="key dtype mismatch"):
        checkpoint.load(tmp_path / "s", {"emb": Table(3, optimizer="adam")})
    strings = Table(3, key_dtype="string", optimizer="adam")
    with pytest.raises(checkpoint.CheckpointError, match="key dtype mismatch"):
        checkpoint.load(tmp_path / "i", {"emb": strings})
    assert strings.size() == 0
    with pytest.raises(checkpoint.CheckpointError, match="string keys"):
        checkpoint.load(tmp_path / "s", num_shards=2)


def _by_length(keys, n):
    return np.array([len(k) % n for k in keys], np.int64)


def test_load_into_several_shards_with_a_partitioner(tmp_path):
    """Strings route only by a partitioner the caller gives (the TF Variable passes its
    to_hash_bucket_fast); every row lands in the shard it names, with its slots."""
    src = _filled()
    checkpoint.save(tmp_path / "ck", {"emb": src}, page_rows=50)
    live = [Table(3, key_dtype="string", optimizer="adam") for _ in range(3)]
    live[0].insert_or_assign([b"stale"], np.ones((1, 3), np.float32))
    checkpoint.load(tmp_path / "ck", {"emb": live}, partitioner=_by_length)
    want = _rows(src)
    got = {}
    for j, t in enumerate(live):
        rows = _rows(t)
        assert all(len(k) % 3 == j for k in rows)
        got.update(rows)
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k][0], want[k][0])
        np.testing.assert_array_equal(got[k][1], want[k][1])
    # New tables too (num_shards with a partitioner).
    made = checkpoint.load(tmp_path / "ck", num_shards=2, partitioner=_by_length).tables["emb"]
    assert sorted(k for t in made for k in _rows(t)) == sorted(want)
    # A partitioner out of range is refused before any live table changes.
    def plain(t):
        return {k: (v.tolist(), s.tolist(), c) for k, (v, s, c) in _rows(t).items()}

    before = [plain(t) for t in live]
    with pytest.raises(checkpoint.CheckpointError, match="outside"):
        checkpoint.load(tmp_path / "ck", {"emb": live}, partitioner=lambda k, n: _by_length(k, 5))
    assert [plain(t) for t in live] == before

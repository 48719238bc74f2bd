"""String-valued tables in the common checkpoint format: round trip bit-exact (weird bytes
included), the documented value_offsets/value_bytes encoding read with numpy alone, resharding
by int keys, and refusal by name in a reader that does not know string values."""


import numpy as np
import pytest

import _numpy_shard_reader as shard_reader  # noqa: E402  (tests/ helper)
from dualemb.core import Table, checkpoint
from dualemb.core.checkpoint import _manifest

WEIRD = [b"", b"\x00", b"a\x00b", b"x\x00", b"\xff\xfe", "é日本".encode(), b"L" * 5000]
DIM = 2


def _filled(n=400):
    t = Table(DIM, value_dtype="string", initializer="dflt")
    keys = np.arange(n, dtype=np.int64) * 7 - 100
    vals = np.empty((n, DIM), object)
    for i in range(n):
        vals[i, 0] = WEIRD[i % len(WEIRD)]
        vals[i, 1] = f"row-{i}".encode() * (i % 4)
    t.insert_or_assign(keys, vals)
    return t, {int(k): tuple(v) for k, v in zip(keys, vals)}


def _as_dict(t):
    p = t.export()
    return {int(k): tuple(v) for k, v in zip(p["keys"], p["values"])}


def test_round_trip_is_exact_with_small_pages(tmp_path):
    src, ref = _filled()
    checkpoint.save(tmp_path / "ck", {"emb": src}, page_rows=13)
    got = checkpoint.load(tmp_path / "ck")
    dst = got.tables["emb"] if hasattr(got, "tables") else got["emb"]
    assert dst.value_dtype == np.dtype(object)
    assert _as_dict(dst) == ref
    assert dst.find([10**9])[0].tolist() == [[b"dflt", b"dflt"]]  # the default survives too
    live = Table(DIM, value_dtype="string", initializer="dflt")
    live.insert_or_assign([123456], [[b"gone", b"gone"]])
    checkpoint.load(tmp_path / "ck", {"emb": live})  # restore replaces the contents
    assert _as_dict(live) == ref


def test_reshards_by_int_key(tmp_path):
    src, ref = _filled(300)
    checkpoint.save(tmp_path / "ck", {"emb": src})
    shards = [Table(DIM, value_dtype="string", initializer="dflt") for _ in range(3)]
    checkpoint.load(tmp_path / "ck", {"emb": shards})
    merged = {}
    for s in shards:
        merged.update(_as_dict(s))
    assert merged == ref and sum(s.size() for s in shards) == len(ref)


def test_encoding_is_readable_with_numpy_alone(tmp_path):
    src, ref = _filled(50)
    checkpoint.save(tmp_path / "ck", {"emb": src})
    table, tensor = shard_reader.only_shard(tmp_path / "ck")
    assert table["value_dtype"] == "string"
    assert "values" not in tensor.names
    assert tensor.dtypes["value_offsets"] == "I64" and tensor.dtypes["value_bytes"] == "U8"
    keys = tensor("keys", np.int64)
    offs = tensor("value_offsets", np.int64)
    data = tensor("value_bytes", np.uint8).tobytes()
    assert offs[0] == 0 and len(offs) == len(keys) * DIM + 1 and offs[-1] == len(data)
    strings = [data[offs[e]:offs[e + 1]] for e in range(len(keys) * DIM)]
    got = {int(k): tuple(strings[i * DIM:(i + 1) * DIM]) for i, k in enumerate(keys)}
    assert got == ref


def test_a_reader_without_string_values_refuses_by_name(tmp_path, monkeypatch):
    src, _ = _filled(5)
    checkpoint.save(tmp_path / "ck", {"emb": src})
    monkeypatch.delitem(_manifest.VALUE_DTYPES, "string")  # what an older reader knows
    with pytest.raises(checkpoint.CheckpointError, match="unsupported value_dtype 'string'"):
        checkpoint.load(tmp_path / "ck")


def test_string_and_numeric_checkpoints_do_not_mix(tmp_path):
    src, _ = _filled(5)
    checkpoint.save(tmp_path / "s", {"emb": src})
    live = Table(DIM, value_dtype="int64")
    with pytest.raises(checkpoint.CheckpointError, match="value dtype"):
        checkpoint.load(tmp_path / "s", {"emb": live})
    assert live.size() == 0


def test_corrupt_offsets_are_refused(tmp_path):
    src, _ = _filled(5)
    checkpoint.save(tmp_path / "ck", {"emb": src})
    from dualemb.core.checkpoint import _string_values

    class Fake:
        def read(self, name, row0, out):
            out[:] = [0, 5, 3][: len(out)] if name == "value_offsets" else 0

        def shape(self, name):
            return (10,)

    with pytest.raises(_string_values.CorruptValues, match="value_offsets"):
        _string_values.read_page(Fake(), 0, 1, 2, "x")

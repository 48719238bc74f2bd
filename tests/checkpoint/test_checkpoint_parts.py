"""One checkpoint written by several processes (``checkpoint.parts``), and restoring a share of
a checkpoint into one process (``checkpoint.Subset``), in-process: the "processes" are parts
written one after the other, the reference is the rows inserted (numpy)."""

import os

import numpy as np
import pytest

from dualemb.core import Table, checkpoint
from dualemb.core.checkpoint import CheckpointError
from dualemb.core.routing import shard_of


def shard_tables(n_shards, n=300, dim=3, seed=0):
    """n_shards tables holding the keys shard_of routes to each, and key -> row of all."""
    rng = np.random.default_rng(seed)
    keys = rng.choice(np.arange(-5 * n, 5 * n), n, replace=False).astype(np.int64)
    values = rng.standard_normal((n, dim)).astype(np.float32)
    tables = []
    for j in range(n_shards):
        m = shard_of(keys, n_shards) == j
        t = Table(dim=dim)
        t.insert_or_assign(keys[m], values[m])
        tables.append(t)
    return tables, dict(zip(keys.tolist(), values))


def contents(tables) -> dict:
    out = {}
    for t in tables:
        page = t.export()
        for k, v in zip(page["keys"].tolist(), page["values"]):
            assert k not in out
            out[k] = v
    return out


def assert_rows(got: dict, want: dict):
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def write_job(path, tables, token=7, skip_part=None, dense=None):
    """Two 'processes', each holding one shard of table "t"; the coordinator finishes."""
    staging = checkpoint.parts.begin(path, token)
    for part, t in enumerate(tables):
        if part != skip_part:
            checkpoint.parts.write_part(checkpoint.parts.find_staging(path, token), part, ["t"],
                                        {"t": [(part, t)]})
    checkpoint.parts.finish(staging, path, len(tables), ["t"], steps=5, dense=dense,
                            metadata={"by": "test"})


def test_parts_make_one_checkpoint(tmp_path):
    tables, want = shard_tables(2)
    path = tmp_path / "ck"
    write_job(path, tables, dense={"w": np.arange(3.0)})
    ck = checkpoint.load(path, num_shards=1)
    assert_rows(contents([ck.tables["t"][0]]), want)
    assert ck.steps == {"t": 5} and ck.metadata == {"by": "test"}
    np.testing.assert_array_equal(ck.dense["w"], np.arange(3.0))
    manifest = checkpoint.read_manifest(path)
    assert [s["rows"] for s in manifest["tables"][0]["shards"]] == [int(t.size()) for t in tables]
    assert sorted(os.listdir(path)) == ["dense.safetensors", "manifest.crc32.json",
                                        "manifest.json", "table-0000-shard-00000.safetensors",
                                        "table-0000-shard-00001.safetensors"]
    assert [n for n in os.listdir(tmp_path) if n != "ck"] == []


def test_a_missing_part_keeps_the_previous_checkpoint(tmp_path):
    old, old_rows = shard_tables(2, seed=1)
    path = tmp_path / "ck"
    write_job(path, old)
    tables, _ = shard_tables(2, seed=2)
    with pytest.raises(CheckpointError, match="process 1 did not write its part"):
        write_job(path, tables, token=8, skip_part=1)
    assert_rows(contents([checkpoint.load(path, num_shards=1).tables["t"][0]]), old_rows)
    assert [n for n in os.listdir(tmp_path) if n != "ck"] == []  # staging removed


def test_parts_that_disagree_are_refused(tmp_path):
    a = Table(dim=3)
    b = Table(dim=4)
    a.insert_or_assign(np.array([0], np.int64), np.ones((1, 3), np.float32))
    with pytest.raises(CheckpointError, match="dim"):
        write_job(tmp_path / "ck", [a, b])
    assert not os.path.exists(tmp_path / "ck")


def test_shard_indices_must_cover_every_shard(tmp_path):
    tables, _ = shard_tables(2)
    path = tmp_path / "ck"
    staging = checkpoint.parts.begin(path, 3)
    for part, t in enumerate(tables):  # shards 0 and 2 of a 2-shard table: 1 is missing
        checkpoint.parts.write_part(staging, part, ["t"], {"t": [(2 * part, t)]})
    with pytest.raises(CheckpointError, match="exactly once"):
        checkpoint.parts.finish(staging, path, 2, ["t"])
    assert not os.path.exists(path)


def test_staging_directory_must_be_visible(tmp_path):
    with pytest.raises(CheckpointError, match="shared file system"):
        checkpoint.parts.find_staging(tmp_path / "ck", 99)


@pytest.mark.parametrize("held", [[0], [2], [1, 2]])
def test_subset_loads_only_the_held_replicas(tmp_path, held):
    tables, want = shard_tables(3)
    checkpoint.save(tmp_path / "ck", {"t": tables})
    live = [Table(dim=3) for _ in held]
    to_local = np.full(3, -1)
    to_local[held] = np.arange(len(held))
    ck = checkpoint.load(tmp_path / "ck", {"t": live},
                         partitioner=checkpoint.Subset(lambda k, n: to_local[shard_of(k, 3)]))
    for t, replica in zip(live, held):
        mine = {k: v for k, v in want.items() if shard_of(k, 3) == replica}
        assert_rows(contents([t]), mine)
    assert ck.tables["t"] is live


def test_a_plain_partitioner_may_not_drop_rows(tmp_path):
    tables, want = shard_tables(2)
    checkpoint.save(tmp_path / "ck", {"t": tables})
    live = [Table(dim=3), Table(dim=3)]
    for t in live:
        t.insert_or_assign(np.array([123456], np.int64), np.ones((1, 3), np.float32))
    with pytest.raises(CheckpointError, match=r"outside \[0, 2\)"):
        checkpoint.load(tmp_path / "ck", {"t": live}, partitioner=lambda k, n: k % n - 1)
    for t in live:  # unchanged
        assert_rows(contents([t]), {123456: np.ones(3, np.float32)})

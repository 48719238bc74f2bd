"""One checkpoint written by several processes (``checkpoint.parts``), and restoring a share of
a checkpoint into one process (``checkpoint.Subset``), in-process: the "processes" are threads
running the real protocol with a barrier that sums (``ThreadSync``), the reference is the rows
inserted (numpy)."""

import os
import threading

import numpy as np
import pytest

from dualemb.core import Table, checkpoint
from dualemb.core.checkpoint import CheckpointError
from dualemb.core.checkpoint._staging import Staging
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


class ThreadSync:
    """The protocol's ``sync`` for writers that are threads of this process: a barrier that
    returns the element-wise sum of every writer's values."""

    def __init__(self, n):
        self.barrier = threading.Barrier(n, timeout=60)
        self.lock = threading.Lock()
        self.acc = None
        self.tags = []

    def __call__(self, tag, values):
        with self.lock:
            self.acc = list(values) if self.acc is None else [
                a + int(b) for a, b in zip(self.acc, values)]
        self.barrier.wait()  # every writer contributed
        out = list(self.acc)
        if self.barrier.wait() == 0:  # every writer read the sum
            self.acc = None
            self.tags.append(tag)
        self.barrier.wait()  # reset before anyone contributes again
        return out


def run_writers(path, tables_of, *, coordinator=0, **kwargs):
    """Writer k (a thread) saves tables_of[k] (name -> [(index, Table)], or a function) with
    parts.save; returns each writer's exception (None where it returned)."""
    n = len(tables_of)
    sync = ThreadSync(n)
    errors = [None] * n

    def writer(k):
        try:
            checkpoint.parts.save(path, tables_of[k], names=["t"], sync=sync, part=k,
                                  num_parts=n, coordinator=k == coordinator, **kwargs)
        except Exception as e:  # noqa: BLE001 - returned to the test
            errors[k] = e

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a writer hangs"
    return errors


def write_job(path, tables, dense=None):
    """Two writers, each holding one shard of table "t"; writer 0 coordinates."""
    errors = run_writers(path, [{"t": [(k, t)]} for k, t in enumerate(tables)], steps=5,
                         dense=dense, metadata={"by": "test"})
    assert errors == [None] * len(tables), errors


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


def test_any_writer_may_coordinate(tmp_path):
    tables, want = shard_tables(3)
    path = tmp_path / "ck"
    errors = run_writers(path, [{"t": [(k, t)]} for k, t in enumerate(tables)], coordinator=2)
    assert errors == [None] * 3
    assert_rows(contents([checkpoint.load(path, num_shards=1).tables["t"][0]]), want)


def test_a_failed_writer_keeps_the_previous_checkpoint(tmp_path):
    old, old_rows = shard_tables(2, seed=1)
    path = tmp_path / "ck"
    write_job(path, old)
    tables, _ = shard_tables(2, seed=2)

    def broken():
        raise RuntimeError("disk on fire")

    errors = run_writers(path, [{"t": [(0, tables[0])]}, broken])
    assert isinstance(errors[1], RuntimeError) and "disk on fire" in str(errors[1])
    assert isinstance(errors[0], CheckpointError)
    assert "1 of 2 writers failed" in str(errors[0])
    assert_rows(contents([checkpoint.load(path, num_shards=1).tables["t"][0]]), old_rows)
    assert [n for n in os.listdir(tmp_path) if n != "ck"] == []  # staging removed


def test_a_missing_part_record_is_refused(tmp_path, monkeypatch):
    # A writer that succeeded but whose record the coordinator cannot see (a directory that is
    # not shared): the coordinator refuses, every writer raises.
    old, old_rows = shard_tables(2, seed=1)
    path = tmp_path / "ck"
    write_job(path, old)
    real = Staging.write_record

    def lost(self, part, record):
        if part != 1:
            real(self, part, record)

    monkeypatch.setattr(Staging, "write_record", lost)
    tables, _ = shard_tables(2, seed=2)
    errors = run_writers(path, [{"t": [(k, t)]} for k, t in enumerate(tables)])
    assert "process 1 did not write its part" in str(errors[0])
    assert "was not written" in str(errors[1])
    assert_rows(contents([checkpoint.load(path, num_shards=1).tables["t"][0]]), old_rows)
    assert [n for n in os.listdir(tmp_path) if n != "ck"] == []


def test_parts_that_disagree_are_refused(tmp_path):
    a = Table(dim=3)
    b = Table(dim=4)
    a.insert_or_assign(np.array([0], np.int64), np.ones((1, 3), np.float32))
    errors = run_writers(tmp_path / "ck", [{"t": [(0, a)]}, {"t": [(1, b)]}])
    assert isinstance(errors[0], CheckpointError) and "dim" in str(errors[0])
    assert isinstance(errors[1], CheckpointError)
    assert not os.path.exists(tmp_path / "ck")
    assert os.listdir(tmp_path) == []


def test_shard_indices_must_cover_every_shard(tmp_path):
    tables, _ = shard_tables(2)
    path = tmp_path / "ck"
    # shards 0 and 2 of a 2-shard table: 1 is missing
    errors = run_writers(path, [{"t": [(2 * k, t)]} for k, t in enumerate(tables)])
    assert "exactly once" in str(errors[0])
    assert not os.path.exists(path)


def test_exactly_one_writer_coordinates(tmp_path):
    tables, _ = shard_tables(2)
    sync = ThreadSync(2)
    errors = []

    def writer(k):
        try:
            checkpoint.parts.save(tmp_path / "ck", {"t": [(k, tables[k])]}, names=["t"],
                                  sync=sync, part=k, num_parts=2, coordinator=True)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(errors) == 2 and all("2 writers claim to coordinate" in str(e) for e in errors)
    assert os.listdir(tmp_path) == []  # both staging directories removed


def test_staging_directory_must_be_visible(tmp_path):
    with pytest.raises(CheckpointError, match="shared file system"):
        Staging.join(tmp_path / "ck", 99)


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

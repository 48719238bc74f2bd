"""Edge-case inputs of dualemb.core.Table and checkpoint.load (issue 9, item 5): 0-d keys give
(dim,) rows, empty lists are empty batches, page sizes below 1 are refused, and a manifest whose
slot names were edited raises the checkpoint error."""

import json

import numpy as np
import pytest

from dualemb.core import Table, checkpoint
from dualemb.core.checkpoint import CheckpointError


@pytest.fixture
def table():
    t = Table(4, initializer=0.5)
    t.insert_or_assign(np.arange(10), np.arange(40, dtype=np.float32).reshape(10, 4))
    return t


@pytest.mark.parametrize("page_size", [0, -1])
def test_export_pages_refuses_page_size_below_one(table, page_size):
    with pytest.raises(ValueError, match="page_size"):
        table.export_pages(page_size)


@pytest.mark.parametrize("page_size", [1, 3, 10, 11])
def test_export_pages_cover_the_table(table, page_size):
    keys = np.concatenate([p["keys"] for p in table.export_pages(page_size)])
    assert sorted(keys.tolist()) == list(range(10))


def test_export_negative_offset_or_limit(table):
    with pytest.raises(ValueError):
        table.export(-1)
    with pytest.raises(ValueError):
        table.export(0, -5)


@pytest.mark.parametrize("key", [np.int64(3), np.array(3), 3, np.int32(3)])
def test_zero_d_key_gives_a_dim_row(table, key):
    values, exists = table.find(key)
    assert values.shape == (4,) and np.shape(exists) == ()
    np.testing.assert_array_equal(values, np.arange(12, 16, dtype=np.float32))
    assert bool(exists)
    rows, ex = table.find_or_insert(np.int64(77))
    assert rows.shape == (4,) and np.shape(ex) == () and not bool(ex)
    assert table.initial_values(np.int64(5)).shape == (4,)


def test_zero_d_key_writes(table):
    table.insert_or_assign(np.int64(42), np.full(4, 2.0, np.float32))
    table.accum(np.int64(42), np.ones(4, np.float32), np.array(True))
    np.testing.assert_array_equal(table.find(np.int64(42))[0], np.full(4, 3.0, np.float32))
    table.erase(np.int64(42))
    assert not table.find(np.int64(42))[1]


def test_empty_list_is_an_empty_batch(table):
    values, exists = table.find([])
    assert values.shape == (0, 4) and values.dtype == np.float32 and exists.shape == (0,)
    assert table.find_or_insert([])[0].shape == (0, 4)
    assert table.insert_or_assign([], []) == 0
    assert table.insert_or_assign([], np.zeros((0, 4), np.float32)) == 0
    table.erase([])
    assert table.initial_values([]).shape == (0, 4)
    assert table.size() == 10


def test_float_keys_are_still_refused(table):
    with pytest.raises(TypeError):
        table.find([1.0, 2.0])
    with pytest.raises(TypeError):
        table.find(np.array([], np.float64))


def test_swapped_slot_names_in_manifest_raise_checkpoint_error(tmp_path):
    t = Table(3, optimizer={"name": "adam"})
    t.apply_gradients(np.arange(5), np.ones((5, 3), np.float32), 0.1, 1)
    path = tmp_path / "ck"
    checkpoint.save(path, {"t": t})
    manifest_path = path / "manifest.json"
    m = json.loads(manifest_path.read_text())
    m["tables"][0]["slot_names"] = m["tables"][0]["slot_names"][::-1]
    manifest_path.write_text(json.dumps(m))
    # Whatever catches the edit first (a manifest checksum, or the slot-name check), it is a
    # CheckpointError, never an unknown-table KeyError.
    for kwargs in ({}, {"num_shards": 2}, {"tables": {"t": Table(3)}},
                   {"tables": {"t": Table(3, optimizer={"name": "adam"})}}):
        with pytest.raises(CheckpointError):
            checkpoint.load(path, **kwargs)

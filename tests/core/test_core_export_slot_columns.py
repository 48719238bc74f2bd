"""Table.export_slot_columns (a checkpoint's pages: each optimizer slot in its own [n, dim]
array) against the reference Table.export ([n, num_slots, dim] slots), page by page, for numeric
and string keys, several value dtypes, 0 to 3 slots, and pages that cross the internal batches
and the table's end."""

import numpy as np
import pytest

from dualemb.core import Table

DIM = 6
ROWS = 1500  # past the export's 64 KB batches at every row width below


def _table(key_dtype, value_dtype, optimizer):
    t = Table(DIM, key_dtype=key_dtype, value_dtype=value_dtype, optimizer=optimizer)
    keys = np.arange(ROWS) if key_dtype != "string" else \
        np.array([f"k{i}".encode() for i in range(ROWS)], dtype=object)
    rng = np.random.default_rng(3)
    t.insert_or_assign(keys, rng.standard_normal((ROWS, DIM)).astype(np.float32).astype(
        np.dtype(value_dtype)))
    if optimizer is not None:  # a third of the rows stepped: slots and stepped marks differ
        t.apply_gradients(keys[::3], rng.standard_normal((len(keys[::3]), DIM)).astype(
            np.float32), 0.1, 1)
    return t


@pytest.mark.parametrize("key_dtype,value_dtype,optimizer", [
    ("int64", "float32", {"name": "adam", "amsgrad": True}),  # 3 slots
    ("int64", "float32", {"name": "adam"}),
    ("int32", "float16", "adagrad"),
    ("int64", "float64", None),  # no slots: an empty list
    ("string", "float32", "adam"),
])
def test_pages_equal_the_export(key_dtype, value_dtype, optimizer):
    t = _table(key_dtype, value_dtype, optimizer)
    for offset, limit in [(0, ROWS), (0, 1), (517, 700), (ROWS - 10, 50), (ROWS, 5), (3, 0)]:
        want = t.export(offset, limit)
        got = t.export_slot_columns(offset, limit)
        assert set(got) == set(want) - {"slots"} | {"slot_columns"}
        for field in ("keys", "values", "last_update", "update_count", "stepped"):
            assert got[field].dtype == want[field].dtype, field
            np.testing.assert_array_equal(got[field], want[field], err_msg=field)
        assert len(got["slot_columns"]) == t.num_slots
        for j, column in enumerate(got["slot_columns"]):
            assert column.flags.c_contiguous and column.dtype == want["values"].dtype
            np.testing.assert_array_equal(column, want["slots"][:, j])


def test_bad_arguments_raise():
    t = _table("int64", "float32", "adam")
    with pytest.raises(ValueError):
        t.export_slot_columns(-1, 5)
    with pytest.raises(TypeError):
        t.export_slot_columns(0, 2.5)

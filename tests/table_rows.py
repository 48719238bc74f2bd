"""Every row of a table as numpy arrays sorted by key, and an exact comparison of two such
snapshots: the reference the core and checkpoint tests compare tables with."""

import numpy as np


def snapshot(tables):
    """Every row of a table (or list of shards), sorted by key, as a dict of arrays (the export's
    fields; those it leaves out, None, are dropped)."""
    tables = tables if isinstance(tables, (list, tuple)) else [tables]
    parts = [t.export() for t in tables]
    out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0] if parts[0][k] is not None}
    order = np.argsort(out["keys"], kind="stable")
    return {k: v[order] for k, v in out.items()}


def assert_same(a, b):
    """The same fields, dtypes and values, bit for bit."""
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


ROW_FIELDS = ("values", "slots", "last_update", "update_count")


def rows_by_key(tables, fields=ROW_FIELDS):
    """{key: (the row's fields: arrays as bytes, metadata as int / bool)} over every shard; a key
    in two shards fails."""
    out = {}
    for t in tables if isinstance(tables, (list, tuple)) else [tables]:
        p = t.export()
        for i, k in enumerate(p["keys"].tolist()):
            assert k not in out, f"key {k} in two shards"
            out[k] = tuple(p[f][i].tobytes() if p[f].ndim > 1 else p[f][i].item()
                           for f in fields)
    return out

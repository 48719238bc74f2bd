"""Saving the chief's gathered copies of parameter-server shards (``de.save`` under a
ParameterServerStrategy; ``remote_shards.staged_core_shards`` makes the copies).

Deltas (``base=...``): the core tracks which rows a table wrote since its last save, but a PS
shard's table lives in the PS process, and its copy in the chief is a fresh table that knows
nothing of the base. So the changed rows are found by content: every copied row is compared bit
for bit (values, slots, last_update, update_count, stepped) with the base chain's row of its key;
the copy is then marked as holding the base, and the rows that differ (or are new) are written
again with the same content, which stamps them as changed. The core's delta writer does the rest
(tombstones: the base's keys that are gone). A delta so holds exactly what differs from the base,
whatever the shard was saved to or loaded from in between.

The copies are handed to the core as :class:`Untracked`: the core marks the tables it saved
(after a background save, from its thread), and a copy is freed when ``de.save`` returns.
"""

from __future__ import annotations

import numpy as np

from dualemb.core import checkpoint as _ckpt
from dualemb.core.checkpoint import CheckpointError
from dualemb.core.spec import to_spec
from dualemb._native import load_extension
from dualemb.core.table import Table

_core = load_extension("_core")  # the core's pybind11 binding (csrc/python)

_FIELDS = ("values", "slots", "last_update", "update_count", "stepped")


def mark_changes_since(base, staged: dict) -> None:
    """``staged``: name -> (core tables of the variable's shards, remote flags) as
    ``staged_core_shards`` yields them. Marks every staged copy of a remote shard as holding
    ``base`` with exactly its rows that differ from the base's marked changed. Local shards are
    left to the core's own change tracking. Only scratch copies are written."""
    names = [n for n, (_, remote) in staged.items() if any(remote)]
    if not names:
        return
    readers = {}
    try:
        for name in names:
            readers[name] = _whole_table_like(staged[name][0][0])
        # One load verifies the whole base chain (checksums, dims, dtypes) and reads every
        # table's rows, before any copy is marked.
        _ckpt.load(base, readers)
        for name in names:
            digest = readers[name].changes_label  # the base's manifest SHA-256, set by the load
            base_rows = _BaseRows(readers[name].export())
            tables, remote = staged[name]
            for t, r in zip(tables, remote):
                if r:
                    _mark(t, base_rows, digest, name)
    finally:
        for table in readers.values():
            table.destroy()


def _whole_table_like(shard) -> Table:
    """An empty in-memory table of the shard's dim, dtypes and initializer that holds any number
    of rows: the base's rows of every shard are read into one, and a shard's capacity would
    refuse or evict them."""
    config, _ = shard.describe()
    config = {k: v for k, v in config.items()
              if k not in ("capacity", "evict_policy", "backend", "redis")}
    return Table.attach(_core.create(0, to_spec(config)))


class _BaseRows:
    """The base's rows of one table, found by key (int keys sorted, string keys by dict)."""

    def __init__(self, page: dict):
        self.page = page
        keys = page["keys"]
        self.string = keys.dtype == object
        if self.string:
            self.index = {k: i for i, k in enumerate(keys.tolist())}
        else:
            self.order = np.argsort(keys, kind="stable")
            self.sorted = keys[self.order]

    def positions(self, keys: np.ndarray) -> np.ndarray:
        """Row index in the base of each key, -1 where the base lacks it."""
        if self.string:
            return np.fromiter((self.index.get(k, -1) for k in keys.tolist()), np.int64,
                               len(keys))
        if not len(self.sorted):
            return np.full(len(keys), -1, np.int64)
        at = np.minimum(np.searchsorted(self.sorted, keys), len(self.sorted) - 1)
        return np.where(self.sorted[at] == keys, self.order[at], -1)


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row, whether a[i] and b[i] are equal bit for bit (-0.0 and NaN payloads included)."""
    n = len(a)
    if a.shape != b.shape or a.dtype != b.dtype:
        return np.zeros(n, bool)
    if a.dtype == object:  # string values
        return np.array([bool(np.all(x == y)) for x, y in zip(a.reshape(n, -1),
                                                             b.reshape(n, -1))], bool)
    if n == 0 or a.size == 0:
        return np.ones(n, bool)
    return (np.ascontiguousarray(a).view(np.uint8).reshape(n, -1)
            == np.ascontiguousarray(b).view(np.uint8).reshape(n, -1)).all(axis=1)


def _mark(table, base: _BaseRows, digest: str, name: str) -> None:
    page = table.export()
    at = base.positions(page["keys"])
    found = at >= 0
    same = found.copy()
    for field in _FIELDS:
        same[found] &= _same_bits(page[field][found], base.page[field][at[found]])
    clock = table.clock
    token = table.changes_begin()
    if not token:
        raise CheckpointError(f"table {name!r}: the staged copy of a parameter-server shard "
                              "tracks no changes; save a full checkpoint")
    table.changes_commit(token, digest)  # rows written before: the base's (unchanged)
    changed = ~same
    if changed.any():  # written again, same content: stamped as changed since the mark
        table.import_rows(*(page[f][changed] for f in ("keys",) + _FIELDS))
    table.clock = clock  # as the full save of this copy would record it


class Untracked:
    """A gathered copy as the checkpoint writer sees it: the copy itself for reading and
    ``clone`` (a background save's snapshot), but no save generation (``changes_begin`` gives
    0, as for a backend without tracking), so that nothing marks the copy after ``de.save`` has
    freed it; the delta writer's own marks on the copy, and on a snapshot's clone, are kept."""

    def __init__(self, table):
        self._table = table

    def __getattr__(self, name):
        return getattr(self._table, name)

    def changes_begin(self) -> int:
        return 0

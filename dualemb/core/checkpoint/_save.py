"""checkpoint.save: one process saves its tables; the one-writer case of the commit protocol
(``_parts.py``, ``_commit.py``), after checking every argument before anything is written."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from dualemb.core.checkpoint import _delta, _fs, _parts
from dualemb.core.checkpoint._manifest import dumps
from dualemb.core.checkpoint._write import dense_arrays, describe, int_or_none, shards_of


def save(path, tables, *, steps=None, dense=None, metadata=None, page_rows=1 << 16,
         base=None) -> None:
    """Saves `tables` (name -> Table or list of its live shards), their optimizer `steps`, the
    `dense` parameters and JSON `metadata` as a checkpoint directory at `path`, atomically
    replacing any checkpoint already there. See docs/checkpoint_format.md.

    With ``base`` (the path of a checkpoint, full or delta), writes a *delta*: only the rows
    written since the tables were saved to (or loaded from) ``base``, and tombstones for the
    base's keys that are gone (§10). ``load`` follows the chain to the full checkpoint. Each
    table must have been saved to or loaded from ``base`` last (else ``CheckpointError``), and
    not have changed its dtypes, dim, initializer or optimizer since.

    Every save that is published marks the tables: later deltas hold the rows written after it.
    A failed save marks nothing."""
    path = _fs.normalize(path)
    if not isinstance(tables, Mapping):
        raise TypeError(f"tables must be a mapping of name -> Table, got {type(tables).__name__}")
    if isinstance(page_rows, bool) or not isinstance(page_rows, (int, np.integer)) or page_rows < 1:
        raise ValueError(f"page_rows must be a positive integer, got {page_rows!r}")
    plan = {}
    for name, value in tables.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"table names must be non-empty strings, got {name!r}")
        plan[name] = shards_of(name, value)
    if isinstance(steps, Mapping):
        unknown = set(steps) - set(tables)
        if unknown:
            raise ValueError(f"steps given for unknown tables {sorted(unknown)}")
        step_of = {name: int_or_none(name, steps.get(name)) for name in plan}
    else:  # None or one integer for every table
        step_of = {name: int_or_none(name, steps) for name in plan}
    dense = dense_arrays(dense)
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a JSON object (dict), got {type(metadata).__name__}")
    metadata = dict(metadata)
    dumps({"metadata": metadata})  # fail now, not after writing gigabytes
    for name, shards in plan.items():
        describe(name, shards)  # the shards of each table agree
    if base is not None:
        _delta.save_delta(path, plan, base, steps=step_of, dense=dense or None,
                          metadata=metadata, page_rows=int(page_rows))
        return
    # Begun before the rows are read: rows written from here on are changed for the next delta.
    tokens = [(t, t.changes_begin()) for shards in plan.values() for t in shards
              if hasattr(t, "changes_begin")]
    published: dict = {}
    _parts.save(path, {name: list(enumerate(shards)) for name, shards in plan.items()},
                names=list(plan), steps=step_of, dense=dense or None, metadata=metadata,
                page_rows=int(page_rows), published=published)
    for t, token in tokens:
        if token:
            t.changes_commit(token, published["digest"])

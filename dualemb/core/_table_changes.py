"""Change tracking and evicted-row capture of a core ``Table`` (mixed into ``Table``).

Change tracking serves delta checkpoints (docs/checkpoint_format.md §10): every write stamps the
rows it writes with the table's write generation; ``changes_begin`` moves it on and returns a
token, and ``changes_commit(token, label)`` makes the token the table's *mark* once the checkpoint
named ``label`` is published. Rows written since the mark are ``count_changed`` /
``export_changed``. ``dualemb.core.checkpoint`` calls these; a snapshot taken between
``changes_begin`` and the commit sees the same rows. Backends without tracking (Redis) refuse
with a ValueError naming the reason (``changes_begin`` returns 0 there, so full saves work).

Evicted-row capture: ``capture_evicted()`` makes the table keep every row that a capacity eviction
or ``restrict`` removes (keys and metadata; with ``rows=True`` also values and slots) until
``take_evicted()`` hands them over. In-memory tables with int64/int32 keys and numeric values.
"""

from __future__ import annotations

import numpy as np

from dualemb._native import load_extension
from dualemb.core import _string_keys
from dualemb.core import value_dtypes as _vd

_core = load_extension("_core")


class ChangeTracking:
    """Methods of ``Table`` (``self._id``, ``self._dim``, dtypes, ``num_slots``)."""

    def changes_begin(self) -> int:
        """Starts a save: returns its token (0 if this backend does not track changes). Rows
        written from now on count as changed after the token is committed."""
        return int(_core.changes_begin(self._id))

    def changes_commit(self, token: int, label: str) -> None:
        """Makes ``token`` (from ``changes_begin``) the mark: rows written before it no longer
        count as changed. ``label`` names the checkpoint the mark stands for."""
        _core.changes_commit(self._id, int(token), str(label))

    @property
    def changes_label(self) -> str:
        """The label of the last committed mark ("" before the first)."""
        return _core.changes_label(self._id)

    def count_changed(self) -> int:
        """Rows written since the mark."""
        return int(_core.count_changed(self._id))

    def export_changed(self, cursor: int = 0, limit: int = 1 << 16) -> tuple[dict, int]:
        """One page of the rows written since the mark, scanning from row position ``cursor``
        (0 at first): ``(page, next_cursor)``, the page as ``export`` gives it (``keys``,
        ``values``, ``slots``, ``last_update``, ``update_count``, ``stepped``), empty at the
        end. Stable while the table is not modified."""
        limit = int(limit)
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        strings = self._key_dtype_name == _string_keys.STRING
        keys = None if strings else np.empty(limit, self._key_dtype)
        values = np.empty((limit, self._dim), self._value_dtype)
        last = np.empty(limit, np.int64)
        count = np.empty(limit, np.int64)
        stepped = np.empty(limit, np.uint8)
        for attempt in range(3):
            slots = np.empty((limit, self.num_slots, self._dim), self._value_dtype)
            try:
                n, nxt, skeys = _core.export_changed_page(
                    self._id, int(cursor), limit, keys, values,
                    None if self._value_dtype_name == _vd.STRING else slots, last, count,
                    stepped)
                break
            except ValueError as e:  # an optimizer attached meanwhile: read its slots again
                if "slots buffer sized for" not in str(e) or attempt == 2:
                    raise
        if strings:
            keys = np.empty(n, object)
            keys[:] = skeys
        return ({"keys": keys[:n], "values": values[:n], "slots": slots[:n],
                 "last_update": last[:n], "update_count": count[:n],
                 "stepped": stepped[:n].astype(bool)}, int(nxt))

    def capture_evicted(self, enabled: bool = True, *, rows: bool = False) -> None:
        """Keeps the rows that capacity evictions and ``restrict`` remove from now on (keys and
        metadata; with ``rows=True`` also values and slots) until ``take_evicted``. Each call
        drops what was kept; ``capture_evicted(False)`` stops."""
        _core.capture_evicted(self._id, (2 if rows else 1) if enabled else 0)

    def take_evicted(self, page_rows: int = 1 << 16) -> dict:
        """Hands over (and forgets) the rows evicted since capture started or the last take:
        ``{"keys", "last_update", "update_count"}`` and, when capturing rows, ``"values"`` and
        ``"slots"`` ``[n, num_slots, dim]``, oldest first. The metadata are the rows' own at
        eviction."""
        with_rows = True
        parts = []
        while True:
            keys = np.empty(page_rows, self._key_dtype)
            last = np.empty(page_rows, np.int64)
            count = np.empty(page_rows, np.int64)
            values = np.empty((page_rows, self._dim), self._value_dtype) if with_rows else None
            slots = (np.empty((page_rows, self.num_slots, self._dim), self._value_dtype)
                     if with_rows else None)
            try:
                n, remaining = _core.take_evicted_page(self._id, page_rows, keys, values, slots,
                                                       last, count)
            except ValueError as e:
                if with_rows and "rows were not captured" in str(e):
                    with_rows = False
                    continue
                raise
            part = {"keys": keys[:n], "last_update": last[:n], "update_count": count[:n]}
            if with_rows:
                part.update(values=values[:n], slots=slots[:n])
            parts.append(part)
            if remaining == 0 or n == 0:
                break
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

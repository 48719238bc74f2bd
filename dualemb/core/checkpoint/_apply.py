"""checkpoint.apply: brings live tables that answer lookups to a newer checkpoint in place.

``load`` replaces a table's contents by clearing it first, so a lookup running meanwhile finds
keys missing (and gets the initializer's row). ``apply`` never clears:

- a **delta** (docs/checkpoint_format.md §10) applies on top of the checkpoint the tables hold
  (their change-tracking label, set by every load, save and apply, must be the delta's base
  SHA-256): its tombstones are erased, then its rows imported;
- a **full** checkpoint replaces whatever the tables hold: the live keys it lacks are erased,
  then its rows imported over the live ones.

Erasing first keeps a capacity-limited table from evicting rows the import is about to keep.
Each row goes from its old state to its new one in one core call that holds the table's lock
exclusively (``import_rows``, ``erase``), and lookups (``find``) hold it shared, so a lookup sees
every row either before or after the update, never half-written. A lookup of several keys may
see some rows already at the new step and others not yet (the update is applied page by page).

Everything that can be checked (manifest, checksums of every file read, dtypes, dims, the
optimizer, the base) is checked before a live table is modified; a refusal leaves the tables
unchanged. Afterwards the tables' label is the applied checkpoint's manifest SHA-256, so the
next delta applies on top and ``checkpoint.save(..., base=)`` of the same tables works too. A
failure after writing began (out of memory) labels them with no checkpoint instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from dualemb.core.checkpoint import _delta, _fs, _manifest
from dualemb.core.checkpoint import _load
from dualemb.core.checkpoint import _string_keys as _skeys
from dualemb.core.checkpoint._manifest import CheckpointError
from dualemb.core.checkpoint._write import shards_of, workers
from dualemb.core.table import Table

_KEYS_PAGE = 1 << 16


@dataclass(frozen=True)
class Applied:
    """One checkpoint applied to live tables: where, its identity (the manifest's SHA-256),
    whether it was a delta, and the steps of the tables applied."""
    path: str
    digest: str
    delta: bool
    steps: dict


def held_label(shards: list) -> str:
    """The checkpoint (manifest SHA-256) the live shards hold, "" for none; every shard of a
    table must agree (a partial apply or a write between them leaves them apart)."""
    labels = {t.changes_label for t in shards}
    return labels.pop() if len(labels) == 1 else ""


def apply(path, tables: Mapping, *, partitioner=None) -> Applied:
    """Applies the checkpoint at ``path`` (a delta on the one the tables hold, or a full one) to
    the live ``tables`` (name -> Table or list of live shards) in place, while lookups go on.

    ``partitioner`` routes keys to live shards as in ``load``. Raises ``CheckpointError`` (the
    tables unchanged) for a delta that is not on the checkpoint the tables hold, a table the
    checkpoint lacks, a mismatched dim/dtype/optimizer or a corrupt file.
    """
    if not isinstance(tables, Mapping) or not tables:
        raise TypeError("tables must be a non-empty mapping name -> Table (or list of shards)")
    root = _fs.resolve(_fs.normalize(path))
    manifest, digest = _manifest.read_with_digest(root)
    entries = {t["name"]: t for t in manifest["tables"]}
    missing = [n for n in tables if n not in entries]
    if missing:
        raise CheckpointError(f"tables {missing} are not in the checkpoint at {root} (it has "
                              f"{sorted(entries)})")
    delta = manifest.get("base") is not None
    parts = partitioner if isinstance(partitioner, Mapping) else {n: partitioner for n in tables}
    jobs = []
    pool = ThreadPoolExecutor(workers(), thread_name_prefix="dualemb-apply")
    try:
        # ---- phase 1: verify everything; no live table is modified -----------------------------
        for name, value in tables.items():
            e = entries[name]
            live = shards_of(name, value)
            if delta:
                want = manifest["base"]["manifest_sha256"]
                held = held_label(live)
                if held != want:
                    raise CheckpointError(
                        f"table {name!r} holds checkpoint {held or '(none)'}, but the delta at "
                        f"{root} is on {want}: apply its base (or a full checkpoint) first")
            job = _load._Job(name, e, live, len(live), single=not isinstance(value, (list, tuple)))
            job.partitioner = parts.get(name) or _load._default_partitioner
            if _skeys.is_string(e) and (isinstance(job.partitioner, _load.Subset) or (
                    job.num_live > 1 and job.partitioner is _load._default_partitioner)):
                raise CheckpointError(f"table {name!r} has string keys: it applies whole into "
                                      "one live table, or into several with a partitioner")
            job.layers = [(root, e, _load._open_and_check(job, root, e), None)]
            jobs.append(job)
        _load._verify_all(jobs, pool)
        _load._check_distinct_live(jobs)
        removals = {}
        for job in jobs:
            _load._check_live(job)
            if job.set_optimizer and any(int(t.size()) for t in job.set_optimizer):
                raise CheckpointError(
                    f"table {job.name!r}: the live optimizer is not the checkpoint's "
                    f"{job.entry['optimizer']!r}; applying in place would reset every row's "
                    "slots (load the checkpoint instead)")
            if job.set_optimizer:  # empty tables (a server's first apply) take it as load does
                _load._validate_optimizer(job, Table)
            if delta:  # the rows a delta adds could push a shard past its capacity: an eviction
                for j, t in enumerate(job.live):  # would silently lose rows of the checkpoint
                    cap = int(t.describe()[0].get("capacity", 0))
                    if cap and int(t.size()) + int(job.counts[j]) > cap:
                        raise CheckpointError(
                            f"table {job.name!r}: live shard {j} holds {int(t.size())} rows and "
                            f"the delta writes {int(job.counts[j])} into it, more than its "
                            f"capacity {cap} allows; a serving table needs room for the "
                            "trainer's rows (create it without a capacity)")
            string = _skeys.is_string(job.entry)
            if delta:
                removals[job.name] = _delta.file_keys(
                    root, job.entry["tombstones"], string,
                    f"table {job.name!r} tombstones in {root}")
            else:  # the keys it holds: every live key outside them goes
                keep = _delta.KeySet(string)
                for r in job.readers:
                    keep.add(_delta.read_keys(r, string))
                removals[job.name] = keep

        # ---- phase 2: update the live tables, each row in one core call ---------------------
        try:
            for job in jobs:
                for t in job.set_optimizer:
                    t.set_optimizer(job.entry["optimizer"])
                for t in job.live:
                    _erase(t, removals[job.name], delta)
                _load._import(job, job.partitioner, pool)
                for t in job.live:
                    if job.clock > t.clock:
                        t.clock = job.clock
        except BaseException:
            # Part way (out of memory): the tables hold no checkpoint now. Labelled with none,
            # so no delta applies on top; the next full checkpoint repairs them.
            _load.label_tables(jobs, "")
            raise
    finally:
        pool.shutdown(wait=True)
        for job in jobs:
            job.close()
    # The tables now hold this checkpoint: the next delta applies on top of it.
    _load.label_tables(jobs, digest)
    return Applied(path=root, digest=digest, delta=delta,
                   steps={job.name: job.entry["step"] for job in jobs})


def _erase(table, removal, delta: bool) -> None:
    """A delta's tombstones (erasing an absent key does nothing, so every shard gets them all),
    or for a full checkpoint the live keys it does not hold."""
    if delta:
        for a in range(0, len(removal), _KEYS_PAGE):
            table.erase(removal[a:a + _KEYS_PAGE])
        return
    stale = []
    n = int(table.size())
    for offset in range(0, n, _KEYS_PAGE):
        keys = table.export_keys(offset, min(_KEYS_PAGE, n - offset))
        stale.append(keys[~removal.contains(keys)])
    for keys in stale:  # erased after the scan: erasing moves rows, and export pages by position
        if len(keys):
            table.erase(keys)

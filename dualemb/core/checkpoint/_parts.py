"""Tables saved by several writers into one checkpoint: each writer saves the shards it holds, the
coordinator merges their records into the manifest; the commit protocol (``_commit.py``) runs
it. ``checkpoint.save`` is the one-writer case; ``dualemb.tf`` (MultiWorkerMirroredStrategy) and
``dualemb.jax.sharded`` (jax.distributed) call :func:`save` from every process with their own
``sync``. With ``base=`` every writer writes a delta of its shards (``_parts_delta.py``).
docs/checkpoint_format.md §6, "Several writers", and §10.
"""

from __future__ import annotations

from dualemb.core.checkpoint import _part_marks, _parts_delta
from dualemb.core.checkpoint._commit import Sync, commit, single_process
from dualemb.core.checkpoint._manifest import digest, dumps
from dualemb.core.checkpoint._part_records import merge, write_part
from dualemb.core.checkpoint._staging import Staging
from dualemb.core.checkpoint._write import dense_arrays

# What ``checkpoint.parts`` offers the front ends (and later kinds of checkpoint): the tables'
# save, and the protocol under it with its staging directory and the one-writer ``sync``.
__all__ = ["save", "write_part", "merge", "commit", "single_process", "Staging"]


def save(path, tables, *, names: list, sync: Sync = single_process, part: int = 0,
         num_parts: int = 1, coordinator: bool = True, steps=None, dense=None, metadata=None,
         page_rows: int = 1 << 16, published: dict | None = None, base=None,
         num_shards: dict | None = None, mark_changes: bool = False) -> None:
    """Writes this writer's shards of one checkpoint at ``path`` (every writer calls it).

    ``names``: every table of the checkpoint, in the same order on every writer (it fixes the
    file names); ``tables``: name -> [(global shard index, Table)] of the shards this writer holds
    (a table's indices are distinct across writers and together 0..N-1), or a function returning
    that (called inside the protocol, so that its failure reaches every writer instead of leaving
    them at a barrier). ``steps``, ``dense``, ``metadata``: the coordinator's are recorded.
    ``sync``, ``part``, ``num_parts``, ``coordinator``: see ``_commit.commit``. ``published``
    (coordinator): receives ``"digest"``, the SHA-256 of the manifest it writes (the label of
    the tables' change-tracking mark).

    ``mark_changes``: once the checkpoint is published, every writer's tables take its mark
    (one more ``sync`` round hands the manifest digest to every writer), so that a delta on it
    can follow. ``base`` (a checkpoint path, full or delta): writes a *delta* instead
    (docs/checkpoint_format.md §10; always marks): each writer the rows its tables wrote since
    ``base`` and tombstones for the base's keys its shards no longer hold; ``num_shards`` (name
    -> N, required with ``base``) is each table's total shard count, its shards routed by
    ``dualemb.core.routing.shard_of(key, N)`` (how a writer knows which of the base's keys are
    its own)."""
    if base is not None:
        _parts_delta.save(path, tables, names=names, base=base, num_shards=num_shards, sync=sync,
                          part=part, num_parts=num_parts, coordinator=coordinator, steps=steps,
                          dense=dense, metadata=metadata, page_rows=page_rows,
                          published=published)
        return
    names = list(names)
    tokens: list = []

    def write(staging: Staging) -> dict:
        if coordinator:  # checked before writing gigabytes; written in the manifest step
            dense_arrays(dense)
            dumps({"metadata": dict(metadata or {})})
        local = tables() if callable(tables) else tables
        if mark_changes:  # begun before the rows are read: later writes are the next delta's
            tokens.extend(_part_marks.begin(t for shards in local.values() for _, t in shards))
        return write_part(staging, names, local, page_rows)

    mine: dict = {}

    def manifest(staging: Staging, records: list) -> dict:
        m = merge(staging, records, names, steps=steps, dense=dense, metadata=metadata)
        mine["digest"] = digest(dumps(m))
        return m

    commit(path, sync, part=part, num_parts=num_parts, coordinator=coordinator, write=write,
           manifest=manifest)
    if published is not None and coordinator:
        published["digest"] = mine["digest"]
    if mark_changes:
        _part_marks.commit(tokens, _part_marks.share_digest(sync, mine.get("digest")))

"""Tables saved by several writers into one checkpoint: each writer saves the shards it holds, the
coordinator merges their records into the manifest; the commit protocol (``_commit.py``) runs
it. ``checkpoint.save`` is the one-writer case; ``dualemb.tf`` (MultiWorkerMirroredStrategy) and
``dualemb.jax.sharded`` (jax.distributed) call :func:`save` from every process with their own
``sync``. docs/checkpoint_format.md §6, "Several writers".
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from dualemb.core.checkpoint._commit import Sync, commit, single_process
from dualemb.core.checkpoint._manifest import (DENSE_FILE, FORMAT, VERSION, CheckpointError,
                                               digest, dumps, shard_file_name)
from dualemb.core.checkpoint._staging import Staging
from dualemb.core.checkpoint._write import (dense_arrays, describe, int_or_none, workers,
                                            write_dense, write_shard)

# What ``checkpoint.parts`` offers the front ends (and later kinds of checkpoint): the tables'
# save, and the protocol under it with its staging directory and the one-writer ``sync``.
__all__ = ["save", "write_part", "merge", "commit", "single_process", "Staging"]

# The fields every shard of one table must agree on.
_AGREE = ("key_dtype", "value_dtype", "dim", "initializer", "optimizer", "slot_names")


def save(path, tables, *, names: list, sync: Sync = single_process, part: int = 0,
         num_parts: int = 1, coordinator: bool = True, steps=None, dense=None, metadata=None,
         page_rows: int = 1 << 16, published: dict | None = None) -> None:
    """Writes this writer's shards of one checkpoint at ``path`` (every writer calls it).

    ``names``: every table of the checkpoint, in the same order on every writer (it fixes the
    file names); ``tables``: name -> [(global shard index, Table)] of the shards this writer holds
    (a table's indices are distinct across writers and together 0..N-1), or a function returning
    that (called inside the protocol, so that its failure reaches every writer instead of leaving
    them at a barrier). ``steps``, ``dense``, ``metadata``: the coordinator's are recorded.
    ``sync``, ``part``, ``num_parts``, ``coordinator``: see ``_commit.commit``. ``published``
    (coordinator): receives ``"digest"``, the SHA-256 of the manifest it writes (the label of
    the tables' change-tracking mark)."""
    names = list(names)

    def write(staging: Staging) -> dict:
        if coordinator:  # checked before writing gigabytes; written in the manifest step
            dense_arrays(dense)
            dumps({"metadata": dict(metadata or {})})
        return write_part(staging, names, tables() if callable(tables) else tables, page_rows)

    def manifest(staging: Staging, records: list) -> dict:
        m = merge(staging, records, names, steps=steps, dense=dense, metadata=metadata)
        if published is not None:
            published["digest"] = digest(dumps(m))
        return m

    commit(path, sync, part=part, num_parts=num_parts, coordinator=coordinator, write=write,
           manifest=manifest)


def write_part(staging: Staging, names: list, tables: dict, page_rows: int) -> dict:
    """Writes the shard files of ``tables`` into ``staging`` (fsynced); returns the part record
    that lists them with their checksums."""
    record = {}
    with ThreadPoolExecutor(workers(), thread_name_prefix="dualemb-ckpt") as pool:
        for name, shards in tables.items():
            if name not in names:
                raise ValueError(f"table {name!r} is not one of the checkpoint's tables {names}")
            if not shards:
                continue  # a writer that holds no shard of this table
            i = names.index(name)
            info = describe(name, [t for _, t in shards])
            files = []
            for j, t in shards:
                with staging.new_file(shard_file_name(i, j)) as fpath:
                    entry = write_shard(t, fpath, name, j, info, page_rows, pool)
                files.append({"index": int(j), **entry})
            record[name] = {"info": info, "shards": files}
    return {"tables": record}


def _merge_table(name: str, records: list, steps) -> dict:
    """The manifest's entry of table ``name`` from the records' shard lists, in index order."""
    info, shards = None, []
    for rec in records:
        t = rec["tables"].get(name)
        if t is None:
            continue
        if info is None:
            info = t["info"]
        for field in _AGREE:
            if t["info"][field] != info[field]:
                raise CheckpointError(
                    f"table {name!r}: process {rec['part']} has {field} {t['info'][field]!r}, "
                    f"another has {info[field]!r}; the shards of one table must agree")
        shards += t["shards"]
    if info is None:
        raise CheckpointError(f"table {name!r}: no process saved a shard of it")
    shards.sort(key=lambda s: s["index"])
    indices = [s["index"] for s in shards]
    if indices != list(range(len(shards))):
        raise CheckpointError(f"table {name!r}: the processes saved shards {indices}; "
                              f"expected each of 0..{len(shards) - 1} exactly once")
    step = int_or_none(name, steps.get(name) if isinstance(steps, dict) else steps)
    files = [{k: v for k, v in s.items() if k != "index"} for s in shards]
    return {"name": name, **info, "step": step, "rows": sum(f["rows"] for f in files),
            "shards": files}


def merge(staging: Staging, records: list, names: list, *, steps=None, dense=None,
          metadata=None) -> dict:
    """Coordinator: the manifest of the checkpoint from every writer's record; writes the dense
    file into ``staging`` first."""
    tables = [_merge_table(name, records, steps) for name in names]
    dense = dense_arrays(dense)
    dense_entry = None
    if dense:
        with staging.new_file(DENSE_FILE) as fpath:
            dense_entry = write_dense(fpath, dense)
    return {"format": FORMAT, "version": VERSION, "created_unix": time.time(),
            "metadata": dict(metadata or {}), "dense": dense_entry, "tables": tables}

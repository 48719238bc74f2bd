"""The part records of a multi-writer checkpoint (docs/checkpoint_format.md §6): what one writer
wrote (its shard files with their checksums), and the manifest's table entries the coordinator
merges from every writer's record. Used by full saves (``_parts.py``), single-writer deltas
(``_delta.py``) and multi-writer deltas (``_parts_delta.py``).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from dualemb.core.checkpoint._manifest import (DENSE_FILE, FORMAT, VERSION, CheckpointError,
                                               shard_file_name)
from dualemb.core.checkpoint._staging import Staging
from dualemb.core.checkpoint._write import (dense_arrays, describe, int_or_none, workers,
                                            write_dense, write_shard)

# The fields every shard of one table must agree on.
_AGREE = ("key_dtype", "value_dtype", "dim", "initializer", "optimizer", "slot_names")


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

"""One checkpoint written by several processes: each process writes the shard files of the table
shards it holds into one shared staging directory, and one process (the coordinator) then writes
the manifest and publishes the directory (docs/checkpoint_format.md §6, "Several writers").

The sequence, which the caller runs with a barrier between the steps (e.g. a collective
all-reduce, ``dualemb/tf/distribute/job_checkpoint.py``):

1. coordinator: ``staging = begin(path, token)`` (``token``: a random positive integer that every
   process then learns, e.g. through the same all-reduce that serves as the barrier);
2. every process: ``write_part(find_staging(path, token), part, tables)``: its shard files,
   fsynced, then a small part record (written to a temporary name, fsynced, renamed) listing
   them with their checksums;
3. coordinator, once every process has finished step 2: ``finish(staging, path, num_parts,
   names, ...)`` checks that every part record is there and that the parts agree, writes the
   dense file and the manifest (last), removes the part records and publishes the directory
   exactly as a single-process save does; or ``abort(staging)`` if a process failed.

Until step 3 publishes it, the staging directory has no ``manifest.json``: a crash anywhere leaves
the previous checkpoint at ``path``. The directory must be on a file system every process sees
(one machine, or a shared mount with atomic rename such as NFS).
"""

from __future__ import annotations

import glob
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

from dualemb.core.checkpoint import _fs
from dualemb.core.checkpoint._manifest import (DENSE_FILE, FORMAT, VERSION, CheckpointError,
                                               shard_file_name)
from dualemb.core.checkpoint._manifest import write_files as write_manifest_files
from dualemb.core.checkpoint._safetensors import fsync_dir
from dualemb.core.checkpoint._save import (_dense_arrays, _describe, _int_or_none, _workers,
                                           _write_dense, _write_new_file, _write_shard)

_PART = ".part-{:05d}.json"  # hidden: never mistaken for a checkpoint file, removed on finish


def _staging_name(path: str, token: int) -> str:
    # The coordinator's host and pid, as single-process temporary directories have, so that
    # _fs.clean_stale removes the directory of a crashed save like any other.
    return f"{_fs.tmp_prefix(path)}{_fs._host()}-{os.getpid()}-job{int(token):016x}"


def begin(path, token: int) -> str:
    """Coordinator: checks ``path`` as ``checkpoint.save`` does and creates the staging
    directory for ``token``. Returns its path."""
    path = _fs.normalize(path)
    _fs.prepare_target(path)
    staging = _staging_name(path, token)
    os.mkdir(staging, 0o755)
    return staging


def find_staging(path, token: int) -> str:
    """Any process: the staging directory the coordinator made for ``token``."""
    path = _fs.normalize(path)
    found = glob.glob(glob.escape(_fs.tmp_prefix(path)) + f"*-job{int(token):016x}")
    if len(found) != 1:
        raise CheckpointError(
            f"{path}: the staging directory of this save is not visible from this process "
            f"(found {found}); every process of the job must see the same directory (one machine "
            "or a shared file system)")
    return found[0]


def write_part(staging: str, part: int, names: list, tables: dict, *,
               page_rows: int = 1 << 16) -> None:
    """Writes this process's shards into ``staging``. ``names``: every table of the checkpoint,
    in the same order in every process (it fixes the file names); ``tables``: name -> [(global
    shard index, Table)] for the shards this process holds (the indices of one table are
    distinct across processes)."""
    record = {"format": FORMAT, "part": int(part), "tables": {}}
    with ThreadPoolExecutor(_workers(), thread_name_prefix="dualemb-ckpt") as pool:
        for name, shards in tables.items():
            i = names.index(name)
            info = _describe(name, [t for _, t in shards])
            files = []
            for j, t in shards:
                entry = _write_shard(t, os.path.join(staging, shard_file_name(i, j)), name, j,
                                     info, page_rows, pool)
                files.append({"index": int(j), **entry})
            record["tables"][name] = {"info": info, "shards": files}
    final = os.path.join(staging, _PART.format(int(part)))
    tmp = final + f".tmp-{os.getpid()}"
    _write_new_file(tmp, json.dumps(record, allow_nan=False).encode("utf-8"))
    os.rename(tmp, final)  # a part record is either complete or absent
    fsync_dir(staging)


def _read_parts(staging: str, num_parts: int) -> list:
    parts = []
    for k in range(num_parts):
        p = os.path.join(staging, _PART.format(k))
        try:
            with open(p, "rb") as f:
                rec = json.loads(f.read())
        except FileNotFoundError:
            raise CheckpointError(f"{staging}: process {k} did not write its part of the "
                                  "checkpoint (is the directory shared by every process?)") \
                from None
        if rec.get("format") != FORMAT or rec.get("part") != k:
            raise CheckpointError(f"{p}: not part {k} of a dualemb checkpoint")
        parts.append(rec)
    return parts


def _merge(parts: list, names: list, steps) -> list:
    """The manifest's table entries from the parts' shard lists, shards in global index order."""
    out = []
    for name in names:
        info, shards = None, []
        for rec in parts:
            t = rec["tables"].get(name)
            if t is None:
                continue
            if info is None:
                info = t["info"]
            for field in ("key_dtype", "value_dtype", "dim", "initializer", "optimizer",
                          "slot_names"):
                if t["info"][field] != info[field]:
                    raise CheckpointError(
                        f"table {name!r}: process {rec['part']} has {field} "
                        f"{t['info'][field]!r}, another has {info[field]!r}; the shards of one "
                        "table must agree")
            shards += t["shards"]
        if info is None:
            raise CheckpointError(f"table {name!r}: no process saved a shard of it")
        shards.sort(key=lambda s: s["index"])
        indices = [s["index"] for s in shards]
        if indices != list(range(len(shards))):
            raise CheckpointError(f"table {name!r}: the processes saved shards {indices}; "
                                  f"expected each of 0..{len(shards) - 1} exactly once")
        step = _int_or_none(name, steps.get(name) if isinstance(steps, dict) else steps)
        files = [{k: v for k, v in s.items() if k != "index"} for s in shards]
        out.append({"name": name, **info, "step": step,
                    "rows": sum(f["rows"] for f in files), "shards": files})
    return out


def finish(staging: str, path, num_parts: int, names: list, *, steps=None, dense=None,
           metadata=None) -> None:
    """Coordinator, after every process's ``write_part``: writes the manifest (last) and
    publishes ``staging`` at ``path``, atomically replacing the checkpoint there. On failure the
    staging directory is removed and ``path`` is untouched."""
    path = _fs.normalize(path)
    try:
        tables = _merge(_read_parts(staging, num_parts), list(names), steps)
        dense = _dense_arrays(dense)
        dense_entry = _write_dense(os.path.join(staging, DENSE_FILE), dense) if dense else None
        manifest = {"format": FORMAT, "version": VERSION, "created_unix": time.time(),
                    "metadata": dict(metadata or {}), "dense": dense_entry, "tables": tables}
        for k in range(num_parts):
            os.unlink(os.path.join(staging, _PART.format(k)))
        write_manifest_files(staging, manifest, _write_new_file)
        fsync_dir(staging)
        if os.path.lexists(path) and not _fs.is_complete(path):
            os.rmdir(path)  # an empty directory (begin refused anything else)
        _fs.publish(staging, path)
    except BaseException:
        abort(staging)
        raise


def abort(staging: str) -> None:
    """Removes a staging directory (no manifest is ever in it before ``finish``)."""
    _fs.remove_tree(staging)

"""The files of a checkpoint: table shards streamed page by page into safetensors files, and the
dense file. Every save (one process or several, docs/checkpoint_format.md §6) writes its files
through these functions into its staging directory (``_staging.py``)."""

from __future__ import annotations

import operator
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dualemb.core.checkpoint import _string_keys as _skeys
from dualemb.core.checkpoint import _string_values as _svals
from dualemb.core.checkpoint._manifest import FORMAT, SLOT_PREFIX, STEPPED, CheckpointError
from dualemb.core.checkpoint._safetensors import Writer, dtype_code, pwrite_all
from dualemb.core.value_dtypes import NUMPY as VALUE_NUMPY

# A page never exceeds this many bytes (whatever page_rows says), which bounds the memory a save
# uses to about two pages plus the slot columns being copied out.
PAGE_BYTES = 4 << 20
# Pages are written (and checksummed) by a few threads in pieces of at most this many bytes.
CHUNK_BYTES = 1 << 20
_INIT_KEYS = ("initializer", "seed", "mean", "stddev", "minval", "maxval", "value", "values")


def shards_of(name, value) -> list:
    if hasattr(value, "export") and hasattr(value, "describe"):
        return [value]
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"table {name!r}: expected a Table or a sequence of Table shards, "
                        f"got {type(value).__name__}")
    shards = list(value)
    if not shards:
        raise ValueError(f"table {name!r}: empty sequence of shards")
    for s in shards:
        if not (hasattr(s, "export") and hasattr(s, "describe")):
            raise TypeError(f"table {name!r}: shard {s!r} is not a Table")
    return shards


def int_or_none(name, v):
    if v is None:
        return None
    try:
        if isinstance(v, (bool, np.bool_)):
            raise TypeError
        return operator.index(v)  # int, numpy integer, 0-d integer arrays (numpy, jax, tf)
    except TypeError:
        raise TypeError(f"step of table {name!r} must be an integer or None, got {v!r}") from None


def describe(name: str, shards: list) -> dict:
    """The manifest fields that every shard of one logical table must agree on."""
    first = None
    for j, t in enumerate(shards):
        config, opt = t.describe()
        entry = {
            "key_dtype": str(config.get("key_dtype", "int64")),
            "value_dtype": str(config.get("value_dtype", "float32")),
            "dim": int(config["dim"]),
            "initializer": {k: config[k] for k in _INIT_KEYS if k in config},
            "optimizer": opt,
            "slot_names": list(t.slot_names),
            "capacity": int(config.get("capacity", 0)),
            "evict_policy": str(config.get("evict_policy", "recency")),
        }
        if first is None:
            first = entry
            continue
        for field in ("key_dtype", "value_dtype", "dim", "initializer", "optimizer",
                      "slot_names"):
            if entry[field] != first[field]:
                raise ValueError(f"table {name!r}: shard {j} has {field} {entry[field]!r}, "
                                 f"shard 0 has {first[field]!r}; shards of one table must agree")
    return first


def write_new_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        pwrite_all(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def _export_page(table, offset: int, limit: int) -> dict:
    """One page of `table`: its slots as the file's columns ("slot_columns") where the table
    exports them so, else as the export's [m, num_slots, dim] "slots" (indirection kept so tests
    can slow a save down; they may return either)."""
    if hasattr(table, "export_slot_columns"):
        return table.export_slot_columns(offset, limit)
    return table.export(offset, limit)


def workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def write_shard(table, path: str, name: str, shard: int, info: dict, page_rows: int,
                 pool: ThreadPoolExecutor, source=None) -> dict:
    """Streams the rows of `table` into the shard file at `path`; returns its manifest entry.
    `source` (a delta's ``_delta.ChangedRows``) replaces the table's rows by a subset: its
    ``count()``, ``page(offset, limit)`` in order, ``key_bytes(n)`` and ``value_bytes(n)``."""
    dim = info["dim"]
    slot_names = info["slot_names"]
    ns = len(slot_names)
    strings = _skeys.is_string(info)
    key_dtype = np.dtype(np.int64 if strings else info["key_dtype"])
    value_dtype = VALUE_NUMPY[info["value_dtype"]]  # values and slots keep the table's dtype
    clock0 = table.clock
    n = int(table.size()) if source is None else source.count()
    if strings:
        key_bytes = (_skeys.count_key_bytes(table, n, max(1, min(int(page_rows), 1 << 16)))
                     if source is None else source.key_bytes(n))
        key_tensors = _skeys.tensors(n, key_bytes)
    else:
        key_tensors = [("keys", key_dtype, (n,))]
    string_values = _svals.is_string(info)
    if string_values:
        value_bytes = (_svals.count_value_bytes(table, n, max(1, min(int(page_rows), 1 << 14)))
                       if source is None else source.value_bytes(n))
        value_tensors = _svals.tensors(n, dim, value_bytes)
    else:
        value_tensors = [("values", value_dtype, (n, dim))]
    tensors = [("last_update", np.int64, (n,)), ("update_count", np.int64, (n,)),
               *key_tensors, *value_tensors]
    tensors += [(SLOT_PREFIX + s, value_dtype, (n, dim)) for s in slot_names]
    # The stepped marks (optional in the format): a delta's pages (export_changed) carry them like
    # a full export; a GPU table's exports do not, so its checkpoints leave the tensor out and
    # their rows load by the default rule (stepped where the slots differ from the initial slots;
    # docs/checkpoint_format.md).
    with_stepped = bool(ns) and getattr(table, "has_stepped", True)
    if with_stepped:
        tensors.append((STEPPED, np.uint8, (n,)))
    writer = Writer(path, tensors, {"format": FORMAT, "table": name, "shard": str(shard)})
    row_bytes = value_dtype.itemsize * dim * (1 + ns) + 16 + key_dtype.itemsize
    rows_per_page = max(1, min(int(page_rows), PAGE_BYTES // row_bytes))

    def pieces(arr, row0):
        view = memoryview(arr.reshape(-1).view(np.uint8))
        pos = row0 * (arr.nbytes // len(arr))
        return [(pos + a, view[a:a + CHUNK_BYTES]) for a in range(0, len(view), CHUNK_BYTES)]

    def put(tname, row0, arr):
        """Queues a page's rows of one tensor, in pieces of at most CHUNK_BYTES."""
        return [pool.submit(writer.write_at, tname, pos, piece) for pos, piece in pieces(arr, row0)]

    def slot_task(j, row0, slots):
        # Copies slot column j out of [m, num_slots, dim] and writes it, in this worker thread.
        for pos, piece in pieces(np.ascontiguousarray(slots[:, j, :]), row0):
            writer.write_at(SLOT_PREFIX + slot_names[j], pos, piece)

    inflight: list = []  # futures of the page being written while the next one is exported
    done = 0
    key_writer = None
    value_writer = None
    try:
        if strings:
            key_writer = _skeys.KeyWriter(writer, key_bytes)
        if string_values:
            value_writer = _svals.ValueWriter(writer, dim, value_bytes)
        while done < n:
            page = (_export_page(table, done, min(rows_per_page, n - done)) if source is None
                    else source.page(done, min(rows_per_page, n - done)))
            m = len(page["keys"])
            if m == 0:
                break
            for f in inflight:
                f.result()
            inflight = []
            for tname in ("last_update", "update_count") + (() if string_values else ("values",)):
                inflight += put(tname, done, page[tname])
            if value_writer is not None:
                try:
                    value_writer.write_page(done, page["values"])
                except _svals.CorruptValues:
                    clock0 = None  # modified while saved: reported below
            if key_writer is None:
                inflight += put("keys", done, page["keys"])
            else:
                try:
                    key_writer.write_page(done, page["keys"])
                except _skeys.CorruptKeys:
                    clock0 = None  # modified while saved: reported below
            columns = page.get("slot_columns")
            if columns is None:  # split here, on the pool's threads
                inflight += [pool.submit(slot_task, j, done, page["slots"]) for j in range(ns)]
            elif len(columns) != ns:  # an optimizer attached meanwhile
                raise CheckpointError(
                    f"table {name!r} shard {shard} was modified while it was being saved (its "
                    f"slot count changed from {ns} to {len(columns)}); save again while no "
                    "thread writes to it")
            else:
                for j, column in enumerate(columns):
                    inflight += put(SLOT_PREFIX + slot_names[j], done, column)
            if with_stepped:
                inflight += put(STEPPED, done, page["stepped"].astype(np.uint8))
            done += m
            del page
        for f in inflight:
            f.result()
        inflight = []
        if done != n or table.clock != clock0 or list(table.slot_names) != slot_names or \
                (key_writer is not None and not key_writer.complete()) or \
                (value_writer is not None and not value_writer.complete()):
            raise CheckpointError(
                f"table {name!r} shard {shard} was modified while it was being saved "
                f"({done} of {n} rows exported); save again while no thread writes to it")
        entry = writer.finish()
    finally:
        for f in inflight:  # never close the file under a running write
            f.exception()
        writer.close()
    entry["rows"] = n
    entry["clock"] = int(clock0)
    return entry


def dense_arrays(dense) -> dict:
    if dense is None:
        return {}
    if not isinstance(dense, Mapping):
        raise TypeError(f"dense must be a mapping name -> array, got {type(dense).__name__}")
    arrays = {}
    for k, v in dense.items():
        if not isinstance(k, str) or not k or k == "__metadata__":
            raise ValueError(f"invalid dense parameter name {k!r}")
        a = np.asarray(v)
        try:
            dtype_code(a.dtype)
        except TypeError:
            raise TypeError(f"dense parameter {k!r} has dtype {a.dtype}, which safetensors "
                            "cannot store") from None
        arrays[k] = a
    return arrays


def write_dense(path: str, arrays: dict) -> dict:
    writer = Writer(path, [(k, a.dtype, a.shape) for k, a in arrays.items()],
                    {"format": FORMAT, "content": "dense"})
    try:
        for k, a in arrays.items():
            flat = a.reshape(-1)
            step = max(1, PAGE_BYTES // max(1, a.dtype.itemsize))
            for i in range(0, flat.size, step):
                writer.write(k, np.ascontiguousarray(flat[i:i + step]))
        return writer.finish()
    finally:
        writer.close()

"""checkpoint.load: verifies a whole checkpoint, then restores tables page by page."""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dualemb.core.checkpoint import _delta, _fs, _manifest
from dualemb.core.checkpoint import _string_keys as _skeys
from dualemb.core.checkpoint import _string_values as _svals
from dualemb.core.checkpoint._manifest import (KEY_DTYPES, META_TENSORS, SLOT_PREFIX, STEPPED,
                                               VALUE_DTYPES, CheckpointError)
from dualemb.core.checkpoint._result import Checkpoint
from dualemb.core.routing import shard_of
from dualemb.core.checkpoint._safetensors import Reader, crc32_combine
from dualemb.core.checkpoint._write import PAGE_BYTES, shards_of, workers
from dualemb.core.table import Table
from dualemb.core.value_dtypes import NUMPY as VALUE_NUMPY

_VERIFY_BUFFER = 4 << 20  # per thread; a multiple of 8, so verification chunks hold whole keys
_SEGMENT_BYTES = 32 << 20  # tensors are checksummed in segments of this size, in parallel


def read_manifest_at(root: str) -> dict:
    return _manifest.read(root)


def read_manifest(path) -> dict:
    """The parsed and validated manifest of the checkpoint at `path`."""
    return read_manifest_at(_fs.resolve(_fs.normalize(path)))


def load_dense_at(root: str, manifest: dict) -> dict:
    entry = manifest.get("dense")
    if entry is None:
        return {}
    reader = Reader(os.path.join(root, entry["file"]), entry, "dense parameters")
    try:
        reader.verify(bytearray(_VERIFY_BUFFER))
        return {name: reader.read_all(name) for name in entry["tensors"]}
    finally:
        reader.close()


def load_dense(path) -> dict:
    """The dense parameters saved with the checkpoint at `path` (checksums verified)."""
    root = _fs.resolve(_fs.normalize(path))
    return load_dense_at(root, read_manifest_at(root))


def _default_partitioner(keys: np.ndarray, n: int) -> np.ndarray:
    return shard_of(keys, n)


class Subset:
    """A partitioner for a process that holds only some of a table's keys (one process of a
    multi-process job): ``fn(keys, num_live_shards)`` returns the live shard of each key, or
    ``-1`` for a key no live shard of this process holds; those rows are skipped. Plain
    partitioners may not return -1 (a dropped row would be a silent loss); wrapping one in
    ``Subset`` says the skipping is meant."""

    def __init__(self, fn):
        if not callable(fn):
            raise TypeError(f"Subset takes a partitioner function, got {fn!r}")
        self.fn = fn

    def __call__(self, keys, n):
        return self.fn(keys, n)


def _route(partitioner, keys: np.ndarray, n: int, name: str) -> np.ndarray:
    """Live shard index of each key; -1 (skip the row) only from a ``Subset`` partitioner."""
    sid = np.asarray(partitioner(keys, n))
    if sid.shape != keys.shape or sid.dtype.kind not in "iu":
        raise CheckpointError(f"table {name!r}: partitioner returned {sid.dtype} {sid.shape}, "
                              f"expected integer shard indices of shape {keys.shape}")
    low = -1 if isinstance(partitioner, Subset) else 0
    if sid.size and (sid.min() < low or sid.max() >= n):
        raise CheckpointError(f"table {name!r}: partitioner returned shard indices outside "
                              f"[{low}, {n})")
    return sid.astype(np.intp, copy=False)


class _Job:
    """One logical table to restore: its manifest entry, readers and live (or new) shards."""

    def __init__(self, name: str, entry: dict, live: list | None, num_live: int,
                 single: bool):
        self.name = name
        self.entry = entry
        self.live = live
        self.num_live = num_live
        self.single = single
        self.readers: list[Reader] = []
        self.counts = np.zeros(num_live, np.int64)
        self.set_optimizer = []  # live shards that get the saved optimizer attached
        self.clock = max([int(s.get("clock", 0)) for s in entry["shards"]] + [0])
        self.max_last_update = -1  # over the imported rows (a clock below it would be wrong)
        self.partitioner = _default_partitioner
        # A delta's chain, newest first: (root, entry, readers, shadow) per checkpoint; a layer's
        # rows whose keys are in its shadow (rewritten or tombstoned by a newer layer) are
        # skipped. One layer with no shadow for a full checkpoint.
        self.layers: list = []

    def close(self):
        for r in self.readers:
            r.close()


def _expected_tensors(entry: dict) -> dict:
    v_dtype = VALUE_DTYPES[entry["value_dtype"]]
    dim = entry["dim"]
    if _svals.is_string(entry):  # shapes "n*dim+1" and "1-d": see _open_and_check
        out = {_svals.OFFSETS: ("I64", "n*dim+1"), _svals.BYTES: ("U8", "1-d")}
    else:
        out = {"values": (v_dtype, dim)}
    if _skeys.is_string(entry):  # shapes "n+1" and "1-d": see _open_and_check
        out.update({_skeys.OFFSETS: ("I64", "n+1"), _skeys.BYTES: ("U8", "1-d")})
    else:
        out["keys"] = (KEY_DTYPES[entry["key_dtype"]], None)
    for m in META_TENSORS:
        out[m] = ("I64", None)
    for s in entry["slot_names"]:
        out[SLOT_PREFIX + s] = (v_dtype, dim)
    return out


def _check_live(job: _Job) -> None:
    e = job.entry
    for j, t in enumerate(job.live):
        where = f"table {job.name!r}" + (f" live shard {j}" if len(job.live) > 1 else "")
        if int(t.dim) != e["dim"]:
            raise CheckpointError(f"{where}: dim mismatch: the live table has dim {t.dim}, the "
                                  f"checkpoint has dim {e['dim']}")
        kd = _skeys.live_key_dtype_name(t)
        if kd != e["key_dtype"]:
            raise CheckpointError(f"{where}: key dtype mismatch: the live table has {kd} keys, "
                                  f"the checkpoint has {e['key_dtype']} keys")
        config, opt = t.describe()
        vd = str(config.get("value_dtype", "float32"))
        if vd != e["value_dtype"]:
            raise CheckpointError(f"{where}: value dtype mismatch: the live table has {vd}, the "
                                  f"checkpoint has {e['value_dtype']}")
        cap = int(config.get("capacity", 0))
        if cap and job.counts[j] > cap:
            raise CheckpointError(f"{where}: {job.counts[j]} checkpoint rows go to a shard of "
                                  f"capacity {cap}; they would be evicted")
        if e["optimizer"] is not None and opt != e["optimizer"]:
            job.set_optimizer.append(t)
        elif e["optimizer"] is not None and list(t.slot_names) != e["slot_names"]:
            raise CheckpointError(f"{where}: the live optimizer has slots {t.slot_names}, the "
                                  f"checkpoint stores {e['slot_names']}")


def _validate_optimizer(job: _Job, table_cls) -> None:
    """Attaching the saved optimizer must work before any live table is touched."""
    e = job.entry
    try:
        scratch = table_cls(dim=e["dim"], key_dtype=e["key_dtype"],
                            value_dtype=e["value_dtype"], optimizer=e["optimizer"])
    except Exception as exc:
        raise CheckpointError(f"table {job.name!r}: cannot attach the saved optimizer "
                              f"{e['optimizer']!r}: {exc}") from exc
    try:
        if list(scratch.slot_names) != e["slot_names"]:
            raise CheckpointError(f"table {job.name!r}: the saved optimizer has slots "
                                  f"{scratch.slot_names}, the checkpoint stores {e['slot_names']}")
    finally:
        scratch.destroy()


def _open_and_check(job: _Job, root: str, e: dict) -> list:
    """Opens the shard files of entry `e` (checked against it); returns their readers."""
    readers = []
    want = _expected_tensors(e)
    for j, s in enumerate(e["shards"]):
        label = f"table {job.name!r} shard {j}"
        shard_want = dict(want)
        if e["slot_names"] and STEPPED in s["tensors"]:  # optional: older checkpoints lack it
            shard_want[STEPPED] = ("U8", None)
        if set(s["tensors"]) != set(shard_want):
            raise CheckpointError(f"{label}: tensors {sorted(s['tensors'])}, expected "
                                  f"{sorted(want)}" + (f" (and {STEPPED!r})" if e["slot_names"]
                                                       else ""))
        for tname, (code, dim) in shard_want.items():
            t = s["tensors"][tname]
            if dim == "n+1":
                shape = [s["rows"] + 1]
            elif dim == "n*dim+1":
                shape = [s["rows"] * e["dim"] + 1]
            elif dim == "1-d":
                shape = t["shape"] if len(t["shape"]) == 1 else ["any"]
            else:
                shape = [s["rows"]] if dim is None else [s["rows"], dim]
            if t["dtype"] != code or t["shape"] != shape:
                raise CheckpointError(f"{label}: tensor {tname!r} is {t['dtype']} {t['shape']}, "
                                      f"expected {code} {shape}")
        readers.append(Reader(os.path.join(root, s["file"]), s, label))
        job.readers.append(readers[-1])
    return readers


def _verify_all(jobs: list, pool: ThreadPoolExecutor) -> None:
    """Streams every tensor of every shard file through CRC-32, in segments spread over the
    pool's threads, and counts how many rows each live shard will receive."""
    local = threading.local()
    route_lock = threading.Lock()
    tasks = []
    for job in jobs:
        key_np = None if _skeys.is_string(job.entry) else np.dtype(job.entry["key_dtype"])
        for r in job.readers:
            for tname, lo, hi in r.segments(_SEGMENT_BYTES):
                tasks.append((job, r, tname, lo, hi, key_np))

    def run(task):
        job, r, tname, lo, hi, key_np = task
        buf = getattr(local, "buffer", None)
        if buf is None:
            buf = local.buffer = bytearray(_VERIFY_BUFFER)
        counts = np.zeros(job.num_live, np.int64)

        def on_chunk(name, chunk):
            keys = np.frombuffer(chunk, key_np)
            if job.num_live == 1 and not isinstance(job.partitioner, Subset):
                counts[0] += len(keys)
            else:
                with route_lock:  # the partitioner is user code: one call at a time
                    sid = _route(job.partitioner, keys, job.num_live, job.name)
                counts[:] += np.bincount(sid[sid >= 0], minlength=job.num_live)

        counting = tname == "keys" and len(job.layers) == 1
        crc = r.crc_range(tname, lo, hi, buf, on_chunk if counting else None)
        return crc, counts

    results = list(pool.map(run, tasks))
    crcs: dict = {}
    for (job, r, tname, lo, hi, _), (crc, counts) in zip(tasks, results):
        prev = crcs.get((id(r), tname), 0)
        crcs[(id(r), tname)] = crc32_combine(prev, crc, hi - lo)
        job.counts += counts
    for job in jobs:
        for r in job.readers:
            for tname in r.entry["tensors"]:
                r.check_crc(tname, crcs.get((id(r), tname), 0))
        if len(job.layers) > 1:
            _count_chain_routes(job)
        elif _skeys.is_string(job.entry):
            _count_string_routes(job)


def _count_chain_routes(job: _Job) -> None:
    """A delta chain: builds each layer's shadow (the keys newer layers rewrote or tombstoned;
    tombstone files verified here) and counts the rows each live shard will receive, from the
    layers' keys (checksums already verified) minus their shadows."""
    string = _skeys.is_string(job.entry)
    shadow = _delta.KeySet(string)
    layers = []
    for root, e, readers, _ in job.layers:
        layer_shadow = _delta.KeySet(string)
        layer_shadow.strs, layer_shadow.ints = set(shadow.strs), shadow.ints
        layers.append((root, e, readers, layer_shadow))
        for r in readers:
            keys = _delta.read_keys(r, string)
            kept = keys[~layer_shadow.contains(keys)]
            if job.num_live == 1 and not isinstance(job.partitioner, Subset):
                job.counts[0] += len(kept)
            elif len(kept):
                sid = _route(job.partitioner, kept, job.num_live, job.name)
                job.counts += np.bincount(sid[sid >= 0], minlength=job.num_live)
            if e is not job.layers[-1][1]:
                shadow.add(keys)
        if e is not job.layers[-1][1]:
            shadow.add(_delta.file_keys(root, e["tombstones"], string,
                                        f"table {job.name!r} tombstones in {root}"))
    job.layers = layers


def _count_string_routes(job: _Job) -> None:
    """Rows per live shard of a string table (its keys are not one fixed-width tensor that the
    checksum pass could route): all rows for one live table, else the keys read again, page by
    page (after their checksums passed), and routed by the table's partitioner."""
    rows = int(job.entry["rows"])
    if job.num_live == 1:
        job.counts[0] = rows
        return
    page = 1 << 16
    for r, s in zip(job.readers, job.entry["shards"]):
        for row0 in range(0, int(s["rows"]), page):
            m = min(page, int(s["rows"]) - row0)
            try:
                keys = _skeys.read_page(r, row0, m, f"table shard file {r.path}")
            except _skeys.CorruptKeys as exc:
                raise CheckpointError(str(exc)) from None
            sid = _route(job.partitioner, keys, job.num_live, job.name)
            job.counts += np.bincount(sid, minlength=job.num_live)


def _check_distinct_live(jobs: list) -> None:
    """Two checkpoint tables restored into the same live table would silently overwrite each
    other (the later one wins): refuse before anything is written."""
    owner: dict = {}
    for job in jobs:
        for t in job.live or ():
            other = owner.setdefault(int(t.id), job.name)
            if other != job.name or sum(int(s.id) == int(t.id) for s in job.live) > 1:
                raise CheckpointError(
                    f"live table {int(t.id)} is given more than once (for tables {other!r} and "
                    f"{job.name!r}): each restore would overwrite the other")


def _read_page(r: Reader, e: dict, row0: int, m: int) -> dict:
    dim = e["dim"]
    ns = len(e["slot_names"])
    strings = _skeys.is_string(e)
    vd = VALUE_NUMPY[e["value_dtype"]]
    page = {"keys": None if strings else np.empty(m, np.dtype(e["key_dtype"])),
            "values": np.empty((m, dim), vd),
            "last_update": np.empty(m, np.int64), "update_count": np.empty(m, np.int64),
            "slots": None, "stepped": None}
    string_values = _svals.is_string(e)
    for name in (("last_update", "update_count") + (() if string_values else ("values",))
                 + (() if strings else ("keys",))):
        r.read(name, row0, page[name])
    if string_values:
        try:
            page["values"] = _svals.read_page(r, row0, m, dim, f"table shard file {r.path}")
        except _svals.CorruptValues as exc:
            raise CheckpointError(str(exc)) from None
    if strings:
        try:
            page["keys"] = _skeys.read_page(r, row0, m, f"table shard file {r.path}")
        except _skeys.CorruptKeys as exc:
            raise CheckpointError(str(exc)) from None
    if ns:
        slots = np.empty((m, ns, dim), vd)
        col = np.empty((m, dim), vd)
        for k, sname in enumerate(e["slot_names"]):
            r.read(SLOT_PREFIX + sname, row0, col)
            slots[:, k, :] = col
        page["slots"] = slots
        if STEPPED in r.entry["tensors"]:
            page["stepped"] = np.empty(m, np.uint8)
            r.read(STEPPED, row0, page["stepped"])
    return page


def _import(job: _Job, partitioner, pool: ThreadPoolExecutor) -> None:
    """Reads the shard files page by page (the next page is read by a worker thread while the
    current one is imported) and imports each row into the live shard the partitioner names."""
    e = job.entry
    key_np = np.dtype(np.int64 if _skeys.is_string(e) else e["key_dtype"])
    row_bytes = (VALUE_NUMPY[e["value_dtype"]].itemsize * e["dim"] * (1 + len(e["slot_names"]))
                 + 16 + key_np.itemsize)
    rows_per_page = max(1, PAGE_BYTES // row_bytes)
    work = [(r, row0, min(rows_per_page, s["rows"] - row0), shadow)
            for _, le, readers, shadow in job.layers
            for r, s in zip(readers, le["shards"]) for row0 in range(0, s["rows"], rows_per_page)]
    nxt = pool.submit(lambda w: _read_page(w[0], e, w[1], w[2]), work[0]) if work else None
    for i in range(len(work)):
        page = nxt.result()
        nxt = pool.submit(lambda w: _read_page(w[0], e, w[1], w[2]), work[i + 1]) \
            if i + 1 < len(work) else None
        shadow = work[i][3]
        if shadow is not None and len(shadow):
            keep = ~shadow.contains(page["keys"])
            page = {k: (None if v is None else v[keep]) for k, v in page.items()}
        try:
            _import_page(job, partitioner, page)
        except BaseException:
            if nxt is not None:
                nxt.exception()
            raise


def _import_page(job: _Job, partitioner, page: dict) -> None:
    keys, values, slots = page["keys"], page["values"], page["slots"]
    last, count, stepped = page["last_update"], page["update_count"], page["stepped"]
    if len(last):
        job.max_last_update = max(job.max_last_update, int(last.max()))
    if job.num_live == 1 and not isinstance(partitioner, Subset):
        job.live[0].import_rows(keys, values, slots, last, count, stepped)
        return
    sid = _route(partitioner, keys, job.num_live, job.name)
    held = sid >= 0  # a Subset partitioner's -1: a row this process does not hold
    if not held.all():
        sid, keys, values, last, count = sid[held], keys[held], values[held], last[held], count[held]
        slots = None if slots is None else slots[held]
        stepped = None if stepped is None else stepped[held]
    order = np.argsort(sid, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(sid, minlength=job.num_live))])
    keys, values, last, count = keys[order], values[order], last[order], count[order]
    if slots is not None:
        slots = slots[order]
    if stepped is not None:
        stepped = stepped[order]
    for k, t in enumerate(job.live):
        a, b = bounds[k], bounds[k + 1]
        if a < b:
            t.import_rows(keys[a:b], values[a:b], None if slots is None else slots[a:b],
                          last[a:b], count[a:b], None if stepped is None else stepped[a:b])


def _new_table(table_cls, job: _Job):
    e = job.entry
    kwargs = {}
    if e.get("capacity"):
        kwargs = {"capacity": int(e["capacity"]), "evict_policy": e.get("evict_policy", "recency")}
    try:
        t = table_cls(dim=e["dim"], key_dtype=e["key_dtype"], value_dtype=e["value_dtype"],
                      initializer=e["initializer"], optimizer=e["optimizer"], name=job.name,
                      **kwargs)
    except Exception as exc:
        raise CheckpointError(f"table {job.name!r}: cannot create it from the manifest: "
                              f"{exc}") from exc
    got = list(t.slot_names)  # read before destroy: a destroyed table has no slot names
    if got != e["slot_names"]:
        t.destroy()
        raise CheckpointError(f"table {job.name!r}: the saved optimizer has slots "
                              f"{got}, the checkpoint stores {e['slot_names']}")
    return t


def load(path, tables=None, *, names=None, partitioner=None, num_shards=None):
    """Restores tables (and reads dense parameters and metadata) from the checkpoint at `path`.

    Args:
      path: the checkpoint directory (if a save was interrupted between its renames, the aside
        copy ``.<name>.old`` is read, with a RuntimeWarning). Missing: FileNotFoundError.
      tables: optional mapping name -> Table, or list of Tables (the live shards of one logical
        table). Their contents are replaced (clear, then import); dim, key dtype and value dtype
        must match; if a live table has no optimizer or a different one, the saved optimizer is
        attached first, and slots are restored. Names not given here are created fresh.
      names: which saved tables to restore (default: the keys of `tables`, or all of them).
      partitioner: ``partitioner(keys, num_live_shards) -> shard index per key`` routing keys to
        live shards (default ``np.mod(keys, n)``); must be deterministic. A mapping name ->
        partitioner gives each table its own (names left out get the default), so tables
        sharded differently still load in one call, verified together. A ``Subset``
        partitioner may return -1 for rows this process does not hold (skipped).
      num_shards: live shards for each table created fresh: None gives a single Table, an int a
        list of that many Tables.

    Returns a ``Checkpoint`` (tables, steps, dense, metadata, manifest). Everything that can be
    checked (manifest, files, sizes, checksums, dtypes, dims, capacities, the optimizer) is
    checked before any live table is modified; problems raise ``CheckpointError`` (a
    ValueError) naming the table, file and tensor.
    """
    path = _fs.normalize(path)
    root = _fs.resolve(path)
    manifest, digest = _manifest.read_with_digest(root)
    layers = _delta.chain(root, manifest, digest)  # [this checkpoint] unless it is a delta
    entries = {t["name"]: t for t in manifest["tables"]}
    if tables is not None and not isinstance(tables, Mapping):
        raise TypeError(f"tables must be a mapping name -> Table (or list of shards), got "
                        f"{type(tables).__name__}")
    if names is not None:
        if isinstance(names, str):
            names = [names]
        selected = list(dict.fromkeys(names))
    elif tables is not None:
        selected = list(tables)
    else:
        selected = list(entries)
    missing = [n for n in selected if n not in entries]
    if missing:
        raise CheckpointError(f"tables {missing} are not in the checkpoint at {root} (it has "
                              f"{sorted(entries)})")
    if num_shards is not None and (isinstance(num_shards, bool) or
                                   not isinstance(num_shards, (int, np.integer))
                                   or num_shards < 1):
        raise ValueError(f"num_shards must be a positive integer, got {num_shards!r}")
    if isinstance(partitioner, Mapping):
        partitioners = dict(partitioner)
    else:
        partitioners = {name: partitioner for name in selected}

    jobs: list[_Job] = []
    created: list = []
    pool = ThreadPoolExecutor(workers(), thread_name_prefix="dualemb-ckpt")
    try:
        # ---- phase 1: verify everything; no live table is modified -----------------------------
        for name in selected:
            e = entries[name]
            live_value = tables.get(name) if tables is not None else None
            if live_value is not None:
                live = shards_of(name, live_value)
                job = _Job(name, e, live, len(live),
                           single=not isinstance(live_value, (list, tuple)))
            else:
                n = int(num_shards or 1)
                job = _Job(name, e, None, n, single=num_shards is None)
            job.partitioner = partitioners.get(name) or _default_partitioner
            if _skeys.is_string(e) and (isinstance(job.partitioner, Subset) or (
                    job.num_live > 1 and job.partitioner is _default_partitioner)):
                raise CheckpointError(f"table {name!r} has string keys: it loads whole into one "
                                      "live table, or into several with a partitioner for "
                                      "them (such as the dualemb.tf Variable's "
                                      "to_hash_bucket_fast); dualemb.core has no default "
                                      "routing for strings, and a Subset partitioner cannot "
                                      "take them")
            jobs.append(job)
            if len(layers) == 1:
                job.layers = [(root, e, _open_and_check(job, root, e), None)]
            else:
                for (lroot, _, _), le in zip(layers, _delta.layer_entries(layers, name)):
                    job.layers.append((lroot, le, _open_and_check(job, lroot, le), None))
                job.clock = max(int(s.get("clock", 0)) for _, le, _, _ in job.layers
                                for s in le["shards"]) if any(
                    le["shards"] for _, le, _, _ in job.layers) else 0
        dense = load_dense_at(root, manifest)
        _verify_all(jobs, pool)
        _check_distinct_live(jobs)
        for job in jobs:
            if job.live is not None:
                _check_live(job)
                if job.set_optimizer:
                    _validate_optimizer(job, Table)
                continue
            if job.entry["optimizer"] is not None:
                _validate_optimizer(job, Table)  # slot names and hyper-parameters, up front
            cap = int(job.entry.get("capacity") or 0)
            if cap and int(job.counts.max()) > cap:
                raise CheckpointError(f"table {job.name!r}: {int(job.counts.max())} rows go to "
                                      f"one new shard of capacity {cap}; they would be evicted")
        for job in jobs:
            if job.live is None:
                job.live = []
                for _ in range(job.num_live):  # one by one, so a failure destroys those made
                    job.live.append(_new_table(Table, job))
                    created.append(job.live[-1])

        # ---- phase 2: replace the live tables' contents -----------------------------------------
        for job in jobs:
            for t in job.set_optimizer:
                t.set_optimizer(job.entry["optimizer"])
            for t, c in zip(job.live, job.counts):
                t.clear()
                if c:
                    t.reserve(int(c))
            _import(job, job.partitioner, pool)
            # The cleared tables take the saved clock itself, not the clock their history and
            # the import calls (one tick each) left: then the rows written next are stamped as
            # the trainer's would have been, whether a full save or a chain of deltas (more
            # import calls) was loaded. Never below an imported row's stamp (old checkpoints
            # record no clock); equal to it is right (a write ticks the clock before stamping).
            clock = max(job.clock, job.max_last_update)
            for t in job.live:
                t.clock = clock
            total = sum(int(t.size()) for t in job.live)
            expected = int(job.counts.sum())  # all saved rows, or a Subset's share of them
            if total != expected:
                warnings.warn(f"table {job.name!r}: restored {total} rows of "
                              f"{expected} saved (duplicate keys across saved shards?)",
                              RuntimeWarning, stacklevel=2)
    except BaseException:
        for t in created:
            t.destroy()
        raise
    finally:
        pool.shutdown(wait=True)
        for job in jobs:
            job.close()

    # The tables now hold this checkpoint: a later delta on it holds the rows written from here.
    label_tables(jobs, digest)
    out_tables = {job.name: (job.live[0] if job.single else list(job.live)) for job in jobs}
    if tables is not None:
        for job in jobs:
            if job.name in tables and tables[job.name] is not None:
                out_tables[job.name] = tables[job.name]
    return Checkpoint(path=root, manifest=manifest, tables=out_tables,
                      steps={job.name: job.entry["step"] for job in jobs},
                      dense=dense, metadata=manifest.get("metadata", {}))


def label_tables(jobs, digest: str) -> None:
    """Labels every live table of ``jobs`` as holding the checkpoint ``digest`` (its manifest's
    SHA-256; "" for none, after a part-way failure): the change tracking then counts the rows
    written from here, and a delta applies only on top of that checkpoint."""
    for job in jobs:
        for t in job.live:
            token = t.changes_begin() if hasattr(t, "changes_begin") else 0
            if token:
                t.changes_commit(token, digest)

"""Delta checkpoints (docs/checkpoint_format.md §10): the rows each table wrote since a base
checkpoint, plus tombstones for the base's keys that are gone, written through the one commit
protocol (``_commit.commit``) like every save.

Which rows changed comes from the core's change tracking (``Table.count_changed`` /
``export_changed``: a per-row stamp written with the row). Which keys are gone is computed here
at save time, as the base's keys minus the table's keys now, so the core keeps no log that would
grow while a table evicts between saves, and no removal path (erase, capacity eviction, restrict,
clear) can be missed. A table's mark advances only once the delta is published, so a failed save
loses nothing.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dualemb.core.checkpoint import _fs, _manifest, _objects
from dualemb.core.checkpoint import _string_keys as _skeys
from dualemb.core.checkpoint._commit import commit, single_process
from dualemb.core.checkpoint._manifest import DELTA_VERSION, CheckpointError, dumps
from dualemb.core.checkpoint._part_records import merge
from dualemb.core.checkpoint._safetensors import Reader, Writer
from dualemb.core.checkpoint._write import describe, workers, write_shard

MAX_CHAIN = 10_000  # a longer chain is refused (and a cycle cannot loop forever)
# The fields a delta's table must share with its base's entry: rows of both are one table.
_SAME = ("key_dtype", "value_dtype", "dim", "initializer", "optimizer", "slot_names")


def tombstone_file_name(table_index: int) -> str:
    return f"table-{table_index:04d}-tombstones.safetensors"


# ---- the chain: delta -> ... -> full ---------------------------------------------------------

def base_root(root: str, manifest: dict) -> str:
    """The directory a delta's ``base.path`` names (relative to the delta's own directory)."""
    rel = manifest["base"]["path"]
    if os.path.isabs(rel) or _objects.is_remote(rel):
        raise CheckpointError(f"{root}: the base path {rel!r} must be relative")
    try:
        return _objects.resolve_relative(root, rel)  # on an object store: '/'-joined, in the URL
    except ValueError as e:
        raise CheckpointError(f"{root}: the base path {rel!r} is invalid ({e})") from None


def relative_base(path: str, base: str) -> str:
    """``base.path`` of a delta saved to ``path`` on the base checkpoint ``base`` (normalized
    paths). Relative to the delta's own directory: ``path`` itself on local disk; on an object
    store the generation prefix under ``path`` that its manifest is written in, and the base's
    URL, not its generation (the loader follows its commit marker; a base saved again since is
    then told apart by its manifest SHA-256)."""
    if _objects.is_remote(path):
        start = _objects.join(path, "generation")  # every generation is one level below path
    else:
        start = path
    try:
        return _objects.relative(base, start)
    except ValueError as e:
        raise CheckpointError(f"a delta at {path} on the base {base}: {e}; save the delta next to "
                              "its base") from None


def chain(root: str, manifest: dict, digest: str) -> list:
    """[(root, manifest, digest)] from the checkpoint at ``root`` down to its full base, newest
    first (one entry for a full checkpoint). Each base must exist and have the manifest SHA-256
    its delta recorded."""
    layers = [(root, manifest, digest)]
    while manifest.get("base") is not None:
        if len(layers) > MAX_CHAIN:
            raise CheckpointError(f"{layers[0][0]}: the chain of bases is longer than "
                                  f"{MAX_CHAIN} (a cycle?)")
        want = manifest["base"]["manifest_sha256"]
        path = base_root(root, manifest)
        try:
            broot = _fs.resolve(path)
            manifest, digest = _manifest.read_with_digest(broot)
        except FileNotFoundError:
            raise CheckpointError(f"{root}: its base checkpoint {path} is missing; a delta "
                                  "loads only on top of its base") from None
        except CheckpointError as e:
            raise CheckpointError(f"{root}: its base checkpoint {path} cannot be read: "
                                  f"{e}") from None
        if digest != want:
            raise CheckpointError(f"{root}: its base checkpoint {path} is not the one it was "
                                  f"written on (manifest SHA-256 {digest}, the delta records "
                                  f"{want}): the base was replaced")
        root = broot
        layers.append((root, manifest, digest))
    return layers


def layer_entries(layers: list, name: str) -> list:
    """The entries of table ``name`` along the chain, newest first; they must agree."""
    entries = []
    for root, manifest, _ in layers:
        e = next((t for t in manifest["tables"] if t["name"] == name), None)
        if e is None:
            raise CheckpointError(f"table {name!r} is not in {root}, a base of the delta at "
                                  f"{layers[0][0]}")
        for field in _SAME:
            if entries and e[field] != entries[0][field]:
                raise CheckpointError(f"table {name!r}: {field} {e[field]!r} in {root} differs "
                                      f"from {entries[0][field]!r} in the delta at "
                                      f"{layers[0][0]}")
        entries.append(e)
    return entries


# ---- keys: tombstone files and shard keys ---------------------------------------------------

def read_keys(reader: Reader, string: bool) -> np.ndarray:
    """Every key of a verified shard or tombstone file: int64/int32 array, or object array of
    bytes for string keys."""
    if not string:
        keys = reader.read_all("keys")
        if keys.dtype not in (np.int64, np.int32):
            raise CheckpointError(f"{reader.path}: keys are {keys.dtype}, not int64/int32")
        return keys
    offs = reader.read_all(_skeys.OFFSETS)
    data = reader.read_all(_skeys.BYTES).tobytes()
    if len(offs) == 0 or offs[0] != 0 or np.any(np.diff(offs) < 0) or offs[-1] != len(data):
        raise CheckpointError(f"{reader.path}: key_offsets are not a valid offsets array")
    out = np.empty(len(offs) - 1, object)
    out[:] = [data[offs[i]:offs[i + 1]] for i in range(len(offs) - 1)]
    return out


def file_keys(root: str, entry: dict, string: bool, label: str) -> np.ndarray:
    """The keys of a shard or tombstone file, their tensors' checksums verified (only theirs: a
    delta save reads the base's keys, not its rows)."""
    names = (_skeys.OFFSETS, _skeys.BYTES) if string else ("keys",)
    if not set(names) <= set(entry["tensors"]) or any(
            len(entry["tensors"][n]["shape"]) != 1 for n in names):
        raise CheckpointError(f"{label}: {entry['file']} holds tensors "
                              f"{sorted(entry['tensors'])}, expected 1-d {list(names)}")
    reader = Reader(os.path.join(root, entry["file"]), entry, label)
    try:
        buf = bytearray(4 << 20)
        for name in names:
            begin, end = entry["tensors"][name]["data_offsets"]
            reader.check_crc(name, reader.crc_range(name, 0, end - begin, buf))
        return read_keys(reader, string)
    finally:
        reader.close()


def sorted_member(sorted_unique: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Whether each of ``keys`` is in ``sorted_unique``: binary search over the keys sorted first
    (in order, the searches touch the set's memory in one sweep). ``np.isin`` took seconds per
    million keys under numpy 2 (it calls the hash-based ``np.unique``)."""
    if len(sorted_unique) == 0 or len(keys) == 0:
        return np.zeros(len(keys), bool)
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    at = np.searchsorted(sorted_unique, ordered)
    at[at == len(sorted_unique)] = 0
    found = np.empty(len(keys), bool)
    found[order] = sorted_unique[at] == ordered
    return found


class KeySet:
    """A set of int keys (sorted unique array) or of string keys (Python set).

    Int keys added are kept as parts and merged by one sort when the set is read: merging page by
    page (``np.union1d``) re-sorted the growing set every page, and numpy 2's hash-based
    ``np.unique`` takes seconds per million keys, which made a delta of a 1M-row table slower
    than its full checkpoint."""

    def __init__(self, string: bool):
        self.string = string
        self._ints = np.empty(0, np.int64)
        self._parts: list = []
        self.strs: set = set()

    @property
    def ints(self) -> np.ndarray:
        if self._parts:
            merged = np.sort(np.concatenate([self._ints, *self._parts]))
            keep = np.ones(len(merged), bool)
            keep[1:] = merged[1:] != merged[:-1]
            self._ints, self._parts = merged[keep], []
        return self._ints

    @ints.setter
    def ints(self, sorted_unique: np.ndarray) -> None:
        self._ints, self._parts = sorted_unique, []

    def add(self, keys: np.ndarray) -> None:
        if self.string:
            self.strs.update(keys.tolist())
        elif len(keys):
            self._parts.append(keys.astype(np.int64))

    def contains(self, keys: np.ndarray) -> np.ndarray:
        if self.string:
            return np.fromiter((k in self.strs for k in keys.tolist()), bool, len(keys))
        return sorted_member(self.ints, keys.astype(np.int64))

    def __len__(self) -> int:
        return len(self.strs) if self.string else len(self.ints)


def chain_keys(layers: list, name: str) -> KeySet:
    """The keys table ``name`` holds in the state the chain describes: each layer's rows that no
    newer layer rewrote or tombstoned."""
    entries = layer_entries(layers, name)
    string = _skeys.is_string(entries[0])
    out, shadow = KeySet(string), KeySet(string)
    for (root, _, _), e in zip(layers, entries):
        for j, s in enumerate(e["shards"]):
            keys = file_keys(root, s, string, f"table {name!r} shard {j}")
            out.add(keys[~shadow.contains(keys)])
        if e is not entries[-1]:
            for j, s in enumerate(e["shards"]):
                shadow.add(file_keys(root, s, string, f"table {name!r} shard {j}"))
            shadow.add(file_keys(root, e["tombstones"], string, f"table {name!r} tombstones"))
    return out


# ---- saving a delta ---------------------------------------------------------------------------

class ChangedRows:
    """The rows of ``table`` changed since its mark, as ``write_shard`` reads a table: a count,
    then pages in order (a cursor over row positions)."""

    def __init__(self, table, page_rows: int):
        self.table = table
        self.page_rows = max(1, min(int(page_rows), 1 << 14))
        self._cursor = 0
        self._done = 0

    def count(self) -> int:
        return int(self.table.count_changed())

    def page(self, offset: int, limit: int) -> dict:
        if offset != self._done:
            raise AssertionError("changed rows are read in order")
        page, self._cursor = self.table.export_changed(self._cursor, limit)
        self._done += len(page["keys"])
        return page

    def _pages(self):
        cursor = 0
        while True:
            page, cursor = self.table.export_changed(cursor, self.page_rows)
            if len(page["keys"]) == 0:
                return
            yield page

    def key_bytes(self, n: int) -> int:
        return sum(len(k) for p in self._pages() for k in p["keys"].tolist())

    def value_bytes(self, n: int) -> int:
        return sum(len(v) for p in self._pages() for v in p["values"].reshape(-1).tolist())


def key_pages(table, page_rows: int = 1 << 16):
    """The keys ``table`` holds now, a page at a time."""
    n = int(table.size())
    for offset in range(0, n, page_rows):
        yield table.export_keys(offset, min(page_rows, n - offset))


def _live_keys(shards: list, string: bool) -> KeySet:
    live = KeySet(string)
    for t in shards:
        for keys in key_pages(t):
            live.add(keys)
    return live


def _write_tombstones(path: str, name: str, keys: np.ndarray, entry: dict) -> dict:
    string = _skeys.is_string(entry)
    if string:
        total = sum(len(k) for k in keys.tolist())
        tensors = _skeys.tensors(len(keys), total)
    else:
        tensors = [("keys", np.dtype(entry["key_dtype"]), (len(keys),))]
    writer = Writer(path, tensors, {"format": _manifest.FORMAT, "table": name,
                                    "content": "tombstones"})
    try:
        if string:
            _skeys.KeyWriter(writer, total).write_page(0, keys.tolist())
        elif len(keys):
            writer.write("keys", np.ascontiguousarray(keys.astype(entry["key_dtype"])))
        out = writer.finish()
    finally:
        writer.close()
    out["rows"] = int(len(keys))
    return out


def _check_marks(name: str, shards: list, base_digest: str, base_path: str) -> None:
    for j, t in enumerate(shards):
        try:
            label = t.changes_label
        except AttributeError:
            raise CheckpointError(f"table {name!r}: {type(t).__name__} does not track changed "
                                  "rows; save a full checkpoint") from None
        except (ValueError, RuntimeError) as e:  # a backend without tracking names why
            raise CheckpointError(f"table {name!r}: {e}") from None
        if label != base_digest:
            what = f"the checkpoint with manifest SHA-256 {label}" if label else \
                "no checkpoint (it was never saved or loaded)"
            where = f" shard {j}" if len(shards) > 1 else ""
            raise CheckpointError(
                f"table {name!r}{where} tracks its changes since {what}, not since the base "
                f"{base_path} (manifest SHA-256 {base_digest}); a delta must be saved on the "
                "checkpoint the table was last saved to or loaded from: save a full checkpoint "
                "or pass that base")


def save_delta(path: str, plan: dict, base, *, steps: dict, dense: dict | None, metadata: dict,
               page_rows: int) -> None:
    """``checkpoint.save(..., base=...)``: see the module docstring. ``plan``: name -> live
    shards; arguments checked by the caller."""
    base_url = _fs.normalize(base)
    broot = _fs.resolve(base_url)
    bmanifest, bdigest = _manifest.read_with_digest(broot)
    layers = chain(broot, bmanifest, bdigest)  # the base itself must load
    names = list(plan)
    for name, shards in plan.items():
        entries = layer_entries(layers, name)
        info = describe(name, shards)
        for field in _SAME:
            if info[field] != entries[0][field]:
                raise CheckpointError(f"table {name!r}: {field} is {info[field]!r} now and "
                                      f"{entries[0][field]!r} in the base {broot}; a delta "
                                      "holds rows of the same table: save a full checkpoint")
        _check_marks(name, shards, bdigest, broot)
    # From the delta's own directory (locally, the base's resolved directory, as before).
    rel_base = relative_base(path, base_url if _objects.is_remote(base_url) else broot)
    tokens = [(t, t.changes_begin()) for shards in plan.values() for t in shards]
    published = {}

    def write(staging) -> dict:
        record = {}
        with ThreadPoolExecutor(workers(), thread_name_prefix="dualemb-ckpt") as pool:
            for i, (name, shards) in enumerate(plan.items()):
                info = describe(name, shards)
                files = []
                for j, t in enumerate(shards):
                    # new_file: on an object store a local spool file, uploaded after the block.
                    with staging.new_file(_manifest.shard_file_name(i, j)) as fpath:
                        entry = write_shard(t, fpath, name, j, info, page_rows, pool,
                                            source=ChangedRows(t, page_rows))
                    files.append({"index": j, **entry})
                string = _skeys.is_string(info)
                base_keys = chain_keys(layers, name)
                live = _live_keys(shards, string)
                if string:
                    gone = sorted(k for k in base_keys.strs if k not in live.strs)
                    tomb = np.empty(len(gone), object)
                    tomb[:] = gone
                else:
                    tomb = base_keys.ints[~live.contains(base_keys.ints)]
                with staging.new_file(tombstone_file_name(i)) as fpath:
                    tombstones = _write_tombstones(fpath, name, tomb, info)
                record[name] = {"info": info, "shards": files, "tombstones": tombstones,
                                "live_rows": len(live)}
        return {"tables": record}

    def manifest(staging, records: list) -> dict:
        m = merge(staging, records, names, steps=steps, dense=dense, metadata=metadata)
        rec = records[0]["tables"]
        for t in m["tables"]:
            t["tombstones"] = rec[t["name"]]["tombstones"]
            t["total_rows"] = rec[t["name"]]["live_rows"]
        m["version"] = DELTA_VERSION
        m["base"] = {"path": rel_base, "manifest_sha256": bdigest}
        published["digest"] = _manifest.digest(dumps(m))
        return m

    commit(path, single_process, part=0, num_parts=1, coordinator=True, write=write,
           manifest=manifest)
    for t, token in tokens:
        if token:
            t.changes_commit(token, published["digest"])

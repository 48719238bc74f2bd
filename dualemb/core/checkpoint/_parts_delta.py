"""Delta checkpoints written by several writers (``_parts.save(..., base=...)``): the same delta a
single writer writes (``_delta.py``, docs/checkpoint_format.md §10), each writer contributing the
shards it holds, through the one commit protocol (``_commit.commit``).

Every writer, inside the protocol (so that any failure reaches every writer):

* reads the base's manifest and follows its chain (the base must load), checks that each of its
  tables still has the base's dtypes, dim, initializer and optimizer, and that each was last
  saved to or loaded from the base (its change-tracking mark is labelled with the base's
  manifest SHA-256, exactly as a single writer checks);
* writes shard file ``j`` of each of its shards: the rows written since the mark
  (``Table.export_changed``), as a single-writer delta does;
* computes its share of the tombstones: the chain's keys that route to its own shards
  (``shard_of(key, N)``) minus the keys those shards hold now. Routing is what makes the shares
  disjoint and complete without any writer seeing another's keys; a writer also checks that
  every key its shards hold routes to them, so a table not routed by ``shard_of`` is refused
  instead of giving wrong tombstones. Its share travels in its part record (JSON integers).

The coordinator merges the records: the manifest's shards as a full multi-writer save, one
tombstone file per table from the shares (sorted), ``version`` 3 and ``base`` naming the base by
the SHA-256 of its manifest. A record written on another base (the base replaced while the
writers read it) is refused. After the commit, every writer's tables take the delta's mark
(``_part_marks``), so the next delta is written on this one.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dualemb.core.checkpoint import _delta, _fs, _manifest, _objects, _part_marks
from dualemb.core.checkpoint import _string_keys as _skeys
from dualemb.core.checkpoint._commit import Sync, commit
from dualemb.core.checkpoint._manifest import DELTA_VERSION, CheckpointError, dumps
from dualemb.core.checkpoint._part_records import merge
from dualemb.core.checkpoint._write import dense_arrays, describe, workers, write_shard
from dualemb.core.routing import shard_of


def _check_num_shards(names: list, num_shards) -> dict:
    if not isinstance(num_shards, dict) or set(num_shards) != set(names):
        raise ValueError(f"a multi-writer delta needs num_shards, name -> total shard count of "
                         f"every table {names}; got {num_shards!r}")
    out = {}
    for name, n in num_shards.items():
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"num_shards[{name!r}] must be a positive integer, got {n!r}")
        out[name] = int(n)
    return out


def _live_keys(name: str, j: int, table, n: int) -> np.ndarray:
    """Every key shard ``j`` holds now (int64), checked to route to it."""
    parts = [np.asarray(keys).astype(np.int64) for keys in _delta.key_pages(table)]
    keys = np.concatenate(parts) if parts else np.empty(0, np.int64)
    wrong = keys[shard_of(keys, n) != j]
    if len(wrong):
        raise CheckpointError(
            f"table {name!r} shard {j}: it holds key {int(wrong[0])}, which "
            f"dualemb.core.routing.shard_of routes to shard {int(shard_of(wrong[:1], n)[0])} of "
            f"{n}; a multi-writer delta needs shards routed by shard_of (it decides which "
            "writer records a key's tombstone): save a full checkpoint")
    return keys


def _tombstone_share(layers: list, name: str, shards: list, n: int) -> np.ndarray:
    """The chain's keys that route to this writer's shards and that they no longer hold."""
    base_keys = _delta.chain_keys(layers, name).ints
    mine = np.zeros(len(base_keys), bool)
    route = shard_of(base_keys, n)
    live = _delta.KeySet(string=False)
    for j, t in shards:
        mine |= route == j
        live.add(_live_keys(name, j, t, n))
    return base_keys[mine & ~live.contains(base_keys)]


def save(path, tables, *, names: list, base, num_shards, sync: Sync, part: int, num_parts: int,
         coordinator: bool, steps, dense, metadata, page_rows: int,
         published: dict | None) -> None:
    """See the module docstring; arguments as ``_parts.save``."""
    names = list(names)
    num_shards = _check_num_shards(names, num_shards)
    path = _fs.normalize(path)
    tokens: list = []
    seen: dict = {}  # what this writer read of the base, for the coordinator's manifest

    def write(staging) -> dict:
        if coordinator:  # checked before writing; written in the manifest step
            dense_arrays(dense)
            dumps({"metadata": dict(metadata or {})})
        local = tables() if callable(tables) else tables
        base_url = _fs.normalize(base)
        broot = _fs.resolve(base_url)
        bmanifest, bdigest = _manifest.read_with_digest(broot)
        layers = _delta.chain(broot, bmanifest, bdigest)  # the base itself must load
        seen.update(root=broot, digest=bdigest,
                    named=base_url if _objects.is_remote(base_url) else broot)
        for name, shards in local.items():
            if name not in names:
                raise ValueError(f"table {name!r} is not one of the checkpoint's tables {names}")
            if not shards:
                continue
            entries = _delta.layer_entries(layers, name)
            info = describe(name, [t for _, t in shards])
            if _skeys.is_string(info):
                raise CheckpointError(f"table {name!r}: a multi-writer delta of string keys is "
                                      "not supported (tombstones are routed by integer key); "
                                      "save a full checkpoint")
            for field in _delta._SAME:
                if info[field] != entries[0][field]:
                    raise CheckpointError(
                        f"table {name!r}: {field} is {info[field]!r} now and "
                        f"{entries[0][field]!r} in the base {broot}; a delta holds rows of the "
                        "same table: save a full checkpoint")
            _delta._check_marks(name, [t for _, t in shards], bdigest, broot)
        # Every check passed: begin the next generation, then read the changed rows.
        tokens.extend(_part_marks.begin(t for shards in local.values() for _, t in shards))
        record = {}
        with ThreadPoolExecutor(workers(), thread_name_prefix="dualemb-ckpt") as pool:
            for name, shards in local.items():
                if not shards:
                    continue
                i = names.index(name)
                info = describe(name, [t for _, t in shards])
                files = []
                for j, t in shards:
                    with staging.new_file(_manifest.shard_file_name(i, j)) as fpath:
                        entry = write_shard(t, fpath, name, j, info, page_rows, pool,
                                            source=_delta.ChangedRows(t, page_rows))
                    files.append({"index": int(j), **entry})
                tomb = _tombstone_share(layers, name, shards, num_shards[name])
                record[name] = {"info": info, "shards": files,
                                "tombstones": tomb.tolist(),
                                "live_rows": int(sum(int(t.size()) for _, t in shards))}
        return {"base_sha256": bdigest, "tables": record}

    mine: dict = {}

    def manifest(staging, records: list) -> dict:
        for rec in records:
            if rec["base_sha256"] != seen["digest"]:
                raise CheckpointError(
                    f"{path}: process {rec['part']} read a base with manifest SHA-256 "
                    f"{rec['base_sha256']}, the coordinator {seen['digest']}: the base "
                    f"{seen['root']} was replaced during the save; nothing is published")
        m = merge(staging, records, names, steps=steps, dense=dense, metadata=metadata)
        for i, t in enumerate(m["tables"]):
            shares = [np.asarray(rec["tables"][t["name"]]["tombstones"], np.int64)
                      for rec in records if t["name"] in rec["tables"]]
            keys = np.sort(np.concatenate(shares)) if shares else np.empty(0, np.int64)
            with staging.new_file(_delta.tombstone_file_name(i)) as fpath:
                t["tombstones"] = _delta._write_tombstones(fpath, t["name"], keys, t)
            t["total_rows"] = sum(rec["tables"][t["name"]]["live_rows"] for rec in records
                                  if t["name"] in rec["tables"])
        m["version"] = DELTA_VERSION
        # Relative to the delta's own directory, as a single-writer delta records it.
        m["base"] = {"path": _delta.relative_base(path, seen["named"]),
                     "manifest_sha256": seen["digest"]}
        mine["digest"] = _manifest.digest(dumps(m))
        return m

    commit(path, sync, part=part, num_parts=num_parts, coordinator=coordinator, write=write,
           manifest=manifest)
    if published is not None and coordinator:
        published["digest"] = mine["digest"]
    _part_marks.commit(tokens, _part_marks.share_digest(sync, mine.get("digest")))

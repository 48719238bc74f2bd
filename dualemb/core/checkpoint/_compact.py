"""checkpoint.compact: a delta chain written out as one full checkpoint."""

from __future__ import annotations

from dualemb.core.checkpoint import _fs, _manifest
from dualemb.core.checkpoint import _string_keys as _skeys
from dualemb.core.checkpoint._load import load, load_dense
from dualemb.core.checkpoint._save import save


def compact(path, out_path, *, page_rows: int = 1 << 16) -> None:
    """Writes the state the checkpoint at ``path`` describes (a delta: its chain down to the full
    base) as a full checkpoint at ``out_path``: the same keys, rows, slots, metadata, steps,
    dense parameters and metadata that loading ``path`` gives. Each table keeps the delta's
    shard count (routed by the default partitioner; string tables in one shard). The tables are
    rebuilt in memory, so this needs about the table's size in RAM."""
    root = _fs.resolve(_fs.normalize(path))
    manifest = _manifest.read(root)
    shards = {t["name"]: (None if _skeys.is_string(t) else max(1, len(t["shards"])))
              for t in manifest["tables"]}
    made: list = []
    try:
        tables = {}
        groups: dict = {}
        for name, n in shards.items():
            groups.setdefault(n, []).append(name)
        for n, names in groups.items():
            ck = load(path, names=names, num_shards=n)
            for name in names:
                t = ck.tables[name]
                made += t if isinstance(t, list) else [t]
                tables[name] = t
        dense = load_dense(path)
        save(out_path, tables, steps={t["name"]: t["step"] for t in manifest["tables"]},
             dense=dense, metadata=manifest.get("metadata", {}), page_rows=page_rows)
    finally:
        for t in made:
            t.destroy()

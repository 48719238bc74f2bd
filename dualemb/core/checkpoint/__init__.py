"""The common checkpoint format of dualemb: one directory that the TF and JAX front ends both
write and read, with tables (optimizer slots included), dense parameters and metadata.

    from dualemb.core import checkpoint
    checkpoint.save(path, {"user": table, "item": [shard0, shard1]}, steps=100,
                    dense={"mlp/w": w}, metadata={"framework": "jax"})
    ckpt = checkpoint.load(path, {"user": table, "item": [live0, live1, live2]})
    ckpt = checkpoint.load(path)          # fresh tables from the manifest
    handle = checkpoint.save(path, tables, steps=100, blocking=False)  # in the background
    handle.wait()                         # raises its error; handle.cancel() stops it
    checkpoint.read_manifest(path); checkpoint.load_dense(path)
    checkpoint.save(path2, tables, steps=200, base=path)  # a delta: rows written since `path`
    checkpoint.compact(path2, path3)      # a delta chain as one full checkpoint
    checkpoint.Publisher(dir, tables).publish(step)      # trainer: deltas into a directory
    checkpoint.Follower(dir, tables).start(interval=1)   # server: applies them while serving

Every ``path`` may be a local directory or the URL of an object store (``gs://bucket/ckpt``,
``s3://bucket/ckpt``, any fsspec URL; the ``object-store`` extra): there a save writes a fresh
generation prefix and publishes it with a ``commit.json`` marker written last.

The on-disk format (safetensors shard files + ``manifest.json``), the crash-safety scheme and
the verification rules are specified in docs/checkpoint_format.md. Every save, by one process or
by several (``parts.save`` with the job's ``sync`` collective), runs one commit protocol:
``_commit.py`` over ``_staging.py``. A background save (``blocking=False``, ``_background.py``)
runs the same writer on a background thread over a snapshot (``Table.clone()``) of the tables.
"""

from __future__ import annotations

from dualemb.core.checkpoint._load import Subset, load, load_dense, read_manifest
from dualemb.core.checkpoint._manifest import FORMAT, VERSION, CheckpointError
from dualemb.core.checkpoint._result import Checkpoint
from dualemb.core.checkpoint._background import SaveCancelled, SaveHandle, save
from dualemb.core.checkpoint._compact import compact
from dualemb.core.checkpoint._apply import Applied, apply
from dualemb.core.checkpoint._follower import Follower
from dualemb.core.checkpoint._publisher import Publisher
from dualemb.core.checkpoint import _parts as parts  # one checkpoint written by several processes


__all__ = ["save", "SaveHandle", "SaveCancelled", "load", "compact", "read_manifest", "load_dense",
           "Checkpoint", "CheckpointError", "Subset", "parts", "FORMAT", "VERSION",
           "apply", "Applied", "Follower", "Publisher"]

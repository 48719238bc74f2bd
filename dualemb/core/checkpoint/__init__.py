"""The common checkpoint format of dualemb: one directory that the TF and JAX front ends both
write and read, with tables (optimizer slots included), dense parameters and metadata.

    from dualemb.core import checkpoint
    checkpoint.save(path, {"user": table, "item": [shard0, shard1]}, steps=100,
                    dense={"mlp/w": w}, metadata={"framework": "jax"})
    ckpt = checkpoint.load(path, {"user": table, "item": [live0, live1, live2]})
    ckpt = checkpoint.load(path)          # fresh tables from the manifest
    checkpoint.read_manifest(path); checkpoint.load_dense(path)

The on-disk format (safetensors shard files + ``manifest.json``), the crash-safety scheme and
the verification rules are specified in docs/checkpoint_format.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dualemb.core.checkpoint._load import load, load_dense, read_manifest
from dualemb.core.checkpoint._manifest import FORMAT, VERSION, CheckpointError
from dualemb.core.checkpoint._save import save


@dataclass
class Checkpoint:
    """What ``load`` returns.

    Attributes:
      path: the directory read (the checkpoint path, or its aside copy after an interrupted
        save).
      manifest: the parsed manifest.json.
      tables: name -> Table, or list of Tables (its live shards).
      steps: name -> the optimizer step saved with the table (or None).
      dense: name -> np.ndarray, the dense parameters (loaded eagerly, checksums verified).
      metadata: the metadata dict given to ``save``.
    """

    path: str
    manifest: dict
    tables: dict = field(default_factory=dict)
    steps: dict = field(default_factory=dict)
    dense: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)


__all__ = ["save", "load", "read_manifest", "load_dense", "Checkpoint", "CheckpointError",
           "FORMAT", "VERSION"]

"""``Checkpoint``: what ``dualemb.core.checkpoint.load`` returns (its own module so that the
loader and the package both import it at module level)."""

from __future__ import annotations

from dataclasses import dataclass, field


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

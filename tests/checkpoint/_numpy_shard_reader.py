"""Reads a one-shard table of a common-format checkpoint with json and numpy alone (no dualemb,
no safetensors package): the spec in docs/checkpoint_format.md is enough to decode it."""
import json
import pathlib

import numpy as np


def only_shard(ckpt_dir):
    """The manifest entry of the checkpoint's only table, and ``tensor(name, dtype)`` reading a
    tensor of its only shard file; ``tensor.names`` lists the tensors the file holds."""
    ckpt_dir = pathlib.Path(ckpt_dir)
    manifest = json.loads((ckpt_dir / "manifest.json").read_text())
    (table,) = manifest["tables"]
    (shard,) = table["shards"]
    raw = (ckpt_dir / shard["file"]).read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + header_len])
    base = 8 + header_len

    def tensor(name, dtype):
        a, b = header[name]["data_offsets"]
        return np.frombuffer(raw[base + a:base + b], dtype)

    tensor.names = set(header) - {"__metadata__"}
    tensor.dtypes = {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}
    return table, tensor

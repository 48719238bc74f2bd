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


def _tensors(path):
    raw = pathlib.Path(path).read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + header_len])
    base = 8 + header_len

    def tensor(name, dtype):
        a, b = header[name]["data_offsets"]
        return np.frombuffer(raw[base + a:base + b], dtype)
    return tensor


def chain_rows(ckpt_dir):
    """The int64-keyed rows {key: (values, last_update, update_count)} of the only table of a
    checkpoint that may be a delta (docs/checkpoint_format.md §10), with json, hashlib and numpy
    alone: each layer's rows unless a newer layer rewrote or tombstoned the key."""
    import hashlib
    import os
    state, hidden = {}, set()
    path = pathlib.Path(ckpt_dir)
    while True:
        manifest = json.loads((path / "manifest.json").read_text())
        table, tensor = only_shard(path) if manifest["tables"][0]["shards"] else (
            manifest["tables"][0], None)
        if tensor is not None:
            dim = table["dim"]
            keys = tensor("keys", np.int64)
            values = tensor("values", np.float32).reshape(-1, dim)
            last, count = tensor("last_update", np.int64), tensor("update_count", np.int64)
            for i, k in enumerate(keys.tolist()):
                if k not in hidden:
                    state[k] = (values[i], int(last[i]), int(count[i]))
            hidden |= set(keys.tolist())
        if "base" not in manifest:
            return state
        hidden |= set(_tensors(path / table["tombstones"]["file"])("keys", np.int64).tolist())
        base = pathlib.Path(os.path.normpath(path / manifest["base"]["path"]))
        digest = hashlib.sha256((base / "manifest.json").read_bytes()).hexdigest()
        assert digest == manifest["base"]["manifest_sha256"]
        path = base

"""Format constants, the error type, ``manifest.json`` with its checksum file, and validation."""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from typing import Any

from dualemb.core import legacy_spec
from dualemb.core.checkpoint import _objects

FORMAT = "dualemb-checkpoint"
# 2: initializer and optimizer objects hold the JSON specs the core describes (exact types), and
#    manifest.json is covered by MANIFEST_CHECKSUM. 1: specs converted from "name=value" text
#    (read through dualemb.core.legacy_spec), no manifest checksum.
VERSION = 2
# 3: a delta checkpoint (docs/checkpoint_format.md §10): rows written since a base checkpoint
#    and tombstones, with a `base` member. Full checkpoints are still written as version 2, so
#    readers that predate deltas keep reading them and refuse deltas by their version.
DELTA_VERSION = 3
READ_VERSION = DELTA_VERSION  # the newest version this reader understands
MANIFEST = "manifest.json"
# {"bytes": <size of manifest.json>, "crc32": <CRC-32 of its bytes>, "file": "manifest.json"}
MANIFEST_CHECKSUM = "manifest.crc32.json"
DENSE_FILE = "dense.safetensors"

# "string" keys are stored as key_offsets + key_bytes (checkpoint/_string_keys.py), not `keys`.
KEY_DTYPES = {"int64": "I64", "int32": "I32", "string": None}
# Values and slots are stored in the table's own value dtype (dualemb.core.value_dtypes);
# "string" values as value_offsets + value_bytes (checkpoint/_string_values.py), not `values`.
VALUE_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
                "int8": "I8", "int32": "I32", "int64": "I64", "string": None}
META_TENSORS = ("last_update", "update_count")
# U8 [n], 1 where an optimizer step has updated the row (what slot views list). Written for
# tables with slots; optional on load: checkpoints written before it load with the core's
# default (a row is stepped where its slots differ from the initial slots).
STEPPED = "stepped"
SLOT_PREFIX = "slot."


class CheckpointError(ValueError):
    """A checkpoint that is missing parts, corrupt, of an unknown format, or that does not match
    the tables it is loaded into. Raised before any live table is modified."""


def shard_file_name(table_index: int, shard_index: int) -> str:
    return f"table-{table_index:04d}-shard-{shard_index:05d}.safetensors"


def dumps(manifest: dict) -> bytes:
    """Strict JSON (no NaN/Infinity), UTF-8, newline terminated."""
    try:
        text = json.dumps(manifest, indent=1, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"checkpoint manifest is not JSON-serialisable: {e}") from e
    return (text + "\n").encode("utf-8")


def _checksum_record(data: bytes) -> bytes:
    rec = {"bytes": len(data), "crc32": zlib.crc32(data), "file": MANIFEST}
    return (json.dumps(rec, sort_keys=True, separators=(",", ":")) + "\n").encode("ascii")


def write_files(directory: str, manifest: dict, write_file) -> None:
    """Writes MANIFEST_CHECKSUM, then manifest.json (last: its presence marks a complete
    checkpoint). `write_file(path, data)` writes and fsyncs one new file."""
    data = dumps(manifest)
    write_file(os.path.join(directory, MANIFEST_CHECKSUM), _checksum_record(data))
    write_file(os.path.join(directory, MANIFEST), data)


def _verify_checksum(root: str, data: bytes) -> bool:
    """Checks manifest.json's bytes against MANIFEST_CHECKSUM; False if there is none."""
    cpath = os.path.join(root, MANIFEST_CHECKSUM)
    try:
        stored = _objects.read_bytes(cpath)  # local or object store
    except FileNotFoundError:
        return False
    if stored != _checksum_record(data):
        try:
            rec = json.loads(stored.decode("ascii"))
            detail = (f"it records {rec['bytes']} bytes with CRC-32 {rec['crc32']}, the manifest "
                      f"has {len(data)} bytes with CRC-32 {zlib.crc32(data)}")
        except Exception:
            detail = f"{MANIFEST_CHECKSUM} is malformed"
        raise CheckpointError(f"{os.path.join(root, MANIFEST)}: checksum mismatch ({detail}); "
                              "the manifest or its checksum file is corrupt")
    return True


def digest(data: bytes) -> str:
    """The identity of a checkpoint: the SHA-256 (hex) of its manifest.json bytes. A delta
    names its base by it, and a table's change-tracking mark carries it."""
    return hashlib.sha256(data).hexdigest()


def read(root: str) -> dict:
    """The validated manifest of the checkpoint directory `root`, its bytes verified first."""
    return read_with_digest(root)[0]


def read_with_digest(root: str) -> tuple:
    """(manifest, digest of its bytes) of the checkpoint directory `root`, from one read."""
    mpath = os.path.join(root, MANIFEST)
    try:
        data = _objects.read_bytes(mpath)  # local or object store
    except FileNotFoundError:
        raise CheckpointError(f"{root}: no {MANIFEST}; not a complete dualemb checkpoint") from None
    checked = _verify_checksum(root, data)
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{mpath}: not valid JSON ({e})") from None
    manifest = validate(manifest, mpath)
    if not checked and manifest["version"] >= 2:
        raise CheckpointError(f"{mpath}: {MANIFEST_CHECKSUM} is missing; a version "
                              f"{manifest['version']} manifest cannot be verified without it")
    return manifest, digest(data)


def _need(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise CheckpointError(f"malformed manifest ({where}): {what}")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_tensors(where: str, tensors: Any) -> None:
    _need(isinstance(tensors, dict), where, "'tensors' must be an object")
    for tname, t in tensors.items():
        w = f"{where}, tensor {tname!r}"
        _need(isinstance(t, dict), w, "must be an object")
        _need(isinstance(t.get("dtype"), str), w, "'dtype' must be a string")
        _need(isinstance(t.get("shape"), list) and all(_is_int(d) and d >= 0 for d in t["shape"]),
              w, "'shape' must be a list of non-negative integers")
        off = t.get("data_offsets")
        _need(isinstance(off, list) and len(off) == 2 and all(_is_int(o) for o in off)
              and 0 <= off[0] <= off[1], w, "'data_offsets' must be [begin, end]")
        _need(_is_int(t.get("crc32")) and 0 <= t["crc32"] < 1 << 32, w,
              "'crc32' must be an unsigned 32-bit integer")


def _check_file(where: str, f: Any) -> None:
    _need(isinstance(f, dict), where, "file entry must be an object")
    name = f.get("file")
    _need(isinstance(name, str) and name and os.path.basename(name) == name
          and name not in (".", "..") and not name.startswith("."),
          where, f"'file' must be a plain file name, got {name!r}")
    _need(_is_int(f.get("bytes")) and f["bytes"] >= 8, where, "'bytes' must be an integer >= 8")
    _need(_is_int(f.get("header_bytes")) and 8 <= f["header_bytes"] <= f["bytes"], where,
          "'header_bytes' must be an integer in [8, bytes]")
    _need(_is_int(f.get("header_crc32")), where, "'header_crc32' must be an integer")
    _check_tensors(where + f" file {name!r}", f.get("tensors"))


def _upgrade_v1(table: dict, where: str) -> None:
    """Gives the specs of a version-1 manifest the types the core describes today."""
    for member in ("initializer", "optimizer"):
        if isinstance(table.get(member), dict):
            try:
                table[member] = legacy_spec.upgrade_spec(table[member])
            except ValueError as e:
                raise CheckpointError(f"malformed manifest ({where}): '{member}': {e}") from None


def validate(manifest: Any, where: str) -> dict:
    """Checks the structure of a parsed manifest; returns it. `where` names it in errors."""
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{where}: manifest is not a JSON object")
    fmt = manifest.get("format")
    if fmt != FORMAT:
        raise CheckpointError(f"{where}: not a dualemb checkpoint (format {fmt!r}, "
                              f"expected {FORMAT!r})")
    version = manifest.get("version")
    if not _is_int(version):
        raise CheckpointError(f"{where}: format version must be an integer, got {version!r}")
    if version > READ_VERSION:
        raise CheckpointError(
            f"{where}: checkpoint format version {version} is newer than this dualemb "
            f"understands (up to version {READ_VERSION}); upgrade dualemb to read it")
    base = manifest.get("base")
    _need((version >= DELTA_VERSION) == (base is not None), where,
          f"a version {version} manifest {'needs' if version >= DELTA_VERSION else 'has no'} "
          "'base' member")
    if base is not None:
        _need(isinstance(base, dict) and isinstance(base.get("path"), str) and base["path"]
              and isinstance(base.get("manifest_sha256"), str)
              and len(base["manifest_sha256"]) == 64, where,
              "'base' must be {\"path\": <relative path>, \"manifest_sha256\": <64 hex digits>}")
    if version < 1:
        raise CheckpointError(f"{where}: invalid checkpoint format version {version}")
    _need(isinstance(manifest.get("metadata", {}), dict), where, "'metadata' must be an object")
    dense = manifest.get("dense")
    if dense is not None:
        _check_file(where + ", dense", dense)
    tables = manifest.get("tables")
    _need(isinstance(tables, list), where, "'tables' must be a list")
    seen = set()
    for i, t in enumerate(tables):
        w = f"{where}, tables[{i}]"
        _need(isinstance(t, dict), w, "must be an object")
        name = t.get("name")
        _need(isinstance(name, str) and name != "", w, "'name' must be a non-empty string")
        _need(name not in seen, w, f"duplicate table name {name!r}")
        seen.add(name)
        w = f"{where}, table {name!r}"
        for member, default in (("optimizer", None), ("step", None), ("slot_names", [])):
            t.setdefault(member, default)  # absent means null / none
        if version == 1:
            _upgrade_v1(t, w)
        _need(t.get("key_dtype") in KEY_DTYPES, w,
              f"unsupported key_dtype {t.get('key_dtype')!r} (int64, int32, string)")
        _need(t.get("value_dtype") in VALUE_DTYPES, w,
              f"unsupported value_dtype {t.get('value_dtype')!r} ({', '.join(VALUE_DTYPES)})")
        _need(_is_int(t.get("dim")) and t["dim"] >= 1, w, "'dim' must be a positive integer")
        _need(isinstance(t.get("initializer"), dict) and "initializer" in t["initializer"], w,
              "'initializer' must be an initializer spec object")
        _need(t.get("optimizer") is None or (isinstance(t["optimizer"], dict)
                                             and "name" in t["optimizer"]), w,
              "'optimizer' must be null or an optimizer spec object")
        _need(t.get("step") is None or _is_int(t["step"]), w, "'step' must be null or an integer")
        slots = t.get("slot_names")
        _need(isinstance(slots, list) and all(isinstance(s, str) and s for s in slots), w,
              "'slot_names' must be a list of names")
        _need(t.get("optimizer") is not None or not slots, w, "slot_names without an optimizer")
        _need(_is_int(t.get("rows")) and t["rows"] >= 0, w, "'rows' must be an integer >= 0")
        shards = t.get("shards")
        _need(isinstance(shards, list), w, "'shards' must be a list")
        total = 0
        for j, s in enumerate(shards):
            _check_file(w + f", shards[{j}]", s)
            _need(_is_int(s.get("rows")) and s["rows"] >= 0, w + f", shards[{j}]",
                  "'rows' must be an integer >= 0")
            total += s["rows"]
        _need(total == t["rows"], w, f"shard rows sum to {total}, table 'rows' is {t['rows']}")
        if base is not None:
            tomb = t.get("tombstones")
            _check_file(w + ", tombstones", tomb)
            _need(_is_int(tomb.get("rows")) and tomb["rows"] >= 0, w + ", tombstones",
                  "'rows' must be an integer >= 0")
    return manifest

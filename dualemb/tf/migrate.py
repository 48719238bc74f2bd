"""Importers for TFRA (`tensorflow_recommenders_addons.dynamic_embedding`) checkpoints.

They read TFRA 0.8.1's tables with nothing but numpy (and TensorFlow's checkpoint reader for TF
checkpoints): TF2 object checkpoints (`tf.train.Checkpoint`, Keras `save_weights`,
`de.train.Checkpoint`), TF1 Saver checkpoints, and FileSystemSaver files; docs/
migrating_from_tfra.md describes what TFRA writes in each. The shards are merged and every key
re-routed to the live shard that owns it.

Each reader returns ``{variable_name: entry}`` for the primary (non-slot) variables, where entry is

    {"keys": int64/int32 [n] (string keys: an object array of bytes),
     "values": [n, dim] in the variable's value dtype (string values: an object array of bytes),
     "dim": dim, "num_shards": N, "format": ...,
     "slots": {slot_name: [n, dim] aligned with keys}, "slot_exists": {slot_name: bool [n]},
     "step": optimizer iteration count or None}

``slots[name][i]`` is the slot row of ``keys[i]`` where ``slot_exists[name][i]`` (keys that the
optimizer never touched have no slot row in TFRA; they read as 0 here and get the live
optimizer's initial slot value when loaded). Keys are in TFRA's export order, shard by shard.

`load_tfra_into(target, entry)` then writes the rows (and, when the live table has a matching
fused optimizer, the slots) into dualemb tables. Optimizer state that TFRA does not keep per key
(the iteration count, Adam's beta powers, Nadam's momentum cache) is not written into the table;
the iteration count is returned as ``step`` so a training loop can continue from it.
"""

from __future__ import annotations

import glob
import os
import re
import warnings
from typing import Callable, Iterable

import numpy as np

from dualemb.core import value_dtypes as _value_dtypes
from dualemb.core.routing import shard_of

__all__ = ["read_tfra_checkpoint", "read_tfra_file_system", "load_tfra_into",
           "default_partition", "SLOT_MAP"]

# Last path components that TFRA's optimizers (tf_keras, legacy Keras, TF1) give their slots.
_KNOWN_SLOTS = ("m", "v", "vhat", "accumulator", "accum", "accum_update", "accum_grad",
                "accum_var", "linear", "momentum", "rms", "mg", "gradient_accumulator",
                "gradient_squared_accumulator")
# Restrict-policy status variables (TimestampRestrictPolicy, FrequencyRestrictPolicy).
_STATUS = ("timestamp", "frequency")

# dualemb core optimizer name -> {core slot name: TFRA slot names that hold the same quantity}.
# Keras-flavoured and Optax-flavoured slot names are both listed (a table has one flavour).
_ADAM = {"momentum": ("m",), "velocity": ("v",), "velocity_hat": ("vhat",),
         "mu": ("m",), "nu": ("v",), "nu_max": ("vhat",)}
SLOT_MAP: dict[str, dict[str, tuple[str, ...]]] = {
    "adam": _ADAM, "adamw": _ADAM, "amsgrad": _ADAM,
    "nadam": {"momentum": ("m",), "velocity": ("v",), "mu": ("m",), "nu": ("v",)},
    "adamax": {"momentum": ("m",), "norm": ("v",), "mu": ("m",), "nu": ("v",)},
    "adagrad": {"accumulator": ("accumulator",), "sum_of_squares": ("accumulator",)},
    "ftrl": {"accumulator": ("accumulator", "accum"), "linear": ("linear",)},
    "rmsprop": {"velocity": ("rms",), "momentum": ("momentum",), "average_gradient": ("mg",),
                "nu": ("rms",), "trace": ("momentum",), "mu": ("mg",)},
    "sgd": {"momentum": ("momentum",), "trace": ("momentum",)},
    "adadelta": {"accumulated_grad": ("accum_grad", "accum"),
                 "accumulated_delta_var": ("accum_var", "accum_update"),
                 "e_g": ("accum_grad", "accum"), "e_x": ("accum_var", "accum_update")},
    "lion": {"momentum": ("m",), "mu": ("m",)},
}

_TF2_RE = re.compile(r"^(?:.*/)?tables_of_(?P<var>[^/]+)/(?P<idx>\d+)/\.ATTRIBUTES/"
                     r"table-(?P<kind>keys|values|shard_upsert_restore)$")
_V1_RE = re.compile(r"^(?:(?P<scope>.*)/)?(?P<flat>[^/]+)_mht_(?P<i>\d+)of(?P<n>\d+)"
                    r"-(?P<kind>keys|values|shard_upsert_restore)$")
_FS_RE = re.compile(r"^(?P<flat>.+)_mht_(?P<i>\d+)of(?P<n>\d+)"
                    r"(?:_rank(?P<rank>\d+)_size(?P<size>\d+))?-(?P<kind>keys|values)$")
_FS_DIR = "TFRADynamicEmbedding"


def _flat(name: str) -> str:
    return name.replace("/", "_")


def _unescape(local_name: str) -> str:
    """Inverse of TF's object-graph escaping ("/" -> ".S", "." -> "..")."""
    return re.sub(r"\.(.)", lambda m: "/" if m.group(1) == "S" else m.group(1), local_name)


def default_partition(keys: np.ndarray, num_shards: int) -> np.ndarray:
    """TFRA's CPU `default_partition_fn`: floored ``key mod num_shards`` for integer keys,
    ``tf.strings.to_hash_bucket_fast(keys, num_shards)`` for string keys (bytes).

    (TFRA's CUDA build masks int64 keys to 31 bits first; pass a custom partitioner for that.)
    """
    keys = np.asarray(keys)
    if keys.dtype.kind in "OSU":
        import tensorflow as tf
        from dualemb.core._string_keys import as_string_keys
        if not keys.size:
            return np.zeros(keys.shape, np.int64)
        return tf.strings.to_hash_bucket_fast(as_string_keys(keys), num_shards).numpy()
    return shard_of(keys, num_shards).astype(np.int64)


# ---- grouping variables into primaries and slots ---------------------------------------------

def _split_slot(name: str, names: set[str], flat: bool):
    """(primary, slot_name) if `name` is a slot or status variable of another variable."""
    best = None
    for p in names:
        if p == name:
            continue
        if flat:
            if name.startswith(p + "_") and (best is None or len(p) > len(best)):
                rest = name[len(p) + 1:]
                if any(rest == s or rest.endswith("_" + s) for s in _KNOWN_SLOTS + _STATUS):
                    best = p
        elif name.startswith(p + "/") and (best is None or len(p) > len(best)):
            best = p
    if best is None:
        return None
    rest = name[len(best) + 1:]
    if flat:
        slot = max((s for s in _KNOWN_SLOTS + _STATUS if rest == s or rest.endswith("_" + s)),
                   key=len)
    else:
        slot = rest.rsplit("/", 1)[-1]
    return best, slot


def _align(keys: np.ndarray, slot_keys: np.ndarray, slot_values: np.ndarray, dim: int):
    """Slot rows re-ordered to `keys`; rows of keys without a slot row are 0 (exists False)."""
    out = np.zeros((len(keys), dim), slot_values.dtype if slot_values.size else np.float32)
    exists = np.zeros(len(keys), bool)
    if len(keys) and len(slot_keys):
        order = np.argsort(keys, kind="stable")
        sk = keys[order]
        pos = np.clip(np.searchsorted(sk, slot_keys), 0, len(sk) - 1)
        hit = sk[pos] == slot_keys
        rows = order[pos[hit]]
        out[rows] = slot_values.reshape(len(slot_keys), -1)[hit]
        exists[rows] = True
    return out, exists


def _merge_shards(name: str, shards: dict[int, tuple[np.ndarray, np.ndarray]]):
    idx = sorted(shards)
    keys = [shards[i][0].reshape(-1) for i in idx]
    values = [shards[i][1] for i in idx]
    dims = {v.shape[1] for v in values if v.ndim == 2 and v.shape[0]}
    if len(dims) > 1:
        raise ValueError(f"TFRA variable {name!r}: shards disagree on dim {sorted(dims)}")
    dim = dims.pop() if dims else (values[0].shape[1] if values and values[0].ndim == 2 else 0)
    keys = np.concatenate(keys) if keys else np.zeros(0, np.int64)
    values = (np.concatenate([v.reshape(-1, dim) for v in values]) if values
              else np.zeros((0, dim), np.float32))
    if len(keys) != len(values):
        raise ValueError(f"TFRA variable {name!r}: {len(keys)} keys but {len(values)} rows")
    uniq, first = np.unique(keys[::-1], return_index=True)
    if len(uniq) != len(keys):
        # TFRA restores by upserting shard after shard, so the last copy of a key wins.
        warnings.warn(f"TFRA variable {name!r}: {len(keys) - len(uniq)} keys appear in more than "
                      "one shard; the last shard's row is kept")
        keep = np.sort(len(keys) - 1 - first)
        keys, values = keys[keep], values[keep]
    return keys, values, dim


def _assemble(tables: dict[str, dict[int, tuple]], num_shards: dict[str, int], fmt: str,
              flat: bool, step=None, display: dict[str, str] | None = None) -> dict:
    """tables: variable name -> {shard index: (keys, values)} -> reader result."""
    names = set(tables)
    merged = {n: _merge_shards(n, tables[n]) for n in names}
    parents = {n: _split_slot(n, names, flat) for n in names}
    # A slot of a slot is not a thing: resolve each slot to a primary.
    primaries = {n for n in names if parents[n] is None}
    out = {}
    for n in sorted(primaries):
        keys, values, dim = merged[n]
        out[(display or {}).get(n, n)] = {
            "keys": keys, "values": values, "dim": int(dim), "num_shards": num_shards[n],
            "format": fmt, "slots": {}, "slot_exists": {}, "status": {}, "step": step}
    for n in sorted(names - primaries):
        p, slot = parents[n]
        while p not in primaries and parents.get(p):
            p = parents[p][0]
        if p not in primaries:
            continue
        entry = out[(display or {}).get(p, p)]
        skeys, svalues, sdim = merged[n]
        if len(skeys) and sdim != entry["dim"] and slot not in _STATUS:
            raise ValueError(f"TFRA slot {n!r} has dim {sdim}, its variable {p!r} has "
                             f"{entry['dim']}")
        target = "status" if slot in _STATUS else "slots"
        if target == "status":
            entry["status"][slot] = _align(entry["keys"], skeys, svalues, max(sdim, 1))[0]
            continue
        if slot in entry["slots"]:
            # Two optimizers (or two lookups) made same-named slots: keep them apart.
            slot = n[len(p) + 1:]
        aligned, exists = _align(entry["keys"], skeys, svalues, entry["dim"])
        entry["slots"][slot] = aligned
        entry["slot_exists"][slot] = exists
    return out


# ---- readers ---------------------------------------------------------------------------------

def _checkpoint_prefix(path: str) -> str:
    import tensorflow as tf
    if os.path.isdir(path):
        prefix = tf.train.latest_checkpoint(path)
        if prefix is None:
            raise FileNotFoundError(f"no TF checkpoint in directory {path!r}")
        return prefix
    if not glob.glob(glob.escape(path) + ".index") and not os.path.exists(path):
        raise FileNotFoundError(f"no TF checkpoint at {path!r} (expected {path}.index)")
    return path


def _find_fs_dir(prefix: str) -> str | None:
    base = os.path.dirname(os.path.abspath(prefix))
    m = re.search(r"-(\d+)$", prefix)
    for cand in ([f"{_FS_DIR}-{m.group(1)}"] if m else []) + [_FS_DIR]:
        d = os.path.join(base, cand)
        if os.path.isdir(d):
            return d
    return None


def read_tfra_checkpoint(path: str, fs_dir: str | None = None, fs_key_dtype="int64",
                         fs_value_dtype="float32") -> dict:
    """Reads every TFRA `de.Variable` (with its optimizer slots) from a TF checkpoint.

    Args:
      path: a checkpoint prefix (``.../ckpt-3``, ``.../weights``) or a directory holding a
        ``checkpoint`` state file (its latest checkpoint is read). Both TF2 object checkpoints
        (`tf.train.Checkpoint`, Keras `save_weights`, `de.train.Checkpoint`) and TF1
        `tf.compat.v1.train.Saver` checkpoints are understood.
      fs_dir: where the FileSystemSaver files are, for checkpoints written with
        ``CuckooHashTableCreator(saver=FileSystemSaver())``; by default
        ``TFRADynamicEmbedding-<step>`` or ``TFRADynamicEmbedding`` next to the checkpoint.
      fs_key_dtype, fs_value_dtype: the key and value dtypes of the tables in those files (the
        TF checkpoint records none for them; see `read_tfra_file_system`). Tables stored in
        the TF checkpoint itself carry their own dtypes, string values included.

    Returns:
      ``{variable_name: entry}`` (see the module docstring), one per primary variable.
    """
    import tensorflow as tf

    prefix = _checkpoint_prefix(path)
    reader = tf.train.load_checkpoint(prefix)
    shapes = reader.get_variable_to_shape_map()
    tables: dict[str, dict[int, dict[str, np.ndarray]]] = {}
    num_shards: dict[str, int] = {}
    fs_names: dict[str, str] = {}  # flat name -> variable name, for FileSystemSaver fallback
    tf2 = v1 = False
    display = {}
    for tensor in shapes:
        m = _TF2_RE.match(tensor)
        if m:
            tf2 = True
            name, idx = _unescape(m.group("var")), int(m.group("idx"))
        else:
            m = _V1_RE.match(tensor)
            if not m:
                continue
            v1 = True
            flat, idx = m.group("flat"), int(m.group("i")) - 1
            name = flat
            scope = m.group("scope")
            if scope and _flat(scope) == flat:
                display[flat] = scope  # the variable's real name ("model/emb")
            num_shards[name] = int(m.group("n"))
        if m.group("kind") == "shard_upsert_restore":
            fs_names[_flat(name)] = name
            continue
        tables.setdefault(name, {}).setdefault(idx, {})[m.group("kind")] = tensor
    for name, shards in tables.items():
        if name not in num_shards:
            num_shards[name] = max(shards) + 1
    step = _read_step(reader, shapes)

    read: dict[str, dict[int, tuple]] = {}
    for name, shards in tables.items():
        read[name] = {}
        for idx, parts in shards.items():
            if "keys" not in parts or "values" not in parts:
                raise ValueError(f"TFRA checkpoint {prefix!r}: shard {idx} of {name!r} lacks its "
                                 f"{'values' if 'keys' in parts else 'keys'} tensor")
            read[name][idx] = (reader.get_tensor(parts["keys"]), reader.get_tensor(parts["values"]))
    result = _assemble(read, num_shards, "tf2_checkpoint" if tf2 else "tf1_saver",
                       flat=v1 and not tf2, step=step, display=display)

    missing = {f: n for f, n in fs_names.items() if n not in tables}
    if missing:
        d = fs_dir or _find_fs_dir(prefix)
        if d is None:
            raise FileNotFoundError(
                f"TFRA checkpoint {prefix!r} was written with a FileSystemSaver (its tables "
                f"{sorted(missing.values())} are not in it) and no {_FS_DIR}[-<step>] directory "
                "is next to it; pass fs_dir=")
        fs = read_tfra_file_system(d, names=list(missing.values()), key_dtype=fs_key_dtype,
                                   value_dtype=fs_value_dtype)
        for name, entry in fs.items():
            entry["step"] = step
            result[name] = entry
    return result


def _read_step(reader, shapes) -> int | None:
    steps = set()
    for t in shapes:
        if t.endswith("_iterations/.ATTRIBUTES/VARIABLE_VALUE") or t == "global_step":
            try:
                steps.add(int(reader.get_tensor(t)))
            except Exception:  # noqa: BLE001 (an odd dtype: no step)
                pass
    return steps.pop() if len(steps) == 1 else None


def read_tfra_file_system(dirpath: str, dim: int | None = None, key_dtype="int64",
                          value_dtype="float32", proc_size: int | None = None,
                          names: Iterable[str] | None = None) -> dict:
    """Reads the raw key/value files that TFRA's FileSystemSaver wrote.

    Args:
      dirpath: the directory with ``*_mht_<i>of<N>_rank<r>_size<s>-keys|-values`` files, or a
        checkpoint directory with a ``TFRADynamicEmbedding[-<step>]`` subdirectory (the one of
        the latest step is read).
      dim: row length; by default inferred from the file sizes (needed only if every shard of a
        variable is empty).
      key_dtype, value_dtype: what the files hold (TFRA writes no header, so they cannot be
        read from the files): int64/int32 keys; values of any dtype TFRA's tables hold
        (float32, float16, bfloat16, float64, int8, int32, int64; names or numpy types).
        String keys or values raise TypeError: TFRA dumps them as raw in-memory tstring
        structs, which hold only a pointer for strings over 22 bytes.
      proc_size: which Horovod world size to read when files of several are present.
      names: variable names ("/" or "_" separated) to return; by default all.

    Returns:
      ``{variable_name: entry}`` (see the module docstring). The files hold only flat names
      ("user_emb" for "user/emb"), so `names` given with "/" are returned under those names.
    """
    dirpath = os.fspath(dirpath)
    if not os.path.isdir(dirpath):
        raise FileNotFoundError(f"no directory {dirpath!r}")
    if not any(_FS_RE.match(f) for f in os.listdir(dirpath)):
        subs = [d for d in os.listdir(dirpath) if os.path.isdir(os.path.join(dirpath, d))
                and re.fullmatch(_FS_DIR + r"(-\d+)?", d)]
        if subs:
            subs.sort(key=lambda d: int(d.rsplit("-", 1)[1]) if "-" in d else -1)
            dirpath = os.path.join(dirpath, subs[-1])
    if str(getattr(key_dtype, "name", key_dtype)) in ("string", "str", "bytes", "object") or \
            key_dtype in (str, bytes, object):
        # TFRA 0.8.1 dumps a string table's keys as raw in-memory tstring structs: the bytes of
        # short keys inline, but only a pointer for keys over 22 bytes. Nothing can read that.
        raise TypeError("FileSystemSaver files of string keys cannot be read: TFRA writes them "
                        "as raw in-memory tstring structs (a pointer for keys longer than 22 "
                        "bytes). Save the TFRA variable with tf.train.Checkpoint and read it "
                        "with read_tfra_checkpoint")
    if _value_dtypes.name_of(value_dtype) == _value_dtypes.STRING:
        # Same dump as for string keys: each value is a raw 24-byte tstring struct (checked on
        # TFRA 0.8.1, tests/fixtures/tfra/file_system_string_values), a pointer for long strings.
        raise TypeError("FileSystemSaver files of string values cannot be read: TFRA writes them "
                        "as raw in-memory tstring structs (a pointer for values longer than 22 "
                        "bytes). Save the TFRA variable with tf.train.Checkpoint and read it "
                        "with read_tfra_checkpoint")
    kd = np.dtype(key_dtype)
    if kd.kind != "i":
        raise TypeError(f"key_dtype must be int64 or int32, got {kd}")
    vd = _value_dtypes.NUMPY[_value_dtypes.name_of(value_dtype)]
    wanted = None if names is None else {_flat(n): n for n in names}

    files: dict[tuple, dict[str, str]] = {}
    sizes_seen: dict[str, set] = {}
    for fname in os.listdir(dirpath):
        m = _FS_RE.match(fname)
        if not m:
            continue
        flat = m.group("flat")
        if wanted is not None and not any(flat == w or flat.startswith(w + "_") for w in wanted):
            continue  # neither a wanted variable nor (possibly) one of its slots
        size = int(m.group("size") or 1)
        rank = int(m.group("rank") or 0)
        sizes_seen.setdefault(flat, set()).add(size)
        key = (flat, size, rank, int(m.group("i")), int(m.group("n")))
        files.setdefault(key, {})[m.group("kind")] = os.path.join(dirpath, fname)
    if not files:
        raise FileNotFoundError(f"no TFRA FileSystemSaver files (*_mht_*-keys) in {dirpath!r}")

    raw: dict[str, dict[int, tuple]] = {}
    num_shards: dict[str, int] = {}
    dims: dict[str, int] = {}
    for (flat, size, rank, i, n), parts in sorted(files.items()):
        if proc_size is None and len(sizes_seen[flat]) > 1:
            raise ValueError(f"{dirpath!r} holds files of {flat!r} for several proc_size values "
                             f"{sorted(sizes_seen[flat])}; pass proc_size=")
        if proc_size is not None and size != proc_size:
            continue
        if set(parts) != {"keys", "values"}:
            raise ValueError(f"{flat}_mht_{i}of{n} (rank {rank}, size {size}) in {dirpath!r} "
                             f"has no -{'values' if 'keys' in parts else 'keys'} file")
        kbytes, vbytes = os.path.getsize(parts["keys"]), os.path.getsize(parts["values"])
        if kbytes % kd.itemsize:
            raise ValueError(f"{parts['keys']}: {kbytes} bytes is not a whole number of "
                             f"{kd} keys (wrong key_dtype?)")
        count = kbytes // kd.itemsize
        if count:
            if vbytes % (count * vd.itemsize):
                raise ValueError(f"{parts['values']}: {vbytes} bytes do not hold {count} rows of "
                                 f"{vd} (corrupt file or wrong value_dtype)")
            d = vbytes // (count * vd.itemsize)
            if dim is not None and d != dim:
                raise ValueError(f"{parts['values']}: rows of length {d}, expected dim={dim}")
            if dims.setdefault(flat, d) != d:
                raise ValueError(f"{flat!r}: shards disagree on dim ({dims[flat]} and {d})")
        elif vbytes:
            raise ValueError(f"{parts['values']}: values without keys")
        # Global shard index: rank-major, like TFRA's repartitioning (rank, then local shard).
        g = rank * n + (i - 1)
        num_shards[flat] = n * size
        raw.setdefault(flat, {})[g] = (parts["keys"], parts["values"], count)

    # Slots share their variable's dim: fill in the dim of variables whose shards are all empty.
    for flat in raw:
        if flat not in dims:
            parent = _split_slot(flat, set(raw), flat=True)
            dims[flat] = dim or (dims.get(parent[0]) if parent else None) or 0
    tables = {}
    for flat, shards in raw.items():
        d = dims[flat]
        tables[flat] = {g: (np.fromfile(kp, kd), np.fromfile(vp, vd).reshape(c, d))
                        for g, (kp, vp, c) in shards.items()}
    out = _assemble(tables, num_shards, "file_system", flat=True, display=wanted)
    if wanted is not None:
        out = {n: e for n, e in out.items() if n in wanted.values()}
        # Names of slot variables are returned inside their variable's entry.
        missing = {n for f, n in wanted.items()
                   if n not in out and _split_slot(f, set(wanted), flat=True) is None}
        if missing:
            raise KeyError(f"no FileSystemSaver files for {sorted(missing)} in {dirpath!r}")
    return out


# ---- loading into dualemb tables -------------------------------------------------------------

def _live_tables(target) -> list:
    from dualemb.core import Table

    if isinstance(target, Table):
        items = [target]
    elif hasattr(target, "tables"):
        items = list(target.tables)
    elif isinstance(target, (list, tuple)):
        items = list(target)
    else:
        raise TypeError("target must be a dualemb.core.Table, a list of them, or an object with "
                        f"a .tables list (a dualemb.tf Variable); got {type(target).__name__}")
    if not items:
        raise ValueError("target has no tables")
    out = []
    for t in items:
        if isinstance(t, Table):
            out.append(t)
        elif hasattr(t, "table_id"):
            out.append(Table.attach(int(t.table_id)))
        elif isinstance(t, (int, np.integer)):
            out.append(Table.attach(int(t)))
        else:
            raise TypeError(f"cannot find a core table in {t!r} (no .table_id)")
    return out


def _to_numpy(x) -> np.ndarray:
    return np.asarray(x.numpy() if hasattr(x, "numpy") else x)


def _pick_entry(data, name):
    if isinstance(data, dict) and "keys" in data and "values" in data:
        return data
    if not isinstance(data, dict) or not data:
        raise TypeError("data must be a reader result {name: entry} or one entry")
    if name is None:
        if len(data) != 1:
            raise ValueError(f"data holds several TFRA variables {sorted(data)}; pass name=")
        return next(iter(data.values()))
    if name not in data:
        flat = {_flat(k): k for k in data}
        if _flat(name) in flat:
            return data[flat[_flat(name)]]
        raise KeyError(f"no TFRA variable {name!r} in data (have {sorted(data)})")
    return data[name]


def _slot_plan(table, entry) -> tuple[list[str] | None, str]:
    """TFRA slot names in the order of the table's core slots, or None and why not."""
    tfra_slots = set(entry.get("slots", {}))
    if not tfra_slots:
        return None, "the TFRA data has no optimizer slots"
    opt = table.optimizer
    if opt is None:
        return None, (f"the live table has no optimizer, so TFRA slots {sorted(tfra_slots)} were "
                      "skipped (attach the matching optimizer to the table first to keep them)")
    mapping = SLOT_MAP.get(opt["name"], {})
    plan = []
    for core_slot in table.slot_names:
        found = [s for s in mapping.get(core_slot, ()) if s in tfra_slots]
        if not found:
            return None, (f"the live table's {opt['name']} slot {core_slot!r} has no counterpart "
                          f"among the TFRA slots {sorted(tfra_slots)}; slots were skipped (rows "
                          "start from the optimizer's initial slot values)")
        plan.append(found[0])
    return plan, f"TFRA slots {plan} -> core slots {table.slot_names}"


def load_tfra_into(target, data, name: str | None = None,
                   partitioner: Callable[[np.ndarray, int], np.ndarray] | None = None,
                   slots: bool = True, page_rows: int = 1 << 20) -> dict:
    """Writes TFRA rows (and optimizer slots) into live dualemb tables.

    Args:
      target: a `dualemb.core.Table`, a list of them (one per live shard), or an object with a
        ``.tables`` list whose items have ``.table_id`` (such as a dualemb.tf Variable); each
        is attached with `Table.attach`.
      data: what a reader returned (``{name: entry}``; pick one with `name` when it holds
        several variables) or a single entry.
      partitioner: ``fn(keys, num_shards) -> shard index per key``; by default the target's own
        ``partition_fn`` when it has one (a dualemb.tf Variable), else floored
        ``key mod num_shards`` (TFRA's CPU default). Keys are re-routed, so any TFRA shard count
        loads into any live shard count.
      slots: write TFRA optimizer slots when every core slot of the live table's optimizer has
        a TFRA counterpart (`SLOT_MAP`: e.g. Adam's ``m``/``v`` -> ``momentum``/``velocity``).
        Otherwise slots are skipped with a warning and the rows get the optimizer's initial
        slots. Keys that TFRA's optimizer never touched also get the initial slots.
      page_rows: rows written per call, bounding the temporary copies.

    Values go into the live table's value dtype by `dualemb.core.value_dtypes.as_values` (floats
    round into float tables; integers must fit an integer table exactly); string values (TFRA's
    ``value_dtype=tf.string``) go only into string tables (``Table(dim, value_dtype="string")``,
    ``de.Variable(value_dtype=tf.string)``) as their exact bytes. Every page is checked before
    the first row is written, so a refused load (TypeError / ValueError naming the mismatch:
    string keys or values against numeric ones, dim, int32 keys out of range, a value beyond the
    live dtype) leaves every live table unchanged.

    Merge, not replace: the TFRA rows are written over the live rows with the same keys (value,
    slots and metadata replaced), and rows the live tables hold for other keys stay. Restoring
    a dualemb checkpoint (`dualemb.core.checkpoint.load`, ``tf.train.Checkpoint.restore``,
    ``dej.load``) replaces a table's whole content instead. For a table holding exactly the
    TFRA rows, load into fresh tables or ``clear()`` them first.

    Returns:
      A report: ``rows`` (written per live shard), ``slots`` (what was done with the slots),
      ``step`` (TFRA's optimizer iteration count, if the checkpoint had one).
    """
    entry = _pick_entry(data, name)
    tables = _live_tables(target)
    keys = np.asarray(entry["keys"]).reshape(-1)
    values = np.asarray(entry["values"])
    if values.ndim != 2 or values.shape[0] != keys.shape[0]:
        raise ValueError(f"values have shape {values.shape}, expected ({keys.shape[0]}, dim)")
    n_live = len(tables)
    _check_kinds(tables, keys, values)
    part = partitioner or getattr(target, "partition_fn", None) or default_partition
    shard = _to_numpy(part(keys, n_live)).reshape(-1)
    if shard.shape != keys.shape or (shard.size and (shard.min() < 0 or shard.max() >= n_live)):
        raise ValueError(f"partitioner must return one shard index in [0, {n_live}) per key")

    plans = [(_slot_plan(t, entry) if slots else (None, "slots=False: skipped")) for t in tables]
    slot_note = plans[0][1]
    if slots and entry.get("slots") and plans[0][0] is None:
        warnings.warn(f"load_tfra_into: {slot_note}")

    def pages(s):
        """(table, keys, values, slots or None) per page of live shard s, converted to the
        table's value dtype (a TypeError names a lossy mismatch)."""
        t, plan = tables[s], plans[s][0]
        vd = _value_dtypes.name_of(t.value_dtype)
        idx = np.nonzero(shard == s)[0]
        for lo in range(0, len(idx), page_rows):
            sel = idx[lo:lo + page_rows]
            k = keys[sel]
            v = _value_dtypes.as_values(values[sel], vd, "TFRA values")
            if plan is None:
                yield t, k, v, None
                continue
            has = np.logical_and.reduce([entry["slot_exists"][p][sel] for p in plan])
            if (~has).any():
                yield t, k[~has], v[~has], None
            if has.any():
                sl = np.stack([_value_dtypes.as_values(np.asarray(entry["slots"][p][sel][has]),
                                                       vd, "TFRA slots") for p in plan], axis=1)
                yield t, k[has], v[has], sl

    # Every page is converted once before anything is written, so a value that does not fit
    # the live dtype (an int64 count into an int8 table) leaves every table unchanged.
    for s in range(n_live):
        for _ in pages(s):
            pass
    rows = [0] * n_live
    for s in range(n_live):
        for t, k, v, sl in pages(s):
            t.import_rows(k, v, slots=sl)
            rows[s] += len(k)
    return {"rows": rows, "slots": slot_note, "step": entry.get("step")}


def _check_kinds(tables, keys: np.ndarray, values: np.ndarray) -> None:
    """Refuses key or value dtypes that cannot go into the live tables at all (before writing)."""
    string_keys = keys.dtype.kind in "OSU"
    string_values = values.dtype.kind in "OSU"
    what = "string" if string_values else values.dtype.name
    for t in tables:
        if string_keys != (t.key_dtype_name == "string"):
            raise TypeError(f"the TFRA variable has {'string' if string_keys else keys.dtype.name} "
                            f"keys but live table {t.id} has {t.key_dtype_name} keys")
        live = _value_dtypes.name_of(t.value_dtype)
        if string_values != (live == _value_dtypes.STRING):
            raise TypeError(f"the TFRA variable has {what} values but live table {t.id} has "
                            f"{live} values: string and numeric values do not convert")
        if values.shape[0] and t.dim != values.shape[1]:
            raise ValueError(f"TFRA rows have dim {values.shape[1]} but live table {t.id} has "
                             f"dim {t.dim}")
        if t.key_dtype_name == "int32" and keys.size and not string_keys and (
                keys.min() < np.iinfo(np.int32).min or keys.max() > np.iinfo(np.int32).max):
            raise ValueError(f"the TFRA variable's {keys.dtype.name} keys do not fit live table "
                             f"{t.id}'s int32 keys")

"""TFRA's ``Variable.save_to_file_system`` / ``load_from_file_system``, on the common checkpoint
format: one checkpoint directory per variable (and per process rank), so TFRA code that saves
tables beside its TF checkpoints keeps working. See docs/tf_saving.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import numpy as np

from dualemb.core import checkpoint as _ckpt
from dualemb.core.checkpoint import CheckpointError
from dualemb.core.table import Table
from dualemb.tf.saving import variable_state as state


def _fs_dir(var, dirpath, proc_size, proc_rank, dirpath_env) -> str:
    base = os.environ.get(dirpath_env) if dirpath_env else None
    base = base or dirpath
    if base is None:
        raise ValueError("save_to_file_system/load_from_file_system need a dirpath")
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", str(var.name))
    if int(proc_size) > 1:
        name += f"_rank{int(proc_rank)}_size{int(proc_size)}"
    return os.path.join(os.fspath(base), name)


def save_variable_to_file_system(var, dirpath, proc_size=1, proc_rank=0, dirpath_env="TFRA_SAVED_KV",
                                 step=None, **unused):
    """``Variable.save_to_file_system``: writes the variable (all shards, slots, metadata) as a
    common-format checkpoint directory ``<dirpath>/<variable name>`` (with
    ``_rank{r}_size{s}`` appended when proc_size > 1). The env var named by ``dirpath_env``
    overrides dirpath, as in TFRA. Returns the directory written."""
    path = _fs_dir(var, dirpath, proc_size, proc_rank, dirpath_env)
    _ckpt.save(path, {str(var.name): state.core_shards(var)}, steps=step,
               metadata={"framework": "tensorflow", "writer": "Variable.save_to_file_system"})
    return path


def load_variable_from_file_system(var, dirpath, proc_size=1, proc_rank=0,
                                   dirpath_env="TFRA_SAVED_KV", load_entire_dir=False, **unused):
    """``Variable.load_from_file_system``: replaces the variable's contents with what
    :func:`save_variable_to_file_system` wrote (any saved shard count). With
    ``load_entire_dir``, every ``<name>_rank*_size*`` directory of the variable under dirpath is
    loaded (their union replaces the contents). Returns the number of rows loaded."""
    if load_entire_dir:
        base = os.environ.get(dirpath_env) if dirpath_env else None
        base = os.fspath(base or dirpath)
        stem = os.path.basename(_fs_dir(var, base, 1, 0, None))
        dirs = sorted(os.path.join(base, d) for d in os.listdir(base)
                      if d == stem or re.fullmatch(re.escape(stem) + r"_rank\d+_size\d+", d))
        if not dirs:
            raise CheckpointError(f"no saved files of de.Variable {var.name!r} under {base}")
    else:
        dirs = [_fs_dir(var, dirpath, proc_size, proc_rank, dirpath_env)]
    if len(dirs) == 1:
        manifest = _ckpt.read_manifest(dirs[0])
        if len(manifest["tables"]) != 1:
            raise CheckpointError(f"{dirs[0]} holds {len(manifest['tables'])} tables, expected "
                                  "the one of a single variable")
        entry = manifest["tables"][0]
        state.check_entry(var, entry, f"loading {dirs[0]}")
        _ckpt.load(dirs[0], {entry["name"]: state.core_shards(var)},
                   partitioner=state.numpy_partitioner(var))
        return sum(t.size() for t in state.core_shards(var))
    return _load_union(var, dirs)


def _load_union(var, dirs: Sequence[str], replace: bool = True) -> int:
    """Loads several single-table checkpoints into scratch tables, then writes their union into
    var (routed by var's partitioner), replacing its contents (or, without ``replace``,
    overwriting only the keys loaded). Returns var's size after."""
    scratch = []
    try:
        for d in dirs:
            manifest = _ckpt.read_manifest(d)
            if len(manifest["tables"]) != 1:
                raise CheckpointError(f"{d} holds {len(manifest['tables'])} tables, expected one")
            state.check_entry(var, manifest["tables"][0], f"loading {d}")
            got = _ckpt.load(d, num_shards=1)
            for v in got.tables.values():
                scratch.extend(v if isinstance(v, list) else [v])
        shards = state.core_shards(var)
        opt = scratch[0].optimizer
        for s in scratch[1:]:
            if s.optimizer != opt:
                raise CheckpointError(f"the saved files under {os.path.dirname(dirs[0])} disagree "
                                      "on the optimizer")
        route = state.numpy_partitioner(var)
        for t in shards:
            if opt is not None and t.optimizer != opt:
                t.set_optimizer(opt)
            if replace:
                t.clear()
        for s in scratch:
            for page in s.export_pages():
                k = page["keys"]
                sid = np.zeros(len(k), np.intp) if route is None else route(k, len(shards))
                for i, t in enumerate(shards):
                    m = sid == i
                    if m.any():
                        t.import_rows(k[m], page["values"][m],
                                      page["slots"][m] if t.num_slots else None,
                                      page["last_update"][m], page["update_count"][m],
                                      page["stepped"][m] if t.num_slots else None)
        return sum(t.size() for t in shards)
    finally:
        for s in scratch:
            s.destroy()


# ---- one shard (TFRA's table-level save_to_file_system / load_from_file_system) -------------------

def _local_path(dirpath, dirpath_env) -> str:
    """dirpath (or the env var named by dirpath_env) as a local path; TFRA takes file:// URLs."""
    base = os.environ.get(dirpath_env) if dirpath_env else None
    base = os.fspath(base or dirpath)
    if base.startswith("file://"):
        base = base[len("file://"):]
    elif "://" in base:
        raise ValueError(f"only local paths (or file:// URLs) are supported, got {base!r}")
    return base


def _file_stem(name) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(name))


def save_shard_to_file_system(shard, dirpath, file_name=None, dirpath_env="TFRA_SAVED_KV") -> str:
    """``TableShard.save_to_file_system``: writes this one table (rows, slots, metadata) as a
    common-format checkpoint directory ``<dirpath>/<file_name or the shard's name>``."""
    path = os.path.join(_local_path(dirpath, dirpath_env), _file_stem(file_name or shard.name))
    table = Table.attach(shard.table_id, name=str(shard.name))
    _ckpt.save(path, {str(file_name or shard.name): [table]},
               metadata={"framework": "tensorflow", "writer": "TableShard.save_to_file_system"})
    return path


def load_shard_from_file_system(shard, var, dirpath, file_name=None, load_entire_dir=False,
                                dirpath_env="TFRA_SAVED_KV") -> int:
    """``TableShard.load_from_file_system``: writes the rows saved under
    ``<dirpath>/<file_name or the shard's name>`` (with ``load_entire_dir``: every saved
    directory whose name starts with it) into ``var``, the Variable this shard belongs to, each
    key into the shard var's partitioner routes it to (TFRA puts every key into this table, where
    lookups through the Variable miss the keys that route elsewhere). Keys not in the files keep
    their rows. Returns var's size after."""
    base = _local_path(dirpath, dirpath_env)
    stem = _file_stem(file_name or shard.name)
    if load_entire_dir:
        dirs = sorted(os.path.join(base, d) for d in os.listdir(base)
                      if d.startswith(stem) and os.path.isdir(os.path.join(base, d)))
    else:
        dirs = [os.path.join(base, stem)]
    if not dirs or not all(os.path.isdir(d) for d in dirs):
        raise CheckpointError(f"no saved table {stem!r} under {base}")
    return _load_union(var, dirs, replace=False)

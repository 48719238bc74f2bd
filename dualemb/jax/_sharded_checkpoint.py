"""save / load of sharded tables (:mod:`dualemb.jax.sharded`) in the common checkpoint format.

A P-process job writes ONE checkpoint, in two phases: every process writes the shard files of
its own shards (``table-0000-shard-<d>`` for mesh shard ``d``) into one temporary directory
beside ``path``; after a barrier, process 0 writes the manifest (covering every file and
checksum; the other processes hand their shard entries over as small JSON files that it reads
and removes) and publishes the directory atomically, as a single-process save does. The result
is an ordinary checkpoint with N shards routed by ``dualemb.core.routing.shard_of``, so it loads
into any number of processes (:func:`load`), into one (``dualemb.jax.load``) and into
``dualemb.tf`` (any shard count), optimizer slots and step included. The directory must be on
a filesystem every process sees (one machine, or a shared mount).
"""

from __future__ import annotations

import json
import numbers
import os
import time

import jax
import numpy as np

from dualemb.core.checkpoint import _fs
from dualemb.core.checkpoint import load as _core_load
from dualemb.core.checkpoint._manifest import (FORMAT, VERSION, CheckpointError, shard_file_name)
from dualemb.core.checkpoint._manifest import write_files as _write_manifest_files
from dualemb.core.checkpoint._safetensors import fsync_dir
from dualemb.core.checkpoint._save import _describe, _write_new_file, _write_shard, _workers
from dualemb.core.table import Table as CoreTable
from dualemb.jax import _values
from dualemb.jax import optimizers as _opts
from dualemb.jax.checkpoint import DEFAULT_NAME, META_KEY, _resolve_optimizer

_ENTRY = "shard-entry-{:05d}.json"  # a process's shard entry, for process 0 (removed by it)


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


def _job_token() -> int:
    """A random number every process agrees on (process 0's)."""
    token = np.frombuffer(os.urandom(4), np.uint32).astype(np.int32)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        token = multihost_utils.broadcast_one_to_all(token)
    return int(np.asarray(token)[0]) & 0x7FFFFFFF


def save(table, path, *, name: str = DEFAULT_NAME, page_rows: int = 1 << 16) -> None:
    """Saves a :class:`~dualemb.jax.sharded.ShardedTable` as table ``name`` of a checkpoint at
    ``path`` (every process calls it; see the module docstring). Waits for pending writes."""
    path = _fs.normalize(path)
    first = jax.process_index() == 0
    local = table.local_tables()  # blocks on the versions
    step = int(next(iter(local.values())).step) if local else 0
    token = _job_token()
    tmp = f"{_fs.tmp_prefix(path)}job-{token:08x}"
    if first:
        if os.path.islink(path) or (os.path.lexists(path) and not (
                os.path.isdir(path) and (_fs.is_complete(path) or not os.listdir(path)))):
            raise CheckpointError(f"{path} exists and is not a dualemb checkpoint; refusing to "
                                  "overwrite it")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mkdir(tmp, 0o755)
    _barrier(f"dualemb-save-begin-{token}")
    try:
        cores = {d: CoreTable.attach(t.id) for d, t in local.items()}
        info = _describe(name, list(cores.values())) if cores else None
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(_workers(), thread_name_prefix="dualemb-ckpt") as pool:
            for d, core in sorted(cores.items()):
                entry = _write_shard(core, os.path.join(tmp, shard_file_name(0, d)), name, d,
                                     info, page_rows, pool)
                _write_new_file(os.path.join(tmp, _ENTRY.format(d)),
                                json.dumps({"entry": entry, "info": info}).encode())
        _barrier(f"dualemb-save-written-{token}")
        if first:
            _publish(table, path, tmp, name, step)
    except BaseException:
        if first:
            _fs.remove_tree(tmp)
        raise
    _barrier(f"dualemb-save-published-{token}")


def _publish(table, path: str, tmp: str, name: str, step: int) -> None:
    n = table.num_shards
    files, info = [], None
    for d in range(n):
        epath = os.path.join(tmp, _ENTRY.format(d))
        if not os.path.exists(epath):
            raise CheckpointError(f"shard {d} of {n} was not written (is {tmp} on a filesystem "
                                  "every process sees?)")
        with open(epath) as f:
            rec = json.load(f)
        os.unlink(epath)
        if info is None:
            info = rec["info"]
        elif rec["info"] != info:
            raise CheckpointError(f"shard {d} disagrees with shard 0 on the table's definition")
        files.append(rec["entry"])
    opt = table.optimizer
    lr = opt.learning_rate if isinstance(opt, _opts.Optimizer) else None
    meta = {META_KEY: {name: {
        "optimizer": "fused" if opt is not None else None,
        "learning_rate": float(lr) if isinstance(lr, numbers.Real) else None}},
        "dualemb.jax.sharded": {name: {"num_shards": n, "axis": str(table.axis)}}}
    manifest = {"format": FORMAT, "version": VERSION, "created_unix": time.time(),
                "metadata": meta, "dense": None,
                "tables": [{"name": name, **info, "step": step,
                            "rows": sum(f["rows"] for f in files), "shards": files}]}
    _write_manifest_files(tmp, manifest, _write_new_file)
    fsync_dir(tmp)
    if os.path.lexists(path) and not _fs.is_complete(path):
        os.rmdir(path)
    _fs.publish(tmp, path)


def load(path, mesh, axis: str, build, *, name: str | None = None, optimizer=None,
         learning_rate=None):
    """Loads table ``name`` of the checkpoint at ``path`` (saved by any number of processes, by
    ``dualemb.jax.save`` or by ``dualemb.tf``) as a ShardedTable over ``mesh`` (every process
    calls it). The rows are resharded by ``shard_of`` to the mesh axis' N shards; each process
    keeps its own shards (it reads the whole checkpoint once and holds the other shards' rows
    only while loading). Optimizer and step as ``dualemb.jax.load``. ``axis`` is the checked
    mesh axis; ``build(shard_id_of, dim, key_dtype, optimizer, step, value_dtype)`` makes the
    table (given by dualemb.jax.sharded, which imports this module)."""
    from dualemb.jax.checkpoint import table_names
    from dualemb.jax.table import canonical
    from dualemb.jax import checkpoint as _jck
    manifest = _jck._ckpt.read_manifest(path)
    if name is None:
        names = table_names(path)
        if len(names) != 1:
            raise ValueError(f"the checkpoint at {path} holds tables {names}: pass name=...")
        name = names[0]
    entries = {t["name"]: t for t in manifest["tables"]}
    if name not in entries:
        raise CheckpointError(f"table {name!r} is not in the checkpoint at {path}")
    entry = entries[name]
    meta = manifest.get("metadata") or {}
    info = dict(meta.get(META_KEY, {}).get(name, {}))
    info["neutral_learning_rate"] = meta.get("learning_rates", {}).get(name)
    value_dtype = str(entry.get("value_dtype", "float32"))
    _values.require_available(value_dtype)
    opt = _resolve_optimizer(name, entry, info, optimizer, learning_rate)
    if opt is not None:
        _values.check_trainable(value_dtype, f"sharded load of table {name!r} with an optimizer")
    if opt is not None and not isinstance(opt, _opts.Optimizer):
        raise TypeError("a sharded table needs a fused optimizer from dualemb.jax.optimizers")
    n = int(mesh.shape[axis])
    mine = {d for idx, dev in np.ndenumerate(mesh.devices)
            for d in [idx[mesh.axis_names.index(axis)]]
            if dev.process_index == jax.process_index()}
    ck = _core_load(path, names=[name], num_shards=n)
    shards = ck.tables[name]
    shards = shards if isinstance(shards, list) else [shards]
    for d, core in enumerate(shards):
        if d not in mine:
            core.destroy()
        elif opt is not None:
            core.set_optimizer(opt.spec)  # a no-op for the saved optimizer (slots kept)
    if opt is not None and mine:
        opt = canonical(shards[min(mine)], opt)
    return build(lambda d: shards[d].id, entry["dim"], str(entry["key_dtype"]), opt,
                 int(entry.get("step") or 0), value_dtype)

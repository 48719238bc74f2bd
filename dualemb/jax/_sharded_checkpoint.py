"""save / load of sharded tables (:mod:`dualemb.jax.sharded`) in the common checkpoint format.

A P-process job writes ONE checkpoint through the common multi-writer protocol
(``dualemb.core.checkpoint.parts``, docs/checkpoint_format.md §6): every process writes the shard
files of its own shards (``table-0000-shard-<d>`` for mesh shard ``d``) into one staging directory
beside ``path``, process 0 writes the manifest last and publishes it atomically; the processes
synchronise through :func:`_all_sum` (an all-gather over ``jax.distributed``). The result is an
ordinary checkpoint with N shards routed by ``dualemb.core.routing.shard_of``, so it loads into
any number of processes (:func:`load`), into one (``dualemb.jax.load``) and into ``dualemb.tf``
(any shard count), optimizer slots and step included. The directory must be on a filesystem
every process sees (one machine, or a shared mount).

Deltas (``base=``) go through the same protocol (``parts.save(..., base=)``, each process its
shards' changed rows and its share of the tombstones); a background save (``blocking=False``)
runs it on a background thread over copies of the shards, synchronised through the
distributed key-value store instead of the all-gather (``_kv_sync`` says why).
"""

from __future__ import annotations

import numbers

import jax
import numpy as np

from dualemb.core import checkpoint as _ckpt
from dualemb.core.checkpoint import CheckpointError
from dualemb.core.checkpoint import _background
from dualemb.core.checkpoint import load as _core_load
from dualemb.core.table import Table as CoreTable
from dualemb.jax import _kv_sync, _values
from dualemb.jax import optimizers as _opts
from dualemb.jax.checkpoint import DEFAULT_NAME, META_KEY, _resolve_optimizer, only_table_name


# How long a background save's round waits for the other processes (each process writes its
# shards between two rounds, so this bounds the slowest writer's share too).
BACKGROUND_SYNC_TIMEOUT_S = 1800.0


def _all_sum(tag: str, values) -> list:
    """The checkpoint protocol's ``sync``: the element-wise sum over the job's processes (a
    barrier too). Values stay below 2**31, so JAX's default int32 carries them."""
    values = np.asarray(values, np.int32)
    if jax.process_count() == 1:
        return values.tolist()
    from jax.experimental import multihost_utils
    gathered = np.asarray(multihost_utils.process_allgather(values))
    return gathered.reshape(jax.process_count(), -1).astype(np.int64).sum(axis=0).tolist()


def _metadata(table, name: str) -> dict:
    opt = table.optimizer
    lr = opt.learning_rate if isinstance(opt, _opts.Optimizer) else None
    return {META_KEY: {name: {
        "optimizer": "fused" if opt is not None else None,
        "learning_rate": float(lr) if isinstance(lr, numbers.Real) else None}},
        "dualemb.jax.sharded": {name: {"num_shards": table.num_shards, "axis": str(table.axis)}}}


def save(table, path, *, name: str = DEFAULT_NAME, page_rows: int = 1 << 16, base=None,
         blocking: bool = True, sync_timeout_s: float = BACKGROUND_SYNC_TIMEOUT_S):
    """Saves a :class:`~dualemb.jax.sharded.ShardedTable` as table ``name`` of a checkpoint at
    ``path`` (every process calls it, in the same order; see the module docstring). Waits for
    pending writes, and for this process's background save if one runs.

    ``base``: writes a delta on that checkpoint (docs/checkpoint_format.md §10): each process
    the rows its shards wrote since, and the tombstones of the base's keys its shards no longer
    hold; the table must have been saved to or loaded from ``base`` last. Every published save
    marks the shards, so a delta can follow any save.

    ``blocking=False``: each process copies its shards now (``Table.clone()``, the state as of
    this call), returns a ``dualemb.core.checkpoint.SaveHandle`` at once and writes the copy on
    a background thread while training goes on. Its rounds of the commit protocol go through
    jax.distributed's key-value store (``_kv_sync``), never through an XLA collective, so they
    cannot interleave with the training steps' collectives. ``sync_timeout_s`` bounds each
    round's wait for the other processes. A failure or ``cancel()`` in one process fails the
    save in all (``wait()`` raises), and nothing is published."""
    if not isinstance(blocking, bool):
        raise TypeError(f"blocking must be True or False, got {blocking!r}")
    local = table.local_tables()  # blocks on the versions
    step = int(next(iter(local.values())).step) if local else 0
    indices = sorted(local)
    cores = [CoreTable.attach(local[d].id) for d in indices]
    options = dict(names=[name], part=jax.process_index(), num_parts=jax.process_count(),
                   coordinator=jax.process_index() == 0, steps=step,
                   metadata=_metadata(table, name), page_rows=page_rows, base=base,
                   num_shards={name: table.num_shards}, mark_changes=True)
    with _background._turn:  # after this process's background save, like checkpoint.save
        # A failure of this process's last background save that nobody waited for is raised
        # inside the protocol (by ``held``), so that it fails this save on every process; raised
        # here, it would leave the other processes waiting at the first round.
        try:
            _background.wait_running()
            earlier = None
        except CheckpointError as e:
            earlier = e

        def held(shards: list) -> dict:
            if earlier is not None:
                raise earlier
            return {name: list(zip(indices, shards))}

        if blocking:
            _ckpt.parts.save(path, lambda: held(cores), sync=_all_sum, **options)
            return None
    sync = _ckpt.parts.single_process if jax.process_count() == 1 else \
        _kv_sync.KeyValueSync(path, sync_timeout_s)

    def write(copies: dict) -> None:  # on the background thread, over the copies
        _ckpt.parts.save(path, lambda: held(copies[name]), sync=sync, **options)
        if sync is not _ckpt.parts.single_process:
            sync.close()

    return _background.start(str(path), {name: cores}, write)


def load(path, mesh, axis: str, build, *, name: str | None = None, optimizer=None,
         learning_rate=None):
    """Loads table ``name`` of the checkpoint at ``path`` (saved by any number of processes, by
    ``dualemb.jax.save`` or by ``dualemb.tf``) as a ShardedTable over ``mesh`` (every process
    calls it). The rows are resharded by ``shard_of`` to the mesh axis' N shards; each process
    keeps its own shards (it reads the whole checkpoint once and holds the other shards' rows
    only while loading). Optimizer and step as ``dualemb.jax.load``. ``axis`` is the checked
    mesh axis; ``build(shard_id_of, dim, key_dtype, optimizer, step, value_dtype)`` makes the
    table (given by dualemb.jax.sharded, which imports this module)."""
    from dualemb.jax.table import canonical
    manifest = _ckpt.read_manifest(path)
    name = only_table_name(path, name)
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

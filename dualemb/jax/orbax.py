"""Orbax integration: save and restore dualemb tables with an ``orbax.checkpoint``
``CheckpointManager``, beside the dense parameters.

    import orbax.checkpoint as ocp
    from dualemb.jax import orbax as deo

    mngr = ocp.CheckpointManager(directory)
    mngr.save(step, args=ocp.args.Composite(
        params=ocp.args.StandardSave(params),
        tables=deo.TablesSave({"user": user_table, "item": item_table})))
    restored = mngr.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract_params),
        tables=deo.TablesRestore({"user": user_table, "item": item_table})))
    user_table = restored.tables["user"]

The item directory holds a checkpoint in dualemb's common format (``<item>/dualemb``), so TF
and ``dualemb.jax.load`` read it too. Restoring into live tables keeps their ids (compiled
functions stay valid); with ``TablesRestore()`` (no targets) new tables are created and the
saved optimizers are used (pass ``optimizers=`` for schedules or Optax transformations).
A restore is all or nothing: every table of the item is verified (dims, dtypes, optimizers,
checksums of every shard) before any live table is written.

The manager's own policies work on these items as on any other: ``max_to_keep`` (older step
directories, tables included, are deleted), ``best_fn`` / ``best_mode`` with
``mngr.save(step, metrics=...)`` (keeps the best N by a metric, ``mngr.best_step()``),
``save_interval_steps`` / ``should_save``.

Async checkpointing (the manager's default, ``enable_async_checkpointing=True``): the handler is
an ``AsyncCheckpointHandler``. ``mngr.save`` copies the tables during the call (``Table.clone()``
of each, after their pending writes: the state as of the call, as Orbax snapshots arrays to host
memory) and returns; a dualemb background save (``dualemb.core.checkpoint``'s, one at a time per
process) writes the copies once Orbax has created the step's directory, and the commit future
Orbax waits on (``wait_until_finished``, the next save) ends when they are published, raising
the save's error if it failed, so Orbax never finalizes a step without its tables. With async
checkpointing off the same path runs, and the save returns once the rows are on disk.

A table whose fused optimizer has an injected learning rate
(``dualemb.jax.optimizers.inject_hyperparams``) has its current value saved beside it and set
again on restore (the generic path's injected hyper-parameters are part of its saved state).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any, List, Mapping, Optional

import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from dualemb.core.checkpoint import CheckpointError
from dualemb.core.checkpoint import _background
from dualemb.core.checkpoint import _save as _core_save
from dualemb.core.checkpoint._manifest import dumps
from dualemb.jax import checkpoint as _ck
from dualemb.jax import optimizers as _opts
from dualemb.jax.table import Table

SUBDIR = "dualemb"
INJECTED_KEY = "dualemb.jax.injected_learning_rates"  # in the checkpoint's metadata
# How long an async save's copies wait for Orbax to create the step directory before the save
# fails (Orbax creates it on a thread of its own right after the save call).
DIRECTORY_TIMEOUT_S = 600.0


def _injected_rates(tables: Mapping[str, Table]) -> dict:
    """name -> current learning rate of each table whose fused optimizer injects it."""
    out = {}
    for name, t in tables.items():
        opt = getattr(t, "optimizer", None)
        if isinstance(opt, _opts.Optimizer) and opt.injected:
            out[name] = float(np.asarray(_opts.hyperparams(t)["learning_rate"]))
    return out


def _write_tables(path: str, tables: dict, steps: dict, metadata: dict) -> None:
    """Writes the (copied) core tables: the one writer of both the sync and the async save."""
    _core_save.save(path, tables, steps=steps, metadata=metadata)


class TablesCheckpointHandler(ocp.AsyncCheckpointHandler):
    """Writes / reads a mapping name -> :class:`dualemb.jax.Table`. The rows live outside JAX,
    in the core: a save waits for pending writes, copies the tables, and writes the copies in
    the background (see the module docstring)."""

    def _collect(self, directory: epath.Path, args: "TablesSave"):
        metadata = dict(args.metadata or {})
        injected = _injected_rates(args.tables)
        if injected:
            metadata[INJECTED_KEY] = injected
        core, steps, meta = _ck.collect(args.tables)
        metadata[_ck.META_KEY] = meta
        dumps({"metadata": metadata})  # not JSON: fail in the call, not in the background
        return str(epath.Path(directory) / SUBDIR), core, steps, metadata

    def save(self, directory: epath.Path, args: "TablesSave"):
        """Writes the tables now (after this process's running background save)."""
        path, core, steps, metadata = self._collect(directory, args)
        with _background._turn:  # after this process's background save, as every save
            _background.wait_running()
            _write_tables(path, core, steps, metadata)

    async def async_save(self, directory: epath.Path, args: "TablesSave"
                         ) -> Optional[List[Any]]:
        """Copies the tables now (the state as of the call) and returns the commit future that
        writes the copies once Orbax has made ``directory`` and raises the write's error."""
        path, core, steps, metadata = self._collect(directory, args)
        created = threading.Event()  # set by the commit future: Orbax made the directory

        def write(copies: dict) -> None:  # background thread, over the copies
            if not created.wait(DIRECTORY_TIMEOUT_S):
                raise CheckpointError(f"{path}: Orbax did not create the step directory within "
                                      f"{DIRECTORY_TIMEOUT_S:.0f} s; the tables were not saved")
            _write_tables(path, copies, steps, metadata)

        handle = _background.start(path, core, write)  # copies taken here, in the call

        async def commit() -> None:
            created.set()
            await asyncio.to_thread(handle.wait)  # raises the save's error: no step without it

        # Runs ``commit`` once Orbax signals that the step's directories exist.
        return [ocp.future.CommitFutureAwaitingContractedSignals(
            commit(), name="dualemb-tables-save")]

    def restore(self, directory: epath.Path, args: Optional["TablesRestore"] = None
                ) -> dict:
        path = str(epath.Path(directory) / SUBDIR)
        args = args or TablesRestore()
        # All tables in one load: every table is verified before any live table changes.
        tables = _ck.load_tables(path, into=args.tables, optimizers=args.optimizers)
        from dualemb.core import checkpoint as core_ckpt
        saved = (core_ckpt.read_manifest(path).get("metadata") or {}).get(INJECTED_KEY, {})
        for name, rate in saved.items():
            t = tables.get(name)
            if t is not None and isinstance(t.optimizer, _opts.Optimizer) and t.optimizer.injected:
                tables[name] = _opts.set_hyperparams(t, learning_rate=rate)
        return tables

    def metadata(self, directory: epath.Path) -> Optional[Any]:
        from dualemb.core import checkpoint as core_ckpt
        return core_ckpt.read_manifest(str(epath.Path(directory) / SUBDIR))


@ocp.args.register_with_handler(TablesCheckpointHandler, for_save=True)
@dataclasses.dataclass
class TablesSave(ocp.args.CheckpointArgs):
    """Save args: ``tables`` (name -> Table), optional JSON ``metadata``."""

    tables: Mapping[str, Table]
    metadata: Optional[dict] = None


@ocp.args.register_with_handler(TablesCheckpointHandler, for_restore=True)
@dataclasses.dataclass
class TablesRestore(ocp.args.CheckpointArgs):
    """Restore args: ``tables`` (name -> live Table to restore into, keeping its id; None =
    every saved table, into new tables), ``optimizers`` (name -> optimizer, see
    :func:`dualemb.jax.load`)."""

    tables: Optional[Mapping[str, Table]] = None
    optimizers: Optional[Mapping[str, Any]] = None

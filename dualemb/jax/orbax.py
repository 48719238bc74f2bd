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
``save_interval_steps`` / ``should_save``. The save is synchronous (it returns once the rows are
on disk). For a save that does not stop training, ``dualemb.jax.save(..., blocking=False)``
writes a snapshot of the tables in the background (docs/online_learning.md).

A table whose fused optimizer has an injected learning rate
(``dualemb.jax.optimizers.inject_hyperparams``) has its current value saved beside it and set
again on restore (the generic path's injected hyper-parameters are part of its saved state).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from dualemb.jax import checkpoint as _ck
from dualemb.jax import optimizers as _opts
from dualemb.jax.table import Table

SUBDIR = "dualemb"
INJECTED_KEY = "dualemb.jax.injected_learning_rates"  # in the checkpoint's metadata


def _injected_rates(tables: Mapping[str, Table]) -> dict:
    """name -> current learning rate of each table whose fused optimizer injects it."""
    out = {}
    for name, t in tables.items():
        opt = getattr(t, "optimizer", None)
        if isinstance(opt, _opts.Optimizer) and opt.injected:
            out[name] = float(np.asarray(_opts.hyperparams(t)["learning_rate"]))
    return out


class TablesCheckpointHandler(ocp.CheckpointHandler):
    """Writes / reads a mapping name -> :class:`dualemb.jax.Table` (synchronously: the rows
    live outside JAX, in the core; the save waits for pending writes, then pages them out)."""

    def save(self, directory: epath.Path, args: "TablesSave"):
        metadata = dict(args.metadata or {})
        injected = _injected_rates(args.tables)
        if injected:
            metadata[INJECTED_KEY] = injected
        _ck.save(args.tables, str(epath.Path(directory) / SUBDIR), metadata=metadata)

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

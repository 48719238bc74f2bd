"""save / load of JAX table handles in dualemb's common checkpoint format.

The rows, optimizer slots, initializer and optimizer spec go through
:mod:`dualemb.core.checkpoint` (so TF reads what JAX writes and back); what only the JAX handle
knows is recorded beside them:

* the step count (the format's per-table ``step``);
* under ``metadata["dualemb.jax"][name]``: the learning rate when it is a number (a schedule
  cannot be serialised: pass ``learning_rate=`` or ``optimizer=`` to :func:`load`), and for the
  generic Optax path the scalar state and the names of the companion state tables (saved as
  tables ``<name>.opt_state.<i>``).
"""

from __future__ import annotations

import numbers
from typing import Mapping

import numpy as np

from dualemb.core import checkpoint as _ckpt
from dualemb.core.table import Table as CoreTable
from dualemb.jax import _values
from dualemb.jax import optimizers as _opts
from dualemb.jax.table import (Table, _optimizer, _scalar, block, canonical,
                                check_exists)

META_KEY = "dualemb.jax"
DEFAULT_NAME = "table"


def _as_mapping(tables) -> dict:
    if isinstance(tables, Table):
        return {DEFAULT_NAME: tables}
    if isinstance(tables, Mapping) and all(isinstance(t, Table) for t in tables.values()):
        return dict(tables)
    raise TypeError("tables must be a dualemb.jax.Table or a mapping name -> Table")


def _state_name(name: str, i: int) -> str:
    return f"{name}.opt_state.{i}"


def collect(tables) -> tuple[dict, dict, dict]:
    """(core tables by name, steps by name, JAX metadata) for ``checkpoint.save``; waits for
    every write the handles depend on."""
    core, steps, meta = {}, {}, {}
    for name, t in _as_mapping(tables).items():
        check_exists(t)
        block(t)
        core[name] = CoreTable.attach(t.id)
        steps[name] = int(np.asarray(t.step))
        info: dict = {"optimizer": None, "learning_rate": None}
        opt = t.optimizer
        if isinstance(opt, _opts.Optimizer):
            info["optimizer"] = "fused"
            lr = opt.learning_rate
            if isinstance(lr, numbers.Real):
                info["learning_rate"] = float(lr)
        elif opt is not None:
            info["optimizer"] = "generic"
            info["state_tables"] = []
            for i, tid in enumerate(t.slot_ids):
                sname = _state_name(name, i)
                core[sname] = CoreTable.attach(tid)
                info["state_tables"].append(sname)
            info["opt_state"] = [{"value": np.asarray(s).tolist(),
                                  "dtype": str(np.asarray(s).dtype)} for s in t.opt_state]
        meta[name] = info
    return core, steps, meta


def save(tables, path, *, dense: Mapping | None = None, metadata: dict | None = None,
         base=None, blocking: bool = True):
    """Saves a table (or a mapping name -> table) to ``path`` in the common format, atomically.

    Waits for every pending write to the tables first. ``dense`` (name -> array) and
    ``metadata`` (a JSON dict) are stored beside them. A single table is saved as "table".
    With ``base`` (a checkpoint the tables were last saved to or loaded from), writes a delta:
    the rows written since, and tombstones (docs/checkpoint_format.md §10); ``load`` follows the
    chain.

    ``blocking=False`` returns a ``dualemb.core.checkpoint.SaveHandle`` at once and writes the
    state as of the call (the tables copied, the dense arrays fetched) on a background thread
    while training goes on; ``handle.wait()`` raises its error, ``handle.cancel()`` stops it
    before it publishes (docs/online_learning.md). Otherwise returns None once it is written.
    """
    core, steps, meta = collect(tables)
    md = dict(metadata or {})
    md[META_KEY] = meta
    dense_np = None if dense is None else {k: np.asarray(v) for k, v in dense.items()}
    return _ckpt.save(path, core, steps=steps, dense=dense_np, metadata=md, base=base,
                      blocking=blocking)


def table_names(path) -> list[str]:
    """Names of the tables saved at ``path`` (the generic path's state tables left out)."""
    manifest = _ckpt.read_manifest(path)
    meta = (manifest.get("metadata") or {}).get(META_KEY, {})
    hidden = {s for info in meta.values() for s in info.get("state_tables", [])}
    return [t["name"] for t in manifest["tables"] if t["name"] not in hidden]


def only_table_name(path, name=None) -> str:
    """``name``, or the name of the only table saved at ``path`` (ValueError if several)."""
    if name is not None:
        return name
    names = table_names(path)
    if len(names) != 1:
        raise ValueError(f"the checkpoint at {path} holds tables {names}: pass name=...")
    return names[0]


def _resolve_optimizer(name, entry, info, optimizer, learning_rate):
    """The optimizer the loaded handle gets (see :func:`load`)."""
    if optimizer is not None:
        return _optimizer(optimizer)
    if info.get("optimizer") == "generic":
        raise ValueError(
            f"table {name!r} was trained with an Optax transformation (generic path), which a "
            "checkpoint cannot record: pass the same transformation as optimizer=...")
    spec = entry.get("optimizer")
    if not spec:
        return None
    lr = learning_rate if learning_rate is not None else info.get("learning_rate")
    if lr is None:  # recorded by another front end (dualemb.tf.save), when it was a constant
        lr = info.get("neutral_learning_rate")
    if lr is None:
        raise ValueError(
            f"table {name!r} has optimizer {spec['name']!r} but the checkpoint does not record "
            "its learning rate (a schedule, or saved by another front end): pass "
            "learning_rate=... or optimizer=...")
    return _opts.from_spec(spec, lr)


def load(path, name: str | None = None, *, optimizer=None, learning_rate=None,
         into: Table | None = None) -> Table:
    """Loads one table from the checkpoint at ``path`` and returns its handle.

    Args:
      name: which table (needed only when the checkpoint holds several).
      optimizer: the optimizer to train with; default: ``into``'s, else the saved one (its
        definition and slots), with the saved learning rate, or ``learning_rate`` if given.
        A generic-path table needs its Optax transformation here. A fused optimizer other than
        the saved one starts from fresh slots.
      into: restore into this live table (keeping its id, so compiled functions and other
        front ends holding the id see the restored rows); its dim and key dtype must match the
        checkpoint's, else ``CheckpointError`` and the table is left unchanged. Default: a new
        table.

    The step count is restored (0 if the checkpoint has none). To restore several tables, use
    :func:`load_tables`: it verifies all of them before changing any.
    """
    manifest = _ckpt.read_manifest(path)
    name = only_table_name(path, name)
    return _load(path, manifest, [name], {name: into}, {name: optimizer},
                 {name: learning_rate})[name]


def load_tables(path, names=None, *, into: Mapping | None = None,
                optimizers: Mapping | None = None,
                learning_rates: Mapping | None = None) -> dict:
    """Loads several tables from the checkpoint at ``path``: name -> handle.

    ``names``: which tables (default: the keys of ``into`` if given, else every saved table);
    ``into``, ``optimizers``, ``learning_rates``: mappings name -> what :func:`load` takes as
    ``into``, ``optimizer``, ``learning_rate`` (a name left out gets the default).

    All or nothing: every table's manifest entry, dim, dtypes, optimizer and every checksum of
    every shard file are verified before any live table is modified, so a bad second table
    leaves the first live table as it was.
    """
    manifest = _ckpt.read_manifest(path)
    into, optimizers = dict(into or {}), dict(optimizers or {})
    learning_rates = dict(learning_rates or {})
    if names is None:
        names = list(into) if into else table_names(path)
    elif isinstance(names, str):
        names = [names]
    names = list(dict.fromkeys(names))
    return _load(path, manifest, names, into, optimizers, learning_rates)


def _plan(path, manifest: dict, name: str, into, optimizer, learning_rate) -> dict:
    """Everything about one table that can be checked without touching a live table."""
    entries = {t["name"]: t for t in manifest["tables"]}
    if name not in entries:
        raise _ckpt.CheckpointError(f"table {name!r} is not in the checkpoint at {path} "
                                    f"(it has {table_names(path)})")
    if into is not None and not isinstance(into, Table):
        raise TypeError(f"into[{name!r}] must be a dualemb.jax.Table, got {type(into).__name__}")
    if optimizer is None and into is not None:
        optimizer = into.optimizer
    entry = entries[name]
    if entry.get("key_dtype") == "string":
        from dualemb.jax.ids import STRING_KEYS_MESSAGE
        raise TypeError(f"table {name!r} of the checkpoint at {path} has string keys: "
                        f"{STRING_KEYS_MESSAGE}")
    value_dtype = str(entry.get("value_dtype", "float32"))
    _values.require_available(value_dtype)  # float64/int64 need x64 (before anything is read)
    metadata = manifest.get("metadata") or {}
    info = dict(metadata.get(META_KEY, {}).get(name, {}))
    info["neutral_learning_rate"] = metadata.get("learning_rates", {}).get(name)
    opt = _resolve_optimizer(name, entry, info, optimizer, learning_rate)
    if opt is not None:
        _values.check_trainable(value_dtype, f"load of table {name!r} with an optimizer")
    generic = opt is not None and not isinstance(opt, _opts.Optimizer)
    state_names = list(info.get("state_tables", [])) if generic else []
    state = []
    if generic:
        state = [np.asarray(s["value"], dtype=s["dtype"]) for s in info.get("opt_state", [])]
        lay = opt.layout(entry["dim"])
        missing = [s for s in state_names if s not in entries]
        if missing or len(state_names) != sum(k == "row" for k in lay.kinds) or len(state) != len(
                lay.scalar_init):
            raise _ckpt.CheckpointError(
                f"table {name!r}: the saved generic optimizer state does not fit {opt.tx!r}")
    live = {}
    if into is not None:
        check_exists(into)
        block(into)
        live[name] = CoreTable.attach(into.id)
        if generic and len(into.slot_tables) == len(state_names):
            live.update({s: CoreTable.attach(t) for s, t in zip(state_names, into.slot_ids)})
    return {"name": name, "opt": opt, "generic": generic, "value_dtype": value_dtype, "state_names": state_names,
            "state": state, "step": int(entry.get("step") or 0), "live": live}


def _load(path, manifest: dict, names: list, into: dict, optimizers: dict,
          learning_rates: dict) -> dict:
    plans = [_plan(path, manifest, n, into.get(n), optimizers.get(n), learning_rates.get(n))
             for n in names]
    live, load_names = {}, []
    for p in plans:
        load_names += [p["name"]] + p["state_names"]
        live.update(p["live"])
    # One core load for every table: it verifies the whole selection (and that no live table
    # is given twice) before writing any.
    ck = _ckpt.load(path, live, names=load_names)
    return {p["name"]: _handle(p, ck) for p in plans}


def _handle(plan: dict, ck) -> Table:
    name, opt = plan["name"], plan["opt"]
    core = ck.tables[name]
    if isinstance(opt, _opts.Optimizer):
        core.set_optimizer(opt.spec)  # a no-op when it is the saved one (slots kept)
        opt = canonical(core, opt)
    table = Table(core.id, core.dim, core.key_dtype.name,
                  opt if isinstance(opt, _opts.Optimizer) else None, _scalar(0),
                  _scalar(plan["step"]), value_dtype=_values.name_of(core.value_dtype))
    if plan["generic"]:
        import jax.numpy as jnp
        slot_ids = tuple(ck.tables[s].id for s in plan["state_names"])
        table = table.replace(optimizer=opt, slot_tables=slot_ids,
                              opt_state=tuple(jnp.asarray(s) for s in plan["state"]))
    return table


# ---- live serving updates (docs/online_learning.md) -------------------------------------------

class Publisher:
    """The trainer's side: ``publish(tables)`` saves the JAX tables into ``directory`` named by
    their step, a full checkpoint every ``full_every`` publishes and deltas between
    (``dualemb.core.checkpoint.Publisher``, after waiting for the tables' pending writes)."""

    def __init__(self, directory, *, full_every: int = 10):
        self._core = _ckpt.Publisher(directory, {}, full_every=full_every)
        self.directory = self._core.directory

    def publish(self, tables, *, step: int | None = None, dense: Mapping | None = None,
                metadata: dict | None = None, blocking: bool = True):
        """Saves ``tables`` (a table or name -> table, their current handles) as ``save``
        does; the checkpoint is named by ``step`` (default: the largest of their steps), which
        must grow from one publish to the next."""
        core, steps, meta = collect(tables)
        md = dict(metadata or {})
        md[META_KEY] = meta
        dense_np = None if dense is None else {k: np.asarray(v) for k, v in dense.items()}
        step = max(steps.values()) if step is None else step
        return self._core.publish(step, tables=core, steps=steps, dense=dense_np,
                                  metadata=md, blocking=blocking)


def follow(directory, tables, *, partitioner=None) -> "_ckpt.Follower":
    """The serving side: a ``dualemb.core.checkpoint.Follower`` that keeps the JAX ``tables``
    (a table or name -> table) at the newest checkpoint in ``directory``; ``poll()`` or
    ``start(interval)``/``stop()``. Lookups (``dej.lookup``/``dej.find``, jitted or not) go on
    meanwhile and see each row before or after an update, never half-written. The tables may
    be fresh (``dej.create`` with the trainer's dim and dtypes) or loaded from a checkpoint of
    the directory. Tables of the generic Optax path follow without their optimizer state."""
    core = {}
    for name, t in _as_mapping(tables).items():
        check_exists(t)
        block(t)
        core[name] = CoreTable.attach(t.id)
    return _ckpt.Follower(directory, core, partitioner=partitioner)

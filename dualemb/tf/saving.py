"""Saving and restoring dynamic-embedding tables from TensorFlow and Keras 3.

Every saving path carries, per ``de.Variable``, the rows of all its shards with their optimizer
slots and per-key metadata, plus a small JSON description (dim, dtypes, the table config and
the fused optimizer's spec). Restoring **replaces** a variable's contents: after a restore its
tables hold exactly the saved keys, with the saved rows, slots and metadata. A checkpoint whose
dim or dtypes differ from the variable it is restored into is refused before the table is
touched. See docs/tf_saving.md.

Paths:

* TF object checkpoints (``tf.train.Checkpoint``, ``CheckpointManager``) and SavedModel:
  ``Variable._serialize_to_tensors`` / ``_restore_from_tensors`` call :func:`serialize_variable`
  and :func:`restore_variable`. The tensors are built with the dualemb TF ops only, so the same
  code runs eagerly and in the functions a SavedModel stores; a SavedModel re-creates its tables
  (same ids, same config) when it is loaded in a fresh process after ``import dualemb.tf``.
* Keras 3 ``.weights.h5`` and ``.keras`` files: a DE layer's ``save_own_variables`` /
  ``load_own_variables`` call :func:`layer_save_own_variables` / :func:`layer_load_own_variables`.
* The common checkpoint format (``dualemb.core.checkpoint``), readable from JAX: :func:`save` /
  :func:`load` for a Variable, a layer, a model or any trackable, with the optimizer step and the
  dense weights; :func:`save_variable_to_file_system` / :func:`load_variable_from_file_system`
  back ``Variable.save_to_file_system`` / ``load_from_file_system``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow as tf

from dualemb.core import checkpoint as _ckpt
from dualemb.core.checkpoint import CheckpointError
from dualemb.core.table import Table

__all__ = [
    "CheckpointError", "serialize_variable", "restore_variable", "layer_save_own_variables",
    "layer_load_own_variables", "save", "load", "find_variables", "save_variable_to_file_system",
    "load_variable_from_file_system",
]

FORMAT = "dualemb.tf.variable"
FORMAT_VERSION = 1
# The local names of the tensors one Variable contributes to a TF checkpoint or a Keras store.
# They are the same whatever the shard count and optimizer, so a checkpoint restores into any
# number of shards (keys are re-routed with the variable's partitioner) and into a variable whose
# optimizer is not attached yet.
FIELDS = ("keys", "values", "slots", "last_update", "update_count")
META = "meta"
_DTYPES = {"keys": tf.int64, "values": tf.float32, "slots": tf.float32,
           "last_update": tf.int64, "update_count": tf.int64, META: tf.string}
# Keras stores: DE entries are named "dualemb.<j>.<field>", next to Keras' own "0", "1", ...
_STORE_PREFIX = "dualemb."


# ---- access to the Variable and the ops ------------------------------------------------------

def _ops():
    """dualemb.tf.ops: the wrappers of the dualemb TF ops (create_table, export_table, ...)."""
    from dualemb.tf import ops as de_ops

    return de_ops


def is_variable(obj) -> bool:
    """Whether obj is a ``dualemb.tf.Variable``."""
    from dualemb.tf.variable import Variable

    return isinstance(obj, Variable)


def _shard_ids(var) -> list[int]:
    ids = [int(getattr(t, "table_id", t)) for t in var.tables]
    if not ids:
        raise ValueError(f"de.Variable {var.name!r} has no tables")
    return ids


def _shard_handles(var) -> list:
    """The table ids as constants made in the current graph. Never a captured eager tensor: a
    SavedModel cannot export the save/restore functions of a non-resource object that capture
    one. A SavedModel's tables are re-created under their saved ids when it is loaded (by the
    ``create_table`` calls below, and by the variable's own resources), so the ids stay valid."""
    return [tf.constant(i, tf.int64) for i in _shard_ids(var)]


def _tf_key_dtype(var) -> tf.DType:
    return tf.as_dtype(var.key_dtype)


def _var_facts(var) -> dict:
    """dim, dtypes, shard ids and shard configs of a Variable, read now (in Python)."""
    ids = _shard_ids(var)
    descr = []
    for tid in ids:
        config, _, opt = _describe(tid).partition("|")
        descr.append((config, opt))
    return {
        "name": str(var.name),
        "dim": int(var.dim),
        "key_dtype": _tf_key_dtype(var).name,
        "value_dtype": tf.as_dtype(var.value_dtype).name,
        "ids": ids,
        "configs": [c for c, _ in descr],
    }


def _describe(table_id: int) -> str:
    from dualemb.core.table import _core

    return _core.describe(int(table_id))


def _partition(var, keys: tf.Tensor, num_shards: int) -> tf.Tensor:
    """Shard index of every key, by the variable's own partitioner (so restored keys land where
    the variable's lookups look for them)."""
    return tf.cast(var.partition_fn(keys, num_shards), tf.int32)


# ---- the meta description -----------------------------------------------------------------------

def _meta_tensor(facts: dict, describe: tf.Tensor) -> tf.Tensor:
    """JSON text describing the saved variable. The table's description (config '|' optimizer
    spec) is read by an op when the checkpoint is written, so it is current in graph mode too."""
    static = {"format": FORMAT, "version": FORMAT_VERSION, "name": facts["name"],
              "dim": facts["dim"], "key_dtype": facts["key_dtype"],
              "value_dtype": facts["value_dtype"], "num_shards": len(facts["ids"])}
    head = json.dumps(static)[:-1] + ', "describe": "'
    return tf.strings.join([head, describe, '"}'])


def _parse_meta(text, where: str) -> dict:
    if isinstance(text, (tf.Tensor, np.ndarray)):
        text = text.numpy() if isinstance(text, tf.Tensor) else text
        if isinstance(text, np.ndarray):
            text = text.tobytes() if text.dtype == np.uint8 else text.item()
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    try:
        meta = json.loads(text)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: the dualemb description is not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{where}: not a dualemb variable checkpoint (format "
                              f"{meta.get('format') if isinstance(meta, dict) else meta!r})")
    if not isinstance(meta.get("version"), int) or meta["version"] > FORMAT_VERSION:
        raise CheckpointError(f"{where}: description version {meta.get('version')!r} is newer than "
                              f"this dualemb understands ({FORMAT_VERSION}); upgrade dualemb")
    return meta


def _check_compatible(facts: dict, meta: dict, where: str) -> None:
    """Raises CheckpointError if the saved variable cannot be restored into this one."""
    for field, what in (("dim", "dim"), ("key_dtype", "key dtype"),
                        ("value_dtype", "value dtype")):
        if meta.get(field) != facts[field]:
            raise CheckpointError(
                f"{where}: {what} mismatch: the checkpoint holds a variable with {what} "
                f"{meta.get(field)!r}, but de.Variable {facts['name']!r} has {what} "
                f"{facts[field]!r}; the variable was left unchanged")


# ---- TF checkpoints and SavedModel --------------------------------------------------------------

def _export_tensors(var) -> dict:
    """The variable's tensors (all shards concatenated), built with the dualemb ops."""
    ops = _ops()
    facts = _var_facts(var)
    kd = _tf_key_dtype(var)
    parts = []
    for res, config in zip(_shard_handles(var), facts["configs"]):
        # Get-or-create: a no-op here, but in a SavedModel loaded in a fresh process the save
        # function runs (to describe the checkpoint) before anything else may have made the table.
        handle = ops.create_table(res, config, "")
        parts.append(ops.export_table(handle, key_dtype=kd, dim=facts["dim"]))
        if len(parts) == 1:
            describe = ops.describe(handle)

    def cat(f):
        xs = [p[f] for p in parts]
        return xs[0] if len(xs) == 1 else tf.concat(xs, axis=0)

    out = {f: cat(f) for f in FIELDS}
    out["keys"] = tf.cast(out["keys"], tf.int64)
    out[META] = _meta_tensor(facts, describe)
    return out


class _LazyExport:
    """Defers the export to the moment TF writes the checkpoint and does it once for all fields.

    TF calls ``_serialize_to_tensors`` also when it only needs the names and dtypes (on every
    restore); returning callables keeps that from copying the whole live table."""

    def __init__(self, var):
        self._var = var
        self._tensors = None
        self._pending = set()

    def get(self, field):
        if not self._pending:
            with tf.device("/cpu:0"):
                self._tensors = _export_tensors(self._var)
            self._pending = set(self._tensors)
        self._pending.discard(field)
        value = self._tensors[field]
        if not self._pending:
            self._tensors = None
        return value


def serialize_variable(var) -> dict:
    """``Variable._serialize_to_tensors``: {"keys", "values", "slots", "last_update",
    "update_count", "meta"} over all shards. Works eagerly and while tracing (SavedModel).
    A variable made with ``checkpoint=False`` contributes nothing."""
    return _serialize(var)


def _serialize(var) -> dict:
    if not getattr(var, "checkpoint", True):
        return {}
    try:
        from tensorflow.python.checkpoint import tensor_callable
    except ImportError:  # pragma: no cover - a TF without deferred checkpoint values
        tensor_callable = None
    if not tf.executing_eagerly() or tensor_callable is None:
        return _export_tensors(var)

    lazy = _LazyExport(var)
    with tf.device("/cpu:0"):
        # The full name (/job:localhost/.../device:CPU:0): with a short one TF would count a
        # second task and move the whole save into a tf.function.
        device = tf.constant(0).device
    return {f: tensor_callable.Callable(lambda f=f: lazy.get(f), _DTYPES[f], device)
            for f in FIELDS + (META,)}


def _graph_checks(facts: dict, restored: dict) -> list:
    """Assertions standing in for the eager checks inside a traced restore function."""
    dim = facts["dim"]
    values, meta = restored["values"], restored[META]
    return [
        tf.debugging.assert_equal(
            tf.shape(values)[1], dim,
            message=f"dualemb: dim mismatch restoring de.Variable {facts['name']!r} "
                    f"(dim {dim}); the variable was left unchanged"),
        tf.debugging.Assert(
            tf.strings.regex_full_match(
                meta, f'.*"key_dtype": "{facts["key_dtype"]}".*"value_dtype": '
                      f'"{facts["value_dtype"]}".*'),
            [tf.constant(f"dualemb: key/value dtype mismatch restoring de.Variable "
                         f"{facts['name']!r}; the variable was left unchanged"), meta]),
    ]


def _eager_checks(facts: dict, restored: dict, where: str) -> None:
    meta = _parse_meta(restored[META], where)
    _check_compatible(facts, meta, where)
    n = int(tf.shape(restored["keys"])[0])
    dim = facts["dim"]
    for f, want in (("values", (n, dim)), ("last_update", (n,)), ("update_count", (n,))):
        shape = tuple(restored[f].shape)
        if shape != want and not (f != "values" and shape == (0,)):
            raise CheckpointError(f"{where}: tensor {f!r} has shape {shape}, expected {want}")
    s = tuple(restored["slots"].shape)
    if len(s) != 3 or s[0] != n or s[2] != dim:
        raise CheckpointError(f"{where}: tensor 'slots' has shape {s}, expected "
                              f"[{n}, num_slots, {dim}]")
    opt = meta.get("describe", "").partition("|")[2]
    if s[1] and not opt:
        raise CheckpointError(f"{where}: the checkpoint has {s[1]} slot columns but no optimizer")
    if opt:
        try:
            scratch = Table(dim=dim, key_dtype=facts["key_dtype"], optimizer=opt)
        except Exception as e:
            raise CheckpointError(f"{where}: cannot attach the saved optimizer {opt!r}: {e}") from e
        try:
            if scratch.num_slots != s[1]:
                raise CheckpointError(f"{where}: the saved optimizer {opt!r} has "
                                      f"{scratch.num_slots} slots, the checkpoint stores {s[1]}")
        finally:
            scratch.destroy()
    if facts["key_dtype"] == "int32" and n:
        k = restored["keys"].numpy()
        if k.min() < np.iinfo(np.int32).min or k.max() > np.iinfo(np.int32).max:
            raise CheckpointError(f"{where}: keys do not fit the variable's int32 key dtype")


def _optimizer_of(meta: tf.Tensor) -> tf.Tensor:
    """The optimizer spec saved in the meta JSON (empty string if none), as a string tensor."""
    describe = tf.strings.regex_replace(meta, r'^.*"describe": "([^"]*)".*$', r"\1")
    return tf.strings.regex_replace(describe, r"^[^|]*\|?", "")


def restore_variable(var, restored: Mapping) -> tf.Operation | None:
    """``Variable._restore_from_tensors`` (see :func:`_restore`)."""
    return _restore(var, restored)


def _restore(var, restored: Mapping) -> tf.Operation | None:
    """``Variable._restore_from_tensors``: replaces the contents of every shard with the saved
    rows, slots and metadata (keys routed by the variable's partitioner), attaching the saved
    optimizer first. Raises CheckpointError (eagerly; an assertion in a traced function) and
    leaves the variable unchanged if the checkpoint does not fit it."""
    where = f"restoring de.Variable {getattr(var, 'name', var)!r}"
    if not getattr(var, "checkpoint", True):
        return None
    missing = [f for f in FIELDS + (META,) if f not in restored]
    if missing:
        raise CheckpointError(f"{where}: the checkpoint lacks tensors {missing}")
    facts = _var_facts(var)
    restored = dict(restored)
    if tf.executing_eagerly():
        _eager_checks(facts, restored, where)
        deps = []
    else:
        deps = _graph_checks(facts, restored)
    return _import_tensors(var, facts, restored, deps)


def _import_tensors(var, facts: dict, restored: dict, deps: list):
    ops = _ops()
    kd = _tf_key_dtype(var)
    with tf.control_dependencies(deps):
        keys = tf.cast(restored["keys"], kd)
    fields = {"keys": keys, "values": restored["values"], "slots": restored["slots"],
              "last_update": restored["last_update"], "update_count": restored["update_count"]}
    n = len(facts["ids"])
    if n > 1:
        part = _partition(var, keys, n)
        split = {f: tf.dynamic_partition(t, part, n) for f, t in fields.items()}
        per_shard = [{f: split[f][i] for f in fields} for i in range(n)]
    else:
        per_shard = [fields]
    opt = _optimizer_of(restored[META])
    # Attach the saved optimizer (if any) to every shard, then replace each shard's rows. The
    # import op validates shapes before it clears, and every shard agrees on them, so a bad
    # checkpoint fails before any shard changes.
    handles = [ops.create_table(res, config, opt)
               for res, config in zip(_shard_handles(var), facts["configs"])]
    results = []
    with tf.control_dependencies(handles):
        for h, part_fields in zip(handles, per_shard):
            results.append(ops.import_table(
                h, part_fields["keys"], part_fields["values"], part_fields["slots"],
                part_fields["last_update"], part_fields["update_count"], clear=True))
    if tf.executing_eagerly():
        _sync_optimizer_spec(var)
        return None
    return tf.group(results)


def _sync_optimizer_spec(var) -> None:
    """Records on each TableShard the optimizer a restore attached, so a SavedModel exported
    later re-creates the table with it."""
    for t, tid in zip(var.tables, _shard_ids(var)):
        if hasattr(t, "optimizer_spec"):
            t.optimizer_spec = _describe(tid).partition("|")[2]


# ---- Keras 3 .weights.h5 / .keras -----------------------------------------------------------------

def _own_de_variables(layer) -> list:
    """The de.Variables a layer holds itself (not through a sub-layer), in a stable order."""
    import keras

    found, seen = [], set()

    def visit(value, depth):
        if depth > 3 or isinstance(value, (str, bytes, keras.layers.Layer)):
            return
        if is_variable(value):
            if id(value) not in seen:
                seen.add(id(value))
                found.append(value)
            return
        if isinstance(value, Mapping):
            for k in sorted(value, key=str):
                visit(value[k], depth + 1)
        elif isinstance(value, (list, tuple)):
            for v in value:
                visit(v, depth + 1)

    for name in sorted(vars(layer)):
        if name.startswith("__") or name in ("_inbound_nodes", "_outbound_nodes", "_tracker"):
            continue
        visit(vars(layer)[name], 0)
    return found


def _saved_de_variables(layer) -> list:
    return [v for v in _own_de_variables(layer) if getattr(v, "checkpoint", True)]


def _keras_vars(layer) -> list:
    return list(layer._trainable_variables) + list(layer._non_trainable_variables)


def layer_save_own_variables(layer, store) -> None:
    """For a Keras layer's ``save_own_variables(store)``: writes the layer's Keras variables
    exactly as Keras does ("0", "1", ...) and, for each de.Variable the layer holds, the entries
    ``dualemb.<j>.{keys,values,slots,last_update,update_count,meta}``."""
    for i, v in enumerate(_keras_vars(layer)):
        store[f"{i}"] = v
    for j, var in enumerate(_saved_de_variables(layer)):
        tensors = _export_tensors(var)
        for f in FIELDS:
            store[f"{_STORE_PREFIX}{j}.{f}"] = tensors[f].numpy()
        meta = tensors[META].numpy()
        store[f"{_STORE_PREFIX}{j}.{META}"] = np.frombuffer(meta, np.uint8).copy()


def layer_load_own_variables(layer, store) -> None:
    """For a Keras layer's ``load_own_variables(store)``: the inverse of
    :func:`layer_save_own_variables`. Every de.Variable is checked against its saved description
    before anything is assigned; its tables' contents are then replaced."""
    keys = list(store.keys())
    plain = [k for k in keys if not str(k).startswith(_STORE_PREFIX)]
    all_vars = _keras_vars(layer)
    if len(plain) != len(all_vars):
        raise ValueError(
            f"Layer {layer.name!r} expects {len(all_vars)} Keras variables, but the saved state "
            f"has {len(plain)}; the file was saved from a different layer")
    de_vars = _saved_de_variables(layer)
    saved = sorted({int(str(k)[len(_STORE_PREFIX):].split(".")[0]) for k in keys
                    if str(k).startswith(_STORE_PREFIX)})
    if saved != list(range(len(de_vars))):
        raise CheckpointError(
            f"Layer {layer.name!r} holds {len(de_vars)} de.Variables, but the saved state has "
            f"{len(saved)}; the file was saved from a different layer")
    restored = []
    for j, var in enumerate(de_vars):
        where = f"loading layer {layer.name!r} de.Variable {var.name!r}"
        try:
            t = {f: tf.convert_to_tensor(np.asarray(store[f"{_STORE_PREFIX}{j}.{f}"]),
                                         _DTYPES[f]) for f in FIELDS}
            meta_bytes = np.asarray(store[f"{_STORE_PREFIX}{j}.{META}"], np.uint8).tobytes()
        except KeyError as e:
            raise CheckpointError(f"{where}: the saved state lacks {e}") from None
        t[META] = tf.constant(meta_bytes)
        _eager_checks(_var_facts(var), t, where)
        restored.append((var, t))
    for i, v in enumerate(all_vars):
        v.assign(store[f"{i}"])
    for var, t in restored:
        _import_tensors(var, _var_facts(var), t, [])


# ---- finding the variables of a model -------------------------------------------------------------

def find_variables(obj) -> dict:
    """name -> de.Variable for every dynamic-embedding variable reachable from obj: a Variable,
    a Keras layer or model (all sub-layers), a tf.Module / tf.train.Checkpoint / any trackable
    (followed through TF's object tracking), or a list/dict of these. Names are the variables'
    own names (a suffix "_1", "_2", ... is added when two variables share a name)."""
    found: list = []
    seen: set = set()

    def add(var):
        if var is not obj and not getattr(var, "checkpoint", True):
            return
        if id(var) not in seen:
            seen.add(id(var))
            found.append(var)

    def walk(o):
        if is_variable(o):
            add(o)
            return
        if isinstance(o, Mapping):
            for v in o.values():
                walk(v)
            return
        if isinstance(o, (list, tuple)):
            for v in o:
                walk(v)
            return
        try:
            import keras

            if isinstance(o, keras.layers.Layer):
                for layer in [o] + list(o._flatten_layers(include_self=False, recursive=True)):
                    for var in _own_de_variables(layer):
                        add(var)
        except ImportError:  # pragma: no cover
            pass
        if isinstance(o, tf.__internal__.tracking.Trackable):
            for d in tf.train.TrackableView(o).descendants():
                if is_variable(d):
                    add(d)

    walk(obj)
    out: dict = {}
    for var in found:
        name = str(var.name)
        unique, k = name, 1
        while unique in out:
            unique = f"{name}_{k}"
            k += 1
        out[unique] = var
    return out


# ---- the common checkpoint format -------------------------------------------------------------

def _core_shards(var) -> list:
    return [Table.attach(tid, name=str(var.name)) for tid in _shard_ids(var)]


def _numpy_partitioner(var):
    n_ids = len(_shard_ids(var))
    if n_ids == 1:
        return None

    def route(keys: np.ndarray, n: int) -> np.ndarray:
        return _partition(var, tf.constant(keys), n).numpy()

    return route


def _optimizer_for(obj, optimizer):
    if optimizer is not None:
        return optimizer
    return getattr(obj, "optimizer", None)


def _iterations(optimizer):
    it = getattr(optimizer, "iterations", None)
    return None if it is None else int(np.asarray(it))


def _constant_learning_rate(optimizer):
    """The optimizer's learning rate if it is a constant (a schedule cannot be recorded)."""
    import keras

    if optimizer is None or isinstance(getattr(optimizer, "_learning_rate", None),
                                       keras.optimizers.schedules.LearningRateSchedule):
        return None
    try:
        return float(np.asarray(optimizer.learning_rate))
    except (AttributeError, TypeError, ValueError):
        return None


def _dense_groups(obj, optimizer) -> dict:
    """{"model": [(path, variable)], "optimizer": [...]}: a Keras obj's weights and its Keras
    optimizer's variables, in their own order."""
    import keras

    groups = {}
    if isinstance(obj, keras.layers.Layer):
        groups["model"] = [(v.path, v) for v in obj.weights]
    if optimizer is not None and isinstance(optimizer, keras.optimizers.Optimizer):
        groups["optimizer"] = [(v.path, v) for v in optimizer.variables]
    return groups


def _dense_weights(obj, optimizer) -> tuple[dict, dict]:
    """(name -> array, group -> saved order). Names are "<group>/<variable path>"."""
    arrays, order = {}, {}
    for group, items in _dense_groups(obj, optimizer).items():
        order[group] = [p for p, _ in items]
        for p, v in items:
            arrays[f"{group}/{p}"] = np.asarray(v.numpy())
    return arrays, order


def save(obj, path, *, optimizer=None, step=None, include_dense=True, metadata=None) -> dict:
    """Writes every de.Variable of ``obj`` (a Variable, layer, model, or any trackable) to
    ``path`` in the common checkpoint format (docs/checkpoint_format.md), readable from JAX.

    Each variable is one table of the checkpoint, named by the variable's name, with all its
    shards, optimizer slots and per-key metadata. ``step`` (default: the iteration count of
    ``optimizer``, or of ``obj.optimizer``) is recorded as every table's optimizer step. With
    ``include_dense``, a Keras ``obj``'s weights (as ``model/<variable.path>``) and its Keras
    optimizer's variables (as ``optimizer/<variable.path>``) are saved as the checkpoint's dense
    parameters. Returns name -> Variable of what was saved."""
    variables = find_variables(obj)
    if not variables:
        raise ValueError(f"{obj!r} holds no dualemb de.Variable to save")
    optimizer = _optimizer_for(obj, optimizer)
    if step is None and optimizer is not None:
        step = _iterations(optimizer)
    tables = {name: _core_shards(var) for name, var in variables.items()}
    dense, order = _dense_weights(obj, optimizer) if include_dense else ({}, {})
    meta = {"framework": "tensorflow", "writer": "dualemb.tf.save",
            "variables": {name: {"num_shards": len(t), "dim": int(var.dim)}
                          for (name, var), t in zip(variables.items(), tables.values())},
            "dense_order": order}
    lr = _constant_learning_rate(optimizer)
    if lr is not None:
        # Front-end neutral: lets dualemb.jax.load continue with the same learning rate.
        meta["learning_rates"] = {name: lr for name in variables}
    if metadata:
        meta["user"] = dict(metadata)
    _ckpt.save(os.fspath(path), tables, steps=step, dense=dense or None, metadata=meta)
    return variables


def load(obj, path, *, optimizer=None, strict=True, load_dense=True):
    """Restores every de.Variable of ``obj`` from the common-format checkpoint at ``path``
    (written by :func:`save` or by the JAX front end), replacing the tables' contents; the
    checkpoint may have any number of shards. The saved optimizer step is assigned to the
    iterations of ``optimizer`` (default ``obj.optimizer``). With ``load_dense``, the saved dense
    weights of a Keras ``obj`` and of its optimizer are assigned too. Tables are matched to
    variables by name, dense weights by variable path; when names differ (auto-generated names
    of another model instance, a checkpoint written from JAX), by position if the counts, dims
    and shapes all agree. An unbuilt Keras optimizer is built first, as
    ``keras.models.load_model`` does.

    With ``strict``, every variable of obj must be in the checkpoint and every dense weight of
    obj must find its saved value. Everything (checksums, dims, dtypes, dense shapes) is verified
    before any table or weight changes. Returns the ``dualemb.core.checkpoint.Checkpoint`` that
    was read."""
    path = os.fspath(path)
    variables = find_variables(obj)
    manifest = _ckpt.read_manifest(path)
    saved = {t["name"]: t for t in manifest["tables"]}
    variables = _match_tables(variables, manifest["tables"])
    missing = [n for n in variables if n not in saved]
    if missing and strict:
        raise CheckpointError(f"de.Variables {missing} are not in the checkpoint at {path} "
                              f"(it has {sorted(saved)}); pass strict=False to skip them")
    chosen = {n: v for n, v in variables.items() if n in saved}
    for name, var in chosen.items():
        _check_entry(var, saved[name], f"loading {path}")
    optimizer = _optimizer_for(obj, optimizer)
    assignments = []
    if load_dense and manifest.get("dense"):
        _build_optimizer(obj, optimizer)
        order = manifest.get("metadata", {}).get("dense_order", {})
        assignments = _plan_dense(obj, optimizer, _ckpt.load_dense(path), order, strict, path)
    # One checkpoint.load for every table, each with its own partitioner: it verifies the
    # whole checkpoint before touching any table.
    result = None
    if chosen:
        result = _ckpt.load(path, {n: _core_shards(v) for n, v in chosen.items()},
                            partitioner={n: _numpy_partitioner(v) for n, v in chosen.items()})
    if result is None:
        result = _ckpt.Checkpoint(path=path, manifest=manifest)
    for v, value in assignments:
        v.assign(value)
    steps = [saved[n]["step"] for n in chosen if saved[n].get("step") is not None]
    if optimizer is not None and steps and getattr(optimizer, "iterations", None) is not None:
        optimizer.iterations.assign(max(steps))
    return result


def _match_tables(variables: dict, entries: list) -> dict:
    """Saved table name -> variable. By name; when some names differ (another model instance's
    auto-generated layer names, or a checkpoint written by JAX) and there are as many tables as
    variables whose dims and key dtypes agree in order, by position."""
    names = [e["name"] for e in entries]
    if all(n in names for n in variables) or len(entries) != len(variables):
        return variables
    if len(entries) == 1:  # one variable, one table: whatever their names (dims checked later)
        return {names[0]: next(iter(variables.values()))}
    pairs = list(zip(entries, variables.values()))
    if all(e["dim"] == int(v.dim) and e["key_dtype"] == _tf_key_dtype(v).name for e, v in pairs):
        return {e["name"]: v for e, v in pairs}
    return variables


def _build_optimizer(obj, optimizer) -> None:
    import keras

    if (isinstance(obj, keras.layers.Layer) and isinstance(optimizer, keras.optimizers.Optimizer)
            and not optimizer.built):
        optimizer.build(obj.trainable_variables)


def _plan_dense(obj, optimizer, dense: dict, order: dict, strict: bool, where: str) -> list:
    """[(variable, saved value)] for the dense weights of obj and its optimizer."""
    plan = []
    for group, items in _dense_groups(obj, optimizer).items():
        prefix = group + "/"
        saved_order = order.get(group) or sorted(k[len(prefix):] for k in dense
                                                 if k.startswith(prefix))
        saved_order = [p for p in saved_order if prefix + p in dense]
        paths = [p for p, _ in items]
        if all(p in saved_order for p in paths):
            pairs = [(v, dense[prefix + p]) for p, v in items]
        elif len(paths) == len(saved_order) and all(
                tuple(v.shape) == tuple(dense[prefix + s].shape)
                for (_, v), s in zip(items, saved_order)):
            pairs = [(v, dense[prefix + s]) for (_, v), s in zip(items, saved_order)]
        else:
            unmatched = [p for p in paths if p not in saved_order]
            if strict:
                raise CheckpointError(
                    f"{where}: the {group} weights {unmatched} have no saved value (the "
                    f"checkpoint has {saved_order}); pass strict=False to skip them")
            pairs = [(v, dense[prefix + p]) for p, v in items if p in saved_order]
        for v, value in pairs:
            if tuple(v.shape) != tuple(value.shape):
                raise CheckpointError(f"{where}: dense weight {v.path!r} has shape "
                                      f"{tuple(v.shape)}, the checkpoint's has {value.shape}")
        plan.extend(pairs)
    return plan


def _check_entry(var, entry: dict, where: str) -> None:
    # Tables store float32 whatever the variable's value_dtype (cast at the boundary), and the
    # checkpoint loader checks the stored value dtype itself.
    facts = dict(_var_facts(var), value_dtype=entry.get("value_dtype"))
    meta = {"dim": entry.get("dim"), "key_dtype": entry.get("key_dtype"),
            "value_dtype": entry.get("value_dtype")}
    _check_compatible(facts, meta, f"{where}, table {entry.get('name')!r}")


# ---- Variable.save_to_file_system / load_from_file_system -----------------------------------------

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
    _ckpt.save(path, {str(var.name): _core_shards(var)}, steps=step,
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
        _check_entry(var, entry, f"loading {dirs[0]}")
        _ckpt.load(dirs[0], {entry["name"]: _core_shards(var)},
                   partitioner=_numpy_partitioner(var))
        return sum(t.size() for t in _core_shards(var))
    return _load_union(var, dirs)


def _load_union(var, dirs: Sequence[str]) -> int:
    """Loads several single-table checkpoints into scratch tables, then replaces var's contents
    with their union (routed by var's partitioner)."""
    scratch = []
    try:
        for d in dirs:
            manifest = _ckpt.read_manifest(d)
            if len(manifest["tables"]) != 1:
                raise CheckpointError(f"{d} holds {len(manifest['tables'])} tables, expected one")
            _check_entry(var, manifest["tables"][0], f"loading {d}")
            got = _ckpt.load(d, num_shards=1)
            for v in got.tables.values():
                scratch.extend(v if isinstance(v, list) else [v])
        shards = _core_shards(var)
        opt = scratch[0].optimizer
        for s in scratch[1:]:
            if s.optimizer != opt:
                raise CheckpointError(f"the saved files under {os.path.dirname(dirs[0])} disagree "
                                      "on the optimizer")
        route = _numpy_partitioner(var)
        for t in shards:
            if opt is not None and t.optimizer != opt:
                t.set_optimizer(opt)
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
                                      page["last_update"][m], page["update_count"][m])
        return sum(t.size() for t in shards)
    finally:
        for s in scratch:
            s.destroy()

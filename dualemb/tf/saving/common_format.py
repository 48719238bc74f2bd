"""``de.save`` / ``de.load``: every de.Variable of a Variable, layer, model or any trackable, with
the optimizer step and the dense weights, in the common checkpoint format
(``dualemb.core.checkpoint``, docs/checkpoint_format.md), which the JAX front end reads and writes.

Tables are matched to variables by name, dense weights by variable path; when names differ (another
model instance's auto-generated names, a checkpoint written from JAX), by position if counts, dims
and shapes all agree. See docs/tf_saving.md.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping

import keras
import numpy as np
import tensorflow as tf

from dualemb.core import checkpoint as _ckpt
from dualemb.core.checkpoint import CheckpointError
from dualemb.tf import keras_adapter
from dualemb.tf.distribute import job_checkpoint, remote_shards, replica_shards
from dualemb.tf.saving import gathered_shards
from dualemb.tf.saving import variable_state as state
from dualemb.tf.saving.keras_files import own_de_variables
from dualemb.tf.trainable import is_trainable_wrapper
from dualemb.tf.variable import Variable

__all__ = ["save", "load", "find_variables"]


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
        if isinstance(o, Variable):
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
        if isinstance(o, keras.layers.Layer):
            for layer in [o] + keras_adapter.sublayers(o):
                for var in own_de_variables(layer):
                    add(var)
        if isinstance(o, tf.__internal__.tracking.Trackable):
            for d in tf.train.TrackableView(o).descendants():
                if isinstance(d, Variable):
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


def _optimizer_for(obj, optimizer):
    if optimizer is not None:
        return optimizer
    return getattr(obj, "optimizer", None)


def _iterations(optimizer):
    it = getattr(optimizer, "iterations", None)
    return None if it is None else int(np.asarray(it))


def _constant_learning_rate(optimizer):
    """The optimizer's learning rate if it is a constant (a schedule cannot be recorded). A
    wrapper (DynamicEmbeddingOptimizer, LossScaleOptimizer) is looked through."""
    while getattr(optimizer, "inner_optimizer", None) is not None:
        optimizer = optimizer.inner_optimizer
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
    groups = {}
    if isinstance(obj, keras.layers.Layer):
        # Gradient anchors hold nothing (their tables are saved as tables): leaving them out also
        # keeps their numpy(), a full table snapshot, from running.
        groups["model"] = [(v.path, v) for v in obj.weights if not is_trainable_wrapper(v)]
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


def save(obj, path, *, optimizer=None, step=None, include_dense=True, metadata=None,
         base=None, blocking=True):
    """Writes every de.Variable of ``obj`` (a Variable, layer, model, or any trackable) to
    ``path`` in the common checkpoint format (docs/checkpoint_format.md), readable from JAX.

    Each variable is one table of the checkpoint, named by the variable's name, with all its
    shards, optimizer slots and per-key metadata. ``step`` (default: the iteration count of
    ``optimizer``, or of ``obj.optimizer``) is recorded as every table's optimizer step. With
    ``include_dense``, a Keras ``obj``'s weights (as ``model/<variable.path>``) and its Keras
    optimizer's variables (as ``optimizer/<variable.path>``) are saved as the checkpoint's dense
    parameters. Returns name -> Variable of what was saved.

    Under a ``MultiWorkerMirroredStrategy`` whose all-to-all embeddings keep each replica's shard
    in its worker, every worker must call ``save`` with the same ``path`` (a directory all of
    them see): together they write one checkpoint of the whole job
    (``dualemb/tf/distribute/job_checkpoint.py``).

    With ``base`` (a checkpoint the variables were last saved to or loaded from), writes a
    delta: the rows written since, and tombstones (docs/checkpoint_format.md §10); ``load``
    follows the chain. Shards on parameter-server tasks are gathered by the chief, which writes
    the rows that differ from the base's (``gathered_shards.py``). Not for a
    MultiWorkerMirroredStrategy job yet: NotImplementedError.

    ``blocking=False`` returns a ``dualemb.core.checkpoint.SaveHandle`` instead, at once: the
    tables are copied (``Table.clone``) and the dense weights read during the call, and the
    checkpoint of that state is written on a background thread while training goes on;
    ``handle.wait()`` raises its error, ``handle.cancel()`` stops it before it publishes
    (docs/online_learning.md); shards on parameter-server tasks are gathered during the call.
    Not under a MultiWorkerMirroredStrategy job (its commit barrier is the strategy's all-reduce,
    which must run on the training thread): ValueError."""
    if not isinstance(blocking, bool):
        raise TypeError(f"blocking must be True or False, got {blocking!r}")
    variables = find_variables(obj)
    if not variables:
        raise ValueError(f"{obj!r} holds no dualemb de.Variable to save")
    optimizer = _optimizer_for(obj, optimizer)
    if step is None and optimizer is not None:
        step = _iterations(optimizer)
    strategy = job_checkpoint.job_strategy(variables)
    if strategy is not None and base is not None:
        raise NotImplementedError("delta saves (base=...) of a multi-worker job are not "
                                  "supported yet; save a full checkpoint")
    if strategy is not None:
        if not blocking:
            raise ValueError("de.save(blocking=False) is not supported for a "
                             "MultiWorkerMirroredStrategy job (the workers' commit barrier is "
                             "the strategy's all-reduce, run on the training thread); save with "
                             "blocking=True")
        dense, meta = _save_metadata(obj, variables, optimizer, include_dense, metadata)
        job_checkpoint.save_job(strategy, os.fspath(path), variables, steps=step,
                                dense=dense or None, metadata=meta)
        return variables
    with contextlib.ExitStack() as stack:
        # Shards on PS tasks are gathered through their handles into scratch tables here.
        staged = {name: stack.enter_context(remote_shards.staged_core_shards(var))
                  for name, var in variables.items()}
        if base is not None:
            # The scratch copies know nothing of the base: their changes are found by content.
            gathered_shards.mark_changes_since(os.fspath(base), staged)
        tables = {name: [gathered_shards.Untracked(t) if r else t for t, r in zip(*shards)]
                  for name, shards in staged.items()}
        # A background save copies the tables before this returns (remote shards' scratch
        # copies included, which the exit then frees).
        handle = _save_tables(obj, path, variables, tables, optimizer, step, include_dense,
                              metadata, base, blocking)
    return variables if blocking else handle


def _save_tables(obj, path, variables, tables, optimizer, step, include_dense, metadata,
                 base=None, blocking=True):
    dense, meta = _save_metadata(obj, variables, optimizer, include_dense, metadata)
    return _ckpt.save(os.fspath(path), tables, steps=step, dense=dense or None, metadata=meta,
                      base=None if base is None else os.fspath(base), blocking=blocking)


def _save_metadata(obj, variables, optimizer, include_dense, metadata) -> tuple[dict, dict]:
    """(dense weights, the manifest's metadata)."""
    dense, order = _dense_weights(obj, optimizer) if include_dense else ({}, {})
    meta = {"framework": "tensorflow", "writer": "dualemb.tf.save",
            # An all-to-all Variable's shards are its replicas' (some in other processes).
            "variables": {name: {"num_shards": (replica_shards.owning_replicas(var)
                                                or len(var.tables)), "dim": int(var.dim)}
                          for name, var in variables.items()},
            "dense_order": order}
    lr = _constant_learning_rate(optimizer)
    if lr is not None:
        # Front-end neutral: lets dualemb.jax.load continue with the same learning rate.
        meta["learning_rates"] = {name: lr for name in variables}
    if metadata:
        meta["user"] = dict(metadata)
    return dense, meta


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
        state.check_entry(var, saved[name], f"loading {path}")
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
        with contextlib.ExitStack() as stack:
            # Shards on PS tasks are loaded into scratch tables, then written to the PS.
            staged = {n: stack.enter_context(remote_shards.staged_core_shards(v))
                      for n, v in chosen.items()}
            result = _ckpt.load(path, {n: t for n, (t, _) in staged.items()},
                                partitioner={n: state.numpy_partitioner(v)
                                             for n, v in chosen.items()})
            for n, (t, remote) in staged.items():
                remote_shards.write_back(chosen[n], t, remote)
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
    if all(e["dim"] == int(v.dim) and e["key_dtype"] == state.tf_key_dtype(v).name for e, v in pairs):
        return {e["name"]: v for e, v in pairs}
    return variables


def _build_optimizer(obj, optimizer) -> None:
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
        # Older checkpoints also list the (0, dim) anchors: they hold nothing, skip them.
        saved_order = [p for p in saved_order if prefix + p in dense and dense[prefix + p].size]
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

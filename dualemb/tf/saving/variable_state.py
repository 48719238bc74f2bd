"""A ``de.Variable``'s saved state, shared by every saving path (docs/tf_saving.md).

What one Variable saves, whatever the path: the rows of all its shards with their optimizer slots
and per-key metadata (the tensors named by :data:`FIELDS`), plus a JSON description (:data:`META`:
dim, dtypes, the table config and the fused optimizer's spec). This module turns a Variable into
those tensors (:func:`export_tensors`), checks saved tensors against a Variable
(:func:`eager_checks`, :func:`check_compatible`) and replaces a Variable's contents with them
(:func:`import_tensors`); it also gives the core ``Table`` views of a Variable's shards that the
common-format paths read and write (:func:`core_shards`, :func:`numpy_partitioner`).

It only reads a Variable's documented attributes (``tables``, ``table_handles()``, ``dim``,
``key_dtype``, ``value_dtype``, ``name``, ``partition_fn``), so ``dualemb.tf.variable`` can import the saving
paths built on it without an import cycle.
"""

from __future__ import annotations

import json

import numpy as np
import tensorflow as tf

from dualemb.core import legacy_spec
from dualemb.core.checkpoint import CheckpointError
from dualemb.core.checkpoint import Subset as _ckpt_subset
from dualemb.core.routing import shard_of
from dualemb.core.spec import parse_description, to_spec
from dualemb._native import load_extension
from dualemb.core.table import Table
from dualemb.tf import ops
from dualemb.tf.distribute import remote_shards
from dualemb.tf.distribute import replica_shards

_core = load_extension("_core")  # the core's pybind11 binding (csrc/python)

FORMAT = "dualemb.tf.variable"
# 2: "describe" is the core's JSON description object. 1: "config|optimizer" in the old
# "name=value" syntax (read through dualemb.core.legacy_spec).
FORMAT_VERSION = 2
# The local names of the tensors one Variable contributes to a TF checkpoint or a Keras store.
# They are the same whatever the shard count and optimizer, so a checkpoint restores into any
# number of shards (keys are re-routed with the variable's partitioner) and into a variable whose
# optimizer is not attached yet.
FIELDS = ("keys", "values", "slots", "last_update", "update_count")
# The stepped marks (what slot views list): saved in Keras weights files and the common format,
# where an entry may be optional. Not in TF object checkpoints: TF restores every name the object
# serializes and fails on a checkpoint without it, so a new name would break every checkpoint
# saved before; those restore with the core's default (a row is stepped where its slots differ
# from the initial slots).
STEPPED = "stepped"
META = "meta"


def dtypes_of(var) -> dict:
    """The dtype of each saved tensor: keys int64 (int32 keys widened) or strings, values and slots
    in the Variable's value dtype (as the tables store them, so integer and float64 rows stay
    exact)."""
    value_dtype = tf.as_dtype(var.value_dtype)
    keys = tf.string if tf_key_dtype(var) == tf.string else tf.int64
    return {"keys": keys, "values": value_dtype, "slots": value_dtype,
            "last_update": tf.int64, "update_count": tf.int64, STEPPED: tf.bool, META: tf.string}


# ---- facts about a Variable -----------------------------------------------------------------------

def shard_ids(var) -> list[int]:
    ids = [int(getattr(t, "table_id", t)) for t in var.tables]
    if not ids:
        raise ValueError(f"de.Variable {var.name!r} has no tables")
    return ids


def _shard_handles(var) -> list:
    """The shards' resource handles for ops built now (``Variable.table_handles``). A traced
    save/restore function captures them, and a SavedModel maps each to the fresh table its loaded
    TableShard creates, so a loaded model restores and serves its own tables."""
    return var.table_handles()


def tf_key_dtype(var) -> tf.DType:
    return tf.as_dtype(var.key_dtype)


def var_facts(var) -> dict:
    """dim, dtypes, shard ids and shard configs of a Variable, read now (in Python)."""
    ids = shard_ids(var)
    descr = []
    for shard in var.tables:
        # Read where the shard lives (a PS task's table is not in this process's registry).
        config, opt = parse_description(remote_shards.describe_shard(shard))
        descr.append((to_spec(config), opt))
    return {
        "name": str(var.name),
        "dim": int(var.dim),
        "key_dtype": tf_key_dtype(var).name,
        "value_dtype": tf.as_dtype(var.value_dtype).name,
        "ids": ids,
        "configs": [c for c, _ in descr],
    }


def describe(table_id: int) -> str:
    """The core's description of a table: JSON {"config": {...}, "optimizer": {...} | null}."""
    return _core.describe(int(table_id))


def partition(var, keys: tf.Tensor, num_shards: int) -> tf.Tensor:
    """Shard index of every key, by the variable's own partitioner (so restored keys land where
    the variable's lookups look for them)."""
    return tf.cast(var.partition_fn(keys, num_shards), tf.int32)


# ---- the meta description -----------------------------------------------------------------------

def _meta_tensor(facts: dict, description: tf.Tensor) -> tf.Tensor:
    """JSON text describing the saved variable. The table's description (the core's JSON object
    {"config": ..., "optimizer": ...}) is read by an op when the checkpoint is written, so it is
    current in graph mode too. It is the last member (see _optimizer_of)."""
    static = {"format": FORMAT, "version": FORMAT_VERSION, "name": facts["name"],
              "dim": facts["dim"], "key_dtype": facts["key_dtype"],
              "value_dtype": facts["value_dtype"], "num_shards": len(facts["ids"])}
    head = json.dumps(static)[:-1] + ', "describe": '
    return tf.strings.join([head, description, "}"])


def parse_meta(text, where: str) -> dict:
    """The saved description (a string tensor, bytes, or uint8 array of JSON) as a dict;
    CheckpointError if it is not a dualemb variable description this version understands."""
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


def check_compatible(facts: dict, meta: dict, where: str) -> None:
    """Raises CheckpointError if the saved variable cannot be restored into this one."""
    for field, what in (("dim", "dim"), ("key_dtype", "key dtype"),
                        ("value_dtype", "value dtype")):
        if meta.get(field) != facts[field]:
            raise CheckpointError(
                f"{where}: {what} mismatch: the checkpoint holds a variable with {what} "
                f"{meta.get(field)!r}, but de.Variable {facts['name']!r} has {what} "
                f"{facts[field]!r}; the variable was left unchanged")


def check_entry(var, entry: dict, where: str) -> None:
    """check_compatible against a table entry of a common-format manifest."""
    facts = var_facts(var)
    meta = {"dim": entry.get("dim"), "key_dtype": entry.get("key_dtype"),
            "value_dtype": entry.get("value_dtype")}
    check_compatible(facts, meta, f"{where}, table {entry.get('name')!r}")


# ---- Variable -> tensors -------------------------------------------------------------------------

def refuse_partial_save(var) -> None:
    """A Variable whose replica shards are spread over the processes of a
    MultiWorkerMirroredStrategy job holds only its own replicas' rows here. TF object checkpoints
    and Keras weight files are written by each worker from its own process (the chief's file is
    the one kept), so saving through them would silently lose the other workers' rows."""
    if replica_shards.held_elsewhere(var):
        raise CheckpointError(
            f"de.Variable {var.name!r} is an all-to-all embedding whose shards live in "
            f"{replica_shards.owning_replicas(var)} replicas of several processes; this process "
            "holds only its own, so tf.train.Checkpoint / model.save_weights / SavedModel would "
            "write an incomplete table. Save the job with dualemb.tf.save(model, path) called "
            "by every worker (one common-format checkpoint of the whole job, "
            "docs/scaling_tf.md)")


def export_tensors(var) -> dict:
    """The variable's tensors (all shards concatenated), built with the dualemb ops so the same
    code runs eagerly and in the functions a SavedModel stores."""
    refuse_partial_save(var)
    facts = var_facts(var)
    kd = tf_key_dtype(var)
    parts = []
    for handle in _shard_handles(var):
        parts.append(ops.export_table(handle, key_dtype=kd, dim=facts["dim"],
                                      value_dtype=tf.as_dtype(var.value_dtype)))
        if len(parts) == 1:
            description = ops.describe(handle)

    def cat(f):
        xs = [p[f] for p in parts]
        return xs[0] if len(xs) == 1 else tf.concat(xs, axis=0)

    out = {f: cat(f) for f in FIELDS + (STEPPED,)}
    if out["keys"].dtype != tf.string:
        out["keys"] = tf.cast(out["keys"], tf.int64)
    out[META] = _meta_tensor(facts, description)
    return out


# ---- tensors -> Variable -------------------------------------------------------------------------

def eager_checks(facts: dict, restored: dict, where: str) -> None:
    """Raises CheckpointError unless the saved tensors fit the variable described by ``facts``
    (description, dim, dtypes, shapes, the saved optimizer's slot count, int32 key range)."""
    meta = parse_meta(restored[META], where)
    check_compatible(facts, meta, where)
    for f in ("values", "slots"):
        got = tf.as_dtype(restored[f].dtype).name
        if got != facts["value_dtype"]:
            raise CheckpointError(f"{where}: tensor {f!r} has dtype {got}, but the variable's "
                                  f"value dtype is {facts['value_dtype']} (a checkpoint written "
                                  "by a dualemb that stored every value dtype as float32?)")
    n = int(tf.shape(restored["keys"])[0])
    dim = facts["dim"]
    for f, want in (("values", (n, dim)), ("last_update", (n,)), ("update_count", (n,))):
        shape = tuple(restored[f].shape)
        if shape != want and not (f != "values" and shape == (0,)):
            raise CheckpointError(f"{where}: tensor {f!r} has shape {shape}, expected {want}")
    if restored.get(STEPPED) is not None and tuple(restored[STEPPED].shape) != (n,):
        raise CheckpointError(f"{where}: tensor {STEPPED!r} has shape "
                              f"{tuple(restored[STEPPED].shape)}, expected {(n,)}")
    s = tuple(restored["slots"].shape)
    if len(s) != 3 or s[0] != n or s[2] != dim:
        raise CheckpointError(f"{where}: tensor 'slots' has shape {s}, expected "
                              f"[{n}, num_slots, {dim}]")
    opt = _saved_optimizer_text(meta, where)
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


def _saved_optimizer_text(meta: dict, where: str) -> str:
    """The optimizer spec (JSON text, "" if none) of a parsed meta description."""
    description = meta.get("describe")
    try:
        if isinstance(description, str):  # description version 1
            opt = legacy_spec.parse_description(description)[1]
        elif isinstance(description, dict) and "optimizer" in description:
            opt = description["optimizer"]
        else:
            raise ValueError(f"'describe' is {description!r}")
        return "" if opt is None else to_spec(opt)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: malformed dualemb description ({e})") from None


# The meta JSON ends with the core's canonical description, whose config and optimizer objects
# hold no nested objects and no free text (only numbers, lists and enumerated names).
_META_OPTIMIZER = (r'^\{.*, "describe": \{"config":\{[^{}]*\},"optimizer":'
                   r'(null|\{[^{}]*\})\}\}$')


def _optimizer_of(meta: tf.Tensor) -> tf.Tensor:
    """The optimizer spec saved in the meta JSON (empty string if none), as a string tensor."""
    if tf.executing_eagerly():
        return tf.constant(_saved_optimizer_text(parse_meta(meta, "dualemb meta"), "meta"))
    known = tf.debugging.Assert(
        tf.strings.regex_full_match(meta, _META_OPTIMIZER),
        [tf.constant("dualemb: this checkpoint's description was written by an older dualemb "
                     "(or is malformed); restore it eagerly (outside tf.function)"), meta])
    with tf.control_dependencies([known]):
        opt = tf.strings.regex_replace(meta, _META_OPTIMIZER, r"\1")
    return tf.strings.regex_replace(opt, "^null$", "")


def import_tensors(var, facts: dict, restored: dict, deps: list):
    """Replaces the contents of every shard with the saved rows, slots and metadata (keys routed
    by the variable's partitioner), attaching the saved optimizer first; runs after ``deps``
    (the checks of a traced restore). Returns None eagerly, the grouped op in a graph."""
    kd = tf_key_dtype(var)
    with tf.control_dependencies(deps):
        keys = tf.identity(restored["keys"]) if kd == tf.string else tf.cast(restored["keys"], kd)
    fields = {"keys": keys, "values": restored["values"], "slots": restored["slots"],
              "last_update": restored["last_update"], "update_count": restored["update_count"]}
    if restored.get(STEPPED) is not None:
        fields[STEPPED] = tf.cast(restored[STEPPED], tf.bool)
    n = len(facts["ids"])
    if replica_shards.held_elsewhere(var):
        per_shard = _own_replicas_share(var, fields, n)
    elif n > 1:
        part = partition(var, keys, n)
        split = {f: tf.dynamic_partition(t, part, n) for f, t in fields.items()}
        per_shard = [{f: split[f][i] for f in fields} for i in range(n)]
    else:
        per_shard = [fields]
    opt = _optimizer_of(restored[META])
    # Attach the saved optimizer (if any) to every shard, then replace each shard's rows. The
    # import op validates shapes before it clears, and every shard agrees on them, so a bad
    # checkpoint fails before any shard changes.
    handles = _shard_handles(var)
    with tf.control_dependencies(deps):  # the graph checks run before anything is written
        attached = [ops.set_optimizer(h, opt, empty_detaches=False) for h in handles]
    results = []
    with tf.control_dependencies(attached):
        for h, part_fields in zip(handles, per_shard):
            results.append(ops.import_table(
                h, part_fields["keys"], part_fields["values"], part_fields["slots"],
                part_fields["last_update"], part_fields["update_count"], clear=True,
                stepped=part_fields.get(STEPPED)))
    if tf.executing_eagerly():
        _sync_optimizer_spec(var)
        return None
    return tf.group(results)


def _own_replicas_share(var, fields: dict, n: int) -> list:
    """Per local shard, the saved rows of the keys this process's replicas own (an all-to-all
    Variable in one worker of a multi-process job); the other workers restore the rest."""
    keys = fields["keys"]
    num_replicas = replica_shards.owning_replicas(var)
    to_local = np.full(num_replicas, -1, np.int32)
    to_local[np.asarray(replica_shards.local_replicas(var), np.intp)] = np.arange(n, dtype=np.int32)
    local = tf.gather(tf.constant(to_local), tf.cast(shard_of(keys, num_replicas), tf.int32))
    held = local >= 0
    kept = {f: tf.boolean_mask(t, held) for f, t in fields.items()}
    local = tf.boolean_mask(local, held)
    split = {f: tf.dynamic_partition(t, local, n) for f, t in kept.items()}
    return [{f: split[f][i] for f in kept} for i in range(n)]


def _sync_optimizer_spec(var) -> None:
    """Records on each TableShard the optimizer a restore attached, so a SavedModel exported
    later re-creates the table with it."""
    for t in var.tables:
        if hasattr(t, "optimizer_spec"):
            opt = parse_description(remote_shards.describe_shard(t))[1]
            t.optimizer_spec = "" if opt is None else to_spec(opt)


# ---- core Table views (the common checkpoint format) ---------------------------------------------

def core_shards(var) -> list:
    """The variable's shards as ``dualemb.core.Table`` handles, in shard order."""
    return [Table.attach(tid, name=str(var.name)) for tid in shard_ids(var)]


def numpy_partitioner(var):
    """The variable's partitioner on numpy keys (None for one shard), for ``checkpoint.load``.
    For an all-to-all Variable of a multi-process job, a ``checkpoint.Subset`` that keeps only
    the keys of this process's replicas (-1 for the others')."""
    if replica_shards.held_elsewhere(var):
        return _ckpt_subset(lambda keys, n: replica_shards.local_shard_of_keys(var, keys))
    if len(shard_ids(var)) == 1:
        return None

    def route(keys: np.ndarray, n: int) -> np.ndarray:
        return partition(var, tf.constant(keys), n).numpy()

    return route

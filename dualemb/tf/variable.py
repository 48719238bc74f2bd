"""``Variable``: TFRA's dynamic embedding variable over core tables.

Semantics (as TFRA): lookups never insert (missing keys read as their initializer row); only an
optimizer step inserts, and exactly the keys it updated. Keys of another dtype than ``key_dtype``
raise ``DtypeMismatchError`` (a ``TypeError`` that is also the ``ValueError`` TFRA raises);
rows of the wrong shape raise ``ValueError``; the table is then unchanged.

Contract for dualemb's own modules, which use only these (never a private attribute):

- ``var.router`` (``shard_router.py``): checked keys and routed row reads and writes, for the
  lookups, the optimizers and the restrict policies; ``distribute/`` gives it a placement.
- ``var.tables``: one ``TableShard`` (``shard.py``) per shard, in shard order, with
  ``.resource`` (pass it to the ops, also inside traced save/restore functions, so that a
  SavedModel maps it to the table it recreates), ``.table_id`` (the core id, for explicit sharing
  with ``dualemb.core`` / ``dualemb.jax``), ``.config`` and ``.optimizer_spec``; freed with the
  Variable. ``var.table_handles()``: the handles for ops built now (a SavedModel's TF1 saver
  graph gets its own).
- ``dim``, ``key_dtype``, ``value_dtype``, ``name``, ``checkpoint``, ``initializer_spec``,
  ``optimizer_spec`` (attached by ``router.attach_optimizer``), ``partition_fn``, ``shard_num``:
  ``partition_fn(keys, shard_num)`` -> int32 shard index (default floored ``key mod N``).
- Saving: ``_serialize_to_tensors`` / ``_restore_from_tensors`` (TF's Trackable protocol)
  delegate to ``saving/tf_checkpoint.py``, which reads only the attributes above and never
  imports this module.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import tensorflow as tf

from dualemb.core.routing import shard_of
from dualemb.core.table import Table
from dualemb.core.spec import to_spec
from dualemb.tf import ops, variable_store
from dualemb.tf.saving import file_system
from dualemb.tf.saving import tf_checkpoint
from dualemb.tf import initializers as de_inits
from dualemb.tf.distribute.placement import default_devices
from dualemb.tf.errors import DtypeMismatchError, ShapeMismatchError
from dualemb.tf.creators import CuckooHashTableCreator, KVCreator
from dualemb.tf.policies import RestrictPolicy
from dualemb.tf.row_lookup import lookup_ids
from dualemb.tf.shard import TableShard
from dualemb.tf.shard_router import ShardRouter, check_trainable_dtype  # noqa: F401
from dualemb.tf.slots import slot_variables
from dualemb.tf.trainable import TrainableWrapper

_KEY_DTYPES = (tf.int64, tf.int32, tf.string)
_VALUE_DTYPES = (tf.float32, tf.float16, tf.bfloat16, tf.float64, tf.int8, tf.int32, tf.int64,
                 tf.string)


def default_partition_fn(keys, shard_num):
    """Shard index of each key: floored ``key mod shard_num`` (int32); all 0 for one shard.
    String keys go to ``tf.strings.to_hash_bucket_fast(keys, shard_num)``, as in TFRA."""
    if shard_num == 1:
        return tf.zeros(tf.shape(keys), dtype=tf.int32)
    if keys.dtype == tf.string:
        return tf.cast(tf.strings.to_hash_bucket_fast(keys, shard_num), tf.int32)
    return tf.cast(shard_of(keys, shard_num), tf.int32)


def _as_dtype(dtype, allowed, what):
    try:
        dt = tf.as_dtype(dtype)
    except TypeError as e:
        raise TypeError(f"unsupported {what} {dtype!r}") from e
    if dt not in allowed:
        raise TypeError(f"unsupported {what} {dt.name} (supported: "
                        f"{', '.join(a.name for a in allowed)})")
    return dt


# Inside a tf.function autograph would convert these methods and all they call (seconds per
# trace); their Python control flow is over Python objects, never tensors.
_not_converted = tf.autograph.experimental.do_not_convert


class Variable(tf.__internal__.tracking.AutoTrackable):
    """A dynamic embedding variable: a hash table from keys to trainable ``dim``-vectors, split
    over ``len(devices)`` core tables. Same arguments and defaults as TFRA's ``Variable``.

    Args:
      key_dtype: ``tf.int64`` (default), ``tf.int32`` or ``tf.string`` (keys compared by their
        bytes, no collisions; str keys are UTF-8 encoded).
      value_dtype: what the tables store: ``tf.float32`` (default), float16 / bfloat16 (2 bytes per
        element; trained with float32 arithmetic), float64, or int8 / int32 / int64 (counters,
        id maps: every operation but training; their initializer must be a constant), or
        ``tf.string`` (int64/int32 keys only, as in TFRA: rows of dim byte strings for lookups,
        upserts, removal, export and checkpoints; ``initializer`` is the default row, see
        ``dualemb.tf.initializers.string_spec``; never trained).
      dim: length of each row.
      devices: one table per entry (default ``["/CPU:0"]``); each table lives in the host memory
        of its entry's task (a GPU entry means that task's CPU), and the ops on it run there.
      partitioner: ``fn(keys, shard_num) -> int32 shard index``; default floored ``key mod N``.
      shared_name: unused (as in TFRA).
      name: the variable's name.
      initializer: see ``dualemb.tf.initializers`` (None -> zeros).
      trainable: whether lookups connect to optimizers.
      checkpoint: whether checkpoints save the tables.
      init_size: rows to reserve, split over the shards.
      kv_creator: table backend options (``dualemb.tf.creators``); default Cuckoo (unbounded).
      restrict_policy: a ``RestrictPolicy`` **class** (e.g. ``TimestampRestrictPolicy``).
      bp_v2: accepted; fused updates are atomic read-modify-writes in the core, so concurrent
        writers never lose updates with or without it.
      short_file_name: accepted for compatibility.
    """

    def __init__(self, key_dtype=tf.int64, value_dtype=tf.float32, dim=1, devices=None,
                 partitioner=default_partition_fn, shared_name=None,
                 name="DynamicEmbedding_Variable", initializer=None, trainable=True,
                 checkpoint=True, init_size=0, kv_creator=None, restrict_policy=None,
                 bp_v2=False, short_file_name=False):
        self._self_setattr_tracking = False  # only the tables are checkpoint dependencies
        self._key_dtype = _as_dtype(key_dtype, _KEY_DTYPES, "key_dtype")
        self._value_dtype = _as_dtype(value_dtype, _VALUE_DTYPES, "value_dtype")
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim <= 0:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        self._dim = int(dim)
        if devices is None:  # one shard per PS task under ParameterServerStrategy's scope
            devices = default_devices() or ["/CPU:0"]
        elif isinstance(devices, str):
            devices = [devices]
        devices = list(devices)
        if not devices:
            raise ValueError("devices must list at least one device")
        self._devices = devices
        if not callable(partitioner):
            raise TypeError(f"partitioner must be callable, got {partitioner!r}")
        self._partition_fn = partitioner
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        self._name = name
        self._shared_name = shared_name
        self._trainable = bool(trainable)
        self._checkpoint = bool(checkpoint)
        self._bp_v2 = bool(bp_v2)
        self._short_file_name = bool(short_file_name)
        self._init_size = int(init_size or 0)
        if kv_creator is None:
            kv_creator = CuckooHashTableCreator()
        if not isinstance(kv_creator, KVCreator):
            raise TypeError(f"kv_creator must be a KVCreator, got {kv_creator!r}")
        self._kv_creator = kv_creator
        self._initializer = initializer
        if self._value_dtype == tf.string:
            if self._key_dtype == tf.string:
                raise TypeError("key-value dtype (string-string) is not supported (nor is it in "
                                "TFRA): a string-valued Variable needs int64 or int32 keys")
            self._initializer_spec = de_inits.string_spec(initializer, self._dim)
        else:
            self._initializer_spec = de_inits.to_spec(initializer, self._dim, name)
        self._trainable_store = {}

        config = {"dim": self._dim, "key_dtype": self._key_dtype.name,
                  "value_dtype": self._value_dtype.name, **self._initializer_spec,
                  **kv_creator.table_options(len(devices))}
        base = name.replace("/", "_")
        n = len(devices)
        try:
            shards = [TableShard(to_spec({**config, **kv_creator.shard_options(base, i, n)}),
                                 f"{base}_mht_{i + 1}of{n}", device=device)
                      for i, device in enumerate(devices)]
        except tf.errors.InvalidArgumentError as e:
            raise ValueError(f"cannot create the tables of Variable {name!r} (value_dtype "
                             f"{self._value_dtype.name}): {e.message}") from e
        if self._init_size > 0:
            for shard in shards:
                if shard.table_id is not None:  # None: built in a TF1 graph, no table yet
                    Table.attach(shard.table_id).reserve(max(1, self._init_size // n))

        if restrict_policy is not None:
            if not (isinstance(restrict_policy, type) and issubclass(restrict_policy, RestrictPolicy)):
                raise TypeError("restrict_policy must be a RestrictPolicy subclass such as "
                                f"de.TimestampRestrictPolicy (the class, not an instance), got "
                                f"{restrict_policy!r}")
            self._restrict_policy = restrict_policy(self)
        else:
            self._restrict_policy = None
        for shard in shards:
            shard.bind_variable(self)
        self._router = ShardRouter(name, self._key_dtype, self._value_dtype, self._dim,
                                   partitioner, shards)
        self._self_setattr_tracking = True
        self._tables = shards  # tracked: a SavedModel recreates each table on load
        if self._restrict_policy is not None:  # tracked: saved and restored with the variable
            self._restrict_status = self._restrict_policy.status_variable

    # ---- description ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def key_dtype(self) -> tf.DType:
        return self._key_dtype

    @property
    def value_dtype(self) -> tf.DType:
        return self._value_dtype

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def devices(self) -> list:
        return list(self._devices)

    @property
    def shard_num(self) -> int:
        return len(self._tables)

    @property
    def partition_fn(self):
        return self._partition_fn

    @property
    def tables(self) -> list:
        return list(self._tables)

    @property
    def trainable(self) -> bool:
        return self._trainable

    @property
    def checkpoint(self) -> bool:
        return self._checkpoint

    @property
    def bp_v2(self) -> bool:
        return self._bp_v2

    @property
    def init_size(self) -> int:
        return self._init_size

    @property
    def kv_creator(self):
        return self._kv_creator

    @property
    def initializer(self):
        """The initializer as given (see ``initializer_spec`` for the core's form)."""
        return self._initializer

    @property
    def initializer_spec(self) -> dict:
        return dict(self._initializer_spec)

    @property
    def optimizer_spec(self):
        """The fused optimizer spec dict attached by ``DynamicEmbeddingOptimizer`` (or None)."""
        return self._router.optimizer_spec

    @property
    def restrict_policy(self):
        return self._restrict_policy

    @property
    def router(self) -> ShardRouter:
        """Internal API for dualemb's own modules: checked keys and routed row reads and writes
        over this Variable's shards (``dualemb/tf/shard_router.py``)."""
        return self._router

    @property
    def trainable_store(self) -> dict:
        """name -> ``TrainableWrapper`` created by lookups and layers on this variable."""
        return self._trainable_store

    def __repr__(self) -> str:
        return (f"<dualemb.tf.Variable {self._name!r} dim={self._dim} key_dtype="
                f"{self._key_dtype.name} value_dtype={self._value_dtype.name} "
                f"shards={len(self._tables)}>")

    # ---- argument checks -------------------------------------------------------------------------
    def _rows(self, values, keys, what: str):
        """``values`` as rows of ``value_dtype`` with shape keys.shape + [dim] (checked statically
        if known). A tensor or array of another dtype raises TypeError (never cast silently)."""
        if isinstance(values, tf.Tensor) and values.dtype == self._value_dtype:
            # The common case, first, without TensorShape arithmetic (a measurable share of an
            # eager upsert's time otherwise).
            shape, key_rank = values.shape, keys.shape.rank
            if key_rank is not None and shape.rank == key_rank + 1 \
                    and shape[-1] == self._dim and shape[:-1] == keys.shape:
                return values
        if isinstance(values, (tf.Tensor, tf.Variable, np.ndarray)):
            dtype = tf.as_dtype(values.dtype)
            if dtype != self._value_dtype:
                raise DtypeMismatchError(f"{what} have dtype {dtype.name}, but Variable "
                                         f"{self._name!r} has value_dtype {self._value_dtype.name}")
            values = tf.convert_to_tensor(values)
        else:
            try:
                values = tf.convert_to_tensor(values, self._value_dtype)
            except (TypeError, ValueError) as e:
                raise DtypeMismatchError(
                    f"{what} cannot be converted to {self._value_dtype.name}: {e}") from e
        want = keys.shape.concatenate([self._dim])
        if not values.shape.is_compatible_with(want):
            raise ShapeMismatchError(f"Expected shape {want} (keys.shape + [dim]) for {what} of "
                                     f"Variable {self._name!r}, got {values.shape}")
        return values

    # ---- shapes ----------------------------------------------------------------------------------
    def _flat(self, keys):
        return tf.reshape(keys, [-1])

    def _flat_rows(self, rows, keys, what):
        """rows [..., dim] -> [n, dim], checking at run time that rows.shape == keys.shape + [dim]
        when the static shapes cannot tell (a plain reshape could silently regroup values)."""
        want = keys.shape.concatenate([self._dim])
        if not (rows.shape.is_fully_defined() and rows.shape == want):
            check = tf.debugging.assert_equal(
                tf.shape(rows, out_type=tf.int64),
                tf.concat([tf.shape(keys, out_type=tf.int64), [self._dim]], 0),
                message=f"{what} must have shape keys.shape + [dim] (dim={self._dim}) for "
                        f"Variable {self._name!r}")
            with tf.control_dependencies([check]):
                rows = tf.identity(rows)
        return tf.reshape(rows, [-1, self._dim])

    def _out(self, rows, keys):
        rows = tf.reshape(rows, tf.concat([tf.shape(keys), [self._dim]], 0))
        rows.set_shape(keys.shape.concatenate([self._dim]))
        return rows

    # ---- TFRA API -------------------------------------------------------------------------------
    @_not_converted
    def lookup(self, keys, return_exists=False, name=None):
        """Rows of ``keys`` (any shape) -> ``keys.shape + [dim]``; missing keys read as their
        initializer row and are **not** inserted. With ``return_exists``, also a bool tensor of
        ``keys.shape`` telling which keys exist."""
        keys = self._router.check_keys(keys)
        if len(self._tables) == 1:  # any shape goes straight through
            rows, exists = ops.find(self._tables[0].resource, keys, self._dim, self._value_dtype)
        else:
            rows, exists = self._router.find(self._flat(keys))
            rows = self._out(rows, keys)
            exists = tf.reshape(exists, tf.shape(keys))
        return (rows, exists) if return_exists else rows

    @_not_converted
    def upsert(self, keys, values, name=None):
        """Inserts or overwrites the rows of ``keys`` (values: keys.shape + [dim]). Returns how
        many keys a capacity limit evicted (int64 scalar, summed over the shards)."""
        keys = self._router.check_keys(keys)
        values = self._rows(values, keys, "values")
        if len(self._tables) == 1:  # the op checks shapes that are only known at run time
            return ops.insert_or_assign(self._tables[0].resource, keys, values)
        out = self._router.write(ops.insert_or_assign, self._flat(keys),
                               self._flat_rows(values, keys, "values"))
        return tf.add_n(out)

    @_not_converted
    def accum(self, keys, old_values, new_values, exists, name=None):
        """bp_v2 update: per key, delta = new - old where ``exists`` else new; then a key absent
        with exists False is inserted with new, a present key with exists True gets += delta,
        anything else is ignored (TFRA's rule). Returns how many keys a capacity limit evicted
        (int64 scalar, summed over the shards)."""
        if self._value_dtype == tf.string:
            raise TypeError(f"accum is not defined for Variable {self._name!r} of value_dtype "
                            "string (it adds numbers); use upsert")
        keys = self._router.check_keys(keys)
        old_values = self._rows(old_values, keys, "old_values")
        new_values = self._rows(new_values, keys, "new_values")
        exists = tf.convert_to_tensor(exists)
        if exists.dtype != tf.bool:
            raise TypeError(f"exists must be bool, got {exists.dtype.name}")
        if not exists.shape.is_compatible_with(keys.shape):
            raise ValueError(f"exists has shape {exists.shape}, expected keys' {keys.shape}")
        # The core computes new - old where exists (else new) as it adds (de_accum_rows): a TF
        # Sub + Select over the batch before the op would be a second pass as costly as the
        # accum itself.
        if len(self._tables) == 1:
            return ops.accum_rows(self._tables[0].resource, keys, old_values, new_values, exists)
        out = self._router.write(ops.accum_rows, self._flat(keys),
                               self._flat_rows(old_values, keys, "old_values"),
                               self._flat_rows(new_values, keys, "new_values"),
                               tf.reshape(exists, [-1]))
        return tf.add_n(out)

    def evicted_total(self) -> int:
        """How many keys capacity limits have evicted from this Variable's tables since they were
        created, every write counted: upserts, accums, and the fused optimizer steps (which Keras
        gives no way to return a count from). Read on the host, eagerly."""
        return sum(Table.attach(shard.table_id).evicted_total for shard in self._tables)

    def capture_evicted(self, enabled: bool = True, *, rows: bool = False) -> None:
        """From now on keeps the keys (with ``rows=True`` also values and optimizer slots) that
        capacity limits evict or ``restrict`` removes from this Variable's tables, for
        ``take_evicted`` (optimizer steps cannot return them). Each call drops what was kept;
        ``enabled=False`` stops. Local shards with int keys and numeric values; eagerly."""
        for shard in self._tables:
            Table.attach(shard.table_id).capture_evicted(enabled, rows=rows)

    def take_evicted(self) -> dict:
        """The rows evicted since ``capture_evicted`` or the last take, as numpy arrays: ``keys``,
        ``last_update``, ``update_count`` (and ``values``, ``slots`` when capturing rows), shard
        by shard, oldest first within a shard; they are forgotten. Read on the host, eagerly."""
        parts = [Table.attach(shard.table_id).take_evicted() for shard in self._tables]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    @_not_converted
    def remove(self, keys, name=None):
        """Erases ``keys`` (absent keys are ignored) with their slots."""
        keys = self._router.check_keys(keys)
        out = self._router.write(ops.erase, self._flat(keys))
        return out[0] if len(out) == 1 else tf.group(out)

    @_not_converted
    def clear(self, name=None):
        """Removes every key."""
        out = [ops.clear_table(t.resource) for t in self._tables]
        return out[0] if len(out) == 1 else tf.group(out)

    @_not_converted
    def size(self, index=None, name=None):
        """Number of keys (int64): all shards, or shard ``index``."""
        if index is not None:
            if not 0 <= int(index) < len(self._tables):
                raise IndexError(f"shard index {index} out of range [0, {len(self._tables)})")
            return ops.table_size(self._tables[int(index)].resource)
        sizes = [ops.table_size(t.resource) for t in self._tables]
        return sizes[0] if len(sizes) == 1 else tf.add_n(sizes)

    @_not_converted
    def export(self, name=None):
        """(keys [n], values [n, dim]) of every shard, concatenated (order unspecified)."""
        pages = [ops.export_table(t.resource, self._key_dtype, self._dim, self._value_dtype)
                 for t in self._tables]
        keys = tf.concat([p["keys"] for p in pages], 0)
        values = tf.concat([p["values"] for p in pages], 0)
        return keys, values

    @_not_converted
    def restrict(self, num_reserved, **kwargs):
        """Keeps about ``num_reserved`` keys by the restrict policy (``trigger=`` the size above
        which to act). Warns and returns None without a policy, as TFRA."""
        if self._restrict_policy is None:
            warnings.warn(f"Variable {self._name!r} has no restrict_policy: restrict() does "
                          "nothing", stacklevel=2)
            return None
        return self._restrict_policy.apply_restriction(num_reserved, **kwargs)

    def get_slot_variables(self, optimizer=None):
        """The optimizer slots of this variable's rows, as read-only ``SlotVariable`` views
        (``export()``, ``lookup(keys)``, ``size()``). Empty before an optimizer is attached, or
        when ``optimizer`` is given and is not the one attached."""
        if optimizer is not None:
            owner = self._router.optimizer_owner()
            # The owner is the DynamicEmbeddingOptimizer wrapper; the optimizer it wraps counts.
            if owner is not None and not (optimizer is owner or optimizer is getattr(
                    owner, "inner_optimizer", None)):
                return []
        return slot_variables(self)

    def get_trainable_by_name(self, name):
        """The ``TrainableWrapper`` a lookup or layer created under ``name`` (or None)."""
        return self._trainable_store.get(name)

    def trainable_wrapper(self, name: str) -> TrainableWrapper:
        """The gradient anchor registered under ``name``, created on first use."""
        wrapper = self._trainable_store.get(name)
        if wrapper is None:
            wrapper = TrainableWrapper(self, name)
            self._trainable_store[name] = wrapper
        return wrapper

    @_not_converted
    def embedding_lookup(self, ids, name=None, max_norm=None, return_trainable=False):
        """``de.embedding_lookup(self, ids, ...)``."""
        return lookup_ids(self, ids, name=name, max_norm=max_norm,
                          return_trainable=return_trainable)

    def save_to_file_system(self, dirpath, proc_size=1, proc_rank=0, file_name_list=None,
                            dirpath_env="TFRA_SAVED_KV", append_to_file=False,
                            buffer_size=4194304, name=None):
        """Saves the tables (rows, slots, metadata) to ``dirpath`` in the common checkpoint format
        (``$TFRA_SAVED_KV`` overrides dirpath, as in TFRA)."""
        return file_system.save_variable_to_file_system(
            self, dirpath, proc_size=proc_size, proc_rank=proc_rank, dirpath_env=dirpath_env)

    def load_from_file_system(self, dirpath, proc_size=1, proc_rank=0, file_name_list=None,
                              dirpath_env="TFRA_SAVED_KV", load_entire_dir=False,
                              buffer_size=4194304, name=None):
        """Loads what ``save_to_file_system`` wrote (any saved shard count), replacing the
        variable's contents (TFRA merges; see docs/tf.md)."""
        return file_system.load_variable_from_file_system(
            self, dirpath, proc_size=proc_size, proc_rank=proc_rank, dirpath_env=dirpath_env,
            load_entire_dir=load_entire_dir)

    def make_status_variable(self, kind: str) -> "Variable":
        """A restrict policy's status: a dim-1 Variable sharded as this one (same devices and
        partitioner), so status shard i holds keys of shard i (dualemb/tf/policies.py)."""
        return Variable(key_dtype=self._key_dtype, dim=1, devices=self._devices,
                        partitioner=self._partition_fn, name=f"{self._name}/status/{kind}",
                        initializer=0.0, trainable=False)

    # ---- checkpointing (dualemb/tf/saving/tf_checkpoint.py) --------------------------------
    def table_handles(self) -> list:
        """The shards' resource handles, for ops built now (eagerly or in a traced function)."""
        return [t.resource for t in self._tables]

    def _export_to_saved_model_graph(self, object_map, tensor_map, options, **kwargs):
        # tf.saved_model.save also builds a TF1 saver (save/restore ops) in the SavedModel's own
        # graph, calling _serialize_to_tensors / _restore_from_tensors of the object it finds in
        # object_map. That graph cannot capture this process' eager handles: give it a copy
        # whose handles are the ones TF made there for the shards (filled into tensor_map as it
        # exports each shard, before any save op is built).
        exported = copy.copy(self)
        tables = list(self._tables)
        object.__setattr__(exported, "table_handles",
                           lambda: [tensor_map[t.resource_handle] for t in tables])
        object_map[self] = exported
        return []

    def _serialize_to_tensors(self):
        return tf_checkpoint.serialize_variable(self)

    def _restore_from_tensors(self, restored_tensors):
        return tf_checkpoint.restore_variable(self, restored_tensors)


class GraphKeys:
    """TFRA's (deprecated) collection names, kept so code that names them runs."""

    DYNAMIC_EMBEDDING_VARIABLES = "dynamic_embedding_variables"
    TRAINABLE_DYNAMIC_EMBEDDING_VARIABLES = "trainable_dynamic_embedding_variables"


def get_variable(name, key_dtype=tf.int64, value_dtype=tf.float32, dim=1, devices=None,
                 partitioner=default_partition_fn, shared_name="get_variable", initializer=None,
                 trainable=True, checkpoint=True, init_size=0, kv_creator=None,
                 restrict_policy=None, bp_v2=False, short_file_name=False):
    """The Variable stored under ``name`` (prefixed by the current
    ``tf.compat.v1.variable_scope`` unless ``short_file_name``), otherwise a new one, stored.
    TFRA's rules (see ``dualemb/tf/variable_store.py``): one store per default graph, so
    ``tf.compat.v1.reset_default_graph()`` starts afresh; the store keeps its variables alive.
    Reusing a name with another key/value dtype or dim raises ``ValueError`` (TFRA would return
    the existing variable unchanged)."""
    full_name = name if short_file_name else variable_store.full_name(name)
    existing = variable_store.lookup(full_name)
    if existing is not None:
        if (existing.key_dtype != tf.as_dtype(key_dtype)
                or existing.value_dtype != tf.as_dtype(value_dtype) or existing.dim != dim):
            raise ValueError(
                f"Variable {full_name!r} already exists with key_dtype="
                f"{existing.key_dtype.name}, value_dtype={existing.value_dtype.name}, "
                f"dim={existing.dim}; asked for {tf.as_dtype(key_dtype).name}, "
                f"{tf.as_dtype(value_dtype).name}, {dim}")
        return existing
    var = Variable(key_dtype=key_dtype, value_dtype=value_dtype, dim=dim, devices=devices,
                   partitioner=partitioner, shared_name=shared_name, name=full_name,
                   initializer=initializer, trainable=trainable, checkpoint=checkpoint,
                   init_size=init_size, kv_creator=kv_creator, restrict_policy=restrict_policy,
                   bp_v2=bp_v2, short_file_name=short_file_name)
    variable_store.add(full_name, var)
    return var

"""What the dynamic embedding layers do, independent of the Keras they are built on: mixins that
``embedding.py`` (Keras 3) and ``keras2.py`` (tf_keras, Keras 2) put in front of their Keras'
``Layer``. A concrete class supplies ``_keras`` (its Keras package, for ``initializers`` and
``saving``) and ``_make_anchor()`` (the gradient anchor: a ``(0, dim)`` weight its Keras tracks).

Each layer owns one ``de.Variable`` (``layer.params``, named ``"<layer name>-parameter"``) and one
anchor (``layer.shadow``): train the layer with a ``de.DynamicEmbeddingOptimizer``-wrapped
optimizer, in ``model.fit`` or a ``GradientTape`` loop. Only the rows of the keys in a batch are
updated (see ``dualemb/tf/optimizers/keras_wrapper.py``).

Ids may be int32 or int64 (int32 ids are widened for an int64 Variable); floating-point ids
raise ``TypeError`` (declare ``Input(..., dtype="int64")``).
"""

from __future__ import annotations

import warnings

import tensorflow as tf

from dualemb.core.spec import from_spec
from dualemb.tf import creators as de_creators
from dualemb.tf import initializers as de_inits
from dualemb.tf import policies as de_policies
from dualemb.tf.distribute import remote_shards
from dualemb.tf.distribute import alltoall, replica_shards
from dualemb.tf.row_lookup import compute_dtype, lookup_ids, lookup_unique_ids
from dualemb.tf.variable import Variable, check_trainable_dtype, default_partition_fn

POOLING = ("sum", "mean", "max", "min")
SEGMENT = ("sum", "mean", "sqrtn")


def _serialize_creator(creator):
    if creator is None:
        return None
    cfg = creator.config
    return {"class_name": type(creator).__name__,
            "config_class": None if cfg is None else type(cfg).__name__,
            "config": None if cfg is None else {k: (int(v) if hasattr(v, "__index__") else v)
                                                for k, v in vars(cfg).items()
                                                if not callable(v)}}


def _deserialize_creator(config):
    if config is None or not isinstance(config, dict):
        return config
    cfg = None
    if config.get("config_class"):
        cfg = getattr(de_creators, config["config_class"])(**(config.get("config") or {}))
    return getattr(de_creators, config["class_name"])(config=cfg)


def _in_process_memory(shard) -> bool:
    """Whether a Variable shard's table is an in-memory table of this process (not Redis, not a
    table on another task such as a parameter server)."""
    return (from_spec(shard.config).get("backend", "memory") == "memory"
            and remote_shards.is_local(shard.table_id))


class EmbeddingLogic:
    """A Keras embedding layer backed by a dynamic embedding table: any integer ids, no
    vocabulary, no collisions. ``call(ids)`` returns ``ids.shape + [embedding_size]`` (a
    RaggedTensor for ragged ids).

    Args:
      embedding_size: the row length (``dim``).
      key_dtype, value_dtype: of the table (int64/int32; float32 or another float dtype).
      combiner: unused by this class (as in TFRA); the pooling of ``SquashedEmbedding``.
      initializer: as ``de.Variable`` (default ``initializers.RandomNormal()`` of the layer's
        Keras, i.e. mean 0, stddev 0.05, with the seed derived from the variable name).
      devices: one table shard per entry.
      name: layer name; the Variable is ``name + "-parameter"``.
      with_unique: look each distinct id up once per batch (``embedding_lookup_unique``) where
        a lookup is a round trip (Redis tables, shards on other tasks); tables in this
        process' memory read duplicates directly, with the same rows and gradients (see
        ``_unique_pays``).
      all_to_all (keyword): made inside the scope of a ``MirroredStrategy`` or
        ``MultiWorkerMirroredStrategy`` with several replicas, each replica owns one shard (one
        table per local replica, on its device, unless ``devices`` is given) and a lookup in a
        replica exchanges ids, rows and row gradients with TF's collective all-to-all
        (``dualemb/tf/distribute/alltoall.py``, docs/scaling_tf.md); outside a replica it looks
        up the local shards as usual. What ``HvdAllToAllEmbedding`` sets.
      short_file_name: accepted for compatibility.
      **kwargs: TFRA's ``trainable, bp_v2, restrict_policy, init_capacity, partitioner,
        kv_creator, max_norm, distribute_strategy, keep_distribution, checkpoint``, then Keras'
        own layer arguments.
    """

    _keras = None  # the Keras package of the concrete class

    def __init__(self, embedding_size, key_dtype=tf.int64, value_dtype=tf.float32,
                 combiner="sum", initializer=None, devices=None, name="DynamicEmbeddingLayer",
                 with_unique=True, short_file_name=False, **kwargs):
        trainable = kwargs.pop("trainable", True)
        bp_v2 = kwargs.pop("bp_v2", False)
        restrict_policy = kwargs.pop("restrict_policy", None)
        init_capacity = kwargs.pop("init_capacity", 0)
        partitioner = kwargs.pop("partitioner", default_partition_fn)
        kv_creator = _deserialize_creator(kwargs.pop("kv_creator", None))
        max_norm = kwargs.pop("max_norm", None)
        distribute_strategy = kwargs.pop("distribute_strategy", None)
        keep_distribution = kwargs.pop("keep_distribution", False)
        checkpoint = kwargs.pop("checkpoint", True)
        all_to_all = bool(kwargs.pop("all_to_all", False))
        exchange = None  # the collective group of the strategy the layer is made under
        table_devices = devices
        if all_to_all and tf.distribute.has_strategy():
            strategy = tf.distribute.get_strategy()
            if strategy.num_replicas_in_sync > 1:
                if partitioner is not default_partition_fn:
                    raise ValueError("an all-to-all embedding routes keys with "
                                     "dualemb.core.routing.shard_of; a custom partitioner "
                                     "is not supported")
                if tf.as_dtype(key_dtype) == tf.string:
                    # TF's collective all-to-all moves numeric tensors only.
                    raise ValueError("an all-to-all embedding takes integer keys; "
                                     "key_dtype=tf.string is not supported (TF's collective "
                                     "all-to-all moves numeric tensors only): use "
                                     "ParameterServerStrategy, or hash the strings to int64 "
                                     "ids first (tf.strings.to_hash_bucket_fast)")
                exchange = alltoall.for_strategy(strategy)
                if devices is None:  # one shard per local replica, on the replica's device
                    table_devices = list(strategy.extended.worker_devices)
        if isinstance(restrict_policy, str):
            restrict_policy = getattr(de_policies, restrict_policy)
        if distribute_strategy is not None:
            warnings.warn("distribute_strategy is ignored: dualemb tables live in host memory "
                          "and are shared by all replicas of the process", stacklevel=2)
        super().__init__(name=name, trainable=trainable, **kwargs)
        self.supports_jit = False
        self.keep_distribution = keep_distribution
        self.embedding_size = int(embedding_size)
        self.key_dtype = tf.as_dtype(key_dtype)
        self.value_dtype = tf.as_dtype(value_dtype)
        if self.value_dtype == tf.string:
            # Embedding layers combine and train rows numerically: refused before any table.
            raise TypeError(f"layer {name!r}: a Keras embedding layer needs numeric rows; "
                            "value_dtype tf.string serves de.Variable lookups and upserts only")
        self.combiner = combiner
        self.initializer = (self._keras.initializers.RandomNormal() if initializer is None
                            else self._deserialize_initializer(initializer))
        self.devices = devices
        self.with_unique = bool(with_unique)
        self.short_file_name = bool(short_file_name)
        self.bp_v2 = bool(bp_v2)
        self.restrict_policy = restrict_policy
        self.init_capacity = int(init_capacity or 0)
        self.partitioner = partitioner
        self.kv_creator = kv_creator
        self.max_norm = max_norm
        self.checkpoint = bool(checkpoint)
        self.all_to_all = all_to_all
        self._exchange = exchange
        self._secondary_unique = True  # the owner reads each key it receives once
        self.params = Variable(
            key_dtype=self.key_dtype, value_dtype=self.value_dtype, dim=self.embedding_size,
            devices=table_devices, partitioner=partitioner, name=f"{name}-parameter",
            initializer=self.initializer, trainable=trainable, checkpoint=checkpoint,
            init_size=self.init_capacity, kv_creator=kv_creator, restrict_policy=restrict_policy,
            bp_v2=bp_v2, short_file_name=short_file_name)
        if exchange is not None:
            replica_shards.mark(self.params, exchange.size, exchange.strategy)
        # Read once: a Variable keeps its shards for life.
        self._tables_in_memory = all(_in_process_memory(s) for s in self.params.tables)
        self._shadow_name = f"{name}-shadow"

    def build(self, input_shape=None):
        if self.trainable:
            # An integer or float64 table cannot be trained by the core's fused optimizers: say
            # so now, not at the first optimizer step.
            check_trainable_dtype(self.params)
        self.shadow = self._make_anchor()
        self.built = True

    def _make_anchor(self):
        raise NotImplementedError

    # ---- (de)serialization with the layer's Keras ------------------------------------------------
    def _serialize_initializer(self, initializer):
        if initializer is None or isinstance(initializer, (int, float, str, dict)):
            return initializer
        if isinstance(initializer, (list, tuple)):
            return list(initializer)
        if hasattr(initializer, "tolist"):
            return initializer.tolist()
        if callable(initializer) and not de_inits.is_initializer_object(initializer):
            # A plain function was called once, when the table was made (TFRA's rule): its
            # result, the table's spec, is what the layer is rebuilt from.
            return dict(self.params.initializer_spec)
        return self._keras.initializers.serialize(initializer)

    def _deserialize_initializer(self, config):
        if isinstance(config, dict) and "class_name" in config:
            return self._keras.initializers.deserialize(config)
        return config

    # ---- lookups -------------------------------------------------------------------------------
    def _ids(self, ids):
        values = ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids
        if isinstance(values, tf.SparseTensor):
            raise TypeError(f"{type(self).__name__} takes dense or ragged ids, not a SparseTensor")
        values = tf.convert_to_tensor(values)
        # String ids are taken only by a layer of string key_dtype (below they must match it).
        if not values.dtype.is_integer and not (values.dtype == tf.string == self.key_dtype):
            raise TypeError(f"{type(self).__name__} {self.name!r} got ids of dtype "
                            f"{values.dtype.name}; ids must be integers (declare "
                            f"Input(..., dtype='{self.key_dtype.name}'))")
        if values.dtype != self.key_dtype:
            if self.key_dtype == tf.int64 and values.dtype in (tf.int32, tf.int16, tf.int8,
                                                               tf.uint8, tf.uint16, tf.uint32):
                values = tf.cast(values, tf.int64)  # widening is exact
            else:
                raise TypeError(f"{type(self).__name__} {self.name!r} has key_dtype "
                                f"{self.key_dtype.name} but got ids of dtype {values.dtype.name}")
        return ids.with_flat_values(values) if isinstance(ids, tf.RaggedTensor) else values

    def _lookup(self, ids):
        position = alltoall.replica_position() if self.all_to_all else None
        if position is not None:  # in a replica of a multi-replica strategy
            return self._exchange_lookup(ids, *position)
        if self._unique_pays():
            return lookup_unique_ids(self.params, ids, name=self._shadow_name,
                                     max_norm=self.max_norm)
        return lookup_ids(self.params, ids, name=self._shadow_name, max_norm=self.max_norm)

    def _unique_pays(self) -> bool:
        """Whether ``with_unique`` reads each distinct id once (``tf.unique``, then a
        ``tf.gather`` of the rows forward and of the keys backward).

        That pays where a read is a round trip: a Redis table, or a shard living in another
        process (a parameter server). A table in this process' memory reads a duplicate id
        faster than ``tf.unique`` + ``tf.gather`` cost (measured in docs/benchmarks.md), so there
        it is read per occurrence. Nothing observable changes:
        initial rows are a pure function of the key, so duplicates read the same row; and the
        optimizer gets the same gradient, element for element — the gather's gradient is the
        per-occurrence row gradients in occurrence order, indexed by the gathered positions,
        which the key-gradient op maps back to the keys (``trainable.py``), exactly the keys and
        values the per-occurrence read gives. Kept where that would not hold bit for bit: a
        ``max_norm`` clip (its backward pass would then see each occurrence's gradient rather
        than their sum), and a ``ShadowVariable`` registered under the layer's name (it records
        the distinct ids, as TFRA's does)."""
        if not self.with_unique:
            return False
        if self.max_norm is not None or getattr(
                self.params.get_trainable_by_name(self._shadow_name), "keeps_lookups", False):
            return True
        return not self._tables_in_memory

    def _exchange_lookup(self, ids, replica, num_replicas):
        exchange = self._exchange
        if exchange is None or exchange.strategy is not tf.distribute.get_strategy():
            raise ValueError(
                f"{type(self).__name__} {self.name!r} runs in a replica of a {num_replicas}-"
                "replica strategy it was not made under: create the layer (and the model) "
                "inside that strategy's scope(), so that each replica gets its own shard")
        values = ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids
        rows = alltoall.lookup_rows(self.params, tf.reshape(values, [-1]), self._shadow_name,
                                    exchange, replica, self._secondary_unique)
        if self.max_norm is not None:
            rows = tf.clip_by_norm(rows, self.max_norm, axes=[1])
        out = tf.reshape(rows, tf.concat([tf.shape(values), [self.embedding_size]], 0))
        out.set_shape(values.shape.concatenate([self.embedding_size]))
        if out.dtype != self.value_dtype:
            out = tf.cast(out, self.value_dtype)
        return ids.with_flat_values(out) if isinstance(ids, tf.RaggedTensor) else out

    def _to_compute_dtype(self, out):
        """Rows in the layer's compute dtype under a float16 / bfloat16 policy (e.g.
        ``mixed_float16``), as Keras layers return; the table keeps ``value_dtype``."""
        dtype = self.compute_dtype
        if dtype in ("float16", "bfloat16") and out.dtype != dtype:
            return tf.cast(out, dtype)
        return out

    def call(self, ids):
        return self._to_compute_dtype(self._lookup(self._ids(ids)))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.embedding_size,)

    # ---- saving ---------------------------------------------------------------------------------
    def get_config(self):
        config = super().get_config()  # with the dtype policy
        if self.partitioner is not default_partition_fn:
            warnings.warn(f"layer {self.name!r}: a custom partitioner is not serialized; "
                          "from_config uses the default", stacklevel=2)
        config.update({
            "embedding_size": self.embedding_size,
            "key_dtype": self.key_dtype.name,
            "value_dtype": self.value_dtype.name,
            "combiner": self.combiner,
            "initializer": self._serialize_initializer(self.initializer),
            "devices": self.devices,
            "with_unique": self.with_unique,
            "short_file_name": self.short_file_name,
            "bp_v2": self.bp_v2,
            "restrict_policy": (None if self.restrict_policy is None
                                else self.restrict_policy.__name__),
            "init_capacity": self.init_capacity,
            "kv_creator": _serialize_creator(self.kv_creator),
            "max_norm": self.max_norm,
            "checkpoint": self.checkpoint,
            "all_to_all": self.all_to_all,
        })
        return config


class SquashedLogic(EmbeddingLogic):
    """``Embedding`` followed by pooling with ``combiner`` ("sum", "mean", "max" or "min") over
    every axis but the first (batch) and the last: ids ``[batch, ...]`` -> ``[batch, dim]``
    (ragged ids pool their ragged axis). As in TFRA, 1-D ids are one example: ids ``[n]`` pool
    over all ``n`` and give ``[dim]``."""

    def __init__(self, embedding_size, key_dtype=tf.int64, value_dtype=tf.float32,
                 combiner="sum", initializer=None, devices=None, name="DynamicEmbeddingLayer",
                 with_unique=True, short_file_name=False, **kwargs):
        if combiner not in POOLING:
            raise ValueError(f"combiner must be one of {POOLING}, got {combiner!r}")
        super().__init__(embedding_size, key_dtype=key_dtype, value_dtype=value_dtype,
                         combiner=combiner, initializer=initializer, devices=devices, name=name,
                         with_unique=with_unique, short_file_name=short_file_name, **kwargs)

    def call(self, ids):
        emb = self._lookup(self._ids(ids))  # pooled in value_dtype, then cast to the policy's
        reduce = {"sum": tf.reduce_sum, "mean": tf.reduce_mean, "max": tf.reduce_max,
                  "min": tf.reduce_min}[self.combiner]
        if isinstance(emb, tf.RaggedTensor):
            for _ in range(emb.ragged_rank):
                emb = reduce(emb, axis=1)
        rank = emb.shape.rank
        if rank == 2:  # ids [n]: a single example (TFRA's squashing), -> [dim]
            emb = reduce(emb, axis=0)
        elif rank is not None and rank > 2:
            emb = reduce(emb, axis=list(range(1, rank - 1)))
        return self._to_compute_dtype(emb)

    def compute_output_shape(self, input_shape):
        if len(input_shape) == 1:
            return (self.embedding_size,)
        return (input_shape[0], self.embedding_size)


class FieldWiseLogic(EmbeddingLogic):
    """``Embedding`` whose rows are pooled per field: ``slot_map_fn(ids)`` gives each id's field
    in ``[0, nslots)`` (default ``ids mod nslots``), and the rows of one example's ids of one field
    are combined with ``combiner`` ("sum", "mean" or "sqrtn"). Ids ``[batch, n]`` (or ``[batch]``,
    or ragged ``[batch, None]``) -> ``[batch, nslots, dim]``; an empty field gives zeros."""

    def __init__(self, embedding_size, nslots, slot_map_fn=None, key_dtype=tf.int64,
                 value_dtype=tf.float32, combiner="sum", initializer=None, devices=None,
                 name="SlotDynamicEmbeddingLayer", with_unique=True, **kwargs):
        if combiner not in SEGMENT:
            raise ValueError(f"combiner must be one of {SEGMENT}, got {combiner!r}")
        if isinstance(slot_map_fn, dict):
            slot_map_fn = self._keras.saving.deserialize_keras_object(slot_map_fn)
        super().__init__(embedding_size, key_dtype=key_dtype, value_dtype=value_dtype,
                         combiner=combiner, initializer=initializer, devices=devices, name=name,
                         with_unique=with_unique, **kwargs)
        self.nslots = int(nslots)
        if self.nslots <= 0:
            raise ValueError(f"nslots must be positive, got {nslots}")
        self.slot_map_fn = slot_map_fn

    def _slots(self, ids):
        if self.slot_map_fn is None:
            return tf.math.floormod(ids, tf.cast(self.nslots, ids.dtype))
        return self.slot_map_fn(ids)

    def call(self, ids):
        ids = self._ids(ids)
        if isinstance(ids, tf.RaggedTensor):
            if ids.shape.rank != 2:
                raise NotImplementedError("FieldWiseEmbedding takes ragged ids of rank 2")
            flat_ids = ids.flat_values
            rows_of = ids.value_rowids()
            batch = ids.nrows()
        else:
            rank = ids.shape.rank
            if rank is None or rank > 2:
                raise NotImplementedError(
                    f"FieldWiseEmbedding takes ids of rank <= 2, got rank {rank}")
            if rank < 2:
                ids = tf.reshape(ids, [-1, 1])
            batch = tf.shape(ids, out_type=tf.int64)[0]
            width = tf.shape(ids, out_type=tf.int64)[1]
            flat_ids = tf.reshape(ids, [-1])
            rows_of = tf.repeat(tf.range(batch), width)
        emb = self._lookup(flat_ids)
        emb = tf.cast(emb, compute_dtype(self.value_dtype))
        slots = tf.cast(self._slots(flat_ids), tf.int64)
        segments = tf.cast(rows_of, tf.int64) * self.nslots + slots
        num = tf.cast(batch, tf.int64) * self.nslots
        pooled = {"sum": tf.math.unsorted_segment_sum, "mean": tf.math.unsorted_segment_mean,
                  "sqrtn": tf.math.unsorted_segment_sqrt_n}[self.combiner](emb, segments, num)
        out = tf.reshape(pooled, [-1, self.nslots, self.embedding_size])
        out = out if out.dtype == self.value_dtype else tf.cast(out, self.value_dtype)
        return self._to_compute_dtype(out)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.nslots, self.embedding_size)

    def get_config(self):
        config = super().get_config()
        config["nslots"] = self.nslots
        config["slot_map_fn"] = (None if self.slot_map_fn is None
                                 else self._keras.saving.serialize_keras_object(self.slot_map_fn))
        return config


class HvdAllToAllLogic(EmbeddingLogic):
    """TFRA's ``HvdAllToAllEmbedding`` (same arguments) without Horovod:
    ``Embedding(..., all_to_all=True)``. Made inside the scope of a ``MirroredStrategy`` or
    ``MultiWorkerMirroredStrategy``, replica ``r`` of ``N`` owns the keys ``shard_of(key, N) ==
    r`` in its own table, and lookups exchange ids, rows and row gradients with TensorFlow's
    collective all-to-all (``dualemb/tf/distribute/alltoall.py``); made outside one, it is an
    ``Embedding``.

    Args:
      with_unique: as ``Embedding`` (the exchange always sends each distinct id once).
      with_secondary_unique: the owner reads each key it receives once, even when several
        replicas ask for it (default True).
      mpi_size: TFRA's Horovod world size; if given, it must equal the strategy's number of
        replicas (1 without a strategy).
      batch_size: accepted and unused, as in TFRA (the exchange sizes itself per batch).
      *args, **kwargs: ``Embedding``'s (``embedding_size``, ``key_dtype``, ...).
    """

    def __init__(self, with_unique=True, with_secondary_unique=True, mpi_size=None,
                 batch_size=None, *args, **kwargs):
        kwargs.pop("all_to_all", None)
        n = (tf.distribute.get_strategy().num_replicas_in_sync
             if tf.distribute.has_strategy() else 1)
        if mpi_size is not None and int(mpi_size) != n:
            raise ValueError(
                f"HvdAllToAllEmbedding got mpi_size={mpi_size} but is made "
                + (f"under a strategy with {n} replicas" if n > 1 else "outside a strategy")
                + ": dualemb exchanges ids between the replicas of the MirroredStrategy or "
                "MultiWorkerMirroredStrategy whose scope() the layer is made in (no Horovod)")
        super().__init__(*args, with_unique=with_unique, all_to_all=True, **kwargs)
        self.with_secondary_unique = bool(with_secondary_unique)
        self._secondary_unique = self.with_secondary_unique
        self.mpi_size = mpi_size
        self.batch_size = batch_size

    def get_config(self):
        config = super().get_config()
        config.pop("all_to_all", None)
        config.update({"with_secondary_unique": self.with_secondary_unique,
                       "mpi_size": self.mpi_size, "batch_size": self.batch_size})
        return config

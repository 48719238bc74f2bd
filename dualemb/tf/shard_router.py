"""``ShardRouter``: a ``Variable``'s internal API, the one way dualemb's own modules read and
write its rows (``variable.router``).

Lookups (``lookup.py``, ``row_lookup.py``), the optimizers' fused step and weight decay
(``optimizers/row_update.py``) and the restrict policies' status writes all go through it:

- ``check_keys(keys, what)``: ``keys`` as a dense tensor of the Variable's ``key_dtype``; a
  tensor or array of another dtype raises ``DtypeMismatchError``, Python numbers out of range
  ``ValueError`` (never a silent cast).
- ``find(flat_keys)``: ``(rows [n, dim] in value_dtype, exists [n])``.
- ``write(op, flat_keys, *row_args)``: ``op(handle, keys, *rows)`` on each shard with the
  shard's share of keys and rows; returns the ops' outputs, one per shard touched.
- ``attach_optimizer(spec, owner)``: the fused optimizer of every shard (``optimizer_spec``).

Keys go to shard ``partition_fn(key, N)``. A placement decides otherwise: distribution code
hands one to ``place()``; its ``local_shard(flat_keys)`` returns ``(shard index, keys)`` to
confine a read or write to one shard, or None to route by key (``distribute/replica_shards.py``:
inside a replica, an all-to-all Variable touches its replica's shard only). This module knows no
distribution strategy.

The router holds the shards and the Variable's description, never the Variable itself (a
reference back would keep the tables alive until the garbage collector runs).
"""

from __future__ import annotations

import weakref

import numpy as np
import tensorflow as tf

from dualemb.core import value_dtypes as _value_dtypes
from dualemb.core._string_keys import as_string_keys
from dualemb.core.spec import to_spec
from dualemb.tf import ops
from dualemb.tf.errors import DtypeMismatchError


def check_trainable_dtype(var) -> None:
    """TypeError unless ``var`` (a Variable or its router) can be trained: its value dtype is
    float32, float16 or bfloat16 (the core's fused optimizers update rows in float32)."""
    if var.value_dtype.name not in _value_dtypes.TRAINABLE:
        raise TypeError(
            f"de.Variable {var.name!r} has value_dtype {var.value_dtype.name}, which cannot be "
            f"trained (training needs {', '.join(sorted(_value_dtypes.TRAINABLE))}); use it for "
            "lookups and writes only, with trainable=False, or make it a float Variable")



class ShardRouter:
    """Checked keys and routed row reads and writes over one Variable's shards."""

    def __init__(self, name: str, key_dtype: tf.DType, value_dtype: tf.DType, dim: int,
                 partition_fn, shards):
        self.name = name
        self.key_dtype = key_dtype
        self.value_dtype = value_dtype
        self.dim = dim
        self.partition_fn = partition_fn
        self.shards = tuple(shards)
        self.placement = None
        self._optimizer_spec = None
        self._optimizer_owner = None

    def place(self, placement) -> None:
        """Makes ``placement`` (an object with ``local_shard(flat_keys)``) decide where reads and
        writes go; None restores routing by key."""
        self.placement = placement

    # ---- the fused optimizer (DynamicEmbeddingOptimizer) ------------------------------------------
    @property
    def optimizer_spec(self):
        """The fused optimizer spec dict attached to the shards (None before any)."""
        return None if self._optimizer_spec is None else dict(self._optimizer_spec)

    def optimizer_owner(self):
        """The optimizer that attached it (None if none or gone)."""
        return None if self._optimizer_owner is None else self._optimizer_owner()

    def attach_optimizer(self, spec: dict, owner) -> None:
        """Makes ``spec`` the fused optimizer of every shard, for ``owner`` (the optimizer
        wrapper). Another owner with another spec is refused (one fused optimizer per Variable).
        The shards are only touched when the spec changes, so every step may call this."""
        check_trainable_dtype(self)
        current = self.optimizer_owner()
        if current is not None and current is not owner and self._optimizer_spec != spec:
            raise ValueError(
                f"Variable {self.name!r} is already trained by another optimizer "
                f"({self._optimizer_spec}); one Variable can have one fused optimizer")
        if self._optimizer_spec != spec:
            spec_text = to_spec(spec)
            for shard in self.shards:
                try:
                    shard.set_optimizer(spec_text)
                except tf.errors.InvalidArgumentError as e:
                    raise ValueError(f"cannot attach optimizer {spec} to Variable "
                                     f"{self.name!r}: {e.message}") from e
            self._optimizer_spec = dict(spec)
        self._optimizer_owner = weakref.ref(owner)

    # ---- keys -------------------------------------------------------------------------------
    def check_keys(self, keys, what: str = "keys"):
        """``keys`` as a dense tensor of ``key_dtype``; TypeError on any other dtype."""
        key_dtype = self.key_dtype
        if isinstance(keys, tf.Tensor) and keys.dtype == key_dtype:
            return keys  # the common case, first
        if isinstance(keys, (tf.SparseTensor, tf.RaggedTensor)):
            raise TypeError(f"{what} must be a dense tensor, got {type(keys).__name__}")
        if isinstance(keys, (tf.Tensor, tf.Variable, np.ndarray, np.generic)):
            dtype = tf.as_dtype(keys.dtype)
            if dtype != key_dtype:
                raise DtypeMismatchError(f"{what} have dtype {dtype.name}, but Variable "
                                         f"{self.name!r} has key_dtype {key_dtype.name}")
            return tf.convert_to_tensor(keys)
        if key_dtype == tf.string:  # str (UTF-8) / bytes, or TypeError naming the element
            return tf.constant(as_string_keys(keys), tf.string)
        # Python numbers / lists: through numpy, so that out-of-range ids are refused (TF would
        # silently wrap 2**40 to 0 when converting to int32).
        arr = np.asarray(keys)
        if arr.dtype.kind not in "iu":
            raise DtypeMismatchError(f"{what} must be integers of key_dtype "
                                     f"{key_dtype.name}, got {arr.dtype} values")
        info = np.iinfo(key_dtype.as_numpy_dtype)
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise ValueError(f"{what} do not fit Variable {self.name!r}'s key_dtype "
                             f"{key_dtype.name}")
        return tf.convert_to_tensor(arr.astype(key_dtype.as_numpy_dtype))

    # ---- rows -------------------------------------------------------------------------------
    def _local(self, flat_keys):
        return None if self.placement is None else self.placement.local_shard(flat_keys)

    def _partition(self, flat_keys):
        n = len(self.shards)
        return tf.cast(self.partition_fn(flat_keys, n), tf.int32)

    def find(self, flat_keys):
        """(rows [n, dim] in value_dtype, exists [n]) of flat keys."""
        local = self._local(flat_keys)
        if local is not None:
            return ops.find(self.shards[local[0]].resource, local[1], self.dim, self.value_dtype)
        if len(self.shards) == 1:
            return ops.find(self.shards[0].resource, flat_keys, self.dim, self.value_dtype)
        n = len(self.shards)
        parts = self._partition(flat_keys)
        positions = tf.dynamic_partition(tf.range(tf.size(flat_keys)), parts, n)
        keys = tf.dynamic_partition(flat_keys, parts, n)
        results = [ops.find(s.resource, k, self.dim, self.value_dtype)
                   for s, k in zip(self.shards, keys)]
        rows = tf.dynamic_stitch(positions, [r[0] for r in results])
        exists = tf.dynamic_stitch(positions, [r[1] for r in results])
        return rows, exists

    def write(self, op, flat_keys, *row_args) -> list:
        """``op(handle, keys, *rows)`` per shard with the shard's share of keys and rows."""
        local = self._local(flat_keys)
        if local is not None:
            return [op(self.shards[local[0]].resource, local[1], *row_args)]
        if len(self.shards) == 1:
            return [op(self.shards[0].resource, flat_keys, *row_args)]
        n = len(self.shards)
        parts = self._partition(flat_keys)
        keys = tf.dynamic_partition(flat_keys, parts, n)
        split = [tf.dynamic_partition(a, parts, n) for a in row_args]
        return [op(s.resource, keys[i], *[part[i] for part in split])
                for i, s in enumerate(self.shards)]

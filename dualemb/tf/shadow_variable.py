"""``ShadowVariable``: TFRA's eager-mode trainable view of a dynamic embedding ``Variable``.

In TFRA a ShadowVariable is a resource variable that holds the rows of the ids last looked up
through it; an optimizer updates that buffer and writes it back to the table. Here it is the
Variable's gradient anchor registered under ``name`` (a ``TrainableWrapper``, see
``trainable.py``: the fused optimizer updates the table directly), plus TFRA's view of the last
lookup:

- ``ids``: a ``tf.Variable`` (key dtype, any shape) with the keys of the last training-mode lookup
  through this shadow (flattened; the distinct keys for ``*_unique`` and sparse lookups);
- ``read_value(do_prefetch=True)``: with ``do_prefetch``, looks ``ids`` up in the table, keeps
  the rows and returns them; without, returns the rows kept by the last prefetch or lookup. An
  optimizer step through the shadow refreshes the kept rows, so, as in TFRA, they show the
  updated values;
- ``exists``: whether each key of ``ids`` was in the table at the last prefetch;
- ``size()``: the table's size; ``params``: the Variable; ``embedding_lookup(ids, ...)``;
  ``_handle``: the kept rows' resource handle (TFRA code reads its buffer through it).
- a TF checkpoint that saves or restores the shadow clears ``ids``, ``exists`` and the kept rows
  (as TFRA clears its shadow buffers when saving).

The lookup functions (``de.embedding_lookup``, ``embedding_lookup_unique``,
``embedding_lookup_sparse``, ``safe_embedding_lookup_sparse`` and ``de.shadow_ops``' own) take a
ShadowVariable in place of a Variable, as TFRA's do. Works eagerly and inside ``tf.function``.
"""

from __future__ import annotations

import tensorflow as tf

from dualemb.tf.row_lookup import lookup_ids
from dualemb.tf.trainable import TrainableWrapper
from dualemb.tf.variable import Variable


class ShadowVariable(TrainableWrapper):
    """TFRA's ``de.shadow_ops.ShadowVariable(params, name="ShadowVariable", max_norm=None,
    trainable=True, distribute_strategy=None, ids=None, exists=None, model_mode=None)``."""

    def __init__(self, params, name="ShadowVariable", max_norm=None, trainable=True,
                 distribute_strategy=None, **kwargs):
        if not tf.executing_eagerly():
            raise NotImplementedError("a ShadowVariable is created eagerly (as in TFRA)")
        if not isinstance(params, Variable):
            raise TypeError(f"params must be a dualemb.tf.Variable, got {type(params).__name__}")
        ids, exists = kwargs.pop("ids", None), kwargs.pop("exists", None)
        kwargs.pop("model_mode", None)
        kwargs.pop("collections", None)
        if kwargs:
            raise TypeError(f"unexpected arguments: {sorted(kwargs)}")
        if ids is not None and not isinstance(ids, tf.Variable):
            raise TypeError("If ids is set, it needs to be a tf.Variable")
        super().__init__(params, name)
        if not trainable:
            self.trainable = False
        self.max_norm = max_norm
        with tf.init_scope():
            self.ids = ids if ids is not None else tf.Variable(
                tf.zeros([0], params.key_dtype), trainable=False, shape=tf.TensorShape(None),
                name=f"{name}-ids".replace("/", "_"))
            self.exists = exists if exists is not None else tf.Variable(
                tf.zeros([0], tf.bool), trainable=False, shape=tf.TensorShape(None),
                name=f"{name}-exists".replace("/", "_"))
            self._kept_rows = tf.Variable(
                tf.zeros([0, params.dim], params.value_dtype), trainable=False,
                shape=tf.TensorShape(None), name=f"{name}-rows".replace("/", "_"))
        self.claim_lookups()

    def claim_lookups(self) -> None:
        """Makes lookups under this shadow's name record into and train through this shadow.
        Called again by every lookup through it: a second ShadowVariable of one name on the
        same Variable (a model built twice) must not take the first one's lookups."""
        self.params.trainable_store[self.de_name] = self

    # ---- TFRA's API --------------------------------------------------------------------------------
    def size(self):
        return self.params.size()

    @property
    def _handle(self):
        """The resource handle of the kept rows: what TFRA's ShadowVariable buffer holds and its
        code (and tests) read with ``read_variable_op(shadow._handle, dtype)``."""
        return self._kept_rows.handle

    def _reset_ids(self, ids):
        return self.ids.assign(tf.convert_to_tensor(ids, self.params.key_dtype))

    def prefetch_values(self, update=False):
        rows, exists = self.params.lookup(self.ids, return_exists=True)
        self.exists.assign(exists)
        self._kept_rows.assign(rows)
        return rows

    def read_value(self, do_prefetch=True):
        if do_prefetch:
            return self.prefetch_values()
        return tf.identity(self._kept_rows)

    def embedding_lookup(self, ids, name=None, max_norm=None, return_trainable=False):
        """``de.embedding_lookup(self, ids, ...)``: through this shadow (its name)."""
        self.claim_lookups()
        return lookup_ids(self.params, ids, name=self.de_name,
                          max_norm=self.max_norm if max_norm is None else max_norm,
                          return_trainable=return_trainable)

    def verify_embedding_weights(self, sparse_ids, sparse_weights=None):
        """TFRA's check: TypeError for ids of another dtype than the key dtype, weights of
        another than the value dtype."""
        if sparse_ids.dtype != self.params.key_dtype:
            raise TypeError(f"sparse_ids have dtype {sparse_ids.dtype.name}, expected "
                            f"{self.params.key_dtype.name}")
        if sparse_weights is not None and sparse_weights.dtype != self.params.value_dtype:
            raise TypeError(f"sparse_weights have dtype {sparse_weights.dtype.name}, expected "
                            f"{self.params.value_dtype.name}")

    def _serialize_to_tensors(self):
        # A TF checkpoint saves or restores through this shadow: its kept ids and rows (a cache
        # of the last lookup; the table itself is saved by its Variable) are cleared, as TFRA
        # clears its shadow buffers, so that rows read before a restore are never served after.
        if tf.executing_eagerly():
            self.ids.assign(tf.zeros([0], self.params.key_dtype))
            self.exists.assign(tf.zeros([0], tf.bool))
            self._kept_rows.assign(tf.zeros([0, self.params.dim], self.params.value_dtype))
        return super()._serialize_to_tensors()

    # ---- hooks of the lookup (row_lookup.py) and the optimizer step (optimizers/row_update.py) ---
    keeps_lookups = True

    def record_lookup(self, keys, rows):
        """A training-mode lookup through this shadow read ``rows`` for ``keys``."""
        self.ids.assign(keys)
        self._kept_rows.assign(tf.cast(tf.stop_gradient(rows), self.params.value_dtype))

    def after_update(self):
        """The table changed under the kept rows: read them again (TFRA's optimizer updates
        the shadow's buffer itself)."""
        self._kept_rows.assign(self.params.lookup(self.ids))


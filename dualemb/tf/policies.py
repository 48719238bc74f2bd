"""Restrict policies: keep a Variable's size in check by evicting its least useful keys.

Pass the **class** to ``Variable(restrict_policy=...)`` (an instance raises ``TypeError``, as in
TFRA); the Variable builds the instance. ``var.restrict(num_reserved, trigger=...)`` calls
``apply_restriction``: when ``var.size() > trigger`` (default ``num_reserved``), each of the N shards
keeps its best ``num_reserved / N`` keys (the remainder goes to the first shards), and the evicted
keys' optimizer slots and metadata go with their rows, in the same core operation.

The scores come from the per-key metadata the core maintains on every write, so ``apply_update``
has nothing to do (it exists for TFRA code that calls it):

- ``TimestampRestrictPolicy``: recency. The core stamps each written row with the table's logical
  clock (one tick per write operation) instead of TFRA's wall-clock seconds, so there are no ties
  within a second.
- ``FrequencyRestrictPolicy``: the number of writes (optimizer steps, upserts) of each row. A key
  repeated within one batch counts once, as in TFRA.

``policy.status`` gives read access to the scores: ``export()`` -> (keys, scores), ``size()``,
``lookup(keys)`` (0 for absent keys).
"""

from __future__ import annotations

import tensorflow as tf

from dualemb.tf import ops


class PolicyStatus:
    """Read-only view of the per-key scores a policy restricts by."""

    def __init__(self, var, field: str):
        self._var = var
        self._field = field  # "last_update" or "update_count"

    def export(self):
        keys, scores = [], []
        for shard in self._var.tables:
            page = ops.export_table(shard.resource, self._var.key_dtype, self._var.dim)
            keys.append(page["keys"])
            scores.append(page[self._field])
        return tf.concat(keys, 0), tf.concat(scores, 0)

    def size(self, index=None):
        return self._var.size(index)

    def lookup(self, keys):
        """Scores of ``keys`` (any shape); 0 for keys not in the table."""
        keys = tf.convert_to_tensor(keys, self._var.key_dtype)
        all_keys, all_scores = self.export()
        order = tf.argsort(all_keys)
        sorted_keys = tf.gather(all_keys, order)
        sorted_scores = tf.gather(all_scores, order)
        flat = tf.reshape(keys, [-1])
        pos = tf.searchsorted(sorted_keys, flat)  # in [0, n]; n means "past the end"
        padded_keys = tf.concat([sorted_keys, tf.zeros([1], sorted_keys.dtype)], 0)
        padded_scores = tf.concat([sorted_scores, tf.zeros([1], tf.int64)], 0)
        found = tf.logical_and(pos < tf.size(sorted_keys), tf.gather(padded_keys, pos) == flat)
        got = tf.where(found, tf.gather(padded_scores, pos), tf.zeros_like(flat, tf.int64))
        return tf.reshape(got, tf.shape(keys))


class RestrictPolicy:
    """Base class. Subclasses set ``_policy`` ("recency" / "frequency") and ``_field``."""

    _policy = None
    _field = None

    def __init__(self, var):
        self.var = var
        self.params_in_slots = []  # TFRA compatibility; slots live beside the rows here

    def apply_update(self, ids):
        """No-op: the core updates each row's metadata on every write."""
        return tf.no_op()

    def apply_restriction(self, num_reserved, **kwargs):
        """Restricts the variable to about ``num_reserved`` keys when its size exceeds
        ``trigger`` (keyword, default ``num_reserved``). Returns how many keys were removed."""
        if isinstance(num_reserved, bool) or (
                not isinstance(num_reserved, int) and not tf.is_tensor(num_reserved)):
            raise TypeError(f"num_reserved must be an int, got {num_reserved!r}")
        if not tf.is_tensor(num_reserved) and num_reserved < 0:
            raise ValueError(f"num_reserved must be >= 0, got {num_reserved}")
        trigger = kwargs.pop("trigger", None)
        if kwargs:
            raise TypeError(f"unexpected arguments to apply_restriction: {sorted(kwargs)}")
        trigger = num_reserved if trigger is None else trigger
        shards = self.var.tables
        n = len(shards)
        reserved = tf.cast(num_reserved, tf.int64)

        def restrict():
            removed = []
            for i, shard in enumerate(shards):
                keep = reserved // n + tf.cast(tf.cast(i, tf.int64) < reserved % n, tf.int64)
                removed.append(ops.restrict(shard.resource, keep, self._policy,
                                            key_dtype=self.var.key_dtype))
            return tf.add_n(removed)

        size = self.var.size()
        if tf.executing_eagerly():
            return restrict() if int(size) > int(trigger) else tf.constant(0, tf.int64)
        return tf.cond(size > tf.cast(trigger, tf.int64), restrict,
                       lambda: tf.constant(0, tf.int64))

    @property
    def status(self) -> PolicyStatus:
        return PolicyStatus(self.var, self._field)


class TimestampRestrictPolicy(RestrictPolicy):
    """Keeps the most recently updated keys."""

    _policy = "recency"
    _field = "last_update"


class FrequencyRestrictPolicy(RestrictPolicy):
    """Keeps the most frequently updated keys."""

    _policy = "frequency"
    _field = "update_count"

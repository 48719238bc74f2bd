"""Restrict policies: keep a Variable's size in check by evicting its least useful keys.

Pass the **class** to ``Variable(restrict_policy=...)`` (an instance raises ``TypeError``, as in
TFRA); the Variable builds the instance. A policy keeps its per-key scores in a status of its
own, a dim-1 ``Variable`` (``policy.status_variable``) whose status shard i holds the keys of
shard i; only ``apply_update(ids)`` changes it (``DynamicEmbeddingOptimizer`` calls it every
step). ``FrequencyRestrictPolicy`` scores by ``update_count``, ``TimestampRestrictPolicy`` by the
status table's ``last_update`` (microseconds; the status shows whole seconds, as TFRA's).
``var.restrict(num_reserved, trigger=...)`` follows TFRA's ``apply_restriction``; keys without a
status are never removed. ``policy.status`` reads the scores (``tstp_var`` / ``freq_var``, TFRA's
names, give the same view). The rules and where they differ from TFRA's: docs/tf.md,
"Restrict policies".
"""

from __future__ import annotations

import tensorflow as tf

from dualemb.tf import ops
from dualemb.tf.slots import positions_in


class PolicyStatus:
    """Read-only view of the per-key scores a policy restricts by."""

    def __init__(self, status_var, field: str, unit: int = 1):
        self._status = status_var
        self._field = field  # "last_update" or "update_count"
        self._unit = unit  # the status shows field // unit (microseconds -> seconds)

    def export(self):
        keys, scores = [], []
        for shard in self._status.tables:
            page = ops.export_table(shard.resource, self._status.key_dtype, 1)
            keys.append(page["keys"])
            scores.append(page[self._field] // self._unit if self._unit != 1
                          else page[self._field])
        return tf.concat(keys, 0), tf.concat(scores, 0)

    def size(self, index=None):
        return self._status.size(index)

    def lookup(self, keys):
        """Scores of ``keys`` (any shape); 0 for keys without status."""
        keys = tf.convert_to_tensor(keys, self._status.key_dtype)
        all_keys, all_scores = self.export()
        pos = positions_in(all_keys, tf.reshape(keys, [-1]))
        padded_scores = tf.concat([all_scores, tf.zeros([1], tf.int64)], 0)  # n: no status
        got = tf.gather(padded_scores, tf.where(pos < 0, tf.size(all_keys), pos))
        return tf.reshape(got, tf.shape(keys))


def _ranked_keys(keys, scores):
    """``keys`` best first: higher score first, the smaller key first among equal scores (the
    core's own tie rule; string keys, which TF cannot sort, by their fingerprint)."""
    order_keys = keys
    if keys.dtype == tf.string:
        order_keys = tf.strings.to_hash_bucket_fast(keys, 2 ** 63 - 1)
    by_key = tf.argsort(order_keys, stable=True)
    by_score = tf.argsort(tf.gather(scores, by_key), direction="DESCENDING", stable=True)
    return tf.gather(keys, tf.gather(by_key, by_score))


class RestrictPolicy:
    """Base class. Subclasses set ``_kind`` (the status name) and ``_field`` (the score)."""

    _kind = None
    _field = None
    _unit = 1  # the status shows the score // _unit

    def __init__(self, var):
        if not callable(getattr(var, "make_status_variable", None)):  # not a dualemb Variable
            raise TypeError(f"{type(self).__name__} takes the Variable it restricts, got {var!r}; "
                            "pass the policy class to Variable(restrict_policy=...)")
        self.var = var
        self.params_in_slots = []  # TFRA compatibility; slots live beside the rows here
        self.status_variable = var.make_status_variable(self._kind)

    def apply_update(self, ids):
        """Records one update of each distinct key in ``ids`` (any shape) in the status. Returns
        an int64 tensor (status keys a capacity evicted: 0), usable in and out of tf.function."""
        status = self.status_variable
        keys, _ = tf.unique(tf.reshape(tf.cast(ids, status.key_dtype), [-1]))
        shards = status.tables
        deps = []
        floor = self._clock_floor()
        if len(shards) > 1 or floor is not None:
            # One clock for all shards, so last_update orders updates across shards too; never
            # below the floor (the write stamps the clock's next tick).
            clocks = [ops.get_clock(s.resource) for s in shards]
            clock = tf.reduce_max(tf.stack(clocks + ([] if floor is None else [floor])))
            deps = [ops.set_clock(s.resource, clock) for s in shards]
        with tf.control_dependencies(deps):
            zeros = tf.zeros([tf.size(keys), 1], tf.float32)
            evicted = status.router.write(ops.insert_or_assign, keys, zeros)
        return evicted[0] if len(evicted) == 1 else tf.add_n(evicted)

    def _clock_floor(self):
        """The least clock the status shards get before an update's write, or None."""
        return None

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
        pairs = list(zip(self.var.tables, self.status_variable.tables))
        n = len(pairs)
        reserved = tf.cast(num_reserved, tf.int64)
        key_dtype = self.var.key_dtype

        def restrict():
            removed = []
            for i, (table, status) in enumerate(pairs):
                keep = reserved // n + tf.cast(tf.cast(i, tf.int64) < reserved % n, tf.int64)
                page = ops.export_table(status.resource, key_dtype, 1)
                ranked = _ranked_keys(page["keys"], page[self._field])
                dropped = ranked[keep:]  # rows without status are kept, as TFRA's
                before = ops.table_size(table.resource)
                with tf.control_dependencies([before]):
                    erased = [ops.erase(table.resource, dropped), ops.erase(status.resource, dropped)]
                with tf.control_dependencies(erased):
                    removed.append(before - ops.table_size(table.resource))
            return tf.add_n(removed)

        size = self.var.size()
        if tf.executing_eagerly():
            return restrict() if int(size) > int(trigger) else tf.constant(0, tf.int64)
        return tf.cond(size > tf.cast(trigger, tf.int64), restrict,
                       lambda: tf.constant(0, tf.int64))

    @property
    def status(self) -> PolicyStatus:
        return PolicyStatus(self.status_variable, self._field, self._unit)


class TimestampRestrictPolicy(RestrictPolicy):
    """Keeps the most recently updated keys."""

    _kind = "timestamp"
    _field = "last_update"  # microseconds since the epoch (see the module docstring)
    _unit = 1_000_000  # the status shows seconds, as TFRA's

    def _clock_floor(self):
        # The clock before the write: its tick stamps the current microsecond or later.
        return tf.cast(tf.timestamp() * 1e6, tf.int64) - 1

    @property
    def tstp_var(self) -> PolicyStatus:
        """TFRA's name for this policy's status (the same view as ``status``)."""
        return self.status


class FrequencyRestrictPolicy(RestrictPolicy):
    """Keeps the most frequently updated keys."""

    _kind = "frequency"
    _field = "update_count"

    @property
    def freq_var(self) -> PolicyStatus:
        """TFRA's name for this policy's status (the same view as ``status``)."""
        return self.status

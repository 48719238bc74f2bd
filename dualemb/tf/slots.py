"""Read-only views of the optimizer slots stored beside a Variable's rows.

TFRA keeps each slot (Adam's m and v, ...) in its own ``de.Variable``; dualemb keeps slots in the
same core row as the value, so that a row and its optimizer state are inserted, evicted, saved and
restored together. ``Variable.get_slot_variables()`` returns one ``SlotVariable`` per slot, named
``"{variable name}/{slot name}"`` with the Keras slot names (``momentum``, ``velocity``, ...).
"""

from __future__ import annotations

import tensorflow as tf

from dualemb.tf import ops


class SlotVariable:
    """One optimizer slot of a Variable: ``export()``, ``lookup(keys)``, ``size()``."""

    def __init__(self, params, index: int, slot_name: str):
        self.params = params
        self.index = index
        self.slot_name = slot_name
        self.name = f"{params.name}/{slot_name}"
        self.dim = params.dim
        self.key_dtype = params.key_dtype

    def export(self):
        """(keys [n], slot values [n, dim])."""
        keys, values = [], []
        for shard in self.params.tables:
            page = ops.export_table(shard.resource, self.params.key_dtype, self.params.dim)
            keys.append(page["keys"])
            values.append(page["slots"][:, self.index, :])
        return tf.concat(keys, 0), tf.concat(values, 0)

    def size(self, index=None):
        return self.params.size(index)

    def lookup(self, keys):
        """Slot rows of ``keys`` (keys.shape + [dim]); zeros for keys not in the table."""
        keys = tf.convert_to_tensor(keys, self.key_dtype)
        all_keys, all_values = self.export()
        order = tf.argsort(all_keys)
        sorted_keys = tf.gather(all_keys, order)
        sorted_values = tf.gather(all_values, order)
        flat = tf.reshape(keys, [-1])
        pos = tf.searchsorted(sorted_keys, flat)
        padded_keys = tf.concat([sorted_keys, tf.zeros([1], sorted_keys.dtype)], 0)
        padded_values = tf.concat([sorted_values, tf.zeros([1, self.dim])], 0)
        found = tf.logical_and(pos < tf.size(sorted_keys), tf.gather(padded_keys, pos) == flat)
        rows = tf.where(found[:, None], tf.gather(padded_values, pos), tf.zeros([1, self.dim]))
        return tf.reshape(rows, tf.concat([tf.shape(keys), [self.dim]], 0))

    def __repr__(self) -> str:
        return f"<dualemb.tf.SlotVariable {self.name!r}>"


def slot_variables(params) -> list:
    if not params.tables:
        return []
    names = params.tables[0].slot_names()
    return [SlotVariable(params, i, n) for i, n in enumerate(names)]

"""Read-only views of the optimizer slots stored beside a Variable's rows.

TFRA keeps each slot (Adam's m and v, ...) in its own ``de.Variable``; dualemb keeps slots in the
same core row as the value, so that a row and its optimizer state are inserted, evicted, saved and
restored together. ``Variable.get_slot_variables()`` returns one ``SlotVariable`` per slot, named
``"{variable name}/{slot name}"`` with the Keras slot names (``momentum``, ``velocity``, ...).

**Which keys a slot shows.** TFRA's slot tables hold the keys the optimizer has stepped: every
key of a batch that ``apply_gradients`` updated, whatever its gradient (an all-zero gradient
behind a dead ReLU included), and no key that was only upserted or looked up. Here every row
carries slots, and the core marks a row "stepped" when a fused optimizer step updates it (an
insert, and a change of optimizer, clear the mark; checkpoints keep it). ``export()`` and
``size()`` show exactly the stepped rows, so they hold the same keys as TFRA's slot tables.
``lookup(keys)`` reads any row's slots (the initial slots for rows never trained, and for
absent keys, which is what TFRA's slot lookup returns for a missing key).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from dualemb.tf import ops


def initial_slots(params) -> np.ndarray:
    """[num_slots, dim] the slots a new row of ``params`` gets from its attached optimizer."""
    from dualemb.core import Table  # host-side, through the pybind module

    optimizer = Table.attach(params.tables[0].table_id).optimizer
    probe = Table(dim=params.dim, value_dtype=params.value_dtype.name)
    try:
        probe.set_optimizer(optimizer)
        probe.import_rows(np.zeros([1], np.int64), np.zeros([1, params.dim], np.float32))
        return probe.export()["slots"][0]
    finally:
        probe.destroy()


def positions_in(table_keys, keys):
    """For each of ``keys`` [m], its position in ``table_keys`` [n] (distinct keys), or -1.

    By ``tf.unique`` over both (not sorting, which TF has no kernel for on strings): the table's
    keys get distinct unique ids, and a query key shares its id with the equal table key, if any.
    Exact for every key dtype (string keys compared by their bytes)."""
    n = tf.size(table_keys)
    unique, index = tf.unique(tf.concat([table_keys, keys], 0), out_idx=tf.int32)
    # position + 1 per unique id, 0 for ids only queries have
    plus_one = tf.scatter_nd(index[:n, None], tf.range(1, n + 1), tf.shape(unique))
    return tf.gather(plus_one, index[n:]) - 1


class SlotVariable:
    """One optimizer slot of a Variable: ``export()``, ``lookup(keys)``, ``size()``."""

    def __init__(self, params, index: int, slot_name: str):
        self.params = params
        self.index = index
        self.slot_name = slot_name
        self.name = f"{params.name}/{slot_name}"
        self.dim = params.dim
        self.key_dtype = params.key_dtype

    def _shard_pages(self, trained_only: bool):
        """Per shard: (keys, this slot's rows), of the stepped rows when ``trained_only``."""
        for shard in self.params.tables:
            page = ops.export_table(shard.resource, self.params.key_dtype, self.params.dim,
                                    self.params.value_dtype)
            keys, slots = page["keys"], page["slots"]
            if trained_only:  # the core's per-row mark: all slot views show the same keys
                keys = tf.boolean_mask(keys, page["stepped"])
                slots = tf.boolean_mask(slots, page["stepped"])
            yield keys, slots[:, self.index, :]

    def export(self):
        """(keys [n], slot values [n, dim]) of the rows the optimizer has stepped."""
        pages = list(self._shard_pages(trained_only=True))
        return tf.concat([k for k, _ in pages], 0), tf.concat([v for _, v in pages], 0)

    def size(self, index=None):
        """Number of rows the optimizer has stepped (all shards, or shard ``index``)."""
        pages = list(self._shard_pages(trained_only=True))
        if index is not None:
            if not 0 <= int(index) < len(pages):
                raise IndexError(f"shard index {index} out of range [0, {len(pages)})")
            pages = [pages[int(index)]]
        return tf.add_n([tf.size(k, out_type=tf.int64) for k, _ in pages])

    def lookup(self, keys):
        """Slot rows of ``keys`` (keys.shape + [dim]); the initial slot for absent keys."""
        keys = tf.convert_to_tensor(keys, self.key_dtype)
        pages = list(self._shard_pages(trained_only=False))
        all_keys = tf.concat([k for k, _ in pages], 0)
        all_values = tf.concat([v for _, v in pages], 0)
        default = tf.constant(initial_slots(self.params)[self.index])[None]
        flat = tf.reshape(keys, [-1])
        pos = positions_in(all_keys, flat)
        padded_values = tf.concat([all_values, default], 0)  # row n: absent keys' slot
        rows = tf.gather(padded_values, tf.where(pos < 0, tf.size(all_keys), pos))
        return tf.reshape(rows, tf.concat([tf.shape(keys), [self.dim]], 0))

    def __repr__(self) -> str:
        return f"<dualemb.tf.SlotVariable {self.name!r}>"


def slot_variables(params) -> list:
    if not params.tables:
        return []
    names = params.tables[0].slot_names()
    return [SlotVariable(params, i, n) for i, n in enumerate(names)]

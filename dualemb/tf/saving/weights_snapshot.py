"""Dynamic embedding tables through Keras' ``get_weights`` / ``set_weights``.

Keras habits such as ``keras.callbacks.EarlyStopping(restore_best_weights=True)`` copy a model's
state with ``model.get_weights()`` (``[v.numpy() for v in model.weights]``) and put it back with
``model.set_weights(...)`` (``v.assign(value)`` per weight). A table is not a Keras weight; what
Keras sees of it is the ``(0, dim)`` gradient anchor (``dualemb/tf/trainable.py``). Left alone,
those habits would restore the dense weights and silently keep the tables at their latest state.

So the anchor's ``numpy()`` returns a ``TableSnapshot``: a real ``(0, dim)`` float32 array (every
shape check Keras makes still holds) that also carries a full copy of its Variable's tables —
rows, optimizer slots and per-key metadata of every shard. ``assign`` of a snapshot restores the
tables exactly as they were (replacing, not merging: keys added since are erased). Any other value
assigned to an anchor raises, since it cannot say what the table should hold.

Cost: a snapshot holds the whole table in host memory, as ``get_weights`` does for dense weights.
Optimizer slots of the table are restored with its rows (the table keeps them beside each row),
whereas Keras leaves dense optimizer variables as they are.
"""

from __future__ import annotations

import numpy as np

from dualemb.core.table import Table


class TableSnapshot(np.ndarray):
    """A ``(0, dim)`` float32 array carrying ``shards``: one export dict per table shard (keys,
    values, slots, last_update, update_count, clock), and ``source``: the Variable's name."""

    shards: tuple = ()
    source: str = ""
    slot_names: tuple = ()

    def __array_finalize__(self, obj):
        self.shards = getattr(obj, "shards", ())
        self.source = getattr(obj, "source", "")
        self.slot_names = getattr(obj, "slot_names", ())


def _core_shards(variable) -> list:
    return [Table.attach(shard.table_id, name=variable.name) for shard in variable.tables]


def take(variable) -> TableSnapshot:
    """A snapshot of every shard of ``variable`` (a ``dualemb.tf.Variable``)."""
    shards = []
    slot_names = ()
    for table in _core_shards(variable):
        data = table.export()
        data["clock"] = table.clock
        shards.append(data)
        slot_names = tuple(table.slot_names)
    snap = np.zeros((0, variable.dim), np.float32).view(TableSnapshot)
    snap.shards = tuple(shards)
    snap.source = variable.name
    snap.slot_names = slot_names
    return snap


def restore(variable, snap) -> None:
    """Makes ``variable``'s tables hold exactly what ``snap`` recorded. Raises ``ValueError``
    (tables unchanged) for a value that is not a snapshot of a compatible Variable."""
    if not isinstance(snap, TableSnapshot) or not snap.shards:
        raise ValueError(
            f"cannot set the weights of dynamic embedding {variable.name!r} from a plain array: "
            "its table is not a Keras weight. Restore tables from a value returned by "
            "model.get_weights() in this process, or with tf.train.Checkpoint / "
            "model.load_weights / de.load.")
    tables = _core_shards(variable)
    if len(snap.shards) != len(tables) or snap.shape[1] != variable.dim:
        raise ValueError(
            f"the snapshot of {snap.source!r} ({len(snap.shards)} shards, dim {snap.shape[1]}) "
            f"does not fit dynamic embedding {variable.name!r} ({len(tables)} shards, dim "
            f"{variable.dim})")
    for table, data in zip(tables, snap.shards):
        if data["keys"].dtype != table.key_dtype:
            raise ValueError(f"the snapshot of {snap.source!r} has {data['keys'].dtype} keys; "
                             f"{variable.name!r} has {table.key_dtype} keys")
        if data["values"].dtype != table.value_dtype:  # never converted silently
            raise ValueError(f"the snapshot of {snap.source!r} has {data['values'].dtype} values; "
                             f"{variable.name!r} has {table.value_dtype} values")
    for table, data in zip(tables, snap.shards):
        # Slots travel only between tables trained by the same kind of optimizer; otherwise the
        # rows are restored and their slots start from the optimizer's initial values.
        same_slots = tuple(table.slot_names) == snap.slot_names
        table.clear()
        table.import_rows(data["keys"], data["values"],
                          slots=data["slots"] if same_slots and table.num_slots else None,
                          last_update=data["last_update"], update_count=data["update_count"],
                          stepped=data["stepped"] if same_slots and table.num_slots else None)
        table.clock = data["clock"]

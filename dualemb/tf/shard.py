"""``TableShard``: one core table of a ``Variable`` as a TensorFlow resource.

It is a ``tf.saved_model.experimental.TrackableResource`` whose handle is the table id (an int64
scalar tensor). Functions capture that handle, so ``tf.saved_model.save`` records how to recreate
the table (the ``DualembCreateTable`` op with the table's config and optimizer spec) and a
SavedModel loaded in a fresh process recreates it, under the same id, before restoring its rows.
Tables are never destroyed when a Python object goes away (a traced function may still refer to
the id); they live as long as the process.

A shard lists its Variable as a checkpoint dependency, so whatever reaches the shard (for instance
Keras' ``model.export``, which collects the TrackableResources its functions use) also saves and
restores the Variable's rows.
"""

from __future__ import annotations

import weakref

import tensorflow as tf

from dualemb.core.spec import parse_description
from dualemb.tf import ops


class TableShard(tf.saved_model.experimental.TrackableResource):
    """One shard of a Variable.

    Attributes:
      table_id: the core table id (Python int).
      config: the core config string the table is created from.
      optimizer_spec: the fused optimizer spec string attached to the table ("" for none).
      resource: the table id as an int64 scalar tensor (``resource_handle``): pass this to the ops
        inside traced functions.
    """

    def __init__(self, config: str, name: str, table_id: int = 0, optimizer_spec: str = ""):
        super().__init__()
        self.config = config
        self.optimizer_spec = optimizer_spec
        self.name = name
        with tf.init_scope():  # create eagerly, even when the Variable is built inside a function
            self.table_id = int(ops.create_table(table_id, config, optimizer_spec).numpy())
            self._resource_handle = tf.constant(self.table_id, tf.int64)

    def _bind_variable(self, variable) -> None:
        self._variable_ref = weakref.ref(variable)

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        children = super()._trackable_children(save_type, **kwargs)
        ref = getattr(self, "_variable_ref", None)
        variable = ref() if ref is not None else None
        if variable is not None:
            children["variable"] = variable
        return children

    def _create_resource(self):
        return ops.create_table(self.table_id, self.config, self.optimizer_spec)

    @property
    def resource(self):
        return self.resource_handle

    def set_optimizer(self, spec: str) -> None:
        """Attaches a fused optimizer spec to the table (recreated with it from a SavedModel)."""
        with tf.init_scope():
            ops.set_optimizer(self.resource, spec)
        self.optimizer_spec = spec

    def describe(self) -> tuple[dict, dict | None]:
        """(config, optimizer spec or None) as the core records them."""
        with tf.init_scope():
            text = ops.describe(self.resource).numpy().decode()
        return parse_description(text)

    def slot_names(self) -> list[str]:
        from dualemb.core import Table  # host-side metadata through the pybind module
        return Table.attach(self.table_id).slot_names

    def __repr__(self) -> str:
        return f"TableShard(name={self.name!r}, table_id={self.table_id})"

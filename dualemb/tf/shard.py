"""``TableShard``: one core table of a ``Variable``, owned as a TensorFlow resource.

A shard is a ``tf.saved_model.experimental.TrackableResource`` whose handle is a real resource
tensor (``DualembTableHandle``): an anonymous, ref-counted handle to a core table, placed on the
host CPU of the Variable's ``devices`` entry, so the ops that take it run where the table lives.
The table lives exactly as long as something references the handle — the shard, or a traced
function that captured it — and is freed after; there is nothing to destroy by hand.

``tf.saved_model.save`` records how to create the table (the handle op with the table's config and
optimizer spec). Loading a SavedModel creates **fresh** tables owned by the loaded object and
restores their rows from its checkpoint, so two SavedModels (two versions of one model) loaded in
one process each serve their own rows, and neither touches the tables of the process that
exported them.

Sharing with ``dualemb.core`` / ``dualemb.jax`` in one process is explicit: ``table_id`` is the
core id, valid while the shard lives (``dualemb.core.Table.attach(shard.table_id)``); a shard built
with ``table_id=`` shares an existing core table and keeps it alive while it lives.

A shard lists its Variable as a checkpoint dependency, so whatever reaches the shard (for instance
Keras' ``model.export``, which collects the TrackableResources its functions use) also saves and
restores the Variable's rows.
"""

from __future__ import annotations

import json
import secrets
import weakref

import tensorflow as tf

from dualemb.core.spec import parse_description, to_spec
from dualemb.tf import ops
from dualemb.tf.saving import file_system


def in_memory(shard) -> bool:
    """Whether ``shard``'s table keeps its rows in this process (the core's "memory" backend,
    the default), from its config; a Redis table (``"backend": "redis"``) does not."""
    try:
        config = json.loads(shard.config)
    except (TypeError, ValueError):
        return False
    return isinstance(config, dict) and config.get("backend", "memory") == "memory"


def host_device(device: str) -> str:
    """The host CPU of ``device`` (same job, replica and task): tables live in host memory."""
    try:
        spec = tf.DeviceSpec.from_string(device or "")
    except ValueError as e:
        raise ValueError(f"cannot place a table on device {device!r}: {e}") from None
    if spec.device_type in (None, "CPU"):
        return spec.to_string()
    return spec.replace(device_type="CPU", device_index=0).to_string()


def _refuse_tracing(what: str) -> None:
    # These read and write files from Python: traced, they would run once, at trace time.
    if not tf.executing_eagerly():
        raise RuntimeError(f"TableShard.{what} runs eagerly (it would run only once inside a "
                           "tf.function or TF1 graph); call it outside")


class TableShard(tf.saved_model.experimental.TrackableResource):
    """One shard of a Variable.

    Args:
      config: the core config string of a new table (ignored with ``table_id``).
      name: the shard's name.
      optimizer_spec: a fused optimizer spec string to attach to a new table ("" for none).
      device: where the table lives (its host CPU is used).
      table_id: share this existing core table (made by any front end in this process) instead of
        creating one; the shard keeps it alive while it lives.

    Attributes:
      table_id: the core table id (Python int), valid while the shard lives; None for a shard
        built in a TF1 graph (its session creates the table).
      config: the core config string the table is created from (in a SavedModel too).
      optimizer_spec: the fused optimizer spec string attached to the table ("" for none).
      device: the device the table resource lives on (a host CPU; "" for the default one).
      resource: the table's resource handle tensor: pass this to the ops.
    """

    def __init__(self, config: str, name: str, optimizer_spec: str = "", device: str = "",
                 table_id: int | None = None):
        self.device = host_device(device)
        super().__init__(device=self.device)
        self.config = config
        self.optimizer_spec = optimizer_spec
        self.name = name
        # Set before the handle is made: _create_resource names a TF1 graph's table from it.
        self.table_id = None if table_id is None else int(table_id)
        with tf.init_scope(), tf.device(self.device):
            # Created eagerly, even when the Variable is built inside a function.
            if table_id is None:
                self._resource_handle = self._create_resource()
            else:
                self._resource_handle = ops.attach_table(table_id)
            if tf.executing_eagerly():
                self.table_id = int(ops.table_id(self._resource_handle))
            # else: built in a TF1 graph (a session makes the table when it first runs the
            # handle op), so there is no core id to know yet: table_id stays None.
        if table_id is not None:  # a SavedModel of this shard recreates the table as it is
            self.config, self.optimizer_spec = self._description()

    def bind_variable(self, variable) -> None:
        """Makes ``variable`` (the Variable this shard belongs to) a child of this shard in TF
        checkpoints and SavedModels, without keeping it alive."""
        self._variable_ref = weakref.ref(variable)

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        children = super()._trackable_children(save_type, **kwargs)
        ref = getattr(self, "_variable_ref", None)
        variable = ref() if ref is not None else None
        if variable is not None:
            children["variable"] = variable
        return children

    def _create_resource(self):
        # Always a fresh table: this is what a SavedModel records, so each load owns its tables.
        session_name = ""
        if not tf.executing_eagerly() and not tf.compat.v1.get_default_graph().building_function:
            # A graph run by a TF1 session: the SavedModel's own graph, where tf.saved_model.save
            # builds the TF1 saver that C++ loaders (TF Serving) run, then serve in later runs.
            # Each run would make a new anonymous table; a name keeps one table per session.
            # A shard first built in such a graph (import_meta_graph, TF1 code) has no core id
            # yet: a random one names it, unique in the process like the core's ids.
            key = self.table_id if self.table_id is not None else secrets.randbits(63)
            session_name = f"dualemb_table_{key}"
        return ops.table_handle(self.config, self.optimizer_spec, session_name=session_name)

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

    def _description(self) -> tuple[str, str]:
        """(config, optimizer spec) as the strings the handle op takes ("" for no optimizer)."""
        config, opt = self.describe()
        return to_spec(config), ("" if opt is None else to_spec(opt))

    def save_to_file_system(self, dirpath, file_name=None, dirpath_env="TFRA_SAVED_KV",
                            append_to_file=False, buffer_size=4194304, name=None):
        """TFRA's table-level save: this table alone, in the common format, to
        ``<dirpath>/<file_name or this shard's name>`` (see ``saving/file_system.py``)."""
        _refuse_tracing("save_to_file_system")
        if append_to_file:
            raise NotImplementedError("append_to_file: each save writes a complete directory")
        path = file_system.save_shard_to_file_system(self, dirpath, file_name, dirpath_env)
        return tf.constant(path)  # a tensor, as TFRA's op (tf.test's evaluate() takes it)

    def load_from_file_system(self, dirpath, file_name=None, dirpath_env="TFRA_SAVED_KV",
                              load_entire_dir=False, buffer_size=4194304, name=None):
        """TFRA's table-level load: the saved rows go into this shard's Variable, each key to
        the shard it routes to (see ``dualemb/tf/saving/file_system.py``)."""
        _refuse_tracing("load_from_file_system")
        ref = getattr(self, "_variable_ref", None)
        variable = ref() if ref is not None else None
        if variable is None:
            raise ValueError(f"{self!r} belongs to no live de.Variable to load into")
        size = file_system.load_shard_from_file_system(self, variable, dirpath, file_name,
                                                       load_entire_dir, dirpath_env)
        return tf.constant(size, tf.int64)  # the Variable's size after

    def slot_names(self) -> list[str]:
        from dualemb.core import Table  # host-side metadata through the pybind module
        return Table.attach(self.table_id).slot_names

    def __repr__(self) -> str:
        return f"TableShard(name={self.name!r}, table_id={self.table_id})"

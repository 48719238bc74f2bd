"""Saving and restoring dynamic-embedding tables from TensorFlow and Keras 3: one import for
every saving entry point, one module per path (docs/tf_saving.md):

* ``variable_state``: what one ``de.Variable`` saves on every path (rows, optimizer slots,
  per-key metadata, a JSON description), the compatibility checks, and the replacement of a
  variable's contents by saved tensors.
* ``tf_checkpoint``: TF object checkpoints and SavedModel (``Variable._serialize_to_tensors`` /
  ``_restore_from_tensors``).
* ``keras_files``: Keras 3 ``.weights.h5`` and ``.keras`` files (a layer's
  ``save_own_variables`` / ``load_own_variables``).
* ``common_format``: ``de.save`` / ``de.load``, the common checkpoint format JAX reads too.
* ``file_system``: ``Variable.save_to_file_system`` / ``load_from_file_system``.
* ``live_updates``: ``follow``, a serving model's tables (a loaded SavedModel's too) applying the
  checkpoints a trainer publishes, in place (docs/online_learning.md).
* ``weights_snapshot``: what ``get_weights()`` returns for a layer's table.

Restoring **replaces** a variable's contents; a checkpoint whose dim or dtypes differ from the
variable it is restored into is refused before the table is touched.

The names below are resolved on first use (PEP 562): ``dualemb.tf.variable`` imports
``tf_checkpoint`` and ``file_system`` from this package, and ``common_format`` imports
``Variable``, so importing them all here would close an import cycle.
"""

import importlib

# public name -> the module of this package that defines it
_EXPORTS = {
    "CheckpointError": "dualemb.core.checkpoint",
    "find_variables": "dualemb.tf.saving.common_format",
    "load": "dualemb.tf.saving.common_format",
    "save": "dualemb.tf.saving.common_format",
    "follow": "dualemb.tf.saving.live_updates",
    "load_variable_from_file_system": "dualemb.tf.saving.file_system",
    "save_variable_to_file_system": "dualemb.tf.saving.file_system",
    "layer_load_own_variables": "dualemb.tf.saving.keras_files",
    "layer_save_own_variables": "dualemb.tf.saving.keras_files",
    "restore_variable": "dualemb.tf.saving.tf_checkpoint",
    "serialize_variable": "dualemb.tf.saving.tf_checkpoint",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))

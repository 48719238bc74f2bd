"""Saving and restoring dynamic-embedding tables from TensorFlow and Keras 3: one import for
every saving entry point. Each path lives in its own module (docs/tf_saving.md):

* ``dualemb.tf.variable_state``: what one ``de.Variable`` saves on every path (rows, optimizer
  slots, per-key metadata and a JSON description), the compatibility checks, and the replacement
  of a variable's contents by saved tensors.
* ``dualemb.tf.tf_checkpoint``: TF object checkpoints and SavedModel
  (``Variable._serialize_to_tensors`` / ``_restore_from_tensors``).
* ``dualemb.tf.keras_files``: Keras 3 ``.weights.h5`` and ``.keras`` files (a DE layer's
  ``save_own_variables`` / ``load_own_variables``).
* ``dualemb.tf.common_format``: ``de.save`` / ``de.load``, the common checkpoint format readable
  from JAX, with the optimizer step and the dense weights.
* ``dualemb.tf.file_system``: ``Variable.save_to_file_system`` / ``load_from_file_system``.

Restoring **replaces** a variable's contents; a checkpoint whose dim or dtypes differ from the
variable it is restored into is refused before the table is touched.
"""

from dualemb.core.checkpoint import CheckpointError
from dualemb.tf.common_format import find_variables, load, save
from dualemb.tf.file_system import load_variable_from_file_system, save_variable_to_file_system
from dualemb.tf.keras_files import layer_load_own_variables, layer_save_own_variables
from dualemb.tf.tf_checkpoint import restore_variable, serialize_variable

__all__ = [
    "CheckpointError", "serialize_variable", "restore_variable", "layer_save_own_variables",
    "layer_load_own_variables", "save", "load", "find_variables", "save_variable_to_file_system",
    "load_variable_from_file_system",
]

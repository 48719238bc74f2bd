"""``de.keras``: Keras 3 integration (layers, ``models.save_model``, ``callbacks``)."""

from dualemb.tf.keras import callbacks, layers, models

__all__ = ["callbacks", "layers", "models"]

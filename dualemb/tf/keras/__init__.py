"""``de.keras``: Keras 3 integration (layers, ``models.save_model``)."""

from dualemb.tf.keras import layers, models

__all__ = ["layers", "models"]

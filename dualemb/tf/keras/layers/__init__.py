"""``de.keras.layers``: Keras layers over dynamic embeddings.

The Keras 3 layers (``embedding.py``), or the tf_keras (Keras 2) ones (``keras2.py``) when
``TF_USE_LEGACY_KERAS`` is set as TensorFlow reads it (``"1"``, ``"true"`` or ``"True"``), i.e.
when ``tf.keras`` is tf_keras: the layers are of the Keras ``tf.keras`` names.
"""

import os

if os.environ.get("TF_USE_LEGACY_KERAS", None) in ("true", "True", "1"):
    from dualemb.tf.keras.layers.keras2 import (BasicEmbedding, Embedding, FieldWiseEmbedding,
                                                HvdAllToAllEmbedding, LayerNormalization,
                                                SquashedEmbedding)
else:
    from dualemb.tf.keras.layers.embedding import (BasicEmbedding, Embedding, FieldWiseEmbedding,
                                                   HvdAllToAllEmbedding, SquashedEmbedding)
    from dualemb.tf.keras.layers.layer_normalization import LayerNormalization

__all__ = ["Embedding", "BasicEmbedding", "SquashedEmbedding", "FieldWiseEmbedding",
           "HvdAllToAllEmbedding", "LayerNormalization"]

"""``de.keras.layers``: Keras 3 layers over dynamic embeddings."""

from dualemb.tf.keras.layers.embedding import (BasicEmbedding, Embedding, FieldWiseEmbedding,
                                               HvdAllToAllEmbedding, SquashedEmbedding)

__all__ = ["Embedding", "BasicEmbedding", "SquashedEmbedding", "FieldWiseEmbedding",
           "HvdAllToAllEmbedding"]

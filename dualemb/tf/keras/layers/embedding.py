"""Keras 3 layers over dynamic embeddings: ``Embedding`` (alias ``BasicEmbedding``),
``SquashedEmbedding`` and ``FieldWiseEmbedding``, with TFRA's arguments (what they do:
``embedding_logic.py``; the tf_keras versions: ``keras2.py``).

The anchor is a ``TrainableWrapper``, a trainable ``(0, dim)`` Keras 3 variable. The layers set
``supports_jit = False`` (the table ops are host ops and cannot be XLA-compiled), so Keras never
jit-compiles a model that contains one.
"""

from __future__ import annotations

import keras

from dualemb.tf.saving import keras_files
from dualemb.tf.keras.layers.embedding_logic import (EmbeddingLogic, FieldWiseLogic,
                                                     HvdAllToAllLogic, SquashedLogic)


@keras.saving.register_keras_serializable(package="dualemb")
class Embedding(EmbeddingLogic, keras.layers.Layer):
    __doc__ = EmbeddingLogic.__doc__
    _keras = keras

    def _make_anchor(self):
        # A trainable (0, dim) weight Keras tracks like any other.
        return self.params.trainable_wrapper(self._shadow_name)

    def save_own_variables(self, store):
        keras_files.layer_save_own_variables(self, store)

    def load_own_variables(self, store):
        keras_files.layer_load_own_variables(self, store)


BasicEmbedding = Embedding


@keras.saving.register_keras_serializable(package="dualemb")
class SquashedEmbedding(SquashedLogic, Embedding):
    __doc__ = SquashedLogic.__doc__


@keras.saving.register_keras_serializable(package="dualemb")
class FieldWiseEmbedding(FieldWiseLogic, Embedding):
    __doc__ = FieldWiseLogic.__doc__


@keras.saving.register_keras_serializable(package="dualemb")
class HvdAllToAllEmbedding(HvdAllToAllLogic, Embedding):
    __doc__ = HvdAllToAllLogic.__doc__

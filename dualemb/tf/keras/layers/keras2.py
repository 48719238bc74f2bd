"""The dynamic embedding layers for tf_keras (Keras 2) models: ``Embedding`` (alias
``BasicEmbedding``), ``SquashedEmbedding``, ``FieldWiseEmbedding`` and ``LayerNormalization``,
with the arguments and behaviour of the Keras 3 ones (``embedding_logic.py``).

``de.keras.layers`` gives these classes when ``TF_USE_LEGACY_KERAS`` is set as TensorFlow reads it
(then ``tf.keras`` is tf_keras); otherwise the Keras 3 ones. Code that builds with ``import
tf_keras`` without the variable imports this module: ``from dualemb.tf.keras.layers import
keras2``. A layer of one Keras cannot go into a model of the other (Keras refuses it).

The anchor is a trainable ``(0, dim)`` ``tf.Variable`` made by ``add_weight`` (tf_keras tracks
``tf.Variable`` weights only); train with ``de.DynamicEmbeddingOptimizer`` around a tf_keras
optimizer (``dualemb/tf/optimizers/legacy_wrapper.py``). The table is a checkpoint dependency of
the layer (``model.save_weights`` in the TF format and ``tf.train.Checkpoint`` save it).
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras

from dualemb.tf.keras.layers.embedding_logic import (EmbeddingLogic, FieldWiseLogic,
                                                     HvdAllToAllLogic, SquashedLogic)
from dualemb.tf.keras.layers.layer_normalization import LayerNormalizationLogic
from dualemb.tf.trainable import mark_keras2_anchor

_register = tf_keras.saving.register_keras_serializable(package="dualemb_keras2")


@_register
class Embedding(EmbeddingLogic, tf_keras.layers.Layer):
    __doc__ = EmbeddingLogic.__doc__
    _keras = tf_keras

    def _make_anchor(self):
        anchor = self.add_weight(name=self._shadow_name.replace("/", "_"),
                                 shape=(0, self.embedding_size), dtype=tf.float32,
                                 initializer="zeros", trainable=self.trainable)
        return mark_keras2_anchor(anchor, self.params, self._shadow_name)


BasicEmbedding = Embedding


@_register
class SquashedEmbedding(SquashedLogic, Embedding):
    __doc__ = SquashedLogic.__doc__


@_register
class FieldWiseEmbedding(FieldWiseLogic, Embedding):
    __doc__ = FieldWiseLogic.__doc__


@_register
class HvdAllToAllEmbedding(HvdAllToAllLogic, Embedding):
    __doc__ = HvdAllToAllLogic.__doc__


@_register
class LayerNormalization(LayerNormalizationLogic, tf_keras.layers.LayerNormalization):
    __doc__ = LayerNormalizationLogic.__doc__

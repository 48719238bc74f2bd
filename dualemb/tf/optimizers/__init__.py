"""The optimizers that train dynamic embeddings: each routes a ``TrainableWrapper``'s gradient
(key-indexed rows) to the core's fused optimizer and dense gradients to the optimizer it wraps.

* ``keras_wrapper``: ``DynamicEmbeddingOptimizer`` around a Keras 3 optimizer.
* ``legacy_wrapper``: the same for tf_keras (Keras 2) and ``tf.compat.v1.train`` optimizers.
* ``fused_specs``: a Keras 3 optimizer's hyper-parameters as the core's optimizer spec.
* ``row_update``: the embedding half of a step, shared by both wrappers.
* ``keras_adapter``: every private Keras / tf_keras attribute the wrappers read, in one place.
"""

from dualemb.tf.optimizers.keras_wrapper import (DynamicEmbeddingOptimizer,
                                                 DynamicEmbeddingOptimizerWrapper)

__all__ = ["DynamicEmbeddingOptimizer", "DynamicEmbeddingOptimizerWrapper"]

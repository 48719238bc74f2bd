"""The reference optimizer of the TF parity tests: a Keras optimizer that gets the embedding's
gradient as a dense tensor (duplicates summed) — the gradient dualemb's fused step applies —
instead of applying an IndexedSlices per occurrence."""

import tensorflow as tf


class _DenseGradients:
    """Mixin: IndexedSlices gradients become dense tensors before the wrapped optimizer."""

    def apply(self, grads, trainable_variables=None):
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                 for g in grads]
        return super().apply(grads, trainable_variables)


def dense_reference(optimizer):
    """``optimizer`` (a Keras optimizer of the reference model) with dense gradients."""
    cls = type(optimizer)
    optimizer.__class__ = type("Dense" + cls.__name__, (_DenseGradients, cls), {})
    return optimizer

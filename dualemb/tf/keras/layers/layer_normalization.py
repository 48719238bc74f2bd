"""``de.keras.layers.LayerNormalization``: TFRA's dynamic layer normalization.

TFRA's layer is Keras' ``LayerNormalization`` (same arguments, weights and results:
``(x - mean) / sqrt(variance + epsilon) * gamma + beta`` over ``axis``) whose ``call`` also takes
inputs whose other dimensions are only known at run time (a dynamic embedding's output often
has them) and ``RaggedTensor`` inputs. ``LayerNormalizationLogic.call`` does that for the Keras 3
class here and for the tf_keras one in ``keras2.py``.
"""

from __future__ import annotations

import keras
import tensorflow as tf


class LayerNormalizationLogic:
    """Keras' ``LayerNormalization`` (same arguments: ``axis=-1, epsilon=1e-3, center=True,
    scale=True``, initializers, regularizers and constraints of ``beta`` and ``gamma``) that also
    normalizes inputs of dynamic shape and ``RaggedTensor`` inputs, whose ragged dimensions must
    not be among ``axis`` (a ragged axis has no fixed size to give ``gamma``; TFRA pads it with
    zeros, which changes the mean, so this layer raises ``ValueError`` instead)."""

    def build(self, input_shape):
        dims = tf.TensorShape(input_shape).as_list()
        axes = self.axis if isinstance(self.axis, (list, tuple)) else [self.axis]
        for a in axes:
            if -len(dims) <= a < len(dims) and dims[a] is None:
                raise ValueError(
                    f"LayerNormalization {self.name!r}: axis {a} of the input (shape "
                    f"{tuple(dims)}) has no fixed size (a ragged or dynamic dimension); "
                    "gamma and beta need one: normalize over dimensions of known size")
        super().build(input_shape)

    def call(self, inputs):
        if getattr(self, "rms_scaling", False):  # Keras 3's deprecated option: Keras' own math
            return super().call(inputs)
        lengths = None
        if isinstance(inputs, tf.RaggedTensor):
            rank = inputs.shape.rank
            axes = sorted(a % rank for a in self.axis)
            if axes[0] <= inputs.ragged_rank:
                raise ValueError(
                    f"LayerNormalization {self.name!r}: axis {self.axis} includes a ragged "
                    f"dimension of the input (ragged_rank {inputs.ragged_rank}); normalize over "
                    "uniform (inner) dimensions")
            lengths = inputs.nested_row_lengths()
            inputs = inputs.to_tensor()
        x = tf.convert_to_tensor(inputs)
        rank = x.shape.rank
        axes = sorted(a % rank for a in self.axis)
        if x.dtype in (tf.float16, tf.bfloat16):
            x = tf.cast(x, tf.float32)  # as Keras: statistics in float32 under mixed precision
        else:
            x = tf.cast(x, self.compute_dtype)
        mean, variance = tf.nn.moments(x, axes, keepdims=True)
        out = (x - mean) * tf.math.rsqrt(variance + self.epsilon)
        # gamma / beta have the (static) sizes of the normalized axes; the others broadcast.
        shape = [1] * rank
        for a in axes:
            shape[a] = x.shape[a]
        if self.gamma is not None:
            out = out * tf.reshape(tf.cast(self.gamma, out.dtype), shape)
        if self.beta is not None:
            out = out + tf.reshape(tf.cast(self.beta, out.dtype), shape)
        out = tf.cast(out, self.compute_dtype)
        if lengths is not None:
            out = tf.RaggedTensor.from_tensor(out, lengths=lengths)
        return out


@keras.saving.register_keras_serializable(package="dualemb")
class LayerNormalization(LayerNormalizationLogic, keras.layers.LayerNormalization):
    __doc__ = LayerNormalizationLogic.__doc__

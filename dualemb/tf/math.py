"""``de.math``: TFRA's GPU variants of TF sparse ops. TFRA itself falls back to the TF ops when its
``_math_ops.so`` is not built (the default); these are those TF ops."""

from __future__ import annotations

import tensorflow as tf


def sparse_segment_sum(data, indices, segment_ids, name=None, num_segments=None):
    return tf.sparse.segment_sum(data, indices, segment_ids, num_segments=num_segments, name=name)


def sparse_fill_empty_rows(sp_input, default_value, name=None):
    return tf.sparse.fill_empty_rows(sp_input, default_value, name=name)


def sparse_reshape(sp_input, shape, name=None):
    return tf.sparse.reshape(sp_input, shape, name=name)

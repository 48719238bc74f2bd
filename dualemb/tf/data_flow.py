"""``de.data_flow``: TFRA's GPU variants of ``dynamic_partition`` / ``dynamic_stitch``; TFRA falls
back to the TF ops when its ``_data_flow_ops.so`` is not built (the default), and so does this."""

from __future__ import annotations

import tensorflow as tf


def dynamic_partition(data, partitions, num_partitions, name=None):
    return tf.dynamic_partition(data, partitions, num_partitions, name=name)


def dynamic_stitch(indices, data, use_fast=True, name=None):
    return tf.dynamic_stitch(indices, data, name=name)

"""``de.train``: TFRA's checkpoint helpers.

A ``de.Variable`` is a TF trackable that saves its tables (rows, slots, metadata) itself and
restores them into any shard count, so TensorFlow's own ``tf.train.Checkpoint`` and
``CheckpointManager`` carry it. TFRA's ``DECheckpoint`` is a ``tf.train.Checkpoint`` subclass
that, in TFRA, patches TF's checkpoint internals to redirect its tables' side files and to save
per Horovod rank; here it is a plain subclass (same constructor, ``save`` / ``write`` /
``restore`` / ``read``), so ``isinstance(ckpt, tf.train.Checkpoint)`` holds and nothing is patched.
"""

from __future__ import annotations

import tensorflow as tf

Checkpoint = tf.train.Checkpoint
CheckpointManager = tf.train.CheckpointManager


class DECheckpoint(tf.train.Checkpoint):
    """``tf.train.Checkpoint`` for models holding dynamic embedding Variables (TFRA's name).

    Args:
      root: the root trackable (or a ``WeakRef`` to it), as ``tf.train.Checkpoint``.
      **kwargs: further trackables, saved under these names.
    """

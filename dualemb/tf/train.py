"""``de.train``: TFRA's checkpoint helpers. A ``de.Variable`` is a TF trackable that saves its
tables (rows, slots, metadata) itself, so TensorFlow's own ``tf.train.Checkpoint`` and
``CheckpointManager`` carry it; TFRA's ``DECheckpoint`` (which only redirected its side files)
is therefore the plain class."""

from __future__ import annotations

import tensorflow as tf

Checkpoint = tf.train.Checkpoint
CheckpointManager = tf.train.CheckpointManager

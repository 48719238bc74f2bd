"""``de.keras.models.save_model``: TFRA's Keras saving entry point on Keras 3.

A path ending in ``.keras`` (or ``.h5``) is saved by ``keras.saving.save_model``; any other path is
written as a TF SavedModel by ``tf.saved_model.save`` (Keras 3 no longer writes SavedModels from
``model.save``). Either way the dynamic embedding tables go with the model, with their optimizer
slots (see docs/tf_saving.md). dualemb's ops have no namespace, so TFRA's
``SaveOptions(namespace_whitelist=["TFRA"])`` is accepted but not needed.
"""

from __future__ import annotations

import os

import keras
import tensorflow as tf


def save_model(model, filepath, overwrite=True, include_optimizer=True, save_format=None,
               signatures=None, options=None, save_traces=True):
    path = os.fspath(filepath)
    if save_format in ("keras", "h5") or path.endswith((".keras", ".h5")):
        return keras.saving.save_model(model, path, overwrite=overwrite)
    return tf.saved_model.save(model, path, signatures=signatures, options=options)

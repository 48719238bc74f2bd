"""Model modes (TFRA's ``ModelMode``): TRAIN connects lookups to the optimizer, INFERENCE does not.

The mode is a process-wide setting read when a lookup is built (traced), as in TFRA: switch it
before building or tracing the model you serve or export. In dualemb a lookup never writes to a
table in either mode (only an optimizer step does); in INFERENCE mode a lookup is a plain,
thread-safe read with no gradient route at all, so a model built in that mode is safe to serve and
to export as a SavedModel.
"""

from __future__ import annotations


class ModelMode:
    """``TRAIN = "train"``, ``INFERENCE = "inference"``; ``CURRENT_SETTING`` is the active one."""

    TRAIN = "train"
    INFERENCE = "inference"
    CURRENT_SETTING = TRAIN


def enable_train_mode() -> None:
    ModelMode.CURRENT_SETTING = ModelMode.TRAIN


def enable_inference_mode() -> None:
    ModelMode.CURRENT_SETTING = ModelMode.INFERENCE


def get_model_mode() -> str:
    return ModelMode.CURRENT_SETTING


def is_training() -> bool:
    return ModelMode.CURRENT_SETTING == ModelMode.TRAIN

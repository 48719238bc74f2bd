"""Exceptions of ``dualemb.tf`` that TFRA code may catch under another name."""

import tensorflow as tf


class DtypeMismatchError(TypeError, ValueError):
    """Keys or rows of another dtype than the Variable's. A ``TypeError`` (dualemb's contract, as
    TF's own lookup tables) and a ``ValueError`` (what TFRA raises: TF's
    ``convert_to_tensor(x, dtype=...)`` fails with ValueError), so code catching either works."""


class ShapeMismatchError(ValueError, tf.errors.InvalidArgumentError):
    """Rows of another shape than ``keys.shape + [dim]``. A ``ValueError`` (dualemb's contract,
    and what a shape check before an op raises in TF) and the ``InvalidArgumentError`` that TFRA's
    kernels raise for it ("Expected shape ..."), so code catching either works."""

    def __init__(self, message: str):
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)

    def __str__(self) -> str:
        return self.message

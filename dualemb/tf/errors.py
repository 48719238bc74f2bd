"""Exceptions of ``dualemb.tf`` that TFRA code may catch under another name."""


class DtypeMismatchError(TypeError, ValueError):
    """Keys or rows of another dtype than the Variable's. A ``TypeError`` (dualemb's contract, as
    TF's own lookup tables) and a ``ValueError`` (what TFRA raises: TF's
    ``convert_to_tensor(x, dtype=...)`` fails with ValueError), so code catching either works."""

"""``de.shadow_ops``: TFRA's eager-mode trainable ("ShadowVariable") API.

``ShadowVariable(params, name)`` (``shadow_variable.py``) is the Variable's gradient anchor
registered under ``name`` with TFRA's ShadowVariable API; ``embedding_lookup(shadow, ids)`` /
``embedding_lookup_unique(shadow, ids, ...)`` look ids up in ``shadow.params`` through it, eagerly
or inside ``tf.function``.
"""

from __future__ import annotations

import tensorflow as tf

from dualemb.tf import lookup as _lookup
from dualemb.tf.shadow_variable import ShadowVariable

__all__ = ["ShadowVariable", "embedding_lookup", "embedding_lookup_unique"]


def _check(shadow, ids):
    if not isinstance(shadow, ShadowVariable):
        raise TypeError(f"expected a de.shadow_ops.ShadowVariable, got {type(shadow).__name__}")
    if isinstance(ids, tf.RaggedTensor):
        dtype = ids.dtype
    else:
        ids = tf.convert_to_tensor(ids)
        dtype = ids.dtype
    if dtype != shadow.params.key_dtype:  # TFRA raises ValueError here
        raise ValueError(f"{dtype.name} ids is not matched with ShadowVariable with ids "
                         f"{shadow.params.key_dtype.name}")
    return ids


def embedding_lookup(shadow, ids, partition_strategy=None, name=None, validate_indices=None):
    """Rows of ``ids`` (any shape) -> ``ids.shape + [dim]``, training through ``shadow``."""
    return _lookup.embedding_lookup(shadow, _check(shadow, ids))


def embedding_lookup_unique(shadow, ids, embedding_size=None, with_unique=True, name=None):
    """Like ``embedding_lookup`` (dense or ragged ids), each distinct id read once when
    ``with_unique``. ``embedding_size`` is accepted and must be ``dim`` if given."""
    if embedding_size is not None and int(embedding_size) != shadow.params.dim:
        raise ValueError(f"embedding_size {embedding_size} != the Variable's dim "
                         f"{shadow.params.dim}")
    fn = _lookup.embedding_lookup_unique if with_unique else _lookup.embedding_lookup
    return fn(shadow, _check(shadow, ids))

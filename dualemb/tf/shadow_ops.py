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

__all__ = ["ShadowVariable", "embedding_lookup", "embedding_lookup_unique",
           "embedding_lookup_unique_base", "HvdVariable"]


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


def embedding_lookup_unique_base(ids, embedding_size, lookup_function, with_unique=True,
                                 name=None):
    """TFRA's helper: ``lookup_function(flat ids) -> [n, embedding_size]`` applied to the
    (distinct, when ``with_unique``) ids of dense or ragged ``ids``, shaped back to
    ``ids.shape + [embedding_size]`` (a RaggedTensor for ragged ids)."""
    ragged = isinstance(ids, tf.RaggedTensor)
    values = ids.flat_values if ragged else tf.convert_to_tensor(ids)
    flat = tf.reshape(values, [-1])
    if with_unique:
        unique, index = tf.unique(flat)
        rows = tf.gather(lookup_function(unique), index)
    else:
        rows = lookup_function(flat)
    rows = tf.reshape(rows, tf.concat([tf.shape(values), [embedding_size]], 0))
    return ids.with_flat_values(rows) if ragged else rows


class HvdVariable:
    """TFRA's Horovod embedding weights: Horovod is not supported (see docs/tf.md)."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError("HvdVariable needs Horovod, which dualemb does not support; "
                                  "see docs/tf.md, \"TFRA features not offered\"")

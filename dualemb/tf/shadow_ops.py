"""``de.shadow_ops``: TFRA's eager-mode trainable ("ShadowVariable") API, over dualemb's
``TrainableWrapper`` (which works eagerly and inside ``tf.function``; see ``trainable.py``).

``ShadowVariable(params, name)`` returns the Variable's wrapper registered under ``name``
(creating it); ``embedding_lookup(shadow, ids)`` / ``embedding_lookup_unique(shadow, ids, ...)``
look ids up in ``shadow.params`` through that wrapper.
"""

from __future__ import annotations

from dualemb.tf import lookup as _lookup
from dualemb.tf.trainable import TrainableWrapper


def ShadowVariable(params, name="ShadowVariable", max_norm=None, trainable=True,
                   distribute_strategy=None, **kwargs):
    """The ``TrainableWrapper`` of ``params`` named ``name`` (TFRA's ShadowVariable)."""
    return params.trainable_wrapper(name)


def _check(shadow):
    if not isinstance(shadow, TrainableWrapper):
        raise TypeError(f"expected a ShadowVariable (dualemb TrainableWrapper), got "
                        f"{type(shadow).__name__}")
    return shadow


def embedding_lookup(shadow, ids, partition_strategy=None, name=None, validate_indices=None):
    shadow = _check(shadow)
    return _lookup.embedding_lookup(shadow.params, ids, name=shadow.de_name)


def embedding_lookup_unique(shadow, ids, embedding_size=None, with_unique=True, name=None):
    shadow = _check(shadow)
    fn = _lookup.embedding_lookup_unique if with_unique else _lookup.embedding_lookup
    return fn(shadow.params, ids, name=shadow.de_name)

"""Reading a Variable's rows for ids, with the gradient route to its fused optimizer: the part of
the lookup family that needs no check of its ``params``. ``Variable.embedding_lookup`` and the
Keras layers call it on their own Variable; ``dualemb.tf.lookup`` checks its arguments (a
Variable or a ``ShadowVariable``), then calls it.

In training mode (``de.enable_train_mode()``, the default) and for a trainable Variable, the rows
carry a gradient route to the Variable's ``TrainableWrapper`` registered under ``name`` (see
``dualemb/tf/trainable.py``); in inference mode they are plain reads. ``max_norm`` clips each
looked-up vector to that L2 norm. Rows are read in the Variable's ``value_dtype``; combining math
runs in :func:`compute_dtype` (float32 for float16/bfloat16, as Keras computes under mixed
precision) and the result is cast back to ``value_dtype`` at the end. Integer rows never go
through a float (an int64 row above 2**24 would not survive float32).

It uses only the Variable's ``router`` (``shard_router.py``) and ``trainable_wrapper``, so
``dualemb.tf.variable`` imports it without an import cycle.
"""

from __future__ import annotations

import tensorflow as tf

from dualemb.tf import modes
from dualemb.tf.trainable import attach_gradient

DEFAULT_NAME = "embedding_lookup"

# Inside a tf.function, autograph would convert the lookups and everything they call (seconds per
# trace). Their Python control flow is over Python objects and static shapes, never over tensors,
# so they run as plain Python while the function is traced.
_not_converted = tf.autograph.experimental.do_not_convert


def compute_dtype(value_dtype) -> tf.DType:
    """The dtype lookups combine rows in: float32 for float16/bfloat16 rows, else the value
    dtype itself."""
    value_dtype = tf.as_dtype(value_dtype)
    return tf.float32 if value_dtype in (tf.float16, tf.bfloat16) else value_dtype


def lookup_rows(params, flat_keys, name, max_norm=None, rows=None):
    """(rows [n, dim] of flat keys in ``compute_dtype(params.value_dtype)``, the
    TrainableWrapper they train or None). Integer rows carry no gradient route (nothing can
    differentiate them). ``rows``: the rows already read (``lookup_many.py`` reads several
    Variables' in one op); None reads them."""
    if rows is None:
        rows, _ = params.router.find(flat_keys)
    wrapper = None
    if params.trainable and modes.is_training() and params.value_dtype.is_floating:
        wrapper = params.trainable_wrapper(name or DEFAULT_NAME)
        if getattr(wrapper, "keeps_lookups", False):  # a ShadowVariable
            wrapper.record_lookup(flat_keys, rows)
        rows = attach_gradient(wrapper, rows, flat_keys)
    if rows.dtype != compute_dtype(params.value_dtype):
        rows = tf.cast(rows, compute_dtype(params.value_dtype))  # exact: float16/bfloat16 widen
    if max_norm is not None:
        rows = tf.clip_by_norm(rows, max_norm, axes=[1])
    return rows, wrapper


def finish(params, out, wrapper, name, return_trainable):
    """``out`` cast to the Variable's value dtype, with the wrapper when ``return_trainable``."""
    if out.dtype != params.value_dtype:
        out = tf.cast(out, params.value_dtype)
    if return_trainable:
        if wrapper is None:
            wrapper = params.trainable_wrapper(name or DEFAULT_NAME)
        return out, wrapper
    return out


def dense_ids(params, ids, fn):
    if isinstance(ids, tf.SparseTensor):
        raise TypeError(f"{fn} takes dense ids; use embedding_lookup_sparse for a SparseTensor")
    return params.router.check_keys(ids, "ids")


def reshape_rows(rows, ids, dim):
    """rows [n, dim] -> ids.shape + [dim]."""
    inner = ids.shape[1:]
    if ids.shape.rank is not None and inner.is_fully_defined() and all(s > 0 for s in inner):
        # Only the batch size unknown (Keras inputs): a constant target shape, without the
        # Shape and ConcatV2 ops of the general case in every step's graph. (-1 cannot stand
        # for a dimension beside a 0.)
        target = [-1] + inner.as_list() + [dim] if ids.shape.rank > 0 else [dim]
        out = tf.reshape(rows, target)
        out.set_shape(ids.shape.concatenate([dim]))
        return out
    out = tf.reshape(rows, tf.concat([tf.shape(ids), [dim]], 0))
    out.set_shape(ids.shape.concatenate([dim]))
    return out


@_not_converted
def lookup_ids(params, ids, name=None, max_norm=None, return_trainable=False):
    """``embedding_lookup`` on a Variable already checked: rows of ``ids`` (any shape; a
    RaggedTensor gives a RaggedTensor) -> ``ids.shape + [dim]``."""
    if isinstance(ids, tf.RaggedTensor):
        flat = params.router.check_keys(ids.flat_values, "ids")
        rows, wrapper = lookup_rows(params, tf.reshape(flat, [-1]), name, max_norm)
        out = ids.with_flat_values(reshape_rows(rows, flat, params.dim))
        return finish(params, out, wrapper, name, return_trainable)
    ids = dense_ids(params, ids, "embedding_lookup")
    rows, wrapper = lookup_rows(params, tf.reshape(ids, [-1]), name, max_norm)
    return finish(params, reshape_rows(rows, ids, params.dim), wrapper, name, return_trainable)


@_not_converted
def lookup_unique_ids(params, ids, name=None, max_norm=None, return_trainable=False):
    """Like :func:`lookup_ids`, but each distinct id is read once (``tf.unique``), then gathered
    back."""
    ragged = isinstance(ids, tf.RaggedTensor)
    dense = params.router.check_keys(ids.flat_values, "ids") if ragged else dense_ids(
        params, ids, "embedding_lookup_unique")
    unique, index = tf.unique(tf.reshape(dense, [-1]))
    rows, wrapper = lookup_rows(params, unique, name, max_norm)
    out = reshape_rows(tf.gather(rows, index), dense, params.dim)
    if ragged:
        out = ids.with_flat_values(out)
    return finish(params, out, wrapper, name, return_trainable)

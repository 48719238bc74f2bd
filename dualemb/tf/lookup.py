"""The lookup family: ``embedding_lookup``, ``embedding_lookup_unique``,
``embedding_lookup_sparse`` and ``safe_embedding_lookup_sparse`` (TFRA's names and arguments).

All of them read rows without inserting keys. In training mode (``de.enable_train_mode()``, the
default) and for a trainable Variable, the rows carry a gradient route to the Variable's
``TrainableWrapper`` registered under ``name`` (see ``dualemb/tf/trainable.py``); in inference
mode they are plain reads. ``max_norm`` clips each looked-up vector to that L2 norm on every path
(TFRA's ``embedding_lookup_unique`` silently ignores it). Rows are combined in float32 for
float16/bfloat16 Variables (``row_lookup.compute_dtype``) and cast to the Variable's
``value_dtype`` at the end.
"""

from __future__ import annotations

import tensorflow as tf

from dualemb.tf.row_lookup import finish, lookup_ids, lookup_rows, lookup_unique_ids
from dualemb.tf.shadow_variable import ShadowVariable
from dualemb.tf.variable import Variable

# Inside a tf.function, autograph would convert these functions and everything they call (seconds
# per trace). Their Python control flow is over Python objects and static shapes, never over
# tensors, so they run as plain Python while the function is traced.
_not_converted = tf.autograph.experimental.do_not_convert

COMBINERS = ("sum", "mean", "sqrtn")


def resolve_params(params, fn: str, name, max_norm):
    """(Variable, wrapper name, max_norm) for ``params``, a Variable or a ``ShadowVariable``
    (whose lookups train through it, clipped by its ``max_norm`` unless one is given). A list
    or tuple of one of them is that one, as in TFRA (``tf.nn.embedding_lookup``'s form)."""
    if isinstance(params, (list, tuple)) and len(params) == 1:
        params = params[0]
    if isinstance(params, ShadowVariable):
        params.claim_lookups()  # the shadow looked up through is the one that records and trains
        return params.params, params.de_name, params.max_norm if max_norm is None else max_norm
    if not isinstance(params, Variable):
        raise TypeError(f"{fn} expects a dualemb.tf.Variable or a ShadowVariable as params (one "
                        f"Variable: shard it with devices=[...]), got {type(params).__name__}")
    return params, name, max_norm


def _check_combiner(combiner):
    if combiner not in COMBINERS:
        raise ValueError(f"combiner must be one of {COMBINERS}, got {combiner!r}")


@_not_converted
def embedding_lookup(params, ids, partition_strategy=None, name=None, validate_indices=None,
                     max_norm=None, return_trainable=False):
    """Rows of ``ids`` (any shape, dtype ``params.key_dtype``; a RaggedTensor gives a
    RaggedTensor) -> ``ids.shape + [dim]``. With ``return_trainable``, also the
    ``TrainableWrapper`` to hand to the optimizer. Works eagerly and inside ``tf.function``;
    ``name`` (default "embedding_lookup") selects the wrapper."""
    params, name, max_norm = resolve_params(params, "embedding_lookup", name, max_norm)
    return lookup_ids(params, ids, name=name, max_norm=max_norm,
                      return_trainable=return_trainable)


@_not_converted
def embedding_lookup_unique(params, ids, partition_strategy=None, name=None,
                            validate_indices=None, max_norm=None, return_trainable=False):
    """Like ``embedding_lookup``, but each distinct id is read once (``tf.unique``), then
    gathered back. ``max_norm`` is honored."""
    params, name, max_norm = resolve_params(params, "embedding_lookup_unique", name, max_norm)
    return lookup_unique_ids(params, ids, name=name, max_norm=max_norm,
                             return_trainable=return_trainable)


def _as_sparse(ids, what):
    if isinstance(ids, tf.RaggedTensor):
        if ids.ragged_rank != 1 or ids.shape.rank != 2:
            raise ValueError(f"{what} as a RaggedTensor must be 2-D with ragged_rank 1")
        return ids.to_sparse()
    if isinstance(ids, tf.SparseTensor):
        return ids
    raise TypeError(f"{what} must be a SparseTensor or a RaggedTensor, got {type(ids).__name__}")


def _combine(params, sp_ids, sp_weights, combiner, name, max_norm):
    """[d0, dim] in ``compute_dtype(value_dtype)``: row i combines the rows of the ids in row i of the 2-D ``sp_ids``
    (zeros for a row without ids), and the wrapper."""
    if params.value_dtype == tf.string:
        raise TypeError(f"Variable {params.name!r} has value_dtype string: sparse lookups combine "
                        "rows numerically; look string rows up with embedding_lookup or lookup")
    if not params.value_dtype.is_floating and (combiner != "sum" or sp_weights is not None):
        raise TypeError(f"Variable {params.name!r} has value_dtype {params.value_dtype.name}: "
                        "integer rows combine only with combiner='sum' and no weights (a mean "
                        "or a weight would need a float)")
    segment_ids = sp_ids.indices[:, 0]
    num_segments = sp_ids.dense_shape[0]
    keys = params.router.check_keys(sp_ids.values, "sp_ids.values")
    unique, index = tf.unique(keys)
    rows, wrapper = lookup_rows(params, unique, name, max_norm)
    embeddings = tf.gather(rows, index)
    if sp_weights is None:
        weights = tf.ones_like(embeddings[:, 0])
    else:
        weights = tf.cast(sp_weights.values, embeddings.dtype)
    embeddings = embeddings * weights[:, None]
    out = tf.math.unsorted_segment_sum(embeddings, segment_ids, num_segments)
    if combiner == "mean":
        total = tf.math.unsorted_segment_sum(weights, segment_ids, num_segments)
        out = tf.math.divide_no_nan(out, total[:, None])
    elif combiner == "sqrtn":
        total = tf.math.unsorted_segment_sum(weights * weights, segment_ids, num_segments)
        out = tf.math.divide_no_nan(out, tf.sqrt(total)[:, None])
    out.set_shape([None, params.dim])
    return out, wrapper


def _check_weights(sp_ids, sp_weights, what):
    if sp_weights is None:
        return None
    sp_weights = _as_sparse(sp_weights, what)
    if not sp_weights.dtype.is_floating:
        raise TypeError(f"{what} must be floating point, got {sp_weights.dtype.name}")
    sp_ids.values.shape.assert_is_compatible_with(sp_weights.values.shape)
    return sp_weights


@_not_converted
def embedding_lookup_sparse(params, sp_ids, sp_weights, partition_strategy=None,
                            name="embedding_lookup_sparse", combiner="mean", max_norm=None,
                            return_trainable=False):
    """Combines the rows of each row of ``sp_ids`` (a 2-D SparseTensor ``[d0, d1]``, or a 2-D
    RaggedTensor), weighted by ``sp_weights`` (same structure, or None for weight 1), with
    ``combiner`` "sum", "mean" (weighted mean) or "sqrtn" (sum / sqrt(sum of squared weights)).
    Returns ``[d0, dim]``; rows without ids are zeros."""
    params, name, max_norm = resolve_params(params, "embedding_lookup_sparse", name, max_norm)
    _check_combiner(combiner)
    sp_ids = _as_sparse(sp_ids, "sp_ids")
    sp_weights = _check_weights(sp_ids, sp_weights, "sp_weights")
    out, wrapper = _combine(params, sp_ids, sp_weights, combiner, name, max_norm)
    return finish(params, out, wrapper, name, return_trainable)


@_not_converted
def safe_embedding_lookup_sparse(embedding_weights, sparse_ids, sparse_weights=None,
                                 combiner="mean", default_id=None,
                                 name="safe_embedding_lookup_sparse", partition_strategy=None,
                                 max_norm=None, return_trainable=False):
    """Like ``tf.nn.safe_embedding_lookup_sparse``, except that every id is valid (negative ones
    too). Ids with weight <= 0 are dropped unless ``combiner == "sum"``; a row left without ids
    gets the row of ``default_id``, or zeros when ``default_id`` is None. ``sparse_ids`` of rank
    > 2 ``[d0, ..., dn-1, dn]`` give ``[d0, ..., dn-1, dim]``."""
    params, name, max_norm = resolve_params(embedding_weights, "safe_embedding_lookup_sparse",
                                            name, max_norm)
    _check_combiner(combiner)
    sparse_ids = _as_sparse(sparse_ids, "sparse_ids")
    sparse_weights = _check_weights(sparse_ids, sparse_weights, "sparse_weights")
    params.router.check_keys(sparse_ids.values, "sparse_ids.values")
    if sparse_weights is not None and sparse_weights.dtype != params.value_dtype:
        # TFRA's (and tf.nn's) safe lookup refuses this rather than casting the weights.
        raise TypeError(f"sparse_weights have dtype {sparse_weights.dtype.name}, but "
                        f"Variable {params.name!r} has value_dtype {params.value_dtype.name}")

    original_shape = sparse_ids.dense_shape
    reshaped = (sparse_ids.shape.rank or 2) > 2
    if reshaped:
        leading = tf.reduce_prod(original_shape[:-1])
        new_shape = tf.stack([leading, original_shape[-1]])
        sparse_ids = tf.sparse.reshape(sparse_ids, new_shape)
        if sparse_weights is not None:
            sparse_weights = tf.sparse.reshape(sparse_weights, new_shape)

    if combiner != "sum" and sparse_weights is not None:
        keep = sparse_weights.values > 0
        sparse_ids = tf.sparse.retain(sparse_ids, keep)
        sparse_weights = tf.sparse.retain(sparse_weights, keep)

    fill_id = 0 if default_id is None else default_id
    sparse_ids, is_empty = tf.sparse.fill_empty_rows(
        sparse_ids, tf.cast(fill_id, sparse_ids.dtype))
    if sparse_weights is not None:
        sparse_weights, _ = tf.sparse.fill_empty_rows(
            sparse_weights, tf.constant(1.0, sparse_weights.dtype))

    out, wrapper = _combine(params, sparse_ids, sparse_weights, combiner, name, max_norm)
    if default_id is None:
        out = tf.where(is_empty[:, None], tf.zeros_like(out), out)
    if reshaped:
        out = tf.reshape(out, tf.concat([original_shape[:-1], [params.dim]], 0))
    return finish(params, out, wrapper, name, return_trainable)

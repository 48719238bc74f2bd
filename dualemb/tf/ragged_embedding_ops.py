"""``de.ragged_embedding_ops``: TFRA's RaggedTensor versions of the sparse lookups. The main
functions accept RaggedTensor ids already; these keep TFRA's signatures."""

from __future__ import annotations

import tensorflow as tf

from dualemb.tf import lookup as _lookup


def embedding_lookup_sparse(params, sp_ids, sp_weights, name="embedding_lookup_sparse",
                            combiner="mean"):
    return _lookup.embedding_lookup_sparse(params, sp_ids, sp_weights, name=name,
                                           combiner=combiner)


def safe_embedding_lookup_sparse(embedding_weights, sparse_ids, sparse_weights=None,
                                 combiner="mean", default_id=None, name=None):
    return _lookup.safe_embedding_lookup_sparse(
        embedding_weights, sparse_ids, sparse_weights, combiner=combiner, default_id=default_id,
        name=name or "safe_embedding_lookup_sparse")


def _fill_empty_rows(ragged_ids, default_id):
    """TFRA's ragged helper, kept for code that imports it: ``(filled, is_row_empty)`` where
    ``filled`` is the 2-D RaggedTensor ``ragged_ids`` with every empty row replaced by
    ``[default_id]`` and ``is_row_empty`` a bool ``[nrows]`` marking the rows that were empty."""
    if not isinstance(ragged_ids, tf.RaggedTensor) or ragged_ids.ragged_rank != 1:
        raise TypeError("_fill_empty_rows takes a RaggedTensor with ragged_rank 1, got "
                        f"{type(ragged_ids).__name__}")
    is_row_empty = tf.equal(ragged_ids.row_lengths(), 0)
    filler = tf.fill([ragged_ids.nrows(), 1], tf.cast(default_id, ragged_ids.dtype))
    # [default_id] for an empty row, [] for the others: appended, it fills exactly the empty rows.
    extra = tf.ragged.boolean_mask(filler, is_row_empty[:, None])
    return tf.concat([ragged_ids, extra], axis=1), is_row_empty

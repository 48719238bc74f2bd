"""``de.ragged_embedding_ops``: TFRA's RaggedTensor versions of the sparse lookups. The main
functions accept RaggedTensor ids already; these keep TFRA's signatures."""

from __future__ import annotations

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

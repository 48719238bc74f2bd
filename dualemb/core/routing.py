"""Key -> shard routing: the one function every part of dualemb uses to decide which shard owns a
key (the common checkpoint's resharding, ``dualemb.tf`` Variables with several ``devices``, the TFRA
importers, and the multi-process front ends).

The rule is TFRA's CPU default, floored ``key mod num_shards``, so a TFRA user's shards keep their
keys. It is written once, with the ``%`` operator, because numpy arrays, TensorFlow tensors and
jax arrays all define ``%`` on integers as the *floored* remainder (the result has the sign of the
divisor, so negative keys land in ``[0, num_shards)`` too); a caller passes its own framework's
array and gets that framework's array back, in the keys' dtype.
"""

from __future__ import annotations


def shard_of(keys, num_shards: int):
    """Index of the shard that owns each key: floored ``keys mod num_shards``, in ``[0,
    num_shards)``, same type and dtype as ``keys`` (numpy, TensorFlow or jax integers).

    ``num_shards`` must be a positive int; with one shard every key routes to 0.
    """
    if isinstance(num_shards, bool) or int(num_shards) != num_shards or num_shards < 1:
        raise ValueError(f"num_shards must be a positive integer, got {num_shards!r}")
    return keys % int(num_shards)

"""``embedding_lookup_many``: the lookups of several Variables in one op (issue 22).

A step that reads F Variables would run F ``DualembFind`` ops, each with TF's per-op cost and
each alone on its thread. This reads the Variables that can share one ``DualembFindMany`` with
it (the core reads the tables in parallel, each with its per-table code, so the rows are those
of the per-Variable lookups bit for bit), and the others with their own lookup. Every result
then takes exactly the path of ``embedding_lookup``'s (the gradient route to the Variable's
``TrainableWrapper``, ``max_norm``, dtypes, shape), so training through it equals training
through ``embedding_lookup``.

Which Variables share the op: those with one table (a sharded Variable routes keys to its shards
first), routed by key (no placement), in-memory, not string-valued, whose ids are a dense
tensor, grouped by device and key dtype. A Keras layer looks its own ids up in its ``call``, so
layers do not group their lookups: this is for custom code that holds the Variables.
"""

from __future__ import annotations

import tensorflow as tf

from dualemb.tf import ops
from dualemb.tf.lookup import resolve_params
from dualemb.tf.row_lookup import dense_ids, finish, lookup_ids, lookup_rows, reshape_rows
from dualemb.tf.shard import in_memory


def _groupable(params, ids) -> bool:
    router = params.router
    return (not isinstance(ids, (tf.RaggedTensor, tf.SparseTensor)) and router.placement is None
            and len(router.shards) == 1 and in_memory(router.shards[0])
            and params.value_dtype != tf.string)


# Python control flow over Python objects: autograph converting it (and all it calls) inside a
# tf.function cost seconds per trace and changes nothing.
@tf.autograph.experimental.do_not_convert
def embedding_lookup_many(params, ids, name=None, max_norm=None, return_trainable=False):
    """``[embedding_lookup(params[i], ids[i], name, max_norm, return_trainable)]``, with the
    Variables that allow it read by one multi-table op (see the module docstring); the results
    are those of the per-Variable lookups bit for bit.

    Args:
      params: a list of Variables (or ShadowVariables).
      ids: one id tensor per Variable (any shape; a RaggedTensor gives a RaggedTensor).
      name: the ``TrainableWrapper`` name (default "embedding_lookup"), one for all or a list.
      max_norm: clips each looked-up vector to this L2 norm (one for all or a list).
      return_trainable: also return each Variable's ``TrainableWrapper``: a list of
        ``(rows, wrapper)``.
    """
    params, ids = list(params), list(ids)
    if len(params) != len(ids):
        raise ValueError(f"embedding_lookup_many: {len(params)} Variables but {len(ids)} id "
                         "tensors")
    names = list(name) if isinstance(name, (list, tuple)) else [name] * len(params)
    norms = list(max_norm) if isinstance(max_norm, (list, tuple)) else [max_norm] * len(params)
    if len(names) != len(params) or len(norms) != len(params):
        raise ValueError("embedding_lookup_many: give one name and one max_norm per Variable "
                         "(or one for all)")
    resolved = [resolve_params(p, "embedding_lookup_many", n, m)
                for p, n, m in zip(params, names, norms)]
    out = [None] * len(params)
    buckets = {}  # (device, key dtype) -> [(index, dense ids)]
    for i, ((p, n, m), x) in enumerate(zip(resolved, ids)):
        if _groupable(p, x):
            device = p.router.shards[0].device
            buckets.setdefault((device, p.key_dtype), []).append(
                (i, dense_ids(p, x, "embedding_lookup_many")))
        else:
            out[i] = lookup_ids(p, x, name=n, max_norm=m, return_trainable=return_trainable)
    for (device, _), members in buckets.items():
        if len(members) == 1:
            i, x = members[0]
            p, n, m = resolved[i]
            out[i] = lookup_ids(p, x, name=n, max_norm=m, return_trainable=return_trainable)
            continue
        tables = [resolved[i][0] for i, _ in members]
        flat = [tf.reshape(x, [-1]) for _, x in members]
        with tf.device(device or None):
            found = ops.find_many([p.router.shards[0].resource for p in tables], flat,
                                  [p.dim for p in tables], [p.value_dtype for p in tables])
        for (i, x), keys, (rows, _) in zip(members, flat, found):
            p, n, m = resolved[i]
            rows, wrapper = lookup_rows(p, keys, n, m, rows=rows)
            out[i] = finish(p, reshape_rows(rows, x, p.dim), wrapper, n, return_trainable)
    return out

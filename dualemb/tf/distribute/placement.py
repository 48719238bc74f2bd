"""Where a Variable's table shards live under ``tf.distribute.experimental.ParameterServerStrategy``.

A shard is a resource placed on the host CPU of its ``devices`` entry, and every op that takes
its handle runs there, so placing the shards on PS tasks is all it takes for workers' lookups and
fused updates to run on the PS that owns the keys (slots live beside their rows in the table).

Under this strategy ``strategy.cluster_resolver`` is None and ``extended.parameter_devices`` names
the chief's CPU (TF 2.21), so the number of PS tasks is read from the cluster resolver the user
gave the strategy's constructor.
"""

from __future__ import annotations

import tensorflow as tf

from dualemb.tf import keras_adapter


def num_ps_tasks(strategy_or_resolver) -> int:
    """The number of ``ps`` tasks of a ``ParameterServerStrategy`` or a cluster resolver."""
    resolver = strategy_or_resolver
    if keras_adapter.is_parameter_server_strategy(strategy_or_resolver):
        # The resolver given to the constructor (the public ``cluster_resolver`` is None).
        resolver = keras_adapter.strategy_cluster_resolver(strategy_or_resolver)
    if not hasattr(resolver, "cluster_spec"):
        raise TypeError("expected a ParameterServerStrategy or a cluster resolver, got "
                        f"{strategy_or_resolver!r}")
    return len(resolver.cluster_spec().as_dict().get("ps", ()))


def ps_devices(strategy_or_resolver, shards_per_ps: int = 1) -> list[str]:
    """``devices=`` for a Variable with ``shards_per_ps`` shards on each PS task, in the order
    ``ps:0, ps:1, ..., ps:0, ps:1, ...`` (so shard i lives on ``ps:(i mod num_ps)``)."""
    if isinstance(shards_per_ps, bool) or int(shards_per_ps) != shards_per_ps or shards_per_ps < 1:
        raise ValueError(f"shards_per_ps must be a positive integer, got {shards_per_ps!r}")
    n = num_ps_tasks(strategy_or_resolver)
    if n == 0:
        raise ValueError("the cluster has no 'ps' job")
    return [f"/job:ps/replica:0/task:{i % n}/device:CPU:0" for i in range(n * int(shards_per_ps))]


def default_devices() -> list[str] | None:
    """The shards' devices for a Variable created without ``devices=``: one shard per PS task when
    created under a ``ParameterServerStrategy``'s scope, else None (the single-process default)."""
    if not tf.distribute.has_strategy():
        return None
    strategy = tf.distribute.get_strategy()
    if keras_adapter.is_parameter_server_strategy(strategy):
        return ps_devices(strategy)
    return None

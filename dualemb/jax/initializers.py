"""Initializers for new rows (the core's: a pure function of (seed, key), so a key gets the
same initial row in JAX, in TF, on any shard or thread count). Re-exported from
``dualemb.core.initializers``: ``zeros``, ``constant``, ``vector``, ``normal``,
``truncated_normal``, ``uniform``."""

from dualemb.core.initializers import (constant, normal, truncated_normal, uniform, vector,
                                       zeros)

__all__ = ["zeros", "constant", "vector", "normal", "truncated_normal", "uniform"]

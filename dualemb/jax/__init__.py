"""dualemb.jax: dynamic embedding tables for JAX — a functional API over XLA FFI custom calls.

A table is a small pytree (:class:`Table`: static dim, key dtype and optimizer; float32 leaves
for its id, a version token and a step count). The id is a runtime operand, so one compiled step
serves every table of the same kind (docs/jax.md). Reads return values; writes return the next
table, and passing that table on is what orders the side-effecting calls::

    import dualemb.jax as dej
    table = dej.create(dim=16, initializer=dej.initializers.normal(0.0, 0.01, seed=0),
                       optimizer=dej.optimizers.adam(1e-3))

    @jax.jit
    def step(table, params, ids, y):
        rows = dej.lookup(table, ids)                        # ids.shape + (16,)
        loss, (g_params, g_rows) = jax.value_and_grad(loss_fn, argnums=(0, 1))(params, rows, y)
        table = dej.apply_gradients(table, ids, g_rows)      # fused Adam in the core
        return table, params - 0.1 * g_params, loss

Works under ``jit``, ``grad``, ``vmap``, ``lax.scan``/``fori_loop`` and with several tables in
one step; :func:`lookup_many` / :func:`apply_gradients_many` (:mod:`dualemb.jax.many`) serve a
pytree of tables in one call. int64 ids in JAX's default 32-bit mode: see :mod:`dualemb.jax.ids`. Optimizers:
:mod:`dualemb.jax.optimizers` (fused, Optax-named) or any Optax transformation
(:mod:`dualemb.jax.generic`); Keras' Adam for dense parameters: :mod:`dualemb.jax.keras_optax`.
Checkpoints: :func:`save` / :func:`load` / :func:`load_tables` (common format),
:mod:`dualemb.jax.orbax` (CheckpointManager). Flax: :mod:`dualemb.jax.nnx` (NNX) and
:mod:`dualemb.jax.linen` (linen).
Importing this module registers the FFI targets for the CPU platform; other platforms (GPU, TPU)
run the same calls as host callbacks (:func:`uses_host_callback`, docs/jax.md).
"""

from dualemb.jax import _ffi  # noqa: F401  (registers the FFI targets)
from dualemb.jax._ffi import uses_host_callback
from dualemb.jax import initializers, optimizers
from dualemb.jax.ids import Ids, ids, string_ids
from dualemb.jax.many import apply_gradients_many, find_many, find_or_insert_many, lookup_many
from dualemb.jax.ops import (accum, after, erase, export, find, find_or_insert, insert, lookup,
                             size)
from dualemb.jax.table import (Table, attach, block, capture_evicted, create, destroy,
                               evicted_total, take_evicted)
from dualemb.jax.train import apply_gradients

__all__ = [
    "Table", "create", "attach", "destroy", "block", "evicted_total", "capture_evicted",
    "take_evicted",
    "Ids", "ids", "string_ids",
    "lookup", "find", "size", "export",
    "find_or_insert", "insert", "accum", "erase", "after",
    "apply_gradients", "uses_host_callback",
    "lookup_many", "find_many", "find_or_insert_many", "apply_gradients_many",
    "initializers", "optimizers",
    "save", "load", "load_tables", "Publisher", "follow",
]


def __getattr__(name):
    # Loaded on first use: checkpoints, and the Flax / Orbax glue (which import flax, orbax).
    import importlib
    if name in ("save", "load", "load_tables", "Publisher", "follow"):
        return getattr(importlib.import_module("dualemb.jax.checkpoint"), name)
    if name in ("checkpoint", "nnx", "linen", "orbax", "generic", "keras_optax", "sharded"):
        return importlib.import_module(f"dualemb.jax.{name}")
    raise AttributeError(f"module 'dualemb.jax' has no attribute {name!r}")

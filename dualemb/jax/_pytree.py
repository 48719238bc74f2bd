"""The pytree registration of :class:`dualemb.jax.Table`, with keys that checkpointers refuse.

A table's pytree leaves are its handle (the table's identity, a runtime operand), version token
and step (and the generic path's scalar state and state-table handles): its rows live in the
core. A pytree checkpointer (``orbax.checkpoint.StandardCheckpointer`` on
``nnx.state(model)`` or on any pytree holding a table) would therefore save and restore those
scalars only and silently lose every row. The keyed flattening (``tree_flatten_with_path``, what
Orbax uses to name leaves) names a table's leaves with :class:`TableRowsNotInPytree` keys: JAX
accepts any key object (``keystr`` prints ``.version``), Orbax refuses key types it does not
know with ``ValueError: Unsupported KeyEntry``, and the key's formatted text tells what to use
instead. Plain flattening (``jit``, ``grad``, ``tree_map``) is unchanged.
"""

from __future__ import annotations

import dataclasses

import jax

ADVICE = ("a dualemb.jax.Table is in this pytree, but its rows live in the table core, not in "
          "the pytree: a pytree checkpoint would save no rows. Checkpoint tables with "
          "dualemb.jax.orbax.TablesSave / TablesRestore (for a Flax model: "
          "dualemb.jax.nnx.tables(model) and nnx.state(model, nnx.Not(dualemb.jax.nnx."
          "EmbeddingTable)) for the rest) or dualemb.jax.save / load")


@dataclasses.dataclass(frozen=True)
class TableRowsNotInPytree:
    """The key of a table's leaf in ``tree_flatten_with_path`` (see the module docstring)."""

    name: str

    def __str__(self) -> str:
        return f".{self.name}"

    def __format__(self, spec: str) -> str:
        # How Orbax (f"...{key}") words its refusal of an unknown key: say what to do instead.
        return f".{self.name} ({ADVICE})"


def register_table(cls, names=("handle", "version", "step", "opt_code", "slot_tables")):
    """Registers ``cls`` (with ``tree_flatten``/``tree_unflatten`` methods) as a pytree whose
    keyed flattening uses :class:`TableRowsNotInPytree` keys; returns ``cls``."""

    def flatten_with_keys(table):
        children, aux = table.tree_flatten()
        keys = [TableRowsNotInPytree(names[i] if i < len(names) else str(i))
                for i in range(len(children))]
        return list(zip(keys, children)), aux

    jax.tree_util.register_pytree_with_keys(
        cls, flatten_with_keys, cls.tree_unflatten, flatten_func=lambda t: t.tree_flatten())
    return cls

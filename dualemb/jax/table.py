"""Table: the JAX handle of a core table — a small pytree.

Static (part of the treedef, so part of jit's cache key): the table id, ``dim``, key dtype and
the optimizer. Leaves (traced under jit):

* ``version`` (int32 scalar): a token. Every operation takes it; every write returns a table with
  the next version. This data dependence is what orders the side-effecting custom calls — XLA
  keeps them alive but not in program order — so always use the table a write returned.
* ``step`` (int32 scalar): how many optimizer updates ``apply_gradients`` has made (Optax's
  ``count``). The schedule's learning rate and the 1-based step the core uses for bias
  correction come from it. The core does not store it: it lives here, and checkpoints record it.
* ``opt_state``: the generic Optax path's scalar state (e.g. ``count``), else ``None``.

The rows themselves live in the core's process-wide registry under the id, shared with
``dualemb.core.Table`` and ``dualemb.tf`` in the same process.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dualemb.core.table import Table as CoreTable
from dualemb.jax import optimizers as _opts
from dualemb.jax._pytree import register_table

_core = None


def _core_module():
    global _core
    if _core is None:
        from dualemb._native import load_extension
        _core = load_extension("_core")
    return _core


@register_table  # keyed: pytree checkpointers refuse a table instead of losing its rows
class Table:
    """A dynamic embedding table as seen from JAX (see the module docstring).

    Build one with :func:`create`, :func:`attach` or :func:`dualemb.jax.load`; never mutate it —
    every write returns a new one.
    """

    __slots__ = ("id", "dim", "key_dtype", "optimizer", "slot_tables", "version", "step",
                 "opt_state")

    def __init__(self, id: int, dim: int, key_dtype: str, optimizer, version, step,
                 opt_state=None, slot_tables: tuple = ()):
        self.id = int(id)
        self.dim = int(dim)
        self.key_dtype = key_dtype
        self.optimizer = optimizer
        self.slot_tables = tuple(slot_tables)
        self.version = version
        self.step = step
        self.opt_state = opt_state

    def tree_flatten(self):
        return ((self.version, self.step, self.opt_state),
                (self.id, self.dim, self.key_dtype, self.optimizer, self.slot_tables))

    @classmethod
    def tree_unflatten(cls, aux, children):
        id_, dim, kd, opt, slot_tables = aux
        version, step, opt_state = children
        return cls(id_, dim, kd, opt, version, step, opt_state, slot_tables)

    def replace(self, **changes) -> "Table":
        """A copy with some fields changed."""
        fields = {k: getattr(self, k) for k in self.__slots__}
        fields.update(changes)
        return Table(**fields)

    def core(self) -> CoreTable:
        """The host-side ``dualemb.core.Table`` of this id, after every write this handle
        depends on has finished (it blocks on ``version``)."""
        block(self)
        return CoreTable.attach(self.id)

    def __repr__(self) -> str:
        return (f"Table(id={self.id}, dim={self.dim}, key_dtype={self.key_dtype}, "
                f"optimizer={self.optimizer!r})")


def block(table: Table) -> Table:
    """Waits until every write this table handle depends on has run; returns the table.
    A host-side read (``dualemb.core``, ``dualemb.tf``, a checkpoint) after a jitted write must
    wait like this: jitted calls run asynchronously."""
    jax.block_until_ready((table.version, table.step))
    return table


def check_exists(table: Table) -> None:
    """Raises KeyError if the table's id is not in this process's registry."""
    if not _core_module().exists(int(table.id)):
        raise KeyError(
            f"unknown table id {table.id}: it was not created or loaded in this process (after "
            "a restart, restore it with dualemb.jax.load or an Orbax restore first)")


def _scalar(value) -> jax.Array:
    return jnp.asarray(value, jnp.int32)


def _optimizer(optimizer):
    """(fused Optimizer | GenericOptimizer | None) from what the user passed."""
    if optimizer is None or isinstance(optimizer, _opts.Optimizer):
        return optimizer
    from dualemb.jax.generic import GenericOptimizer
    if isinstance(optimizer, GenericOptimizer):
        return optimizer
    return GenericOptimizer.of(optimizer)  # raises TypeError for non-transformations


def canonical(core: CoreTable, opt):
    """``opt`` with the hyper-parameters as the core records them (every one, defaults
    included), so that handles made by create, attach and load compare equal."""
    if not isinstance(opt, _opts.Optimizer) or core.optimizer is None:
        return opt
    return _opts.from_spec(core.optimizer, opt.learning_rate)


def create(dim: int, *, key_dtype: str = "int64", initializer=None, optimizer=None,
           capacity: int = 0, evict_policy: str = "recency", num_threads: int = 0,
           table_id: int = 0, name: str | None = None) -> Table:
    """Creates a table in the core and returns its handle (version 0, step 0).

    Args:
      dim: row length.
      key_dtype: "int64" (default) or "int32".
      initializer: what a missing key reads as and a new key starts from: a
        ``dualemb.jax.initializers`` spec, a number, or None (zeros). Initial rows are a pure
        function of (seed, key).
      optimizer: a ``dualemb.jax.optimizers`` optimizer (fused in the core), any
        ``optax.GradientTransformation`` (generic path), or None.
      capacity, evict_policy: an optional size limit; writes past it evict by "recency" or
        "frequency".
      num_threads: threads one batched call may use (0 = all cores).
      table_id: create under (or attach to) this id; 0 draws a fresh one.
    """
    opt = _optimizer(optimizer)
    fused = opt if isinstance(opt, _opts.Optimizer) else None
    core = CoreTable(dim, key_dtype=key_dtype, initializer=initializer,
                     optimizer=fused.spec if fused else None, capacity=capacity,
                     evict_policy=evict_policy, num_threads=num_threads, table_id=table_id,
                     name=name)
    table = Table(core.id, core.dim, core.key_dtype.name, canonical(core, fused), _scalar(0),
                  _scalar(0))
    if opt is not None and fused is None:
        try:
            table = opt.bind(table, core)
        except Exception:
            core.destroy()
            raise
    return table


def attach(table_id: int, *, optimizer=None, step: int = 0, learning_rate=None) -> Table:
    """A handle on an existing core table (made by ``dualemb.core``, ``dualemb.tf`` or another
    handle in this process).

    The optimizer: ``optimizer`` if given (attached to the core table; if it differs from the
    one there, the slots are reset), else the core table's own optimizer with ``learning_rate``
    (required then, since the core does not store learning rates). ``step`` is the number of
    updates already made (the core does not store it either).
    """
    core = CoreTable.attach(int(table_id))
    opt = _optimizer(optimizer)
    if opt is None:
        spec = core.optimizer
        if spec is not None:
            if learning_rate is None:
                raise ValueError(
                    f"table {table_id} has optimizer {spec['name']!r} in the core; pass "
                    "learning_rate=... (or optimizer=...) to train it from JAX")
            opt = _opts.from_spec(spec, learning_rate)
    elif isinstance(opt, _opts.Optimizer):
        core.set_optimizer(opt.spec)
    table = Table(core.id, core.dim, core.key_dtype.name,
                  canonical(core, opt) if isinstance(opt, _opts.Optimizer) else None,
                  _scalar(0), _scalar(step))
    if opt is not None and not isinstance(opt, _opts.Optimizer):
        table = opt.bind(table, core, step=step)
    return table


def destroy(table: Table) -> None:
    """Removes the table (and the generic path's state tables) from the core's registry."""
    block(table)
    for tid in (table.id,) + table.slot_tables:
        if _core_module().exists(int(tid)):
            _core_module().destroy(int(tid))

"""Flax NNX: :class:`Embed`, a module that owns a dynamic table and maps ids to rows, and
:class:`ShardedEmbed`, the same over a table sharded on a mesh (:mod:`dualemb.jax.sharded`; its
ids sharded along their first axis).

Training: :func:`value_and_grad` returns the loss, the usual parameter gradients and the row
gradients of every ``Embed`` call; :func:`apply_gradients` steps each table with its own
optimizer (an ``Embed`` called several times gets one combined update). Calls outside
``value_and_grad`` are plain lookups. What would silently skip the tables raises instead: plain
``nnx.value_and_grad`` / ``nnx.grad`` / ``jax.grad`` of a loss through an ``Embed`` raises
``TypeError`` naming :func:`value_and_grad` (each ``Embed`` owns a zero :class:`TableGradGuard`
whose backward rule raises), and an Orbax ``StandardCheckpointer`` save or restore of
``nnx.state(model)`` raises ``ValueError`` naming ``dualemb.jax.orbax``. The training step, the
checkpoint recipe and how the row gradients are found: docs/jax.md, "Flax NNX".
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from dualemb.jax import many as _many
from dualemb.jax import ops as _ops
from dualemb.jax import optimizers as _opts
from dualemb.jax._grad_guard import guarded
from dualemb.jax._flax_common import (ATTEND_WITHOUT_IDS, TapeSlot, attend_logits, combine,
                                      emb_grads_of, path_key, tapped)
from dualemb.jax import train as _train
from dualemb.jax.ids import key_operand
from dualemb.jax.table import Table, create


class EmbeddingTable(nnx.Variable):
    """The :class:`dualemb.jax.Table` handle an :class:`Embed` owns (not an ``nnx.Param``:
    the rows live in the core, and Optax never sees them)."""


class TableGradGuard(nnx.Param):
    """A zero scalar each :class:`Embed` owns so that differentiating the model's parameters
    through an ``Embed`` outside :func:`value_and_grad` raises instead of silently leaving the
    table untrained (see the module docstring). Its value is never used; its gradient is 0."""


_PLAIN_GRAD_ERROR = (
    "a dualemb.jax.nnx.Embed was differentiated by nnx.value_and_grad / nnx.grad / jax.grad: "
    "that trains the dense parameters and leaves the embedding table untouched. Use "
    "dualemb.jax.nnx.value_and_grad(loss_fn)(model, ...) -> (loss, grads, emb_grads), then "
    "opt.update(model, grads) and dualemb.jax.nnx.apply_gradients(model, emb_grads)")




class Embed(nnx.Module):
    """Maps ids (any shape, any id form :mod:`dualemb.jax.ids` accepts) to rows
    ``ids.shape + (dim,)`` of a dynamic table.

    Args:
      dim: row length.
      table: an existing :class:`dualemb.jax.Table` to own (e.g. from ``dualemb.jax.load``);
        otherwise one is created with the remaining arguments (see :func:`dualemb.jax.create`).
    """

    def __init__(self, dim: int, *, table: Table | None = None, key_dtype: str = "int64",
                 initializer=None, optimizer=None, capacity: int = 0, name: str | None = None,
                 value_dtype="float32"):
        if table is None:
            table = create(dim, key_dtype=key_dtype, value_dtype=value_dtype,
                           initializer=initializer, optimizer=optimizer, capacity=capacity,
                           name=name)
        elif table.dim != dim:
            raise ValueError(f"table has dim {table.dim}, Embed was given dim {dim}")
        self.dim = dim
        self.table = EmbeddingTable(table)
        self.dualemb_grad_guard = TableGradGuard(jnp.zeros((), jnp.float32))

    def __call__(self, ids) -> jax.Array:
        rows = self._lookup(ids)
        tape = _TAPE.get()
        if tape is None:
            return guarded(rows, self.dualemb_grad_guard[...], _PLAIN_GRAD_ERROR)
        return tape.tap(self, ids, rows)

    def attend(self, query: jax.Array, ids=None) -> jax.Array:
        """Tied output embeddings over candidate ``ids`` (1-D): logits ``query @ rows(ids).T``,
        shape ``query.shape[:-1] + (len(ids),)``; inside :func:`value_and_grad` the rows'
        gradient trains them. A dynamic table has no vocabulary, so ``attend(query)`` over
        "every row" (``nnx.Embed.attend``) raises ``TypeError``: pass the candidates."""
        if ids is None:
            raise TypeError(ATTEND_WITHOUT_IDS)
        return attend_logits(query, self(ids))

    def _lookup(self, ids) -> jax.Array:
        return _ops.lookup(self.table.get_value(), ids)

    def apply_gradients(self, ids, grads) -> None:
        """One optimizer step of the table on ``ids`` with per-row ``grads``."""
        self.table.set_value(_train.apply_gradients(self.table.get_value(), ids, grads))

    def _accepts(self, table) -> bool:
        return isinstance(table, Table)


class ShardedEmbed(Embed):
    """An :class:`Embed` whose table is sharded over a device mesh axis
    (:class:`dualemb.jax.sharded.ShardedTable`): lookups and updates route ids to their owning
    shards by all-to-all (:func:`dualemb.jax.sharded.lookup` / ``apply_gradients``). Train it
    like an ``Embed`` (:func:`value_and_grad`, :func:`apply_gradients`) inside ``nnx.jit``, with
    ids sharded along their first axis (a multiple of the shard count) over ``mesh``.

    Args:
      dim: row length.
      mesh: the device mesh (the table's axis must span it, see ``dualemb.jax.sharded``).
      table: an existing ``ShardedTable`` to own (e.g. from ``sharded.load``); otherwise one is
        created with the remaining arguments (see :func:`dualemb.jax.sharded.create`; a fused
        optimizer from ``dualemb.jax.optimizers`` is required to train it).

    Checkpoints: ``dualemb.jax.sharded.save(module.table.get_value(), path)`` / ``sharded.load``
    (then :func:`set_tables`); the Orbax ``TablesSave`` recipe is for single-device tables.
    """

    def __init__(self, dim: int, *, mesh=None, table=None, axis: str | None = None,
                 capacity_per_shard: int | None = None, key_dtype: str = "int64",
                 initializer=None, optimizer=None):
        from dualemb.jax import sharded
        if table is None:
            if mesh is None:
                raise ValueError("ShardedEmbed needs a mesh (or an existing ShardedTable)")
            table = sharded.create(mesh, dim, axis=axis, capacity_per_shard=capacity_per_shard,
                                   key_dtype=key_dtype, initializer=initializer,
                                   optimizer=optimizer)
        elif not isinstance(table, sharded.ShardedTable):
            raise TypeError(f"ShardedEmbed takes a dualemb.jax.sharded.ShardedTable, got "
                            f"{type(table).__name__} (use Embed for a single-device table)")
        elif table.dim != dim:
            raise ValueError(f"table has dim {table.dim}, ShardedEmbed was given dim {dim}")
        self.dim = dim
        self.table = EmbeddingTable(table)
        self.dualemb_grad_guard = TableGradGuard(jnp.zeros((), jnp.float32))

    def _lookup(self, ids) -> jax.Array:
        from dualemb.jax import sharded
        return sharded.lookup(self.table.get_value(), ids)

    def apply_gradients(self, ids, grads) -> None:
        """One optimizer step of the sharded table on ``ids`` with per-row ``grads``."""
        from dualemb.jax import sharded
        self.table.set_value(sharded.apply_gradients(self.table.get_value(), ids, grads))

    def _accepts(self, table) -> bool:
        from dualemb.jax import sharded
        return isinstance(table, sharded.ShardedTable)


# ---- the tape: which Embed calls happened, with what ids, and their taps ----------------------

class _Tape:
    def __init__(self, paths: dict, taps: list | None):
        self.paths = paths  # id(Embed) -> its path in the model graph
        self.taps = taps  # None while recording shapes
        self.calls: list = []  # (path, ids operand, shape)
        self.dtypes: list = []  # the rows' dtype of each call (the table's value dtype)

    def tap(self, module: Embed, ids, rows):
        path = self.paths.get(id(module))
        if path is None:
            raise ValueError("an Embed called inside dualemb.jax.nnx.value_and_grad must be "
                             "part of the model passed to it")
        operand, shape = key_operand(ids, module.table.get_value().key_dtype)
        self.calls.append((path, operand, tuple(shape)))
        self.dtypes.append(rows.dtype)
        return tapped(rows, self.taps, len(self.calls) - 1)


_TAPE = TapeSlot("dualemb_nnx_tape")


def _embeds(model) -> dict:
    """path -> Embed for every Embed of the model (a module reachable by several paths is
    listed once, under the first)."""
    out, seen = {}, set()
    for p, m in nnx.iter_graph(model):
        if isinstance(m, Embed) and id(m) not in seen:
            seen.add(id(m))
            out[tuple(p)] = m
    return out


def _embed_paths(model) -> dict:
    return {id(m): p for p, m in _embeds(model).items()}


def value_and_grad(loss_fn: Callable, *, has_aux: bool = False, wrt=nnx.Param) -> Callable:
    """Like ``nnx.value_and_grad(loss_fn, has_aux=has_aux)`` for ``loss_fn(model, *args)``,
    plus the gradients of the rows every :class:`Embed` of ``model`` returned.

    Returns a function ``(model, *args) -> (value, grads, emb_grads)`` where ``value`` is
    ``loss`` (or ``(loss, aux)``), ``grads`` the ``wrt`` parameters' gradients (an
    ``nnx.State``), and ``emb_grads`` a pytree of ``{embed path: [(ids, row_grads), ...]}``
    for :func:`apply_gradients`.
    """

    def wrapped(model, *args):
        # 1. Shapes of the rows each Embed call returns (abstract: nothing runs).
        def probe(model, *args):
            tape = _Tape(_embed_paths(model), None)
            with _TAPE.recording(tape):
                loss_fn(model, *args)
            # Taps in the rows' dtype, so that rows + tap keeps it (a float16 table's rows
            # stay float16, and their gradients come back float16).
            return [jax.ShapeDtypeStruct(s + (m_dim,), dtype) for (_, _, s), m_dim, dtype
                    in zip(tape.calls, _dims(model, tape.calls), tape.dtypes)]

        shapes = nnx.eval_shape(probe, model, *args)
        taps = [jnp.zeros(s.shape, s.dtype) for s in shapes]

        # 2. Differentiate with respect to the parameters and the taps.
        def inner(model, taps, *args):
            tape = _Tape(_embed_paths(model), taps)
            with _TAPE.recording(tape):
                out = loss_fn(model, *args)
            loss, aux = (out if has_aux else (out, None))
            calls = [(path, operand) for path, operand, _ in tape.calls]
            return loss, (aux, calls)

        grad_fn = nnx.value_and_grad(inner, argnums=(nnx.DiffState(0, wrt), 1), has_aux=True)
        (loss, (aux, calls)), (grads, tap_grads) = grad_fn(model, taps, *args)
        emb_grads = emb_grads_of([c[0] for c in calls], [c[1] for c in calls], tap_grads)
        value = (loss, aux) if has_aux else loss
        return value, grads, emb_grads

    return wrapped


def _dims(model, calls) -> list:
    by_path = _embeds(model)
    return [by_path[path].dim for path, _, _ in calls]


def apply_gradients(model, emb_grads: dict) -> None:
    """Applies :func:`value_and_grad`'s ``emb_grads`` to the tables of ``model``'s
    :class:`Embed` modules (one step per table: the calls of a shared table are combined).

    The tables of plain ``Embed`` modules with fused optimizers are stepped together, in one
    call (:func:`dualemb.jax.apply_gradients_many`: the same bits as one call per table); each
    module must then own a table of its own (two modules holding one table raise). Other
    modules (``ShardedEmbed``, generic Optax optimizers, subclasses that override
    ``apply_gradients``) step their tables themselves."""
    by_path = {path_key(p): m for p, m in _embeds(model).items()}
    together = {}
    for key, entries in emb_grads.items():
        module = by_path.get(key)
        if module is None:
            raise KeyError(f"no Embed at {key!r} in the model")
        ids, grads = combine(entries, module.dim)
        if _steps_together(module):
            together[key] = (module, ids, grads)
        else:
            module.apply_gradients(ids, grads)
    if len(together) == 1:
        (module, ids, grads), = together.values()
        module.apply_gradients(ids, grads)
    elif together:
        new = _many.apply_gradients_many(
            {k: m.table.get_value() for k, (m, _, _) in together.items()},
            {k: i for k, (_, i, _) in together.items()},
            {k: g for k, (_, _, g) in together.items()})
        for k, (m, _, _) in together.items():
            m.table.set_value(new[k])


def _steps_together(module) -> bool:
    """Whether a module's table may join a multi-table optimizer call: a plain single-device
    table with a fused optimizer, stepped by Embed's own apply_gradients."""
    table = module.table.get_value()
    return (isinstance(table, Table) and isinstance(table.optimizer, _opts.Optimizer)
            and type(module).apply_gradients is Embed.apply_gradients)


def lookup_many(embeds, ids) -> list:
    """``[embed(i) for embed, i in zip(embeds, ids)]`` with one lookup call for all the tables
    (:func:`dualemb.jax.lookup_many`): the same rows, trained the same way inside
    :func:`value_and_grad`. For a model with one ``Embed`` per feature, e.g.
    ``rows = dej.nnx.lookup_many([self.user, self.item], [ids[:, 0], ids[:, 1]])``.
    ``ShardedEmbed`` modules (and a module listed twice) are looked up one by one."""
    embeds, ids = list(embeds), list(ids)
    if len(embeds) != len(ids):
        raise ValueError(f"lookup_many got {len(embeds)} Embed modules and {len(ids)} id arrays")
    for e in embeds:
        if not isinstance(e, Embed):
            raise TypeError(f"lookup_many takes dualemb.jax.nnx.Embed modules, got "
                            f"{type(e).__name__}")
    if (len({id(e) for e in embeds}) != len(embeds)
            or any(type(e)._lookup is not Embed._lookup for e in embeds)):
        return [e(i) for e, i in zip(embeds, ids)]
    rows = _many.lookup_many([e.table.get_value() for e in embeds], ids)
    tape = _TAPE.get()
    if tape is None:
        return [guarded(r, e.dualemb_grad_guard[...], _PLAIN_GRAD_ERROR)
                for e, r in zip(embeds, rows)]
    return [tape.tap(e, i, r) for e, i, r in zip(embeds, ids, rows)]


def tables(model) -> dict:
    """``{path: Table}`` for every :class:`Embed` of ``model`` (a ``ShardedTable`` for a
    :class:`ShardedEmbed`; paths as in
    :func:`value_and_grad`'s ``emb_grads``), e.g. for ``dualemb.jax.orbax.TablesSave`` /
    ``TablesRestore`` or ``dualemb.jax.save``."""
    return {path_key(p): m.table.get_value() for p, m in _embeds(model).items()}


def set_tables(model, tables: dict) -> None:
    """Puts restored table handles (``{path: Table}``, as :func:`tables` names them, e.g. what
    ``TablesRestore`` returned) into ``model``'s :class:`Embed` modules."""
    by_path = {path_key(p): m for p, m in _embeds(model).items()}
    unknown = sorted(set(tables) - set(by_path))
    if unknown:
        raise KeyError(f"no Embed at {unknown} in the model (it has {sorted(by_path)})")
    for key, table in tables.items():
        module = by_path[key]
        if not module._accepts(table) or table.dim != module.dim:
            raise ValueError(f"Embed {key!r} (dim {module.dim}) cannot take {table!r}")
        module.table.set_value(table)


"""Flax linen: :class:`Embed`, a module that maps ids to the rows of a dynamic table.

The table handle lives in the variable collection ``"dualemb"`` (:data:`COLLECTION`), beside
``"params"`` and outside it, so the dense optimizer never sees it. :func:`value_and_grad`
returns the gradient of the rows every ``Embed`` returned beside the usual parameter gradients,
and :func:`apply_gradients` hands it to each table's optimizer, returning the next collection.
Each ``model.init`` creates new tables (:func:`tables` lists them, to destroy or save). Plain
``jax.grad`` of a loss through an ``Embed`` raises ``TypeError`` naming :func:`value_and_grad`
rather than leave the tables untrained; ``Embed.attend`` without candidate ``ids`` raises
``TypeError`` (a hash table has no vocabulary). The training step: docs/jax.md, "Flax linen".
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence, Union

import flax.linen as nn
import jax
import jax.numpy as jnp

from dualemb.jax import ops as _ops
from dualemb.jax import train as _train
from dualemb.jax._grad_guard import guarded
from dualemb.jax._flax_common import (ATTEND_WITHOUT_IDS, TapeSlot, attend_logits, combine,
                                      emb_grads_of, path_key, tapped)
from dualemb.jax.ids import key_operand
from dualemb.jax.table import Table, create

COLLECTION = "dualemb"
_TABLE = "table"

_PLAIN_GRAD_ERROR = (
    "a dualemb.jax.linen.Embed was differentiated by jax.grad / jax.value_and_grad: that "
    "trains the dense parameters and leaves the embedding table untouched. Use "
    "dualemb.jax.linen.value_and_grad(loss_fn)(params, ...) -> (loss, grads, emb_grads), then "
    "update params with Optax and tables = dualemb.jax.linen.apply_gradients(tables, emb_grads)")


class Embed(nn.Module):
    """Maps ids (any shape, any id form :mod:`dualemb.jax.ids` accepts) to rows
    ``ids.shape + (dim,)`` of a dynamic table, created by ``init`` (or ``table``, an existing
    :class:`dualemb.jax.Table` to use, e.g. from ``dualemb.jax.load``).

    Attributes (see :func:`dualemb.jax.create`): ``dim``, ``key_dtype``, ``value_dtype``,
    ``initializer``, ``optimizer``, ``capacity``, ``table_name`` (the core table's name).
    """

    dim: int
    key_dtype: str = "int64"
    value_dtype: Any = "float32"
    initializer: Any = None
    optimizer: Any = None
    capacity: int = 0
    table_name: Optional[str] = None
    table: Optional[Table] = None

    def setup(self):
        self._handle = self.variable(COLLECTION, _TABLE, self._make_table)
        self.dualemb_grad_guard = self.param("dualemb_grad_guard", nn.initializers.zeros_init(),
                                             (), jnp.float32)

    def _make_table(self) -> Table:
        if self.table is not None:
            if self.table.dim != self.dim:
                raise ValueError(f"table has dim {self.table.dim}, Embed was given dim "
                                 f"{self.dim}")
            return self.table
        # linen freezes dict attributes (an initializer spec) into FrozenDicts: thaw it.
        init = self.initializer
        init = dict(init) if isinstance(init, Mapping) else init
        return create(self.dim, key_dtype=self.key_dtype, value_dtype=self.value_dtype,
                      initializer=init, optimizer=self.optimizer,
                      capacity=self.capacity, name=self.table_name)

    def __call__(self, ids) -> jax.Array:
        table = self._handle.value
        if not isinstance(table, Table) or table.dim != self.dim:
            raise ValueError(f"Embed {'/'.join(self.scope.path)!r} (dim {self.dim}) found "
                             f"{table!r} in the {COLLECTION!r} collection")
        rows = _ops.lookup(table, ids)
        tape = _TAPE.get()
        if tape is None:
            return guarded(rows, self.dualemb_grad_guard, _PLAIN_GRAD_ERROR)
        return tape.tap(tuple(self.scope.path), table, ids, rows)

    def attend(self, query: jax.Array, ids=None) -> jax.Array:
        """Tied output embeddings over candidate ``ids`` (1-D): logits
        ``query @ rows(ids).T``, shape ``query.shape[:-1] + (len(ids),)``. The rows are looked
        up as by ``__call__`` (inside :func:`value_and_grad` their gradient trains them).
        Without ``ids``: ``TypeError`` (see the module docstring)."""
        if ids is None:
            raise TypeError(ATTEND_WITHOUT_IDS)
        return attend_logits(query, self(ids))


# ---- the tape: which Embed calls happened, with what ids, and their taps ----------------------

class _Tape:
    def __init__(self, taps: list | None):
        self.taps = taps  # None while recording shapes
        self.paths: list = []  # the scope path of each call
        self.operands: list = []  # the ids operand of each call
        self.structs: list = []  # the rows' shape and dtype of each call

    def tap(self, path: tuple, table: Table, ids, rows):
        operand, _ = key_operand(ids, table.key_dtype)
        self.paths.append(path)
        self.operands.append(operand)
        self.structs.append(jax.ShapeDtypeStruct(rows.shape, rows.dtype))
        return tapped(rows, self.taps, len(self.paths) - 1)


_TAPE = TapeSlot("dualemb_linen_tape")


def value_and_grad(fun: Callable, argnums: Union[int, Sequence[int]] = 0, *,
                   has_aux: bool = False) -> Callable:
    """Like ``jax.value_and_grad(fun, argnums, has_aux=has_aux)``, plus the gradients of the
    rows every :class:`Embed` call inside ``fun`` returned.

    Returns a function ``(*args) -> (value, grads, emb_grads)``: ``value`` and ``grads`` as
    ``jax.value_and_grad`` gives them, ``emb_grads`` a dict ``{embed path: [(ids,
    row_grads), ...]}`` (one entry per call) for :func:`apply_gradients`.

    How: ``fun`` is first traced abstractly to learn the shape of the rows of every call, then
    differentiated with a zero "tap" added to each call's rows; a tap's gradient is that call's
    per-row gradient.
    """
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)

    def wrapped(*args):
        probe = _Tape(None)

        def record(*a):
            with _TAPE.recording(probe):
                out = fun(*a)
            return out

        jax.eval_shape(record, *args)
        taps = [jnp.zeros(s.shape, s.dtype) for s in probe.structs]
        paths: list = []

        def inner(*a):
            *real, taps_in = a
            tape = _Tape(taps_in)
            with _TAPE.recording(tape):
                out = fun(*real)
            if len(tape.paths) != len(taps_in):
                raise RuntimeError("the Embed calls of fun changed between two traces "
                                   f"({len(taps_in)} then {len(tape.paths)})")
            paths[:] = tape.paths
            loss, aux = out if has_aux else (out, None)
            return loss, (aux, tape.operands)

        grad_fn = jax.value_and_grad(inner, argnums=nums + (len(args),), has_aux=True)
        (loss, (aux, operands)), grads = grad_fn(*args, taps)
        *param_grads, tap_grads = grads
        emb_grads = emb_grads_of(paths, operands, tap_grads)
        value = (loss, aux) if has_aux else loss
        param_grads = param_grads[0] if isinstance(argnums, int) else tuple(param_grads)
        return value, param_grads, emb_grads

    return wrapped


def tables(collection: Mapping) -> dict:
    """``{embed path: Table}`` for every :class:`Embed` table in ``collection`` (the
    ``"dualemb"`` collection, or a whole ``variables`` dict holding it), paths as in
    :func:`value_and_grad`'s ``emb_grads``; e.g. for ``dualemb.jax.orbax.TablesSave``."""
    if COLLECTION in collection and _TABLE not in collection:
        collection = collection[COLLECTION]
    out = {}

    def walk(node, path):
        for k, v in node.items():
            if k == _TABLE and isinstance(v, Table):
                out[path_key(path)] = v
            elif isinstance(v, Mapping):
                walk(v, path + (k,))

    walk(collection, ())
    return out


def set_tables(collection: Mapping, new: Mapping[str, Table]) -> dict:
    """The ``"dualemb"`` collection with the tables at the given paths replaced (e.g. by what
    ``TablesRestore`` returned); every path must name an existing table of the same dim."""
    have = tables(collection)
    if COLLECTION in collection and _TABLE not in collection:
        collection = collection[COLLECTION]
    unknown = sorted(set(new) - set(have))
    if unknown:
        raise KeyError(f"no Embed table at {unknown} (the collection has {sorted(have)})")
    for key, table in new.items():
        if not isinstance(table, Table) or table.dim != have[key].dim:
            raise ValueError(f"Embed {key!r} (dim {have[key].dim}) cannot take {table!r}")
    return _replace(collection, {tuple(k.split("/")) if k else (): t for k, t in new.items()})


def _replace(collection: Mapping, by_path: dict, prefix: tuple = ()) -> dict:
    out = {}
    for k, v in collection.items():
        if k == _TABLE and isinstance(v, Table):
            out[k] = by_path.get(prefix, v)
        elif isinstance(v, Mapping):
            out[k] = _replace(v, by_path, prefix + (k,))
        else:
            out[k] = v
    return out


def apply_gradients(collection: Mapping, emb_grads: dict) -> dict:
    """Applies :func:`value_and_grad`'s ``emb_grads`` to the tables of ``collection`` (the
    ``"dualemb"`` collection) and returns the next collection (one optimizer step per table:
    the calls of one ``Embed`` are combined). A path without a table raises ``KeyError``."""
    have = tables(collection)
    new = {}
    for key, entries in emb_grads.items():
        table = have.get(key)
        if table is None:
            raise KeyError(f"no Embed table at {key!r} (the collection has {sorted(have)})")
        new[key] = _train.apply_gradients(table, *combine(entries, table.dim))
    return set_tables(collection, new)


"""What the Flax front ends share: the tape their ``value_and_grad`` records the Embed calls on,
the ``emb_grads`` it returns, one optimizer step from several lookups' row gradients, and tied
output embeddings (``attend``).

The Flax front ends (:mod:`dualemb.jax.nnx`, :mod:`dualemb.jax.linen`) collect, per table, one
``(ids, row_grads)`` pair for each call of its module; a table called several times (shared by
features, or ``attend`` beside ``__call__``) gets one combined update, as if its ids had been one
batch (duplicates summed by ``apply_gradients``).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any

import jax.numpy as jnp

from dualemb.jax.ids import Ids


class TapeSlot:
    """Where an Embed call finds the tape of the ``value_and_grad`` being traced (None outside
    one): a context variable, so nested or concurrent traces each see their own."""

    def __init__(self, name: str):
        self._var: contextvars.ContextVar = contextvars.ContextVar(name, default=None)

    def get(self):
        return self._var.get()

    @contextlib.contextmanager
    def recording(self, tape):
        token = self._var.set(tape)
        try:
            yield tape
        finally:
            self._var.reset(token)


def tapped(rows, taps, index: int):
    """``rows`` plus the zero tap of call ``index`` (whose gradient is the rows' gradient);
    ``rows`` unchanged while the shapes are recorded (``taps`` None)."""
    return rows if taps is None else rows + taps[index]


def path_key(path) -> str:
    """An Embed's path as the key of ``emb_grads`` and ``tables()``: its parts joined by "/"."""
    return "/".join(str(p) for p in path)


def emb_grads_of(paths, operands, tap_grads) -> dict:
    """``{embed path: [(ids, row_grads), ...]}`` (one entry per call, in call order) from each
    call's path, ids operand (uint32 pairs become :class:`Ids` again) and tap gradient."""
    out: dict = {}
    for path, operand, g in zip(paths, operands, tap_grads):
        ids = Ids(operand) if operand.dtype == jnp.uint32 else operand
        out.setdefault(path_key(path), []).append((ids, g))
    return out


def combine(entries: list, dim: int) -> tuple:
    """``(ids, grads)`` for one ``apply_gradients`` call from ``[(ids, grads), ...]``."""
    if len(entries) == 1:
        return entries[0]
    ids = concat_ids([e[0] for e in entries])
    grads = jnp.concatenate([e[1].reshape(-1, dim) for e in entries])
    return ids, grads


def concat_ids(ids_list: list) -> Any:
    """The ids of several calls, flattened into one 1-D batch (as :class:`Ids` if any is)."""
    if all(isinstance(i, Ids) for i in ids_list):
        return Ids(jnp.concatenate([i.halves.reshape(-1, 2) for i in ids_list]))
    if any(isinstance(i, Ids) for i in ids_list):
        from dualemb.jax.ids import ids as to_ids
        return concat_ids([to_ids(i) for i in ids_list])
    return jnp.concatenate([i.reshape(-1) for i in ids_list])


ATTEND_WITHOUT_IDS = (
    "Embed.attend(query) over 'every row' has no meaning for a dynamic table: it has no "
    "vocabulary, and its inserted keys change as it trains. Pass the candidate ids: "
    "attend(query, ids) gives query @ rows(ids).T (e.g. a fixed candidate set, or the batch's "
    "ids for an in-batch softmax), and its gradient trains those rows")


def attend_logits(query, rows):
    """``query @ rows.T`` for the rows of 1-D candidate ids (Flax's ``Embed.attend``)."""
    if rows.ndim != 2:
        raise ValueError(f"attend takes a 1-D array of candidate ids, got ids of shape "
                         f"{rows.shape[:-1]}")
    dtype = jnp.result_type(query, rows)
    return jnp.dot(query.astype(dtype), rows.T.astype(dtype))

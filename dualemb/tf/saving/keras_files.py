"""``de.Variable``s in Keras 3 weight files (``.weights.h5``) and ``.keras`` archives: the bodies
of a DE layer's ``save_own_variables`` / ``load_own_variables``.

A layer's store gets its Keras variables exactly as Keras writes them ("0", "1", ...) and, per
de.Variable the layer holds, the tensors of ``dualemb.tf.saving.variable_state`` as
``dualemb.<j>.<field>``. Keras' stores hold numeric arrays only (HDF5 has no variable-length
bytes that keep NULs through Keras), so the keys of a string-keyed Variable are stored as
``dualemb.<j>.key_offsets`` + ``dualemb.<j>.key_bytes`` instead of ``dualemb.<j>.keys``, the
common checkpoint format's encoding. See docs/tf_saving.md.
"""

from __future__ import annotations

from collections.abc import Mapping

import keras
import numpy as np
import tensorflow as tf

from dualemb.core import _string_keys
from dualemb.core.checkpoint import CheckpointError
from dualemb.tf import keras_adapter
from dualemb.tf.saving import variable_state as state
from dualemb.tf.trainable import is_trainable_wrapper
from dualemb.tf.variable import Variable

# Keras stores: DE entries are named "dualemb.<j>.<field>", next to Keras' own "0", "1", ...
_STORE_PREFIX = "dualemb."
# The two entries that replace "keys" for a string-keyed Variable.
_KEY_OFFSETS, _KEY_BYTES = "key_offsets", "key_bytes"


def own_de_variables(layer) -> list:
    """The de.Variables a layer holds itself (not through a sub-layer), in a stable order."""
    found, seen = [], set()

    def visit(value, depth):
        if depth > 3 or isinstance(value, (str, bytes, keras.layers.Layer)):
            return
        if isinstance(value, Variable):
            if id(value) not in seen:
                seen.add(id(value))
                found.append(value)
            return
        if isinstance(value, Mapping):
            for k in sorted(value, key=str):
                visit(value[k], depth + 1)
        elif isinstance(value, (list, tuple)):
            for v in value:
                visit(v, depth + 1)

    for name in sorted(vars(layer)):
        if name.startswith("__") or name in ("_inbound_nodes", "_outbound_nodes", "_tracker"):
            continue
        visit(vars(layer)[name], 0)
    return found


def _saved_de_variables(layer) -> list:
    return [v for v in own_de_variables(layer) if getattr(v, "checkpoint", True)]


def _keras_vars(layer) -> list:
    return keras_adapter.layer_own_variables(layer)


def layer_save_own_variables(layer, store) -> None:
    """For a Keras layer's ``save_own_variables(store)``: writes the layer's Keras variables
    exactly as Keras does ("0", "1", ...) and, for each de.Variable the layer holds, the entries
    ``dualemb.<j>.{keys,values,slots,last_update,update_count,stepped,meta}``."""
    for i, v in enumerate(_keras_vars(layer)):
        store[f"{i}"] = v
    for j, var in enumerate(_saved_de_variables(layer)):
        tensors = state.export_tensors(var)
        for f in state.FIELDS:
            value = tensors[f].numpy()
            if f == "keys" and tensors[f].dtype == tf.string:
                offsets, data = _string_keys.pack(value)
                store[f"{_STORE_PREFIX}{j}.{_KEY_OFFSETS}"] = offsets
                store[f"{_STORE_PREFIX}{j}.{_KEY_BYTES}"] = data
                continue
            store[f"{_STORE_PREFIX}{j}.{f}"] = value
        store[f"{_STORE_PREFIX}{j}.{state.STEPPED}"] = tensors[state.STEPPED].numpy().astype(
            np.uint8)
        meta = tensors[state.META].numpy()
        store[f"{_STORE_PREFIX}{j}.{state.META}"] = np.frombuffer(meta, np.uint8).copy()


def layer_load_own_variables(layer, store) -> None:
    """For a Keras layer's ``load_own_variables(store)``: the inverse of
    :func:`layer_save_own_variables`. Every de.Variable is checked against its saved description
    before anything is assigned; its tables' contents are then replaced."""
    keys = list(store.keys())
    plain = [k for k in keys if not str(k).startswith(_STORE_PREFIX)]
    all_vars = _keras_vars(layer)
    if len(plain) != len(all_vars):
        raise ValueError(
            f"Layer {layer.name!r} expects {len(all_vars)} Keras variables, but the saved state "
            f"has {len(plain)}; the file was saved from a different layer")
    de_vars = _saved_de_variables(layer)
    saved = sorted({int(str(k)[len(_STORE_PREFIX):].split(".")[0]) for k in keys
                    if str(k).startswith(_STORE_PREFIX)})
    if saved != list(range(len(de_vars))):
        raise CheckpointError(
            f"Layer {layer.name!r} holds {len(de_vars)} de.Variables, but the saved state has "
            f"{len(saved)}; the file was saved from a different layer")
    restored = []
    for j, var in enumerate(de_vars):
        where = f"loading layer {layer.name!r} de.Variable {var.name!r}"
        prefix = f"{_STORE_PREFIX}{j}."
        try:
            meta_bytes = np.asarray(store[prefix + state.META], np.uint8).tobytes()
            # Dim and dtypes first: a file of another key dtype has other key entries.
            facts = state.var_facts(var)
            state.check_compatible(facts, state.parse_meta(meta_bytes, where), where)
            t = {f: _read_field(store, prefix, f, state.dtypes_of(var)[f], where)
                 for f in state.FIELDS}
        except KeyError as e:
            raise CheckpointError(f"{where}: the saved state lacks {e}") from None
        if prefix + state.STEPPED in keys:  # absent from files saved before it existed
            t[state.STEPPED] = tf.constant(np.asarray(store[prefix + state.STEPPED]) != 0)
        t[state.META] = tf.constant(meta_bytes)
        state.eager_checks(facts, t, where)
        restored.append((var, t))
    for i, v in enumerate(all_vars):
        if not is_trainable_wrapper(v):  # an anchor holds nothing; its table is imported below
            v.assign(store[f"{i}"])
    for var, t in restored:
        state.import_tensors(var, state.var_facts(var), t, [])


def _read_field(store, prefix: str, field: str, dtype: tf.DType, where: str) -> tf.Tensor:
    """One saved tensor of a de.Variable as ``dtype`` (string keys from their two entries)."""
    if field == "keys" and dtype == tf.string:
        try:
            keys = _string_keys.unpack(np.asarray(store[prefix + _KEY_OFFSETS]),
                                       np.asarray(store[prefix + _KEY_BYTES]), where)
        except ValueError as e:
            raise CheckpointError(str(e)) from None
        return tf.constant(keys, tf.string)
    return tf.convert_to_tensor(np.asarray(store[prefix + field]), dtype)

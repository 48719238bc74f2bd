"""Dense parameters across frameworks: Keras weights <-> ``{name: array}`` <-> Flax params.

A dualemb checkpoint (``dualemb.core.checkpoint``) carries a model's dense parameters as a flat
mapping ``name -> array`` (the ``dense=`` argument of ``checkpoint.save``). This module defines the
names, so that a Keras model and a Flax model of the same architecture read each other's
parameters, optimizer slots included. See docs/interop.md.

**Parameter names** are Flax's: the path of the parameter in the ``nnx.Module``, joined with
``/`` (``fc0/kernel`` for ``model.fc0.kernel``). A Keras weight's name is its ``variable.path``
without the leading ``"<model name>/"``, where the last component is translated to Flax's name
for the layer types whose names differ:

======================================  ====================  ======================
Keras layer (weight)                    Flax ``nnx`` layer    shape (both)
======================================  ====================  ======================
``Dense`` (``kernel``, ``bias``)        ``Linear``            ``[in, out]``, ``[out]``
``Embedding`` (``embeddings``)          ``Embed`` (``embedding``)  ``[num, features]``
``LayerNormalization`` (gamma, beta)    ``LayerNorm`` (scale, bias)  ``[features]``
``BatchNormalization`` (gamma, beta,    ``BatchNorm`` (scale, bias,  ``[features]``
moving_mean, moving_variance)           mean, var)
``Conv1D/2D/3D`` (``kernel``, ``bias``) ``Conv``              ``[*window, in, out]``
======================================  ====================  ======================

Keras' ``Dense`` kernel is ``[in, out]`` and computes ``x @ kernel + bias``; ``nnx.Linear``'s kernel
is ``[in, out]`` too and computes the same: no transpose anywhere. So a Keras layer named ``fc0``
(as ``keras.layers.Dense(64, name="fc0")``) and a Flax attribute ``self.fc0 = nnx.Linear(...)``
share the names ``fc0/kernel`` and ``fc0/bias``. When names do not line up, pass ``name_map``:
a dict ``{default name: name}`` or a callable ``default name -> name`` (returning ``None`` skips
the parameter).

Dynamic embedding anchors (the ``(0, dim)`` ``TrainableWrapper`` weights of ``dualemb.tf``
layers) are not dense parameters: they are skipped; their tables are the checkpoint's tables.

**Optimizer state** is stored beside the parameters: ``optimizer/<name>/<slot>`` per trainable
parameter and ``optimizer/step`` (int64 scalar, the number of updates made). Keras slot names
are shortened for Adam-style optimizers (``momentum`` -> ``m``, ``velocity`` -> ``v``,
``velocity_hat`` -> ``v_hat``); other Keras slots keep their Keras names. On the JAX side,
``keras_adam`` (:mod:`dualemb.jax.keras_optax`, re-exported here) is an Optax transformation
that computes Keras 3's Adam exactly (float32, the same operations in the same order), with
:func:`adam_state_to_dict` / :func:`dict_to_adam_state` to move its state; so a model continues
training across frameworks with the same optimizer.

Functions that need Keras, JAX or Flax import them when called: importing this module imports
only numpy (``keras_adam`` and ``KerasAdamState`` are loaded on first access).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

__all__ = [
    "OPTIMIZER_PREFIX", "STEP", "flatten", "unflatten", "keras_variables",
    "keras_weights_to_dict", "dict_to_keras", "keras_optimizer_to_dict", "dict_to_keras_optimizer",
    "flax_params_to_dict", "dict_to_flax", "from_tf_save", "keras_adam", "KerasAdamState",
    "adam_state_to_dict",
    "dict_to_adam_state",
]

OPTIMIZER_PREFIX = "optimizer/"
STEP = "optimizer/step"


def __getattr__(name):
    # The optimizer itself lives with the JAX optimizers; loaded on first use so that importing
    # this module stays numpy-only.
    if name in ("keras_adam", "KerasAdamState"):
        from dualemb.jax import keras_optax
        return getattr(keras_optax, name)
    raise AttributeError(f"module 'dualemb.interop' has no attribute {name!r}")


# Keras leaf name -> Flax leaf name, per Keras layer class name.
_LEAF_RENAMES = {
    "Embedding": {"embeddings": "embedding"},
    "LayerNormalization": {"gamma": "scale", "beta": "bias"},
    "BatchNormalization": {"gamma": "scale", "beta": "bias", "moving_mean": "mean",
                           "moving_variance": "var"},
}
# The same, by leaf name alone (for names without their layers: from_tf_save).
_LEAF_BY_NAME = {"embeddings": "embedding", "gamma": "scale", "beta": "bias",
                 "moving_mean": "mean", "moving_variance": "var"}
# Keras optimizer slot name -> name in the dict.
_SLOT_SHORT = {"momentum": "m", "velocity": "v", "velocity_hat": "v_hat"}
# Every slot name a Keras 3 optimizer creates with add_variable_from_reference.
_KERAS_SLOTS = ("momentum", "velocity", "velocity_hat", "accumulator", "linear",
                "average_gradient", "m", "u", "accumulated_grad", "accumulated_delta_var")

NameMap = Mapping[str, str] | Callable[[str], str | None] | None


# dualemb.jax.nnx.Embed's zero scalar guard parameter (TableGradGuard): a Flax-side detail with no
# Keras counterpart, never exchanged (importing leaves the model's own value).
_FLAX_ONLY_LEAVES = frozenset({"dualemb_grad_guard"})


def _flax_rename(name_map: NameMap, name: str) -> str | None:
    if name.rsplit("/", 1)[-1] in _FLAX_ONLY_LEAVES:
        return None
    return _rename(name_map, name)


def _rename(name_map: NameMap, name: str) -> str | None:
    if name_map is None:
        return name
    if callable(name_map):
        return name_map(name)
    return name_map.get(name, name)


# ---- flat dicts --------------------------------------------------------------------------------

def flatten(tree: Mapping, sep: str = "/") -> dict:
    """``{"fc0": {"kernel": a}}`` -> ``{"fc0/kernel": a}`` (``flax.traverse_util.flatten_dict``;
    nested dicts are nodes, anything else a leaf, empty dicts dropped; keys that are not
    strings, such as the list indices of ``nnx.to_pure_dict``, are written with ``str``)."""
    from flax import traverse_util
    return {sep.join(str(k) for k in path): v
            for path, v in traverse_util.flatten_dict(dict(tree)).items()}


def unflatten(flat: Mapping, sep: str = "/") -> dict:
    """Inverse of :func:`flatten` (``flax.traverse_util.unflatten_dict``)."""
    from flax import traverse_util
    return traverse_util.unflatten_dict(dict(flat), sep=sep)


# ---- Keras -------------------------------------------------------------------------------------

def _owners(model) -> dict:
    """id(variable) -> class name of the Keras layer that created it."""
    owners: dict = {}
    layers = [model]
    try:
        layers += list(model._flatten_layers(include_self=False, recursive=True))
    except (AttributeError, TypeError):  # pragma: no cover - other Keras versions
        layers += list(getattr(model, "layers", []))
    for layer in layers:
        for v in (list(getattr(layer, "_trainable_variables", []))
                  + list(getattr(layer, "_non_trainable_variables", []))):
            owners.setdefault(id(v), type(layer).__name__)
    return owners


def _is_anchor(v) -> bool:
    """A dualemb.tf TrainableWrapper (or any empty weight): no dense data."""
    return any(int(d) == 0 for d in tuple(v.shape))


def keras_variables(model, name_map: NameMap = None) -> dict:
    """``name -> keras.Variable`` for the dense weights of a built Keras model (or layer), in
    ``model.weights`` order, named as the module docstring says."""
    prefix = f"{model.name}/"
    owners = _owners(model)
    out: dict = {}
    for v in model.weights:
        if _is_anchor(v):
            continue
        path = v.path[len(prefix):] if v.path.startswith(prefix) else v.path
        parts = path.split("/")
        renames = _LEAF_RENAMES.get(owners.get(id(v), ""), {})
        parts[-1] = renames.get(parts[-1], parts[-1])
        name = _rename(name_map, "/".join(parts))
        if name is None:
            continue
        if name in out:
            raise ValueError(f"two Keras weights are both named {name!r} ({out[name].path} and "
                             f"{v.path}); pass name_map to tell them apart")
        out[name] = v
    return out


def keras_weights_to_dict(model, *, name_map: NameMap = None, optimizer=None,
                          strict: bool = True) -> dict:
    """``{name: np.ndarray}`` of a Keras model's dense weights; with ``optimizer``, also its slots
    and step (:func:`keras_optimizer_to_dict`)."""
    out = {name: np.asarray(v.numpy()) for name, v in keras_variables(model, name_map).items()}
    if optimizer is not None:
        out.update(keras_optimizer_to_dict(optimizer, model, name_map=name_map, strict=strict))
    return out


def _check_shape(name: str, have, want) -> None:
    if tuple(have) != tuple(want):
        raise ValueError(f"parameter {name!r}: the dict holds shape {tuple(have)}, the model "
                         f"expects {tuple(want)}")


def dict_to_keras(model, params: Mapping, *, name_map: NameMap = None, optimizer=None,
                  strict: bool = True) -> None:
    """Assigns ``params`` (name -> array) to the weights of a built Keras model; with
    ``optimizer``, also its slots and step. With ``strict``, every weight of the model must be
    in ``params`` and every parameter name of ``params`` must be a weight of the model (names
    under ``optimizer/`` aside). Shapes must match exactly; nothing is assigned unless all
    do."""
    targets = keras_variables(model, name_map)
    plain = {k: v for k, v in params.items() if not k.startswith(OPTIMIZER_PREFIX)}
    if strict:
        missing = sorted(set(targets) - set(plain))
        extra = sorted(set(plain) - set(targets))
        if missing or extra:
            raise KeyError(f"parameters do not match the Keras model: missing {missing}, "
                           f"unknown {extra}")
    todo = []
    for name, var in targets.items():
        if name not in plain:
            continue
        value = np.asarray(plain[name])
        _check_shape(name, value.shape, var.shape)
        todo.append((var, value))
    if optimizer is not None:
        todo += _optimizer_assignments(optimizer, model, params, name_map, strict)
    for var, value in todo:
        var.assign(value.astype(var.dtype) if hasattr(var, "dtype") else value)


_NOT_SLOTS = ("iteration", "learning_rate")


def _slot_variables(optimizer, model, name_map: NameMap, strict: bool = True) -> dict:
    """``"optimizer/<name>/<slot>" -> optimizer variable`` (building the optimizer if needed).

    Keras names a slot ``<weight path with / as _>_<slot>``. With ``strict``, an optimizer
    variable that looks like a slot but belongs to no weight of ``model`` raises ValueError
    (its state would otherwise be silently lost)."""
    named = keras_variables(model, name_map)
    if not optimizer.built:
        optimizer.build([v for v in model.trainable_variables])
    by_name = {v.name: v for v in optimizer.variables}
    out, used = {}, set()
    for name, var in named.items():
        if not var.trainable:
            continue
        ref = var.path.replace("/", "_") + "_"
        for slot in _KERAS_SLOTS:
            sv = by_name.get(ref + slot)
            if sv is not None:
                out[f"{OPTIMIZER_PREFIX}{name}/{_SLOT_SHORT.get(slot, slot)}"] = sv
                used.add(id(sv))
    if strict:
        stray = [v.path for v in optimizer.variables
                 if id(v) not in used and v.name not in _NOT_SLOTS]
        if stray:
            raise ValueError(f"optimizer variables {stray} belong to no weight of the model "
                             "(a weight skipped by name_map, or an optimizer shared with "
                             "another model); pass strict=False to leave them out")
    return out


def keras_optimizer_to_dict(optimizer, model, *, name_map: NameMap = None,
                            strict: bool = True) -> dict:
    """``{"optimizer/<name>/<slot>": array, "optimizer/step": int64}`` of a Keras 3 optimizer
    that trains ``model``. With ``strict``, every slot variable of the optimizer must belong to
    a weight of ``model``."""
    out = {k: np.asarray(v.numpy())
           for k, v in _slot_variables(optimizer, model, name_map, strict).items()}
    out[STEP] = np.asarray(int(np.asarray(optimizer.iterations)), np.int64)
    return out


def _optimizer_assignments(optimizer, model, params, name_map, strict) -> list:
    slots = _slot_variables(optimizer, model, name_map, strict)
    given = {k for k in params if k.startswith(OPTIMIZER_PREFIX) and k != STEP}
    if strict:
        missing = sorted(set(slots) - given)
        if missing:
            raise KeyError(f"optimizer state missing from the dict: {missing}")
    todo = []
    for name, var in slots.items():
        if name in params:
            value = np.asarray(params[name])
            _check_shape(name, value.shape, var.shape)
            todo.append((var, value))
    if STEP in params:
        todo.append((optimizer.iterations, np.asarray(params[STEP]).astype(np.int64)))
    elif strict:
        raise KeyError(f"{STEP!r} missing from the dict")
    return todo


def dict_to_keras_optimizer(optimizer, model, params: Mapping, *, name_map: NameMap = None,
                            strict: bool = True) -> None:
    """Assigns the ``optimizer/...`` entries of ``params`` to a Keras optimizer's slots and
    iterations (building it on ``model``'s trainable variables first if needed)."""
    for var, value in _optimizer_assignments(optimizer, model, params, name_map, strict):
        var.assign(value)


def from_tf_save(dense: Mapping) -> dict:
    """The dense section of a checkpoint written by ``dualemb.tf.saving.save`` (``de.save``), in
    this module's names.

    ``de.save`` names a Keras model's weights ``model/<variable.path>`` and its optimizer's
    variables ``optimizer/<variable.path>`` (e.g. ``optimizer/adam/dlrm_fc0_kernel_momentum``).
    This strips the ``model/`` prefix and the model's name, translates the Keras leaf names of
    the table in the module docstring by name alone (``embeddings``, ``gamma``, ``beta``,
    ``moving_mean``, ``moving_variance``), drops dynamic embedding anchors (empty weights),
    turns ``<optimizer>/iteration`` into ``optimizer/step`` and each slot of a weight into
    ``optimizer/<name>/<slot>``; other optimizer variables (the learning rate) are left out.
    The result loads into a Flax model with :func:`dict_to_flax` and :func:`dict_to_adam_state`.
    """
    model = {k[len("model/"):]: v for k, v in dense.items() if k.startswith("model/")}
    model = {p: v for p, v in model.items() if 0 not in np.shape(v)}
    firsts = {p.split("/", 1)[0] for p in model}
    strip = len(firsts) == 1 and all("/" in p for p in model)
    out: dict = {}
    refs: dict = {}
    for path, value in model.items():
        parts = (path.split("/", 1)[1] if strip else path).split("/")
        parts[-1] = _LEAF_BY_NAME.get(parts[-1], parts[-1])
        name = "/".join(parts)
        out[name] = np.asarray(value)
        refs[path.replace("/", "_")] = name
    for key, value in dense.items():
        if not key.startswith(OPTIMIZER_PREFIX):
            continue
        _, _, rest = key[len(OPTIMIZER_PREFIX):].partition("/")
        if rest == "iteration":
            out[STEP] = np.asarray(int(np.asarray(value)), np.int64)
            continue
        for ref, name in refs.items():
            for slot in _KERAS_SLOTS:
                if rest == f"{ref}_{slot}":
                    out[f"{OPTIMIZER_PREFIX}{name}/{_SLOT_SHORT.get(slot, slot)}"] = \
                        np.asarray(value)
    return out


# ---- Flax --------------------------------------------------------------------------------------

def _is_flax(tree) -> bool:
    """An nnx.Module or nnx.State (anything else that is a Mapping is a plain nested dict)."""
    return type(tree).__module__.startswith("flax.") or not isinstance(tree, Mapping)


def _to_pure(state) -> dict:
    from flax import nnx
    if hasattr(nnx, "to_pure_dict"):
        return nnx.to_pure_dict(state)
    return state.to_pure_dict()  # pragma: no cover - older Flax


def _replace_pure(state, pure: dict) -> None:
    from flax import nnx
    if hasattr(nnx, "replace_by_pure_dict"):
        nnx.replace_by_pure_dict(state, pure)
    else:  # pragma: no cover - older Flax
        state.replace_by_pure_dict(pure)


def _flax_pure(tree, filter_=None) -> dict:
    """A nested dict of arrays from an nnx.Module, an nnx.State or a nested dict."""
    if not _is_flax(tree):
        return dict(tree)
    from flax import nnx
    if isinstance(tree, nnx.Module):
        tree = nnx.state(tree, filter_ if filter_ is not None else nnx.Param)
    return _to_pure(tree)


def flax_params_to_dict(tree, *, name_map: NameMap = None, filter=None) -> dict:
    """``{name: np.ndarray}`` of a Flax model's parameters. ``tree`` is an ``nnx.Module`` (its
    ``nnx.Param`` state, or the state ``filter`` selects, e.g. ``nnx.Variable`` to include batch
    statistics), an ``nnx.State`` or a nested dict of arrays (``nnx.to_pure_dict(state)``)."""
    out = {}
    for name, value in flatten(_flax_pure(tree, filter)).items():
        new = _flax_rename(name_map, name)
        if new is not None:
            out[new] = np.asarray(value)
    return out


def dict_to_flax(template, params: Mapping, *, name_map: NameMap = None, strict: bool = True,
                 filter=None):
    """Puts ``params`` (name -> array) into a Flax model.

    ``template`` is an ``nnx.Module`` (updated in place and returned), an ``nnx.State`` (a new
    State is returned) or a nested dict (a new nested dict of ``jax.Array`` is returned). Names
    are matched as :func:`flax_params_to_dict` makes them; shapes must match exactly and dtypes
    are cast to the template's. With ``strict``, the names must match both ways (entries under
    ``optimizer/`` aside). Nothing is changed unless everything matches.
    """
    import jax.numpy as jnp

    pure = _flax_pure(template, filter)
    flat = flatten(pure)
    renamed = {}
    for name in flat:
        new = _flax_rename(name_map, name)
        if new is not None:
            renamed[new] = name
    plain = {k: v for k, v in params.items() if not k.startswith(OPTIMIZER_PREFIX)}
    if strict:
        missing = sorted(set(renamed) - set(plain))
        extra = sorted(set(plain) - set(renamed))
        if missing or extra:
            raise KeyError(f"parameters do not match the Flax model: missing {missing}, "
                           f"unknown {extra}")
    new_flat = dict(flat)
    for name, path in renamed.items():
        if name not in plain:
            continue
        value = np.asarray(plain[name])
        _check_shape(name, value.shape, np.shape(flat[path]))
        new_flat[path] = jnp.asarray(value, dtype=jnp.asarray(flat[path]).dtype)
    new_pure = unflatten(new_flat)
    if not _is_flax(template):
        return new_pure
    from flax import nnx
    if isinstance(template, nnx.Module):
        state = nnx.state(template, filter if filter is not None else nnx.Param)
        _replace_pure(state, new_pure)
        nnx.update(template, state)
        return template
    import jax
    state = jax.tree_util.tree_map(lambda x: x, template)  # a new State of the same structure
    _replace_pure(state, new_pure)
    return state


# ---- the state of dualemb.jax.keras_optax.keras_adam, by name -----------------------------------

def adam_state_to_dict(state, *, name_map: NameMap = None) -> dict:
    """``{"optimizer/<name>/m": ..., "optimizer/<name>/v": ..., "optimizer/step": int64}`` of a
    :func:`keras_adam` state whose moments are nested dicts or ``nnx.State``."""
    out = {}
    for slot, tree in (("m", state.m), ("v", state.v)):
        for name, value in flax_params_to_dict(tree, name_map=name_map).items():
            out[f"{OPTIMIZER_PREFIX}{name}/{slot}"] = value
    out[STEP] = np.asarray(int(np.asarray(state.count)), np.int64)
    return out


def dict_to_adam_state(params: Mapping, template, *, name_map: NameMap = None):
    """A :func:`keras_adam` state from a dict written by :func:`keras_optimizer_to_dict` (Keras'
    Adam) or :func:`adam_state_to_dict`; ``template`` is the parameters whose structure the
    moments take: a nested dict (moments are nested dicts), an ``nnx.State`` or an
    ``nnx.Module`` (moments are ``nnx.State`` of its ``nnx.Param``). Every ``m``/``v`` entry
    must be present."""
    import jax.numpy as jnp

    if _is_flax(template):
        from flax import nnx
        if isinstance(template, nnx.Module):
            template = nnx.state(template, nnx.Param)
    pure = _flax_pure(template)
    names = {_flax_rename(name_map, n): n for n in flatten(pure)}
    names.pop(None, None)
    moments = []
    for slot in ("m", "v"):
        sub = {}
        for name in names:
            key = f"{OPTIMIZER_PREFIX}{name}/{slot}"
            if key not in params:
                raise KeyError(f"optimizer state {key!r} missing from the dict")
            sub[name] = params[key]
        moments.append(dict_to_flax(template, sub, name_map=name_map))
    if STEP not in params:
        raise KeyError(f"{STEP!r} missing from the dict")
    from dualemb.jax.keras_optax import KerasAdamState
    count = jnp.asarray(int(np.asarray(params[STEP])), jnp.int32)
    return KerasAdamState(count, moments[0], moments[1])

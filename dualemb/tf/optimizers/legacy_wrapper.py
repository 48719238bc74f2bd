"""``DynamicEmbeddingOptimizer`` for tf_keras (Keras 2) and ``tf.compat.v1.train`` optimizers.

``wrap(optimizer, api)`` makes such an optimizer train dynamic embeddings too, so that the import
is the only line of TFRA code to change. Unlike the Keras 3 wrapper (``keras_wrapper.py``) it
**changes the optimizer it is given** and returns it (as TFRA does; a tf_keras ``model.compile``
needs a tf_keras optimizer instance): the instance's class becomes a subclass of its own class
(same ``__name__``; no other instance or class touched) whose ``apply_gradients`` runs the core's
fused optimizer on the anchors' rows (``row_update.py``), then hands the dense gradients to the
original ``apply_gradients``.

Contract: the fused update is the same optimizer, with its hyper-parameters, current learning
rate and step, only where the core computes exactly what the wrapped optimizer computes on a
dense variable (tests/tf/test_tf_legacy_optimizers.py); any other optimizer or option raises
``TypeError`` / ``NotImplementedError`` when wrapped, naming what is supported (``SUPPORTED``;
docs/tf.md, "Keras 2 (tf_keras) and TF1 code", lists them, and the three legacy formulas the
core takes as hyper-parameters). The step is ``iterations + 1`` for tf_keras optimizers; TF1 ones get
a counter of their own (``dualemb_step``). A step with embedding gradients only advances
``iterations`` itself (tf_keras skips an empty step; TF1 refuses one).
"""

from __future__ import annotations

import re
import sys

import tensorflow as tf

from dualemb.tf import keras_adapter
from dualemb.tf.optimizers import row_update
from dualemb.tf.trainable import TrainableWrapper, anchor_holding, anchor_params, is_anchor

_V1 = tf.compat.v1.train

# Hyper-parameters of the Keras-flavoured core optimizers, read from tf_keras optimizers under the
# same names as Keras 3 uses (tf_keras' new optimizers are what Keras 3's were ported from).
_KERAS_HYPER = {
    "AdamW": ("adamw", ("beta_1", "beta_2", "epsilon", "amsgrad")),
    "Adam": ("adam", ("beta_1", "beta_2", "epsilon", "amsgrad")),
    "Nadam": ("nadam", ("beta_1", "beta_2", "epsilon")),
    "Adamax": ("adamax", ("beta_1", "beta_2", "epsilon")),
    "Adagrad": ("adagrad", ("initial_accumulator_value", "epsilon")),
    "Adadelta": ("adadelta", ("rho", "epsilon")),
    "RMSprop": ("rmsprop", ("rho", "momentum", "epsilon", "centered")),
    "SGD": ("sgd", ("momentum", "nesterov")),
    "Ftrl": ("ftrl", ("learning_rate_power", "initial_accumulator_value",
                      "l1_regularization_strength", "l2_regularization_strength",
                      "l2_shrinkage_regularization_strength", "beta")),
    "Lion": ("lion", ("beta_1", "beta_2")),
}
# Legacy (OptimizerV2) optimizers: Keras 3's hyper-parameters; ``_KerasTwoLegacy.spec`` adds
# the core's options for those whose formula differs (Adagrad, RMSprop, Nadam).
_LEGACY_HYPER = {k: _KERAS_HYPER[k] for k in ("Adam", "SGD", "Adagrad", "Adamax", "Adadelta",
                                               "Ftrl", "Nadam", "RMSprop")}
# Modules of OptimizerV2 classes: tf_keras' legacy optimizers, and TF's own old copy of Keras
# (tensorflow.python.keras, which TFRA's tests use).
_LEGACY_MODULES = ("tf_keras.src.optimizers.legacy.", "tensorflow.python.keras.optimizer_v2.")

SUPPORTED = ("tf_keras.optimizers." + "/".join(_KERAS_HYPER) + ", tf_keras.optimizers.legacy."
             + "/".join(_LEGACY_HYPER) + ", tf.compat.v1.train.GradientDescentOptimizer/"
             "AdamOptimizer/AdagradOptimizer")


def _number(name, value):
    if isinstance(value, bool):
        return value
    if isinstance(value, tf.Variable):  # legacy tf_keras hyper-parameters, also when traced
        with tf.init_scope():
            value = value.numpy()
    try:
        return float(value)  # a number, numpy scalar or eager tensor
    except (TypeError, ValueError) as e:
        raise TypeError(f"optimizer hyper-parameter {name}={value!r} must be a number to run in "
                        "the core's fused optimizer") from e


def _tf_keras_optimizers():
    """``tf_keras.optimizers`` if tf_keras is loaded (an instance of one of its optimizers
    implies it is), else None."""
    return sys.modules["tf_keras"].optimizers if "tf_keras" in sys.modules else None


def _family(table, module, optimizer):
    """(class name, core name, hyper-parameter names) of the first class of ``module`` named in
    ``table`` that ``optimizer`` is an instance of (``table`` is ordered most specific first)."""
    for class_name, (core, hyper) in table.items():
        cls = getattr(module, class_name, None)
        if cls is not None and isinstance(optimizer, cls):
            return class_name, core, hyper
    return None


def _is_optimizer_v2(optimizer) -> bool:
    return any(cls.__name__ == "OptimizerV2" and cls.__module__.startswith(_LEGACY_MODULES)
               for cls in type(optimizer).__mro__)


def _legacy_family(optimizer):
    """(class name, core name, hyper-parameter names) of an OptimizerV2 whose class (or a base)
    is one of ``_LEGACY_HYPER``'s in a legacy module, else None."""
    for cls in type(optimizer).__mro__:
        if cls.__name__ in _LEGACY_HYPER and cls.__module__.startswith(_LEGACY_MODULES):
            core, hyper = _LEGACY_HYPER[cls.__name__]
            return cls.__name__, core, hyper
    return None


class _Api:
    """How one optimizer API exposes the learning rate, the step and the hyper-parameters."""

    def spec(self, optimizer) -> dict:
        raise NotImplementedError

    def learning_rate(self, optimizer):
        raise NotImplementedError

    def step(self, optimizer):
        """int64 step of this update (1-based)."""
        return tf.cast(optimizer.iterations, tf.int64) + 1

    def advance(self, optimizer, dense_applied: bool):
        """Counts the step. The original ``apply_gradients`` counts it in ``iterations`` when it
        was called (``dense_applied``)."""
        if not dense_applied:
            optimizer.iterations.assign_add(1)

    def weight_decay(self, optimizer, anchor) -> float:
        return 0.0


def _keras_spec(optimizer, core, hyper):
    spec = {"name": core, "flavor": "keras"}
    for key in hyper:
        spec[key] = _number(key, getattr(optimizer, key))
    return spec


def _refuse_clipping(optimizer):
    for option in ("clipnorm", "clipvalue", "global_clipnorm"):
        if getattr(optimizer, option, None) is not None:
            raise NotImplementedError(
                f"DynamicEmbeddingOptimizer does not support {option} on a tf_keras optimizer; "
                "use a Keras 3 optimizer (keras.optimizers.*), whose wrapper clips embedding "
                "gradients too")


class _KerasTwo(_Api):
    """tf_keras' optimizers (``tf_keras.optimizers.Optimizer``)."""

    def __init__(self, family):
        self.family = family

    def check(self, optimizer):
        _refuse_clipping(optimizer)
        if getattr(optimizer, "gradient_accumulation_steps", None):
            raise NotImplementedError("gradient accumulation is not supported")

    def spec(self, optimizer):
        _, core, hyper = self.family
        spec = _keras_spec(optimizer, core, hyper)
        if core == "adamw":  # the core's adamw takes Keras' weight decay itself
            spec["weight_decay"] = _number("weight_decay", optimizer.weight_decay or 0.0)
        return spec

    def learning_rate(self, optimizer):
        lr = keras_adapter.learning_rate_setting(optimizer)
        if callable(lr):  # a LearningRateSchedule, evaluated where tf_keras evaluates it
            lr = lr(optimizer.iterations)
        return tf.cast(lr, tf.float32)

    def weight_decay(self, optimizer, anchor):
        if self.family[1] == "adamw" or optimizer.weight_decay is None:
            return 0.0
        if isinstance(anchor, tf.Variable):  # a tf_keras layer's anchor
            if not keras_adapter.uses_weight_decay(optimizer, anchor):
                return 0.0
        elif any(re.search(name, anchor.name) for name in
                 keras_adapter.tf_keras_weight_decay_excluded_names(optimizer)):
            return 0.0  # (tf_keras cannot key a Keras 3 variable: only names can exclude it)
        return _number("weight_decay", optimizer.weight_decay)


class _KerasTwoLegacy(_Api):
    """tf_keras' legacy optimizers (``OptimizerV2``)."""

    def __init__(self, family):
        self.family = family

    def check(self, optimizer):
        _refuse_clipping(optimizer)

    def spec(self, optimizer):
        class_name, core, hyper = self.family
        spec = {"name": core, "flavor": "keras"}
        for key in hyper:
            value = getattr(optimizer, key, None)  # a hyper (variable) or a public attribute
            if value is None:  # kept private (Ftrl's initial_accumulator_value, ...)
                value = keras_adapter.legacy_private_hyper(optimizer, key)
            spec[key] = _number(key, value)
        if class_name == "Adagrad":
            # TF's ResourceApplyAdagradV2: w -= lr*g / (sqrt(a) + epsilon)
            spec["epsilon_in_sqrt"] = False
        elif class_name == "RMSprop":
            # Without momentum OptimizerV2 computes w -= lr*g / (sqrt(v) + epsilon) itself; with
            # momentum TF's ResourceApply(Centered)RMSProp takes sqrt(v + epsilon), as Keras 3.
            spec["epsilon_in_sqrt"] = keras_adapter.legacy_has_momentum(optimizer)
        elif class_name == "Nadam":
            # Momentum schedule beta_1*(1 - 0.5*0.96^(schedule_decay*t)); OptimizerV2 keeps
            # schedule_decay (0.004 by default) as its ``decay``.
            spec["schedule_decay"] = _number("schedule_decay",
                                              keras_adapter.legacy_initial_decay(optimizer))
        return spec

    def learning_rate(self, optimizer):
        if self.family[0] == "Nadam":  # its _prepare_local reads the learning rate undecayed
            return tf.cast(keras_adapter.legacy_hyper(optimizer, "learning_rate", tf.float32),
                           tf.float32)
        return tf.cast(keras_adapter.legacy_decayed_learning_rate(optimizer, tf.float32),
                       tf.float32)

    def advance(self, optimizer, dense_applied):
        m_cache = keras_adapter.legacy_nadam_momentum_cache(optimizer) \
            if self.family[0] == "Nadam" else None
        if not dense_applied and m_cache is not None:
            # Nadam's momentum_cache (the product of the schedule's factors) advances with every
            # apply_gradients: an embedding-only step advances it as Nadam would, so that the
            # dense variables' next step sees the cache of their step.
            step = tf.cast(optimizer.iterations + 1, m_cache.dtype)
            beta_1 = keras_adapter.legacy_hyper(optimizer, "beta_1", m_cache.dtype)
            factor = beta_1 * (1.0 - 0.5 * tf.pow(tf.cast(0.96, m_cache.dtype),
                                                  keras_adapter.legacy_initial_decay(optimizer)
                                                  * step))
            m_cache.assign(m_cache * factor)
        super().advance(optimizer, dense_applied)


class _TfV1(_Api):
    """``tf.compat.v1.train`` optimizers, used eagerly or in ``tf.function``."""

    def check(self, optimizer):
        pass

    def spec(self, optimizer):
        if isinstance(optimizer, _V1.AdamOptimizer):
            return {"name": "adam", "flavor": "keras", "amsgrad": False,
                    **{k: _number(k, keras_adapter.tf_v1_value(optimizer, a))
                       for k, a in (("beta_1", "_beta1"), ("beta_2", "_beta2"),
                                    ("epsilon", "_epsilon"))}}
        if isinstance(optimizer, _V1.AdagradOptimizer):
            # TF1: a += g*g; w -= lr*g/sqrt(a) — Keras' Adagrad with epsilon 0.
            return {"name": "adagrad", "flavor": "keras", "epsilon": 0.0,
                    "initial_accumulator_value": _number(
                        "initial_accumulator_value",
                        keras_adapter.tf_v1_value(optimizer, "_initial_accumulator_value"))}
        return {"name": "sgd", "flavor": "keras", "momentum": 0.0, "nesterov": False}

    def learning_rate(self, optimizer):
        attribute = "_lr" if isinstance(optimizer, _V1.AdamOptimizer) else "_learning_rate"
        return tf.cast(keras_adapter.tf_v1_value(optimizer, attribute), tf.float32)

    def _counter(self, optimizer):
        counter = optimizer.__dict__.get("_dualemb_step")
        if counter is None:
            with tf.init_scope():
                counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="dualemb_step")
            optimizer.__dict__["_dualemb_step"] = counter
        return counter

    def step(self, optimizer):
        return self._counter(optimizer) + 1

    def advance(self, optimizer, dense_applied):
        self._counter(optimizer).assign_add(1)  # TF1 optimizers count no steps themselves


# Exactly these TF1 classes (a subclass may change the math).
_TF_V1_CLASSES = (_V1.GradientDescentOptimizer, _V1.AdamOptimizer, _V1.AdagradOptimizer)


def api_of(optimizer):
    """The ``_Api`` of a supported tf_keras or TF1 optimizer, or None if ``optimizer`` is neither
    a tf_keras nor a TF1 optimizer; ``TypeError`` naming what is supported for an unsupported
    one of those."""
    if isinstance(optimizer, _V1.Optimizer):
        if type(optimizer) in _TF_V1_CLASSES:
            return _TfV1()
        raise TypeError(f"DynamicEmbeddingOptimizer cannot wrap {type(optimizer).__name__}: of "
                        f"the TF1 optimizers it wraps GradientDescentOptimizer, AdamOptimizer and "
                        f"AdagradOptimizer (supported: {SUPPORTED})")
    if _is_optimizer_v2(optimizer):
        family = _legacy_family(optimizer)
        if family is None:
            raise TypeError(f"DynamicEmbeddingOptimizer cannot wrap the legacy tf_keras "
                            f"{type(optimizer).__name__} (its math differs from the core's); "
                            f"supported: {SUPPORTED}")
        return _KerasTwoLegacy(family)
    current = _tf_keras_optimizers()
    if current is not None and isinstance(optimizer, current.Optimizer):
        family = _family(_KERAS_HYPER, current, optimizer)
        if family is None:
            raise TypeError(f"DynamicEmbeddingOptimizer cannot wrap tf_keras "
                            f"{type(optimizer).__name__}; supported: {SUPPORTED}")
        return _KerasTwo(family)
    return None


class _RoutesEmbeddings:
    """Mixin over a tf_keras / TF1 optimizer class: embedding gradients to the core."""

    # TF1's and tf_keras' ``minimize`` watch ``var_list`` with a GradientTape, which takes
    # tf.Variables only: a Keras 3 anchor is replaced by the tf.Variable it holds, and back.
    def compute_gradients(self, loss, var_list=None, *args, **kwargs):
        loss, var_list, anchors = _unwrap_anchors(var_list, loss)
        pairs = super().compute_gradients(loss, var_list, *args, **kwargs)
        return [(g, _anchor_or_variable(v, anchors)) for g, v in pairs]

    def _compute_gradients(self, loss, var_list, *args, **kwargs):  # legacy tf_keras
        loss, var_list, anchors = _unwrap_anchors(var_list, loss)
        pairs = super()._compute_gradients(loss, var_list, *args, **kwargs)
        return [(g, _anchor_or_variable(v, anchors)) for g, v in pairs]

    @tf.autograph.experimental.do_not_convert  # Python control flow over Python objects
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        pairs = list(grads_and_vars)
        groups, dense = {}, []
        for grad, var in pairs:
            if not is_anchor(var):
                dense.append((grad, var))
                continue
            if grad is None:
                continue
            params = anchor_params(var)
            group = groups.get(id(params))
            if group is None:
                group = groups[id(params)] = row_update.Group(params)
            group.add(var, grad)
        if groups:
            self._dualemb_apply(list(groups.values()))
        result = super().apply_gradients(dense, *args, **kwargs) if dense or not groups \
            else None
        self._dualemb_api.advance(self, bool(dense) or not groups)
        return result

    def _dualemb_apply(self, groups):
        api = self._dualemb_api
        learning_rate = api.learning_rate(self)
        step = api.step(self)
        for group in groups:
            group.finish()
            spec = api.spec(self)
            decay = api.weight_decay(self, group.wrappers[0])
            if decay:  # decoupled, before the update, inside the core's keras-flavor step
                spec = {**spec, "weight_decay": decay}
            group.params.router.attach_optimizer(spec, self)
        row_update.fused_steps(groups, learning_rate, step)


def _unwrap_anchors(var_list, loss=None):
    """(loss, ``var_list`` with each Keras 3 anchor replaced by the tf.Variable it holds, and a
    dict from that tf.Variable's id to the anchor). A callable ``var_list`` (TF1 / legacy Keras
    accept one) is wrapped: the dict fills when it is called. With a callable ``loss`` and a
    list ``var_list``, the list is read after the loss ran, as TF1 and legacy Keras read it
    (code that fills ``var_list`` with the lookup's ``return_trainable`` inside the loss relies
    on it; a copy taken before would be empty and the step would silently train nothing)."""
    anchors = {}

    def unwrap(variables):
        out = []
        for v in tf.nest.flatten(variables):
            if isinstance(v, TrainableWrapper):
                held = v.value  # the tf.Variable a Keras 3 variable holds (TF backend)
                anchors[id(held)] = v
                v = held
            out.append(v)
        return out

    if var_list is None:
        return loss, None, anchors
    if callable(var_list):
        return loss, (lambda: unwrap(var_list())), anchors
    if callable(loss) and isinstance(var_list, list):
        unwrapped = []  # the list the optimizer sees: filled in place once the loss has run

        def loss_then_var_list():
            value = loss()
            unwrapped[:] = unwrap(var_list)
            return value

        return loss_then_var_list, unwrapped, anchors
    return loss, unwrap(var_list), anchors


def _anchor_or_variable(variable, anchors):
    anchor = anchors.get(id(variable))
    if anchor is None:
        anchor = anchor_holding(variable)
    return variable if anchor is None else anchor


_ROUTED = {}


def _routed_class(cls):
    routed = _ROUTED.get(cls)
    if routed is None:
        # Same name and module as the original: tf_keras serializes the optimizer by them, and
        # a reloaded model then gets the plain optimizer (wrap it again to train embeddings).
        routed = type(cls.__name__, (_RoutesEmbeddings, cls),
                      {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                       "__doc__": cls.__doc__})
        _ROUTED[cls] = routed
    return routed


def is_routed(optimizer) -> bool:
    return isinstance(optimizer, _RoutesEmbeddings)


def wrap(optimizer, api):
    """Makes ``optimizer`` (whose ``_Api`` is ``api``) route embedding gradients; returns it."""
    if is_routed(optimizer):
        return optimizer
    api.check(optimizer)
    api.spec(optimizer)  # hyper-parameters the core cannot take fail now, not at the first step
    optimizer.__class__ = _routed_class(type(optimizer))
    optimizer.__dict__["_dualemb_api"] = api
    return optimizer

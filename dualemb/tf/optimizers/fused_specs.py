"""Keras 3 optimizer -> the core's fused optimizer spec (``flavor="keras"``).

The core implements each optimizer exactly as Keras 3 defines it, under Keras' own argument names
(``csrc/core/optimizers/``), so the mapping only copies hyper-parameters from the optimizer's
``get_config()``. The learning rate and the step are not part of the spec: they are passed with
every update, so learning-rate schedules work.

Weight decay (Keras' generic ``weight_decay`` of every optimizer: ``w -= w * weight_decay * lr``
before the update) runs inside the core's fused step: ``AdamW``, and ``Adam`` given a
``weight_decay`` (the same thing in Keras), as the core's ``adamw``; every other optimizer with
``weight_decay`` in its keras-flavor spec (one core call per step, no extra read and write).
"""

from __future__ import annotations

import numbers

import keras

# Keras class, core name, hyper-parameters the core reads (Keras' names). Most specific first.
FAMILIES = (
    (keras.optimizers.AdamW, "adamw", ("beta_1", "beta_2", "epsilon", "amsgrad")),
    (keras.optimizers.Adam, "adam", ("beta_1", "beta_2", "epsilon", "amsgrad")),
    (keras.optimizers.Nadam, "nadam", ("beta_1", "beta_2", "epsilon")),
    (keras.optimizers.Adamax, "adamax", ("beta_1", "beta_2", "epsilon")),
    (keras.optimizers.Adagrad, "adagrad", ("initial_accumulator_value", "epsilon")),
    (keras.optimizers.Adadelta, "adadelta", ("rho", "epsilon")),
    (keras.optimizers.RMSprop, "rmsprop", ("rho", "momentum", "epsilon", "centered")),
    (keras.optimizers.SGD, "sgd", ("momentum", "nesterov")),
    (keras.optimizers.Ftrl, "ftrl", ("learning_rate_power", "initial_accumulator_value",
                                     "l1_regularization_strength", "l2_regularization_strength",
                                     "l2_shrinkage_regularization_strength", "beta")),
    (keras.optimizers.Lion, "lion", ("beta_1", "beta_2")),
)

SUPPORTED_NAMES = ", ".join(f"keras.optimizers.{cls.__name__}" for cls, _, _ in FAMILIES)


def family_of(optimizer):
    """(Keras base class, core name, hyper-parameter names) of a supported Keras 3 optimizer;
    TypeError naming the supported ones otherwise."""
    if isinstance(optimizer, type):
        raise TypeError(f"DynamicEmbeddingOptimizer takes an optimizer instance, got the class "
                        f"{optimizer.__name__}; it wraps instances of {SUPPORTED_NAMES}")
    for family in FAMILIES:
        if isinstance(optimizer, family[0]):
            return family
    raise TypeError(
        f"DynamicEmbeddingOptimizer cannot wrap {type(optimizer).__module__}."
        f"{type(optimizer).__name__}: it wraps Keras 3 optimizers ({SUPPORTED_NAMES}, or their "
        "subclasses, or a LossScaleOptimizer around one), some tf_keras and tf.compat.v1.train "
        "optimizers (see dualemb/tf/optimizers/legacy_wrapper.py); other optimizers (Lamb, "
        "Adafactor, Muon, ...) are not supported")


def _number(name, value):
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Real):
        return float(value)
    try:  # a tensor / variable / numpy scalar
        return float(value)
    except (TypeError, ValueError) as e:
        raise TypeError(f"optimizer hyper-parameter {name}={value!r} must be a number to run in "
                        "the core's fused optimizer") from e


def weight_decay_of(optimizer) -> float:
    wd = optimizer.weight_decay
    return 0.0 if wd is None else _number("weight_decay", wd)


def fused_spec(optimizer, decay: bool) -> dict:
    """The core spec dict for ``optimizer`` training one variable; ``decay`` says whether Keras
    would decay that variable."""
    _, name, hyper = family_of(optimizer)
    spec = {"name": name, "flavor": "keras"}
    for key in hyper:
        spec[key] = _number(key, getattr(optimizer, key))
    wd = weight_decay_of(optimizer) if decay else 0.0
    if name in ("adam", "adamw"):
        if wd > 0.0:
            return {"name": "adamw", "flavor": "keras", "weight_decay": wd,
                    **{k: v for k, v in spec.items() if k not in ("name", "flavor")}}
        spec["name"] = "adam"
        return spec
    if wd > 0.0:  # decoupled, before the update, inside the core's step
        spec["weight_decay"] = wd
    return spec

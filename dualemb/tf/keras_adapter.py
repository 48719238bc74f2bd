"""Every private attribute of Keras 3, tf_keras, TF1 optimizers and TF's strategies that dualemb
reads, in one place: a framework upgrade that renames one fails here, loudly, and in
tests/tf/test_tf_keras_adapter.py, which checks each name in ``PINNED`` on the installed Keras 3,
tf_keras and TensorFlow.

Each function below is the only reader of its attribute; its callers (``optimizers/``,
``saving/``, ``distribute/``) never touch a framework's private names themselves. Nothing is
patched: these are reads (and one ``assign_add`` on Keras' own step counter).
"""

from __future__ import annotations

# What each function reads, by the object it reads it from; the test instantiates each kind.
PINNED = {
    "keras3_optimizer": ("_get_current_learning_rate", "_iterations", "_learning_rate",
                         "_clip_by_norm", "_clip_gradients", "_use_weight_decay",
                         "_trainable_variables"),
    "keras3_layer": ("_trainable_variables", "_non_trainable_variables", "_flatten_layers"),
    "tf_keras_optimizer": ("_learning_rate", "_use_weight_decay",
                           "_exclude_from_weight_decay_names"),
    "tf_keras_legacy_optimizer": ("_get_hyper", "_decayed_lr", "_initial_decay"),
    "tf_keras_legacy_rmsprop": ("_momentum",),
    "tf_keras_legacy_nadam": ("_m_cache",),  # after its first step
    "tf_v1_optimizer": ("_call_if_callable",),
    "tf_v1_adam": ("_lr", "_beta1", "_beta2", "_epsilon"),
    "tf_v1_sgd": ("_learning_rate",),
    "tf_v1_adagrad": ("_learning_rate", "_initial_accumulator_value"),
    "parameter_server_strategy": ("_is_parameter_server_strategy_v2", "_cluster_resolver"),
    "mirrored_strategy_extended": ("_communication_options",),
}


# ---- Keras 3 optimizers ----------------------------------------------------------------------
def current_learning_rate(optimizer):
    """The learning rate of the coming step (a schedule evaluated at ``iterations``)."""
    return optimizer._get_current_learning_rate()


def step_counter(optimizer):
    """The optimizer's own ``iterations`` variable (assignable; the public property of a
    wrapper may forward elsewhere)."""
    return optimizer._iterations


def learning_rate_setting(optimizer):
    """The learning rate as set: a ``LearningRateSchedule``, a variable or a number."""
    return optimizer._learning_rate


def clip_by_norm(optimizer, values):
    """``values`` clipped to the optimizer's ``clipnorm``, as Keras clips one gradient."""
    return optimizer._clip_by_norm(values)


def clip_gradients(optimizer, grads):
    """``grads`` clipped by the optimizer's ``clipnorm`` / ``clipvalue``, as Keras does."""
    return optimizer._clip_gradients(grads)


def uses_weight_decay(optimizer, variable) -> bool:
    """Whether the optimizer's ``weight_decay`` applies to ``variable`` (Keras 3 and tf_keras:
    ``exclude_from_weight_decay`` honored)."""
    return optimizer._use_weight_decay(variable)


def built_trainable_variables(optimizer) -> list:
    """The variables a built Keras 3 optimizer was built with."""
    return optimizer._trainable_variables


# ---- Keras 3 layers and models ---------------------------------------------------------------
def layer_own_variables(layer) -> list:
    """The variables a Keras 3 layer tracks itself (not its sublayers'), trainable first."""
    return list(layer._trainable_variables) + list(layer._non_trainable_variables)


def sublayers(layer) -> list:
    """Every layer under ``layer`` (recursively, itself excluded)."""
    return list(layer._flatten_layers(include_self=False, recursive=True))


# ---- tf_keras (Keras 2) optimizers -----------------------------------------------------------
def tf_keras_weight_decay_excluded_names(optimizer) -> list:
    """The name patterns ``exclude_from_weight_decay(var_names=...)`` recorded."""
    return getattr(optimizer, "_exclude_from_weight_decay_names", None) or []


# tf_keras' legacy optimizers (OptimizerV2) and TF's old copy of them.
def legacy_hyper(optimizer, name: str, dtype=None):
    """Hyper-parameter ``name`` as the optimizer's step reads it (a tensor)."""
    return optimizer._get_hyper(name, dtype)


def legacy_decayed_learning_rate(optimizer, dtype):
    """The learning rate after OptimizerV2's ``decay`` and schedule, at ``iterations``."""
    return optimizer._decayed_lr(dtype)


def legacy_initial_decay(optimizer):
    """OptimizerV2's ``decay`` (Nadam's ``schedule_decay``)."""
    return optimizer._initial_decay


def legacy_has_momentum(optimizer) -> bool:
    """Whether a legacy RMSprop runs with momentum (it then takes TF's fused kernel)."""
    return bool(optimizer._momentum)


def legacy_private_hyper(optimizer, name: str):
    """A hyper-parameter OptimizerV2 keeps as ``_<name>`` only (Ftrl's
    ``initial_accumulator_value``, ...)."""
    return getattr(optimizer, "_" + name)


def legacy_nadam_momentum_cache(optimizer):
    """Legacy Nadam's running product of momentum factors (None before its first step)."""
    return getattr(optimizer, "_m_cache", None)


# ---- tf.compat.v1.train optimizers -----------------------------------------------------------
def tf_v1_value(optimizer, attribute: str):
    """A TF1 optimizer's setting ``attribute`` (``_lr``, ``_learning_rate``, ``_beta1``, ...),
    called if it is a callable, as TF1 reads it at each step."""
    return optimizer._call_if_callable(getattr(optimizer, attribute))


# ---- TF distribution -------------------------------------------------------------------------
def is_parameter_server_strategy(strategy) -> bool:
    """Whether ``strategy`` is a TF2 ``ParameterServerStrategy`` (TF has no public test)."""
    return bool(getattr(strategy, "_is_parameter_server_strategy_v2", False))


def communication_timeout(strategy) -> float:
    """The ``CommunicationOptions(timeout_seconds=...)`` a (Multi)MirroredStrategy was made with,
    in seconds; 0 when none was set."""
    options = getattr(strategy.extended, "_communication_options", None)
    return float(getattr(options, "timeout_seconds", None) or 0)


def strategy_cluster_resolver(strategy):
    """The cluster resolver a ``ParameterServerStrategy`` was made with (its public
    ``cluster_resolver`` is None)."""
    return strategy._cluster_resolver

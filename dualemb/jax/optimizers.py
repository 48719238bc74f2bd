"""Optimizers for dynamic tables, named and parameterised like Optax's.

Each function returns an :class:`Optimizer`: a hashable description (static under ``jit``) of
an Optax optimizer that the table core runs fused, with Optax's math (``flavor="optax"``), its
slots stored beside each row. ``learning_rate`` is a number or an Optax schedule
(``step -> lr``); :func:`dualemb.jax.apply_gradients` evaluates it on the table's step count
inside the jitted step and passes it to the core as an operand, exactly as
``optax.scale_by_learning_rate`` does (the first update uses ``schedule(0)``).

A learning rate changed between steps without recompiling: :func:`inject_hyperparams`, as
Optax's (``inject_hyperparams(adam)(learning_rate=1e-3)``; the value lives in the table's
pytree, :func:`hyperparams` reads it and :func:`set_hyperparams` changes it).

Any other ``optax.GradientTransformation`` runs on the generic path (see
:mod:`dualemb.jax.generic`): pass it wherever an optimizer is accepted, or wrap it with
:func:`from_optax`. Arguments the core does not fuse take the generic path by themselves:
``mu_dtype`` (``adam``, ``adamw``, ``nadam``, ``nadamw``, ``amsgrad``, ``lion``) and ``sgd``'s
``accumulator_dtype`` other than float32 return :func:`from_optax` of the same Optax optimizer,
whose moment rows are then stored in that dtype. ``mask`` / ``weight_decay_mask`` take a bool
(a table is one parameter: ``True`` decays its rows, ``False`` does not); a callable mask is
refused with ``TypeError`` (it selects leaves of a parameter pytree, and a table is not one).
``weight_decay`` must be a number. docs/jax.md lists every fused optimizer with its Optax and
Keras counterparts.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import numbers
from typing import Any, Callable, Union

import jax.numpy as jnp
import numpy as np

Schedule = Callable[[Any], Any]
ScalarOrSchedule = Union[float, Schedule]


@dataclasses.dataclass(frozen=True)
class Injected:
    """A learning rate that lives in the table's pytree (see :func:`inject_hyperparams`): the
    table carries its current value as a float32 leaf, so changing it does not recompile.
    ``initial`` is the value a new table starts with; it takes no part in equality, so tables
    started at different rates share one compiled step."""

    initial: float = dataclasses.field(compare=False)


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """A fused optimizer: the core spec (``name`` + Optax hyper-parameters) and the learning rate.

    Attributes:
      name: the core's optimizer name ("adam", "sgd", ...).
      hyper: the hyper-parameters, as a tuple of (name, value) pairs (Optax's names).
      learning_rate: a float, a schedule called with the (0-based) step count, or
        :class:`Injected` (the value is in the table, see :func:`inject_hyperparams`).
      flavor: whose definition the core computes: "optax" (all but ftrl) or "keras" (ftrl,
        which Optax lacks).
    """

    name: str
    hyper: tuple
    learning_rate: Any
    flavor: str = "optax"

    @property
    def spec(self) -> dict:
        """The spec dict the core takes."""
        return {"name": self.name, "flavor": self.flavor, **dict(self.hyper)}

    @property
    def injected(self) -> bool:
        """Whether the learning rate lives in the table (:func:`inject_hyperparams`)."""
        return isinstance(self.learning_rate, Injected)

    def initial_state(self):
        """What a new table of this optimizer carries in ``opt_state``: the injected learning
        rate (a float32 scalar), else None."""
        if self.injected:
            return (jnp.asarray(self.learning_rate.initial, jnp.float32),)
        return None

    def learning_rate_at(self, count):
        """The learning rate of the update after ``count`` updates (a float32 scalar)."""
        lr = self.learning_rate
        if isinstance(lr, Injected):
            raise TypeError(
                "this optimizer's learning rate is injected (dualemb.jax.optimizers."
                "inject_hyperparams): its value lives in a dualemb.jax.Table's pytree, and this "
                "kind of table (e.g. a sharded table) does not carry it; use a number or a "
                "schedule here")
        return jnp.asarray(lr(count) if callable(lr) else lr, jnp.float32)

    def learning_rate_for(self, table):
        """The learning rate of ``table``'s next update: the injected value it carries, or the
        schedule at its step count."""
        if self.injected:
            state = table.opt_state
            if not state:
                raise ValueError(f"{table!r} has an injected learning rate but carries no "
                                 "value for it (built by hand without opt_state?)")
            return jnp.asarray(state[0], jnp.float32)
        return self.learning_rate_at(table.step)


def _lr(learning_rate) -> ScalarOrSchedule:
    if isinstance(learning_rate, Injected) or callable(learning_rate):
        return learning_rate
    if isinstance(learning_rate, numbers.Real) and not isinstance(learning_rate, bool):
        return float(learning_rate)
    if hasattr(learning_rate, "shape") and getattr(learning_rate, "shape", None) == ():
        return float(learning_rate)
    raise TypeError(f"learning_rate must be a number or an Optax schedule, got {learning_rate!r}")


def _num(name, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        if not (hasattr(value, "shape") and value.shape == ()):
            raise TypeError(f"{name} must be a number, got {value!r}")
    return float(value)


def _make(name: str, learning_rate, flavor: str = "optax", **hyper) -> Optimizer:
    items = []
    for k, v in hyper.items():
        items.append((k, bool(v) if isinstance(v, bool) else _num(k, v)))
    return Optimizer(name, tuple(items), _lr(learning_rate), flavor)


def _is_float32(dtype) -> bool:
    return dtype is None or jnp.dtype(dtype) == jnp.float32


def _optax_generic(optax_name: str, **args):
    """The generic path running ``optax.<optax_name>(**args)`` (for arguments the core does not
    fuse); an :class:`Injected` learning rate becomes Optax's own ``inject_hyperparams``."""
    import optax
    factory = getattr(optax, optax_name)
    lr = args.get("learning_rate")
    if isinstance(lr, Injected):
        tx = optax.inject_hyperparams(factory)(**{**args, "learning_rate": lr.initial})
    else:
        tx = factory(**args)
    return from_optax(tx)


def _decay(weight_decay, mask, mask_name: str = "mask") -> float:
    """The weight decay a table gets under Optax's ``mask``: a table is one parameter."""
    if mask is None or mask is True or (isinstance(mask, np.bool_) and bool(mask)):
        return weight_decay
    if mask is False or isinstance(mask, np.bool_):
        return 0.0
    raise TypeError(
        f"{mask_name}={mask!r}: a mask selects leaves of a parameter pytree, and a dynamic table "
        f"is one parameter: pass {mask_name}=True (decay its rows) or {mask_name}=False (do not), "
        "and keep the callable for the dense parameters' optimizer")


def sgd(learning_rate: ScalarOrSchedule, momentum: float | None = None,
        nesterov: bool = False, accumulator_dtype=None) -> Optimizer:
    """optax.sgd: ``w -= lr * g``; with ``momentum``: ``t = g + momentum * t`` and
    ``w -= lr * t`` (Nesterov: ``w -= lr * (g + momentum * t)``). Slot: ``trace``.
    ``accumulator_dtype`` other than float32: the generic path."""
    if not _is_float32(accumulator_dtype):
        return _optax_generic("sgd", learning_rate=learning_rate, momentum=momentum,
                              nesterov=nesterov, accumulator_dtype=accumulator_dtype)
    return _make("sgd", learning_rate, momentum=0.0 if momentum is None else momentum,
                 nesterov=bool(nesterov))


def adagrad(learning_rate: ScalarOrSchedule, initial_accumulator_value: float = 0.1,
            eps: float = 1e-7) -> Optimizer:
    """optax.adagrad: ``s += g**2``; ``w -= lr * g / sqrt(s + eps)``."""
    return _make("adagrad", learning_rate, initial_accumulator_value=initial_accumulator_value,
                 eps=eps)


def adam(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
         eps: float = 1e-8, eps_root: float = 0.0, mu_dtype=None, *,
         nesterov: bool = False) -> Optimizer:
    """optax.adam: ``mu = b1*mu + (1-b1)*g``; ``nu = b2*nu + (1-b2)*g**2``;
    ``w -= lr * mu_hat / (sqrt(nu_hat + eps_root) + eps)`` with bias-corrected hats.
    ``mu_dtype`` other than float32: the generic path."""
    if not _is_float32(mu_dtype):
        return _optax_generic("adam", learning_rate=learning_rate, b1=b1, b2=b2, eps=eps,
                              eps_root=eps_root, mu_dtype=mu_dtype, nesterov=nesterov)
    return _make("adam", learning_rate, b1=b1, b2=b2, eps=eps, eps_root=eps_root,
                 nesterov=bool(nesterov))


def amsgrad(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
            eps: float = 1e-8, eps_root: float = 0.0, mu_dtype=None,
            bias_correction_mu: bool = True, bias_correction_nu: bool = True) -> Optimizer:
    """optax.amsgrad: Adam with ``nu_hat = max(nu_max, nu_hat)`` (slot ``nu_max``).
    ``mu_dtype`` other than float32, or a bias correction turned off: the generic path."""
    if not _is_float32(mu_dtype) or not (bias_correction_mu and bias_correction_nu):
        extra = {}
        if not (bias_correction_mu and bias_correction_nu):  # arguments of newer Optax only
            extra = dict(bias_correction_mu=bias_correction_mu,
                         bias_correction_nu=bias_correction_nu)
        return _optax_generic("amsgrad", learning_rate=learning_rate, b1=b1, b2=b2, eps=eps,
                              eps_root=eps_root, mu_dtype=mu_dtype, **extra)
    return _make("adam", learning_rate, b1=b1, b2=b2, eps=eps, eps_root=eps_root,
                 amsgrad=True)


def adamw(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8, eps_root: float = 0.0, mu_dtype=None, weight_decay: float = 1e-4,
          mask=None, *, nesterov: bool = False) -> Optimizer:
    """optax.adamw: Adam's update plus ``weight_decay * w``, scaled by ``-lr``. ``mask``: a
    bool (see the module docstring). ``mu_dtype`` other than float32: the generic path."""
    if not _is_float32(mu_dtype):
        return _optax_generic("adamw", learning_rate=learning_rate, b1=b1, b2=b2, eps=eps,
                              eps_root=eps_root, mu_dtype=mu_dtype, weight_decay=weight_decay,
                              mask=mask, nesterov=nesterov)
    return _make("adamw", learning_rate, b1=b1, b2=b2, eps=eps, eps_root=eps_root,
                 weight_decay=_decay(weight_decay, mask), nesterov=bool(nesterov))


def nadamw(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
           eps: float = 1e-8, eps_root: float = 0.0, mu_dtype=None,
           weight_decay: float = 1e-4, mask=None) -> Optimizer:
    """optax.nadamw (= optax.adamw(nesterov=True)): NAdam's update plus ``weight_decay * w``,
    scaled by ``-lr``."""
    if not _is_float32(mu_dtype):
        return _optax_generic("nadamw", learning_rate=learning_rate, b1=b1, b2=b2, eps=eps,
                              eps_root=eps_root, mu_dtype=mu_dtype, weight_decay=weight_decay,
                              mask=mask)
    return adamw(learning_rate, b1=b1, b2=b2, eps=eps, eps_root=eps_root,
                 weight_decay=weight_decay, mask=mask, nesterov=True)


def adamax(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
           eps: float = 1e-8) -> Optimizer:
    """optax.adamax: ``mu`` as Adam; ``nu = max(b2*nu, |g|)``;
    ``w -= lr * mu / (1 - b1**t) / (nu + eps)``."""
    return _make("adamax", learning_rate, b1=b1, b2=b2, eps=eps)


def nadam(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8, eps_root: float = 0.0, mu_dtype=None) -> Optimizer:
    """optax.nadam (= optax.adam(nesterov=True)). ``mu_dtype`` other than float32: the
    generic path."""
    if not _is_float32(mu_dtype):
        return _optax_generic("nadam", learning_rate=learning_rate, b1=b1, b2=b2, eps=eps,
                              eps_root=eps_root, mu_dtype=mu_dtype)
    return _make("nadam", learning_rate, b1=b1, b2=b2, eps=eps, eps_root=eps_root)


def rmsprop(learning_rate: ScalarOrSchedule, decay: float = 0.9, eps: float = 1e-8,
            initial_scale: float = 0.0, eps_in_sqrt: bool = True, centered: bool = False,
            momentum: float | None = None, nesterov: bool = False,
            bias_correction: bool = False) -> Optimizer:
    """optax.rmsprop: ``nu = decay*nu + (1-decay)*g**2`` (centered: minus the squared running
    mean of g); ``u = g / sqrt(nu + eps)`` (or ``/ (sqrt(nu) + eps)``); optional momentum
    trace; ``w -= lr * u``."""
    return _make("rmsprop", learning_rate, decay=decay, eps=eps, initial_scale=initial_scale,
                 eps_in_sqrt=bool(eps_in_sqrt), centered=bool(centered),
                 momentum=0.0 if momentum is None else momentum, nesterov=bool(nesterov),
                 bias_correction=bool(bias_correction))


def adadelta(learning_rate: ScalarOrSchedule | None = None, rho: float = 0.9,
             eps: float = 1e-6, weight_decay: float = 0.0,
             weight_decay_mask=None) -> Optimizer:
    """optax.adadelta: ``E[g²] = rho*E[g²] + (1-rho)*g²``;
    ``u = sqrt(E[Δ²] + eps) / sqrt(E[g²] + eps) * g``; ``E[Δ²] = rho*E[Δ²] + (1-rho)*u²``;
    ``w -= lr * u``. ``learning_rate=None`` means 1 (descent); note that Optax's None skips the
    learning-rate scaling altogether, sign flip included (so it ascends).
    ``weight_decay_mask``: a bool (see the module docstring)."""
    return _make("adadelta", 1.0 if learning_rate is None else learning_rate, rho=rho, eps=eps,
                 weight_decay=_decay(weight_decay, weight_decay_mask, "weight_decay_mask"))


def lion(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.99, mu_dtype=None,
         weight_decay: float = 1e-3, mask=None) -> Optimizer:
    """optax.lion: ``u = sign(b1*mu + (1-b1)*g) + weight_decay*w``; ``mu = b2*mu + (1-b2)*g``;
    ``w -= lr * u``. ``mask``: a bool. ``mu_dtype`` other than float32: the generic path."""
    if not _is_float32(mu_dtype):
        return _optax_generic("lion", learning_rate=learning_rate, b1=b1, b2=b2,
                              mu_dtype=mu_dtype, weight_decay=weight_decay, mask=mask)
    return _make("lion", learning_rate, b1=b1, b2=b2, weight_decay=_decay(weight_decay, mask))


def ftrl(learning_rate: ScalarOrSchedule, learning_rate_power: float = -0.5,
         initial_accumulator_value: float = 0.1, l1_regularization_strength: float = 0.0,
         l2_regularization_strength: float = 0.0,
         l2_shrinkage_regularization_strength: float = 0.0, beta: float = 0.0) -> Optimizer:
    """FTRL-Proximal (Optax has none; parameterised like ``keras.optimizers.Ftrl``, whose math
    the core runs, ``flavor="keras"``). Slots: ``accumulator``, ``linear``."""
    return _make("ftrl", learning_rate, "keras", learning_rate_power=learning_rate_power,
                 initial_accumulator_value=initial_accumulator_value,
                 l1_regularization_strength=l1_regularization_strength,
                 l2_regularization_strength=l2_regularization_strength,
                 l2_shrinkage_regularization_strength=l2_shrinkage_regularization_strength,
                 beta=beta)


# Optax's name for every optimizer above, so that inject_hyperparams(optax.adam) means adam.
FUSED = ("sgd", "adagrad", "adam", "amsgrad", "adamw", "nadamw", "adamax", "nadam", "rmsprop",
         "adadelta", "lion")


def _fused_factory(inner_factory):
    """The function of this module that ``inner_factory`` (one of them, or Optax's alias of
    the same name) stands for."""
    here = {name: globals()[name] for name in FUSED + ("ftrl",)}
    if inner_factory in here.values():
        return inner_factory
    try:
        import optax
    except ImportError:
        optax = None
    for name in FUSED:  # by identity: some Optax aliases are functools.partial objects
        if optax is not None and getattr(optax, name, None) is inner_factory:
            return here[name]
    raise TypeError(
        f"dualemb.jax.optimizers.inject_hyperparams fuses {', '.join(FUSED)} and ftrl (from "
        f"this module or Optax), not {inner_factory!r}; for any other Optax optimizer pass "
        "optax.inject_hyperparams(...)(...) itself (the generic path, where hyperparams / "
        "set_hyperparams work too)")


def inject_hyperparams(inner_factory: Callable, static_args=(), hyperparam_dtype=None):
    """Optax's ``inject_hyperparams`` for a fused optimizer:
    ``inject_hyperparams(adam)(learning_rate=1e-3)`` (``optax.adam`` is accepted for ``adam``).

    The learning rate then lives in the table's pytree as a float32 leaf (Optax keeps it in
    ``opt_state.hyperparams``): :func:`hyperparams` reads it and :func:`set_hyperparams`
    returns the table with a new value, and a jitted step takes the new value without being
    traced or compiled again. A schedule given as ``learning_rate`` is evaluated on the step
    count as without injection (Optax too recomputes it every step). Only the learning rate is
    an operand of the core's fused step; the other hyper-parameters are compiled into the
    optimizer, so a schedule for one of them raises ``TypeError`` (run
    ``optax.inject_hyperparams(optax.adam)(...)`` on the generic path for that).
    ``hyperparam_dtype``: None or float32 (the core computes in float32).
    """
    factory = _fused_factory(inner_factory)
    static = {static_args} if isinstance(static_args, str) else set(static_args)
    if not _is_float32(hyperparam_dtype):
        raise TypeError(f"hyperparam_dtype={hyperparam_dtype!r}: a fused optimizer's learning "
                        "rate is float32")
    signature = inspect.signature(factory)

    @functools.wraps(factory)
    def wrapped(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        for name, value in arguments.items():
            if name != "learning_rate" and name not in static and callable(value) \
                    and not isinstance(value, bool):
                raise TypeError(
                    f"inject_hyperparams: {name} was given a schedule, but only the learning "
                    f"rate is an operand of the fused {factory.__name__} step (the other "
                    "hyper-parameters are compiled into the optimizer); use "
                    f"optax.inject_hyperparams(optax.{factory.__name__})(...) on the generic path")
        lr = arguments.get("learning_rate")
        if lr is None and factory is adadelta:
            lr = 1.0
        if not callable(lr):
            arguments["learning_rate"] = Injected(_num("learning_rate", lr))
        return factory(**arguments)

    return wrapped


def hyperparams(table) -> dict:
    """The injectable hyper-parameters of ``table``'s optimizer as float arrays (Optax's
    ``opt_state.hyperparams``): ``{"learning_rate": ...}`` for a fused optimizer (the injected
    value, the constant, or the schedule at the table's step), and every injected value of an
    ``optax.inject_hyperparams`` transformation on the generic path."""
    opt = table.optimizer
    if isinstance(opt, Optimizer):
        return {"learning_rate": opt.learning_rate_for(table)}
    if opt is None:
        raise ValueError(f"{table!r} has no optimizer")
    from dualemb.jax import generic
    return generic.hyperparams(table)


def set_hyperparams(table, **values):
    """``table`` with new values of injected hyper-parameters (as Optax users assign
    ``opt_state.hyperparams["learning_rate"] = x``); works inside ``jit``, and a step compiled
    before takes the new table without recompiling. Raises ``TypeError`` for a hyper-parameter
    that is not injected (a constant or a schedule is part of the compiled optimizer)."""
    opt = table.optimizer
    if isinstance(opt, Optimizer):
        unknown = sorted(set(values) - {"learning_rate"})
        if unknown or not opt.injected:
            what = unknown or ["learning_rate"]
            raise TypeError(
                f"set_hyperparams: {', '.join(what)} of {opt.name!r} is not injected: only a "
                "learning rate made with dualemb.jax.optimizers.inject_hyperparams(...) "
                "changes between steps on the fused path (a constant or a schedule is compiled "
                "into the step)")
        if not values:
            return table
        value = jnp.asarray(values["learning_rate"], jnp.float32)
        if value.shape != ():
            raise ValueError(f"learning_rate must be a scalar, got shape {value.shape}")
        return table.replace(opt_state=(value,))
    if opt is None:
        raise ValueError(f"{table!r} has no optimizer")
    from dualemb.jax import generic
    return generic.set_hyperparams(table, values)


def num_slots(optimizer: Optimizer) -> int:
    """How many slot rows per key the core keeps for ``optimizer``."""
    return _num_slots(optimizer.name, optimizer.flavor, optimizer.hyper)


@functools.lru_cache(maxsize=None)
def _num_slots(name: str, flavor: str, hyper: tuple) -> int:
    from dualemb.core.table import Table as CoreTable
    scratch = CoreTable(1, optimizer={"name": name, "flavor": flavor, **dict(hyper)})
    try:
        return scratch.num_slots
    finally:
        scratch.destroy()


def from_optax(tx) -> "Any":
    """Runs any ``optax.GradientTransformation`` on the generic path (see
    :mod:`dualemb.jax.generic`)."""
    from dualemb.jax.generic import GenericOptimizer
    return GenericOptimizer.of(tx)


def from_spec(spec: dict, learning_rate: ScalarOrSchedule) -> Optimizer:
    """An :class:`Optimizer` from a core spec dict (e.g. one a checkpoint recorded)."""
    spec = dict(spec)
    name = spec.pop("name")
    flavor = spec.pop("flavor", "optax")
    hyper = tuple((k, v if isinstance(v, bool) else float(v)) for k, v in spec.items())
    return Optimizer(name, hyper, _lr(learning_rate), flavor)


def keras(name: str, learning_rate: ScalarOrSchedule, **hyper) -> Optimizer:
    """Keras 3's definition of optimizer ``name`` ("adam", "sgd", "adagrad", ...), fused in the
    core with Keras' argument names and defaults (``beta_1``, ``epsilon``, ...): what
    ``dualemb.tf``'s ``DynamicEmbeddingOptimizer`` runs, so a table trained in TensorFlow
    continues in JAX bit for bit. E.g. ``keras("adam", 1e-3, beta_1=0.9)``."""
    return from_spec({"name": name, "flavor": "keras", **hyper}, learning_rate)

"""Optimizers for dynamic tables, named and parameterised like Optax's.

Each function returns an :class:`Optimizer`: a hashable description (static under ``jit``) of
an Optax optimizer that the table core runs fused, with Optax's math (``flavor="optax"``), its
slots stored beside each row. ``learning_rate`` is a number or an Optax schedule
(``step -> lr``); :func:`dualemb.jax.apply_gradients` evaluates it on the table's step count
inside the jitted step and passes it to the core as an operand, exactly as
``optax.scale_by_learning_rate`` does (the first update uses ``schedule(0)``).

Any other ``optax.GradientTransformation`` runs on the generic path (see
:mod:`dualemb.jax.generic`): pass it wherever an optimizer is accepted, or wrap it with
:func:`from_optax`.

Differences from Optax: ``mask`` / ``weight_decay_mask`` and ``mu_dtype`` are not supported
(all state is float32); ``weight_decay`` must be a number.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from typing import Any, Callable, Union

import jax.numpy as jnp

Schedule = Callable[[Any], Any]
ScalarOrSchedule = Union[float, Schedule]


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """A fused optimizer: the core spec (``name`` + Optax hyper-parameters) and the learning rate.

    Attributes:
      name: the core's optimizer name ("adam", "sgd", ...).
      hyper: the hyper-parameters, as a tuple of (name, value) pairs (Optax's names).
      learning_rate: a float, or a schedule called with the (0-based) step count.
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

    def learning_rate_at(self, count):
        """The learning rate of the update after ``count`` updates (a float32 scalar)."""
        lr = self.learning_rate
        return jnp.asarray(lr(count) if callable(lr) else lr, jnp.float32)


def _lr(learning_rate) -> ScalarOrSchedule:
    if callable(learning_rate):
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


def sgd(learning_rate: ScalarOrSchedule, momentum: float | None = None,
        nesterov: bool = False) -> Optimizer:
    """optax.sgd: ``w -= lr * g``; with ``momentum``: ``t = g + momentum * t`` and
    ``w -= lr * t`` (Nesterov: ``w -= lr * (g + momentum * t)``). Slot: ``trace``."""
    return _make("sgd", learning_rate, momentum=0.0 if momentum is None else momentum,
                 nesterov=bool(nesterov))


def adagrad(learning_rate: ScalarOrSchedule, initial_accumulator_value: float = 0.1,
            eps: float = 1e-7) -> Optimizer:
    """optax.adagrad: ``s += g**2``; ``w -= lr * g / sqrt(s + eps)``."""
    return _make("adagrad", learning_rate, initial_accumulator_value=initial_accumulator_value,
                 eps=eps)


def adam(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
         eps: float = 1e-8, eps_root: float = 0.0, *, nesterov: bool = False) -> Optimizer:
    """optax.adam: ``mu = b1*mu + (1-b1)*g``; ``nu = b2*nu + (1-b2)*g**2``;
    ``w -= lr * mu_hat / (sqrt(nu_hat + eps_root) + eps)`` with bias-corrected hats."""
    return _make("adam", learning_rate, b1=b1, b2=b2, eps=eps, eps_root=eps_root,
                 nesterov=bool(nesterov))


def amsgrad(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
            eps: float = 1e-8, eps_root: float = 0.0) -> Optimizer:
    """optax.amsgrad: Adam with ``nu_hat = max(nu_max, nu_hat)`` (slot ``nu_max``)."""
    return _make("adam", learning_rate, b1=b1, b2=b2, eps=eps, eps_root=eps_root,
                 amsgrad=True)


def adamw(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8, eps_root: float = 0.0, weight_decay: float = 1e-4, *,
          nesterov: bool = False) -> Optimizer:
    """optax.adamw: Adam's update plus ``weight_decay * w``, scaled by ``-lr``."""
    return _make("adamw", learning_rate, b1=b1, b2=b2, eps=eps, eps_root=eps_root,
                 weight_decay=weight_decay, nesterov=bool(nesterov))


def adamax(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
           eps: float = 1e-8) -> Optimizer:
    """optax.adamax: ``mu`` as Adam; ``nu = max(b2*nu, |g|)``;
    ``w -= lr * mu / (1 - b1**t) / (nu + eps)``."""
    return _make("adamax", learning_rate, b1=b1, b2=b2, eps=eps)


def nadam(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8, eps_root: float = 0.0) -> Optimizer:
    """optax.nadam (= optax.adam(nesterov=True))."""
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
             eps: float = 1e-6, weight_decay: float = 0.0) -> Optimizer:
    """optax.adadelta: ``E[g²] = rho*E[g²] + (1-rho)*g²``;
    ``u = sqrt(E[Δ²] + eps) / sqrt(E[g²] + eps) * g``; ``E[Δ²] = rho*E[Δ²] + (1-rho)*u²``;
    ``w -= lr * u``. ``learning_rate=None`` means 1 (descent); note that Optax's None skips the
    learning-rate scaling altogether, sign flip included (so it ascends)."""
    return _make("adadelta", 1.0 if learning_rate is None else learning_rate, rho=rho, eps=eps,
                 weight_decay=weight_decay)


def lion(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.99,
         weight_decay: float = 1e-3) -> Optimizer:
    """optax.lion: ``u = sign(b1*mu + (1-b1)*g) + weight_decay*w``; ``mu = b2*mu + (1-b2)*g``;
    ``w -= lr * u``."""
    return _make("lion", learning_rate, b1=b1, b2=b2, weight_decay=weight_decay)


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

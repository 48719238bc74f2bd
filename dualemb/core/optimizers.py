"""Optimizer specs for the core's fused sparse optimizers.

A spec is a dict ``{"name": ..., "flavor": "keras" | "optax", <hyper-parameters>}``; the flavor
picks whose definition of the optimizer the core computes (Keras 3's or Optax's, which differ in
details such as Adam's epsilon placement). The learning rate and the step are not part of the
spec: they are passed to every ``apply_gradients`` call, so schedules work.
"""

from __future__ import annotations

from dualemb.core.spec import from_spec, to_spec

NAMES = ("sgd", "adagrad", "adam", "adamw", "adamax", "nadam", "rmsprop", "ftrl", "adadelta",
         "lion")
FLAVORS = ("keras", "optax")


def make(name: str, flavor: str = "keras", **hyper) -> dict:
    """A spec dict; validated by the core when attached to a table."""
    if name not in NAMES:
        raise ValueError(f"unknown optimizer {name!r} (known: {', '.join(NAMES)})")
    if flavor not in FLAVORS:
        raise ValueError(f"unknown optimizer flavor {flavor!r} (known: keras, optax)")
    return {"name": name, "flavor": flavor, **hyper}


def canonical(optimizer) -> dict | None:
    if optimizer is None:
        return None
    if isinstance(optimizer, str):
        if optimizer.lstrip().startswith("{"):
            optimizer = from_spec(optimizer)
        elif "=" in optimizer:
            raise ValueError(f"optimizer spec {optimizer!r}: 'name=value;...' text is no longer "
                             "accepted; pass a dict or its JSON text")
        else:
            optimizer = {"name": optimizer}
    if not isinstance(optimizer, dict) or "name" not in optimizer:
        raise TypeError(f"optimizer must be a spec dict with a 'name', got {optimizer!r}")
    spec = dict(optimizer)
    spec.setdefault("flavor", "keras")
    return make(**spec)


def spec_string(optimizer) -> str:
    spec = canonical(optimizer)
    return "" if spec is None else to_spec(spec)

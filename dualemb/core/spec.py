"""Specs (table configs, initializer and optimizer specs) as JSON text, to and from Python dicts.

A spec is one JSON object. This is the text every boundary carries: the C ABI
(``de_table_create``, ``de_set_optimizer``, ``de_table_describe``), the TF ops' string inputs, and
the checkpoint manifest. Types survive the round trip exactly: an int stays an int, a float a
float (to the last bit), a list a list of the same length, a string a string, a bool a bool.

Canonical text (:func:`canonical`) is what the C++ core writes in ``describe``, byte for byte:
``json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)``.

NaN and infinities are not JSON: a spec holding one is refused (``ValueError``), as is an
integer outside [-2**63, 2**64) (C++ would read it as a float) and a key that is not a string.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

_INT_MIN, _INT_END = -(1 << 63), 1 << 64


def _plain(value: Any, where: str) -> Any:
    """`value` as plain JSON-able Python (numpy scalars and arrays, tuples become lists)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        if not _INT_MIN <= value < _INT_END:
            raise ValueError(f"spec value {where} = {value} is outside the integer range a spec "
                             f"holds ([-2**63, 2**64))")
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"spec value {where} = {value!r} is not finite; JSON specs hold "
                             f"finite numbers only")
        return float(value)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"spec key {k!r} in {where} is not a string")
            if v is not None:
                out[k] = _plain(v, f"{where}[{k!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if hasattr(value, "tolist"):  # numpy scalar or array
        return _plain(value.tolist(), where)
    raise ValueError(f"spec value {where} = {value!r} ({type(value).__name__}) is not a JSON "
                     f"value (use str, int, float, bool or a list of them)")


def canonical(obj: Any) -> str:
    """The canonical JSON text of a plain JSON value (the bytes C++ ``describe`` writes)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


def to_spec(entries: Mapping[str, Any]) -> str:
    """{"name": "adam", "beta_1": 0.9} -> '{"beta_1":0.9,"name":"adam"}' (canonical JSON; members
    whose value is None are left out; numpy values become plain numbers and lists)."""
    if not isinstance(entries, Mapping):
        raise TypeError(f"a spec must be a dict, got {type(entries).__name__}")
    return canonical(_plain(entries, "spec"))


def _refuse_constant(name: str):
    raise ValueError(f"spec holds {name}; JSON specs hold finite numbers only")


def _no_repeats(pairs: list) -> dict:
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"spec member {k!r} given twice")
        out[k] = v
    return out


def from_spec(text: str | bytes) -> dict:
    """Inverse of to_spec: the JSON object `text` as a dict (ValueError if it is not one)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    try:
        value = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_no_repeats)
    except json.JSONDecodeError as e:
        raise ValueError(f"spec is not valid JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"spec must be a JSON object, got {text!r}")
    return value


def parse_description(text: str | bytes) -> tuple[dict, dict | None]:
    """The core's ``describe`` text {"config": {...}, "optimizer": {...} | null} as
    (config, optimizer spec or None)."""
    d = from_spec(text)
    if set(d) != {"config", "optimizer"} or not isinstance(d["config"], dict) or not (
            d["optimizer"] is None or isinstance(d["optimizer"], dict)):
        raise ValueError(f"not a table description: {text!r}")
    return d["config"], d["optimizer"]

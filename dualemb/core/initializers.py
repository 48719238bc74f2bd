"""Initializer specs. An initial row is a pure function of (seed, key): the same key gets the
same row in TF and JAX, on any number of shards or threads.

Each function returns a plain dict (what checkpoints record); ``Table(initializer=...)`` also
accepts ``None`` (zeros), a number (constant), a 1-D array of length dim or 1 (vector), or such
a dict.
"""

from __future__ import annotations

import numbers

import numpy as np


def zeros() -> dict:
    return {"initializer": "zeros"}


def _exact(value):
    """A JSON-exact number: an integer stays an int (an int64 table's constant may exceed 2^53,
    and the core keeps JSON integers exactly), anything else a float64. Never rounded through
    float32: an integer or float64 table would silently get another value."""
    if isinstance(value, (numbers.Integral, np.integer, np.bool_)):  # bool is Integral
        return int(value)
    return float(value)


def constant(value: float) -> dict:
    return {"initializer": "constant", "value": _exact(value)}


def vector(values) -> dict:
    """Every new row is `values` (length dim, or length 1 broadcast to dim), kept exactly: the
    table rounds them once, to its own value dtype."""
    arr = np.asarray(values).reshape(-1)
    if arr.dtype.kind not in "biuf":
        arr = arr.astype(np.float64)  # numbers given as objects or strings; raises if not numbers
    return {"initializer": "vector", "values": [_exact(v) for v in arr.tolist()]}


def _utf8_text(x, what: str) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, bytes):
        try:
            return x.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{what} {x!r} is not valid UTF-8: a string table's default is "
                             "stored as JSON text in its spec (any bytes can be inserted as "
                             "values)") from None
    raise TypeError(f"{what} of a string table must be str or bytes, got {type(x).__name__}")


def string_constant(value) -> dict:
    """A string table's default: `value` (str, or bytes that are valid UTF-8) in every column."""
    return {"initializer": "constant", "value": _utf8_text(value, "initializer")}


def string_vector(values) -> dict:
    """A string table's default row: `values` (dim or 1 str/bytes)."""
    flat = np.asarray(values, dtype=object).reshape(-1).tolist()
    return {"initializer": "vector", "values": [_utf8_text(v, "initializer value") for v in flat]}


def string_default(initializer) -> dict:
    """A string table's initializer members: None -> {} (empty strings, the core's default), a
    str/bytes -> string_constant, a list/array of them -> string_vector, a dict -> as given."""
    if initializer is None:
        return {}
    if isinstance(initializer, dict):
        return dict(initializer)
    if isinstance(initializer, (str, bytes)):
        return string_constant(initializer)
    if isinstance(initializer, (list, tuple, np.ndarray)):
        return string_vector(initializer)
    raise TypeError(f"a string table's initializer must be None, str/bytes, a list of them or a "
                    f"spec dict, got {type(initializer).__name__}")


def normal(mean: float = 0.0, stddev: float = 1.0, seed: int = 0) -> dict:
    return {"initializer": "normal", "mean": float(mean), "stddev": float(stddev),
            "seed": int(seed)}


def truncated_normal(mean: float = 0.0, stddev: float = 1.0, seed: int = 0) -> dict:
    """Normal draws beyond two standard deviations are redrawn (Keras' TruncatedNormal)."""
    return {"initializer": "truncated_normal", "mean": float(mean), "stddev": float(stddev),
            "seed": int(seed)}


def uniform(minval: float = -0.05, maxval: float = 0.05, seed: int = 0) -> dict:
    return {"initializer": "uniform", "minval": float(minval), "maxval": float(maxval),
            "seed": int(seed)}


def canonical(initializer) -> dict:
    """Turns any accepted initializer form into its dict spec (raises TypeError otherwise)."""
    if initializer is None:
        return zeros()
    if isinstance(initializer, dict):
        if "initializer" not in initializer:
            raise ValueError(f"initializer dict needs an 'initializer' kind: {initializer!r}")
        return dict(initializer)
    if isinstance(initializer, str):
        return {"zeros": zeros, "normal": normal, "truncated_normal": truncated_normal,
                "uniform": uniform}.get(initializer, lambda: {"initializer": initializer})()
    if isinstance(initializer, numbers.Real) and not isinstance(initializer, bool):
        return constant(initializer)
    if isinstance(initializer, (list, tuple, np.ndarray)):
        return vector(initializer)
    raise TypeError(
        f"unsupported initializer {initializer!r}: use None, a number, an array of length dim "
        "or 1, or a dualemb.core.initializers spec")

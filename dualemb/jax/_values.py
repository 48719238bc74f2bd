"""Value dtypes in dualemb.jax: which JAX dtype holds a table's rows, and how inputs convert.

A table's ``value_dtype`` (a name from :mod:`dualemb.core.value_dtypes`) is static in the
handle: it decides the dtype of the FFI calls' row buffers at trace time, and the FFI handler
checks it against the core table when the call runs (a mismatch is an error, never a
reinterpretation of bytes).

float64 and int64 rows exist in JAX only with ``jax_enable_x64`` (in the default 32-bit mode
``jnp.asarray`` would silently turn them into float32 / int32): such a table is refused, with
what to do, until x64 is enabled.

Inputs (rows to insert, accum deltas) follow :func:`dualemb.core.value_dtypes.as_values` when
they are concrete (outside ``jit``): float tables take any float input rounded to nearest, a
finite value beyond the dtype's range refused; integer tables take integers whose every value
fits exactly. A traced input's values cannot be checked, so inside ``jit`` float tables take any
float input rounded by ``astype`` (beyond the range becomes inf, as ``astype`` does) and integer
tables take integer inputs that convert without loss by dtype alone (``int8`` into an ``int32``
table; ``int32`` into an ``int8`` table must be cast explicitly). Gradients are float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dualemb.core import value_dtypes as _vd

NEEDS_X64 = frozenset({"float64", "int64"})
TRAINABLE = _vd.TRAINABLE


def _refuse_strings(name: str) -> None:
    if name == _vd.STRING:
        raise TypeError(
            "dualemb.jax has no string-valued tables: JAX arrays cannot hold strings. Serve a "
            "table of value dtype string with dualemb.core.Table or dualemb.tf (its checkpoint "
            "loads there), or map the strings to integer ids and store those in an int32/int64 "
            "table")


def name_of(value_dtype) -> str:
    """The canonical value dtype name of a name, numpy/jnp dtype or scalar type (TypeError for
    an unsupported one, and for "string", which JAX arrays cannot hold)."""
    name = _vd.name_of(value_dtype)
    _refuse_strings(name)
    return name


def require_available(name: str) -> None:
    """TypeError if rows of ``name`` cannot exist in JAX now (float64/int64 without x64;
    strings never)."""
    _refuse_strings(name)
    if name in NEEDS_X64 and not jax.config.jax_enable_x64:
        raise TypeError(
            f"{_a(name)} table needs jax_enable_x64: in JAX's default 32-bit mode {name} arrays "
            f"do not exist (they would silently become {name[:-2]}32); call "
            "jax.config.update('jax_enable_x64', True) first, or use a 32-bit value dtype")


def jnp_dtype(name: str):
    """The JAX dtype of a table's rows (bfloat16 is ml_dtypes' type, as jnp.bfloat16)."""
    return jnp.dtype(_vd.NUMPY[name])


def _a(name: str) -> str:
    return ("an " if name.startswith("int") else "a ") + name


def check_trainable(name: str, what: str) -> None:
    """TypeError unless ``name`` can be trained (float32, float16, bfloat16)."""
    if name not in TRAINABLE:
        raise TypeError(
            f"{what}: {_a(name)} table cannot be trained (optimizers need a float32, float16 or "
            f"bfloat16 table); {name} tables serve lookups and writes (insert, accum, erase, "
            "export, save/load)")


def rows_operand(name: str, values, want_shape: tuple, what: str):
    """``values`` as a JAX array of value dtype ``name`` and shape ``want_shape``, by the rule
    in the module docstring; TypeError/ValueError otherwise (before anything is called)."""
    dtype = getattr(values, "dtype", None)
    if dtype is None:
        values = np.asarray(values)
        dtype = values.dtype
    dtype = np.dtype(dtype)
    if tuple(np.shape(values)) != tuple(want_shape):
        raise ValueError(f"{what} have shape {tuple(np.shape(values))}, expected ids.shape + "
                         f"(dim,) = {tuple(want_shape)}")
    target = jnp_dtype(name)
    if dtype == target:
        return jnp.asarray(values)
    if not isinstance(values, jax.core.Tracer):
        return jnp.asarray(_vd.as_values(np.asarray(values), name, what))
    if name in _vd.FLOATS:
        if not _vd.is_float(dtype):
            raise TypeError(f"{what} must be floating point for {_a(name)} table, got dtype "
                            f"{dtype}")
        return values.astype(target)
    if dtype.kind not in "iu" or not np.can_cast(dtype, target, casting="safe"):
        raise TypeError(
            f"{what} of dtype {dtype} for {_a(name)} table: inside jit only integer dtypes that "
            f"convert to {name} without loss are taken (their values cannot be checked there); "
            f"cast them with .astype(jnp.{name}) once their range is known")
    return values.astype(target)


def grads_operand(grads, want_shape: tuple):
    """Gradients as float32 ``want_shape`` (any float input; float16/bfloat16 cotangents of a
    half-precision table's rows are widened exactly)."""
    dtype = getattr(grads, "dtype", None)
    if dtype is None:
        grads = np.asarray(grads)
        dtype = grads.dtype
    if not _vd.is_float(np.dtype(dtype)):
        raise TypeError(f"gradients must be floating point, got dtype {dtype}")
    if tuple(jnp.shape(grads)) != tuple(want_shape):
        raise ValueError(f"gradients have shape {tuple(jnp.shape(grads))}, expected ids.shape "
                         f"+ (dim,) = {tuple(want_shape)}")
    return jnp.asarray(grads).astype(jnp.float32)

"""Ids: how int64 ids reach a table without ever being truncated.

In JAX's default 32-bit mode an int64 array does not exist: ``jnp.asarray`` and ``jax.jit``
silently turn numpy int64 ids into int32, dropping the high bits. dualemb therefore accepts:

* numpy (host) integer arrays, anywhere outside ``jit`` — converted without loss;
* :class:`Ids`, int64 ids carried as uint32 ``(low, high)`` pairs ``[..., 2]`` — build them on the
  host with :func:`ids` and pass them into jitted functions;
* int64 JAX arrays when ``jax_enable_x64`` is on;
* int32 JAX arrays for tables with int32 keys, and (only with ``jax_enable_x64``, where JAX
  cannot have truncated them) for int64 tables. In 32-bit mode an int32 JAX array given to an
  int64 table is refused, because it may be the truncated remains of int64 ids; wrap ids that
  really are int32 with :func:`ids` to say so.

Float, bool and complex ids are refused. String keys are refused too (``TypeError``): XLA has no
string arrays, so strings become int64 ids on the host before they reach JAX, with
:func:`string_ids` (a 63-bit fingerprint per string) or a vocabulary of your own.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@jax.tree_util.register_pytree_node_class
class Ids:
    """int64 ids as uint32 pairs: ``halves[..., 0]`` the low 32 bits, ``halves[..., 1]`` the high.

    On a little-endian machine this is exactly the memory of the int64 array, so the core reads
    it in place. ``shape`` is the ids' shape (without the pair axis). Supports ``reshape`` and
    basic indexing along the id axes, so it can be batched, sliced and vmapped like an array.
    """

    def __init__(self, halves):
        self.halves = halves

    def tree_flatten(self):
        return (self.halves,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0])

    @property
    def shape(self) -> tuple:
        return tuple(self.halves.shape[:-1])

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def reshape(self, *shape) -> "Ids":
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return Ids(self.halves.reshape(tuple(shape) + (2,)))

    def __getitem__(self, index) -> "Ids":
        if not isinstance(index, tuple):
            index = (index,)
        if any(i is Ellipsis for i in index):
            raise IndexError("Ids does not support Ellipsis indexing")
        return Ids(self.halves[index + (slice(None),)])

    def __mod__(self, n) -> jax.Array:
        """Floored ``ids mod n`` as int32 (what :func:`dualemb.core.routing.shard_of` computes on
        any integer array), from the pairs without forming int64: with ``v = hi * 2**32 + lo``
        (``hi`` signed), ``v mod n = ((hi mod n) * (2**32 mod n) + lo mod n) mod n``."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 < n <= 46340:
            raise ValueError(f"Ids % n needs a Python int n in [1, 46340], got {n!r}")
        n = int(n)
        halves = jnp.asarray(self.halves)
        lo = halves[..., 0] % jnp.uint32(n)
        hi = halves[..., 1].astype(jnp.int32) % jnp.int32(n)  # floored: in [0, n)
        return (hi * jnp.int32(2**32 % n) + lo.astype(jnp.int32)) % jnp.int32(n)

    def numpy(self) -> np.ndarray:
        """The ids as a numpy int64 array (host)."""
        h = np.ascontiguousarray(np.asarray(self.halves, dtype=np.uint32)).reshape(-1)
        return h.view(np.int64).reshape(self.shape)

    def __repr__(self) -> str:
        return f"Ids(shape={self.shape})"


def ids(x) -> Ids:
    """Wraps ids for passing into jitted code without truncation.

    Accepts host arrays of any integer dtype (uint64 above 2**63-1 is refused), an existing
    :class:`Ids`, or JAX integer arrays (int32 values are sign-extended: use this to declare that
    int32 ids are genuine for an int64 table). Runs on the host for numpy input, and inside
    ``jit`` for JAX input.
    """
    if isinstance(x, Ids):
        return x
    if isinstance(x, (jax.Array, jax.core.Tracer)):
        _check_integer(x.dtype)
        if x.dtype == jnp.uint32 or x.dtype.itemsize < 8:
            x32 = x.astype(jnp.int32) if x.dtype != jnp.uint32 else x
            lo = x32.astype(jnp.uint32)
            if x.dtype == jnp.uint32 or not jnp.issubdtype(x.dtype, jnp.signedinteger):
                hi = jnp.zeros_like(lo)
            else:
                hi = jnp.where(x32 < 0, jnp.uint32(0xFFFFFFFF), jnp.uint32(0))
        else:  # 64-bit JAX array (jax_enable_x64)
            u = x.astype(jnp.uint64)
            lo = (u & jnp.uint64(0xFFFFFFFF)).astype(jnp.uint32)
            hi = (u >> jnp.uint64(32)).astype(jnp.uint32)
        return Ids(jnp.stack([lo, hi], axis=-1))
    return Ids(_host_halves(x))


STRING_KEYS_MESSAGE = (
    "dualemb.jax takes integer ids, not strings (XLA has no string arrays): map string keys to "
    "int64 ids on the host first, e.g. ids = dualemb.jax.string_ids(keys) (a 63-bit "
    "fingerprint of each string's UTF-8 bytes; distinct strings collide with probability "
    "~n**2/2**64), or a vocabulary of your own; tables with exact string keys are offered by "
    "dualemb.core.Table(key_dtype='string') and dualemb.tf")


def string_ids(keys) -> np.ndarray:
    """int64 ids of string keys (str as UTF-8, or bytes), computed on the host: the core's
    fingerprint (``dualemb_core.h``, ``de_string_fingerprint``), the same int64 key whose
    initializer row a string table gives that string. Pass the result (or ``ids(result)`` in
    32-bit mode) to any ``dualemb.jax`` operation."""
    from dualemb.core._string_keys import fingerprints

    return fingerprints(keys)


def _is_string_data(x) -> bool:
    if isinstance(x, (str, bytes)):
        return True
    if isinstance(x, (list, tuple, np.ndarray)):
        arr = np.asarray(x, dtype=object) if not isinstance(x, np.ndarray) else x
        if arr.dtype.kind in "SU":
            return True
        if arr.dtype == object:
            return any(isinstance(v, (str, bytes)) for v in arr.reshape(-1)[:1].tolist())
    return False


def _check_integer(dtype) -> None:
    dtype = np.dtype(dtype)
    if dtype.kind not in "iu" or dtype == np.bool_:
        raise TypeError(f"ids must be integers, got dtype {dtype}")


def _host_int64(x) -> np.ndarray:
    if _is_string_data(x):
        raise TypeError(STRING_KEYS_MESSAGE)
    arr = np.asarray(x)
    if arr.dtype == object or arr.dtype.kind not in "iu":
        if arr.size == 0 and arr.dtype.kind == "f":
            arr = arr.astype(np.int64)
        else:
            raise TypeError(f"ids must be integers, got dtype {arr.dtype}")
    if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise ValueError("uint64 ids above 2**63-1 do not fit int64 keys")
    return np.require(np.asarray(arr, dtype=np.int64), requirements="C")  # keeps 0-d


def _pairs(arr: np.ndarray) -> np.ndarray:
    """int64 [...] -> its uint32 (low, high) halves [..., 2] (little-endian memory)."""
    return arr.reshape(-1).view(np.uint32).reshape(arr.shape + (2,))


def _host_halves(x) -> np.ndarray:
    return _pairs(_host_int64(x))


def is_host(x: Any) -> bool:
    """Whether x is host data (numpy array, list, Python scalar) rather than a JAX value."""
    return not isinstance(x, (jax.Array, jax.core.Tracer, Ids))


def key_operand(x, table_key_dtype: str):
    """(operand for the FFI call, logical ids shape). Raises TypeError/ValueError on ids that
    are not integers, or that could have been truncated (see the module docstring)."""
    x64 = jax.config.jax_enable_x64
    if isinstance(x, Ids):
        h = x.halves
        if np.dtype(h.dtype) != np.uint32 or h.ndim < 1 or h.shape[-1] != 2:
            raise TypeError("Ids.halves must be a uint32 array [..., 2]")
        return h, x.shape
    if is_host(x):
        arr = _host_int64(x)
        if table_key_dtype == "int32":
            if arr.size and (arr.min() < np.iinfo(np.int32).min
                             or arr.max() > np.iinfo(np.int32).max):
                raise ValueError("ids do not fit the table's int32 key dtype")
            return jnp.asarray(arr.astype(np.int32)), arr.shape
        if x64:
            return jnp.asarray(arr), arr.shape
        return jnp.asarray(_pairs(arr)), arr.shape
    dtype = np.dtype(x.dtype)
    _check_integer(dtype)
    shape = tuple(x.shape)
    if dtype == np.int64:
        return x, shape
    if dtype == np.uint64:
        return x.astype(jnp.int64), shape
    if dtype == np.uint32:
        raise TypeError(
            "uint32 ids are ambiguous: use dualemb.jax.ids(...) to pass int64 ids as uint32 "
            "pairs, or cast to int32/int64")
    if dtype.itemsize < 4 or dtype == np.int32:
        x32 = x.astype(jnp.int32)
        if table_key_dtype == "int64" and dtype == np.int32 and not x64:
            raise TypeError(
                "an int64-keyed table got int32 JAX ids in JAX's 32-bit mode, where int64 ids "
                "are silently truncated to int32 by jnp.asarray/jax.jit. Pass int64 ids as "
                "dualemb.jax.ids(numpy_int64_ids) (uint32 pairs), enable jax_enable_x64, or "
                "wrap genuine int32 ids with dualemb.jax.ids(x)")
        return x32, shape
    raise TypeError(f"unsupported id dtype {dtype}")

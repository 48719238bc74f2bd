"""Integers carried as float32 "chunks": how a table's integer state travels in its pytree.

A :class:`dualemb.jax.Table`'s leaves hold integers — the table's 63-bit id, its step count, the
generic Optax path's counters. They are stored as float32 arrays of 16-bit chunks (low chunk
first), each chunk an exact integer in [0, 65535], because:

* ``jax.grad`` refuses integer inputs (unless ``allow_int=True``), and users put tables in the
  parameter pytrees they differentiate. With float leaves that just works: the table gets zero
  cotangents, and ``p - lr * g`` leaves every chunk exactly as it was.
* float32 represents every 16-bit integer exactly, and JAX's default 32-bit mode cannot hold an
  int64 at all: the id is never truncated.
* A chunk that is not an exact integer in range can only come from something that treated the
  leaf as a parameter (weight decay, a dtype cast); the FFI handlers refuse such a handle or
  step count instead of reading another id from it (see ``csrc/jax/ffi_common.h``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

CHUNK_BITS = 16
HANDLE_CHUNKS = 4  # a 63-bit table id


def id_to_handle(table_id: int) -> jax.Array:
    """float32[4]: the chunks of a table id (a non-negative 63-bit integer)."""
    table_id = int(table_id)
    if not 0 <= table_id < 2**63:
        raise ValueError(f"a table id is a non-negative 63-bit integer, got {table_id}")
    chunks = [(table_id >> (CHUNK_BITS * i)) & 0xFFFF for i in range(HANDLE_CHUNKS)]
    return jnp.asarray(np.asarray(chunks, np.float32))


def handle_to_id(handle) -> int:
    """The table id of a concrete handle; ValueError if it is not a valid one."""
    h = np.asarray(handle)
    if h.shape != (HANDLE_CHUNKS,) or h.dtype != np.float32:
        raise ValueError(f"a table handle is float32[{HANDLE_CHUNKS}], got {h.dtype}{list(h.shape)}")
    if not np.all((h >= 0) & (h <= 0xFFFF) & (np.floor(h) == h)) or h[-1] >= 0x8000:
        raise ValueError(
            "corrupted table handle (its values are not the 16-bit chunks of a table id): "
            "something changed the table's leaves, e.g. an optimizer update or a dtype cast "
            "applied to a pytree that holds the table; keep tables out of what optimizers update")
    return sum(int(c) << (CHUNK_BITS * i) for i, c in enumerate(h))


def is_coded(dtype) -> bool:
    """Whether values of ``dtype`` are stored as chunks (integers and bools; floats as is)."""
    return not jnp.issubdtype(dtype, jnp.inexact)


def encode(x, dtype=None) -> jax.Array:
    """An integer or bool array ``[...]`` as float32 chunks ``[..., k]`` (k = its bytes / 2,
    at least 1). Floats are returned unchanged (as ``dtype`` if given)."""
    x = jnp.asarray(x, dtype)
    if not is_coded(x.dtype):
        return x
    if x.dtype.itemsize == 1:
        return x.astype(jnp.float32)[..., None]
    halves = jax.lax.bitcast_convert_type(x, jnp.uint16)
    if x.dtype.itemsize == 2:
        halves = halves[..., None]
    return halves.astype(jnp.float32)


def decode(code, dtype) -> jax.Array:
    """Inverse of :func:`encode` for values of ``dtype``."""
    dtype = jnp.dtype(dtype)
    if not is_coded(dtype):
        return code
    if dtype.itemsize == 1:
        return code[..., 0].astype(dtype)
    halves = code.astype(jnp.uint16)
    if dtype.itemsize == 2:
        halves = halves[..., 0]
    return jax.lax.bitcast_convert_type(halves, dtype)

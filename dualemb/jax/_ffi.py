"""The XLA FFI custom calls of ``dualemb._jax_ffi``, one thin wrapper each.

Importing this module registers the handlers for the CPU platform (a CUDA registration comes with
the GPU table: add it to ``_PLATFORMS`` with the CUDA module's capsules).

Wrappers only shape arguments; validation happens one level up (``dualemb.jax.ops``) so that bad
input raises at trace time. Conventions (see ``csrc/jax/ffi_common.h``):

* ``handle`` is the table's id as float32[4] chunks (see ``dualemb.jax._chunks``): the first
  operand of every table call, a runtime value, so compiled code does not depend on the table.
* ``version`` is the table's float32 version token. Every call takes it; mutating calls
  (``has_side_effect=True``) return the next one. Passing the token along is what orders the
  calls: XLA keeps side-effecting custom calls alive but not in program order.
* Both go through ``stop_gradient``: they are identities, not differentiable inputs (a table
  inside a pytree given to ``jax.grad`` gets zero cotangents instead of an error about a
  missing differentiation rule).
* ``keys`` is an int64 or int32 array, or uint32 pairs ``[..., 2]`` (int64 ids in 32-bit mode);
  ``shape`` is the ids' logical shape (without the pair axis).
* ``vmap_method="expand_dims"``: under ``jax.vmap`` the whole batch goes to one call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dualemb._native import load_extension

_ext = load_extension("_jax_ffi")
_PLATFORMS = ("cpu",)


def _register() -> None:
    for name, capsule in _ext.registrations().items():
        for platform in _PLATFORMS:
            jax.ffi.register_ffi_target(name, capsule, platform=platform)


_register()

_VMAP = "expand_dims"
_f32 = jnp.float32
_i32 = jnp.int32


def _sds(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(shape), dtype)


def _table(handle, version):
    """The (handle, version) operands, cut off from differentiation."""
    return jax.lax.stop_gradient(handle), jax.lax.stop_gradient(version)


def _next(version):
    return _sds(jnp.shape(version), _f32)


def find(handle, dim, version, keys, shape, with_exists=True):
    """(rows [shape + (dim,)], exists [shape]) — reads only. Without ``with_exists`` the
    second result is empty (one output fewer to fill)."""
    return jax.ffi.ffi_call(
        "dualemb_find",
        (_sds(shape + (dim,), _f32), _sds(shape if with_exists else (0,), jnp.bool_)),
        vmap_method=_VMAP)(*_table(handle, version), keys)


def find_or_insert(handle, dim, version, keys, shape):
    """(next version, rows, exists); missing keys are inserted with their initializer row."""
    return jax.ffi.ffi_call(
        "dualemb_find_or_insert",
        (_next(version), _sds(shape + (dim,), _f32), _sds(shape, jnp.bool_)),
        has_side_effect=True, vmap_method=_VMAP)(*_table(handle, version), keys)


def insert_or_assign(handle, version, keys, values, mask=None):
    """Next version; writes rows (where ``mask`` is true, if given)."""
    if mask is None:
        return jax.ffi.ffi_call("dualemb_insert_or_assign", _next(version),
                                has_side_effect=True, vmap_method=_VMAP)(
            *_table(handle, version), keys, values)
    return jax.ffi.ffi_call("dualemb_insert_masked", _next(version), has_side_effect=True,
                            vmap_method=_VMAP)(*_table(handle, version), keys, values, mask)


def accum(handle, version, keys, deltas, exists):
    """Next version; TFRA's accum rule."""
    return jax.ffi.ffi_call("dualemb_accum", _next(version), has_side_effect=True,
                            vmap_method=_VMAP)(*_table(handle, version), keys, deltas, exists)


def erase(handle, version, keys):
    """Next version; removes keys."""
    return jax.ffi.ffi_call("dualemb_erase", _next(version), has_side_effect=True,
                            vmap_method=_VMAP)(*_table(handle, version), keys)


def apply_gradients(handle, version, keys, grads, lr, step_code):
    """Next version; one fused optimizer step with learning rate ``lr`` (a float32 scalar)
    after ``step_code`` updates (the table's step leaf: the core is given that count + 1)."""
    return jax.ffi.ffi_call("dualemb_apply_gradients", _next(version), has_side_effect=True,
                            vmap_method=_VMAP)(
        *_table(handle, version), keys, grads, jnp.asarray(lr, _f32),
        jax.lax.stop_gradient(step_code))


def size(handle, version):
    """Number of keys (int64 with jax_enable_x64, else int32 saturated at 2**31-1)."""
    dtype = jnp.int64 if jax.config.jax_enable_x64 else jnp.int32
    return jax.ffi.ffi_call("dualemb_size", _sds((), dtype), vmap_method=_VMAP)(
        *_table(handle, version))


def export(handle, dim, num_slots, version, offset, limit, key_layout):
    """(keys, values [limit, dim], slots [limit, num_slots, dim], count): a page of rows.

    ``key_layout`` is ``(shape, dtype)`` of the keys result: ``((limit,), int64|int32)`` or
    ``((limit, 2), uint32)`` for pairs."""
    kshape, kdtype = key_layout
    return jax.ffi.ffi_call(
        "dualemb_export",
        (_sds(kshape, kdtype), _sds((limit, dim), _f32), _sds((limit, num_slots, dim), _f32),
         _sds((), _i32)),
        vmap_method=_VMAP)(*_table(handle, version), jnp.asarray(offset, _i32))


def after(version, values):
    """``version``, returned by a custom call that also takes ``values`` (so it waits for them)."""
    return jax.ffi.ffi_call("dualemb_after", _next(version), vmap_method=_VMAP)(
        jax.lax.stop_gradient(version), *[jax.lax.stop_gradient(v) for v in values])


def unique(keys, n):
    """(unique keys padded to n with the first key, inverse [n] int32, count int32)."""
    return jax.ffi.ffi_call(
        "dualemb_unique", (_sds(keys.shape, keys.dtype), _sds((n,), _i32), _sds((), _i32)),
        vmap_method="sequential")(keys)


def exchange_check(needed, capacity, payload):
    """``payload``, once ``needed <= capacity`` (int32 scalars) is checked; otherwise the
    computation fails with an error naming ``capacity_per_shard`` (the sharded path's knob)."""
    return jax.ffi.ffi_call("dualemb_exchange_check", _sds(payload.shape, payload.dtype),
                            vmap_method="sequential")(
        jnp.asarray(needed, _i32), jnp.asarray(capacity, _i32), payload)


def apply_gradients_first(handle, version, keys, grads, lr, step_code, count):
    """Next version; :func:`apply_gradients` on the first ``count`` keys and gradients only
    (the rest of the buffers is padding)."""
    return jax.ffi.ffi_call("dualemb_apply_gradients_first", _next(version),
                            has_side_effect=True, vmap_method=_VMAP)(
        *_table(handle, version), keys, grads, jnp.asarray(lr, _f32),
        jax.lax.stop_gradient(step_code), jnp.asarray(count, _i32))

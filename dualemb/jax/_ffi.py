"""The XLA FFI custom calls of ``dualemb._jax_ffi``, one thin wrapper each.

Importing this module registers the handlers for the CPU platform; :func:`register_cuda`
registers the CUDA handlers (``dualemb._jax_ffi_cuda``) under the same names when the first GPU
table is made. Wrappers only shape arguments: validation happens one level up
(``dualemb.jax.ops``) so that bad input raises at trace time. Every table call takes the
table's ``handle`` and ``version`` token first (both through ``stop_gradient``); mutating calls
(``has_side_effect=True``) return the next version, which is what orders them; on the
CPU they are bound as dualemb's own effect-free primitive (``_write_primitive``). The operand
conventions: ``csrc/jax/ffi_common.h``. Each call lowers either to the native handler (CPU) or
to its host-callback twin in ``dualemb.jax._host`` (other platforms, or
``DUALEMB_JAX_HOST_CALLBACK=1``), chosen when it is traced (:func:`_call`; docs/jax.md,
"Platforms without the native handler").
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
from jax.experimental import io_callback

from dualemb._native import load_extension
from dualemb.jax import _host, _write_primitive
from dualemb.jax._jaxlib_check import check_module

_ext = load_extension("_jax_ffi")
# Before anything is registered: handlers compiled against another jaxlib's FFI headers are
# refused with a message naming both releases (dualemb/jax/_jaxlib_check.py says why).
check_module(_ext)
_PLATFORMS = ("cpu",)  # where the native handlers are registered

# "1": host callbacks everywhere (testing on CPU); "0": the FFI everywhere; unset: per platform.
HOST_CALLBACK_ENV = "DUALEMB_JAX_HOST_CALLBACK"
_FORCED = os.environ.get(HOST_CALLBACK_ENV, "").strip()
if _FORCED not in ("", "0", "1"):
    raise ValueError(f"{HOST_CALLBACK_ENV} must be 0, 1 or unset, got {_FORCED!r}")


# {target name: capsule}: the targets are listed once, in csrc/jax/ffi_handlers.h.
_TARGETS = _ext.registrations()


def _host_twins(targets) -> dict:
    """{target: its host twin}; an ImportError if the targets and the twins are not the same
    set (a native module built from other sources than this Python, or a target added on one
    side only)."""
    missing = sorted(set(targets) - set(_host.TWINS))
    extra = sorted(set(_host.TWINS) - set(targets))
    if missing or extra:
        raise ImportError(
            "dualemb._jax_ffi and dualemb/jax/_host.py disagree: FFI targets without a host "
            f"twin {missing}, host twins without an FFI target {extra}. Every target of "
            "csrc/jax/ffi_handlers.h needs an @twin function in _host.py; if the sources agree, "
            "the native module is stale: rebuild it (tools/dev_build.sh, or pip install).")
    return {name: _host.TWINS[name] for name in targets}


_HOST_FNS = _host_twins(_TARGETS)


def _register() -> None:
    for name, capsule in _TARGETS.items():
        for platform in _PLATFORMS:
            jax.ffi.register_ffi_target(name, capsule, platform=platform)


_register()

_VMAP = "expand_dims"

_cuda_targets = None  # {target: capsule} of dualemb._jax_ffi_cuda once registered


def register_cuda() -> dict:
    """Registers the CUDA-platform handlers (once); raises ImportError/RuntimeError naming why
    they cannot be (no GPU table in this build, a module built from other sources)."""
    global _cuda_targets
    if _cuda_targets is None:
        ext = load_extension("_jax_ffi_cuda")
        targets = ext.registrations()
        unknown = sorted(set(targets) - set(_TARGETS))
        if unknown:
            raise ImportError(f"dualemb._jax_ffi_cuda hands out targets {unknown} that "
                              "dualemb._jax_ffi does not have: rebuild both")
        for name, capsule in targets.items():
            jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
        _cuda_targets = targets
    return _cuda_targets


def uses_host_callback() -> bool:
    """Whether calls traced now run as host callbacks (see the module docstring): forced by
    ``DUALEMB_JAX_HOST_CALLBACK``, else when the default backend has no native handler."""
    if _FORCED:
        return _FORCED == "1"
    return jax.default_backend() not in _PLATFORMS


def _call(target, results, *operands, has_side_effect=False, vmap_method=_VMAP, gpu=False):
    """``jax.ffi.ffi_call(target, results, ...)(*operands)``, or its host-callback twin; with
    ``gpu`` (a GPU table) always the CUDA handler."""
    if gpu:
        if target not in register_cuda():
            raise NotImplementedError(f"{target} has no CUDA handler (a GPU table)")
        return jax.ffi.ffi_call(target, results, has_side_effect=has_side_effect,
                                vmap_method=vmap_method)(*operands)
    if not uses_host_callback() and not (has_side_effect and vmap_method == _VMAP):
        return jax.ffi.ffi_call(target, results, has_side_effect=has_side_effect,
                                vmap_method=vmap_method)(*operands)
    single = not isinstance(results, (tuple, list))
    results = (results,) if single else tuple(results)
    if not uses_host_callback():
        # A write: kept and run once without a JAX effect, so that jit keeps its fast dispatch
        # path (dualemb/jax/_write_primitive.py says why and how).
        outs = tuple(_write_primitive.write(target, results, *operands))
    else:
        outs = _host_call(_HOST_FNS[target], results, has_side_effect, vmap_method, *operands)
    return outs[0] if single else outs


def _host_call(fn, results, has_side_effect, vmap_method, *operands):
    specs = tuple((tuple(r.shape), jnp.dtype(r.dtype)) for r in results)
    callback = functools.partial(fn, outs=specs)
    if vmap_method != _VMAP:  # unique, exchange_check: no table, sequential like the FFI
        return tuple(jax.pure_callback(callback, results, *operands, vmap_method=vmap_method))

    @jax.custom_batching.custom_vmap
    def call(*ops):
        if has_side_effect:
            return tuple(io_callback(callback, results, *ops, ordered=False))
        return tuple(jax.pure_callback(callback, results, *ops))

    @call.def_vmap
    def _expand_dims(axis_size, in_batched, *ops):
        # The FFI's "expand_dims": unbatched operands get a leading axis of size 1, results
        # one of the batch's size, and the whole batch goes to one call.
        ops = [o if b else jnp.expand_dims(o, 0) for o, b in zip(ops, in_batched)]
        batched = tuple(jax.ShapeDtypeStruct((axis_size,) + tuple(r.shape), r.dtype)
                        for r in results)
        out = _host_call(fn, batched, has_side_effect, vmap_method, *ops)
        return out, tuple(True for _ in out)

    return call(*operands)
_f32 = jnp.float32
_i32 = jnp.int32


def _sds(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(shape), dtype)


def _table(handle, version):
    """The (handle, version) operands, cut off from differentiation."""
    return jax.lax.stop_gradient(handle), jax.lax.stop_gradient(version)


def _next(version):
    return _sds(jnp.shape(version), _f32)


def _exists_results(shape, with_exists, gpu):
    """The optional ``exists`` result of find / find_or_insert. Left out where it is not wanted:
    XLA gives results nobody reads one shared buffer, and then runs the calls writing it one
    after another although they are independent (every per-table lookup of a step in one chain
    on the CPU). The CUDA handlers take an empty one instead."""
    if with_exists:
        return (_sds(shape, jnp.bool_),)
    return (_sds((0,), jnp.bool_),) if gpu else ()


def find(handle, dim, version, keys, shape, with_exists=True, dtype=_f32, gpu=False):
    """(rows [shape + (dim,)] of ``dtype`` (the table's value dtype), exists [shape]) — reads
    only. Without ``with_exists``, exists is None (the call does not compute it)."""
    outs = _call("dualemb_find",
                 (_sds(shape + (dim,), dtype), *_exists_results(shape, with_exists, gpu)),
                 *_table(handle, version), keys, gpu=gpu)
    return outs[0], (outs[1] if with_exists else None)


def find_or_insert(handle, dim, version, keys, shape, dtype=_f32, gpu=False, with_exists=True):
    """(next version, rows of ``dtype``, exists, or None without ``with_exists``); missing keys
    are inserted with their initializer row."""
    outs = _call(
        "dualemb_find_or_insert",
        (_next(version), _sds(shape + (dim,), dtype),
         *_exists_results(shape, with_exists, gpu)),
        *_table(handle, version), keys, has_side_effect=True, gpu=gpu)
    return outs[0], outs[1], (outs[2] if with_exists else None)


def insert_or_assign(handle, version, keys, values, mask=None):
    """Next version; writes rows (where ``mask`` is true, if given)."""
    if mask is None:
        return _call("dualemb_insert_or_assign", _next(version), *_table(handle, version),
                     keys, values, has_side_effect=True)
    return _call("dualemb_insert_masked", _next(version), *_table(handle, version), keys,
                 values, mask, has_side_effect=True)


def accum(handle, version, keys, deltas, exists):
    """Next version; TFRA's accum rule."""
    return _call("dualemb_accum", _next(version), *_table(handle, version), keys, deltas,
                 exists, has_side_effect=True)


def erase(handle, version, keys):
    """Next version; removes keys."""
    return _call("dualemb_erase", _next(version), *_table(handle, version), keys,
                 has_side_effect=True)


def apply_gradients(handle, version, keys, grads, lr, step_code, gpu=False):
    """Next version; one fused optimizer step with learning rate ``lr`` (a float32 scalar)
    after ``step_code`` updates (the table's step leaf: the core is given that count + 1)."""
    return _call("dualemb_apply_gradients", _next(version), *_table(handle, version), keys,
                 grads, jnp.asarray(lr, _f32), jax.lax.stop_gradient(step_code),
                 has_side_effect=True, gpu=gpu)


def size(handle, version):
    """Number of keys (int64 with jax_enable_x64, else int32 saturated at 2**31-1)."""
    dtype = jnp.int64 if jax.config.jax_enable_x64 else jnp.int32
    return _call("dualemb_size", _sds((), dtype), *_table(handle, version))


def export(handle, dim, num_slots, version, offset, limit, key_layout, dtype=_f32):
    """(keys, values [limit, dim], slots [limit, num_slots, dim], count): a page of rows
    (values and slots of ``dtype``, the table's value dtype).

    ``key_layout`` is ``(shape, dtype)`` of the keys result: ``((limit,), int64|int32)`` or
    ``((limit, 2), uint32)`` for pairs."""
    kshape, kdtype = key_layout
    return _call(
        "dualemb_export",
        (_sds(kshape, kdtype), _sds((limit, dim), dtype), _sds((limit, num_slots, dim), dtype),
         _sds((), _i32)),
        *_table(handle, version), jnp.asarray(offset, _i32))


def after(version, values):
    """``version``, returned by a custom call that also takes ``values`` (so it waits for them)."""
    return _call("dualemb_after", _next(version), jax.lax.stop_gradient(version),
                 *[jax.lax.stop_gradient(v) for v in values])


def unique(keys, n):
    """(unique keys padded to n with the first key, inverse [n] int32, count int32)."""
    return _call(
        "dualemb_unique", (_sds(keys.shape, keys.dtype), _sds((n,), _i32), _sds((), _i32)),
        keys, vmap_method="sequential")


def exchange_check(needed, capacity, payload):
    """``payload``, once ``needed <= capacity`` (int32 scalars) is checked; otherwise the
    computation fails with an error naming ``capacity_per_shard`` (the sharded path's knob)."""
    return _call("dualemb_exchange_check", _sds(payload.shape, payload.dtype),
                 jnp.asarray(needed, _i32), jnp.asarray(capacity, _i32), payload,
                 vmap_method="sequential")


def apply_gradients_first(handle, version, keys, grads, lr, step_code, count):
    """Next version; :func:`apply_gradients` on the first ``count`` keys and gradients only
    (the rest of the buffers is padding)."""
    return _call("dualemb_apply_gradients_first", _next(version), *_table(handle, version),
                 keys, grads, jnp.asarray(lr, _f32), jax.lax.stop_gradient(step_code),
                 jnp.asarray(count, _i32), has_side_effect=True)


def dense_keras_adam(hyper, grads, m, v):
    """(update, m, v): Keras' Adam on one dense parameter (not a table), in Keras' float32
    order; ``hyper`` is float32[4] {alpha, 1 - beta_1, 1 - beta_2, epsilon}
    (``dualemb.jax.keras_optax``)."""
    s = _sds(jnp.shape(m), _f32)
    return _call("dualemb_dense_keras_adam", (s, s, s), hyper, grads, m, v,
                 vmap_method="sequential")


# ---- many tables in one call -------------------------------------------------------------

def _tables(handles, versions):
    """The (handles [T, 4], versions [T]) operands of a multi-table call."""
    return (jax.lax.stop_gradient(jnp.stack(handles)),
            jax.lax.stop_gradient(jnp.stack([jnp.reshape(v, ()) for v in versions])))


def find_many(handles, versions, keys, shapes, dims, dtypes, with_exists=True):
    """([rows [shape + (dim,)] per table], [exists [shape] per table], or None without
    ``with_exists``: then the call has no exists results, see _exists_results) — reads only."""
    rows = [_sds(s + (d,), dt) for s, d, dt in zip(shapes, dims, dtypes)]
    exists = [_sds(s, jnp.bool_) for s in shapes] if with_exists else []
    outs = _call("dualemb_find_many", tuple(rows + exists), *_tables(handles, versions), *keys)
    return list(outs[:len(keys)]), (list(outs[len(keys):]) if with_exists else None)


def find_or_insert_many(handles, versions, keys, shapes, dims, dtypes):
    """(next versions [T], [rows per table], [exists per table]); missing keys are inserted."""
    n = len(keys)
    results = ((_sds((n,), _f32),) + tuple(_sds(s + (d,), dt) for s, d, dt in
                                           zip(shapes, dims, dtypes))
               + tuple(_sds(s, jnp.bool_) for s in shapes))
    outs = _call("dualemb_find_or_insert_many", results, *_tables(handles, versions), *keys,
                 has_side_effect=True)
    return outs[0], list(outs[1:1 + n]), list(outs[1 + n:])


def apply_gradients_many(handles, versions, keys, grads, lrs, step_codes):
    """Next versions [T]; one fused optimizer step per table (``lrs`` float32 scalars, the
    tables' step leaves as :func:`apply_gradients` takes them)."""
    n = len(keys)
    return _call("dualemb_apply_gradients_many", _sds((n,), _f32), *_tables(handles, versions),
                 jnp.stack([jnp.asarray(lr, _f32) for lr in lrs]),
                 jax.lax.stop_gradient(jnp.stack(step_codes)), *keys, *grads,
                 has_side_effect=True)

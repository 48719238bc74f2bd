"""The host-callback twins of the XLA FFI handlers (``csrc/jax/ffi_*.cc``), in numpy.

Platforms without a native dualemb FFI handler (GPU, TPU: the tables live in host memory) run
every low-level call of :mod:`dualemb.jax._ffi` as a host callback instead; so does the CPU when
``DUALEMB_JAX_HOST_CALLBACK=1`` (for testing this path). Each function here takes the operands
of one FFI handler as numpy arrays and returns its results, with the handler's semantics:

* the handle (float32[4] 16-bit chunks; ``[1, 4]`` under ``vmap``) names one table; a chunk that
  is not an exact integer is refused as a corrupted handle, an unknown id as an unknown table;
* the version token: element 0 is read; writes return ``version + 1`` (wrapping at 2**24) in
  every element of the next token's shape;
* keys: int64, int32 or uint32 pairs ``[..., 2]`` (read as int64), converted to the table's key
  dtype, int64 keys that do not fit an int32 table refused (never truncated);
* row buffers (rows, values, deltas, slots) are in the table's value dtype; one in another dtype
  is refused, naming both (as the handler's CheckValueType), never reinterpreted;
* errors raise :class:`HostCallbackError` with the handler's message; the core's contract leaves
  the table unchanged.

They call the core through the pybind module (``dualemb._core``), so the core does the same
work, with the same summation order, as through the FFI: results are bit for bit the same.
"""

from __future__ import annotations

import numpy as np

from dualemb._native import load_extension
from dualemb.core import value_dtypes as _vd

_core = load_extension("_core")

_INT64, _INT32 = 0, 1  # the core's key dtype codes (DE_KEY_INT64, DE_KEY_INT32)


class HostCallbackError(ValueError):
    """A dualemb call on the host-callback path failed (the FFI handler's error)."""


def _decode_chunks(chunks: np.ndarray) -> int | None:
    """The unsigned integer of 16-bit float chunks (low first), or None if one is not an exact
    integer in [0, 65535]."""
    c = np.asarray(chunks, np.float32).reshape(-1)
    if not np.all((c >= 0) & (c <= 65535) & (np.floor(c) == c)):
        return None
    return sum(int(v) << (16 * i) for i, v in enumerate(c))


def table_id(handle) -> int:
    h = np.asarray(handle)
    if h.size != 4:
        raise HostCallbackError(
            f"dualemb: a table handle is float32[4] naming one table, got {h.size} values "
            "(vmapping over a batch of tables is not supported)")
    v = _decode_chunks(h)
    if v is None or v >> 63:
        raise HostCallbackError(
            "dualemb: corrupted table handle (its values are not the 16-bit chunks of a table "
            "id): something changed the table's leaves, e.g. an optimizer update or a dtype "
            "cast applied to a pytree that holds the table; keep tables out of what optimizers "
            "update")
    return v


def _dims(tid: int) -> tuple[int, int, int]:
    """(dim, key dtype code, num_slots) of a live table, or the handler's unknown-id error."""
    if not _core.exists(tid):
        raise HostCallbackError(
            f"dualemb: unknown table id {tid} (destroyed, or not created or loaded in this "
            "process; create it or load its checkpoint first)")
    dim, kd, ns = _core.dims(tid)
    return int(dim), int(kd), int(ns)


def _next_version(version, shape) -> np.ndarray:
    v = np.asarray(version, np.float32).reshape(-1)
    v = v[0] if v.size else np.float32(0)
    nxt = np.float32(v + np.float32(1))
    if not nxt >= 0 or nxt >= 16777216:
        nxt = np.float32(0)
    return np.full(shape, nxt, np.float32)


def _keys(keys, key_dtype: int) -> np.ndarray:
    """Flat keys in the table's key dtype (the handler's DecodeKeys)."""
    k = np.asarray(keys)
    if k.dtype == np.uint32:
        if k.ndim == 0 or k.shape[-1] != 2:
            raise HostCallbackError("dualemb: keys must be int64, int32, or uint32 pairs "
                                    "[..., 2] (from dualemb.jax.ids)")
        k = np.ascontiguousarray(k).view(np.int64)  # (low, high) pairs, little-endian
    elif k.dtype not in (np.int64, np.int32):
        raise HostCallbackError("dualemb: keys must be int64, int32, or uint32 pairs [..., 2] "
                                "(from dualemb.jax.ids)")
    k = k.reshape(-1)
    if key_dtype == _INT64:
        return np.ascontiguousarray(k, np.int64)
    if k.dtype == np.int64:
        bad = (k < np.iinfo(np.int32).min) | (k > np.iinfo(np.int32).max)
        if bad.any():
            raise HostCallbackError(f"dualemb: key {int(k[bad][0])} does not fit the table's "
                                    "int32 key dtype")
    return np.ascontiguousarray(k, np.int32)


def _prepare(handle, keys, rows=None, rows_name=""):
    """(table id, dim, num_slots, keys) — the handler's Prepare, checking that ``rows`` holds
    keys x dim values."""
    tid = table_id(handle)
    dim, kd, ns = _dims(tid)
    k = _keys(keys, kd)
    if rows is not None and np.size(rows) != k.size * dim:
        raise HostCallbackError(f"dualemb: {rows_name} hold {np.size(rows)} values, expected "
                                f"keys ({k.size}) x dim ({dim})")
    return tid, dim, ns, k


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).reshape(-1)


def _value_dtype(tid: int) -> np.dtype:
    return _vd.NUMPY[_vd.CODES[int(_core.value_dtype(tid))]]


def _check_values(tid: int, dtype, what: str) -> np.dtype:
    """The table's value dtype, if ``dtype`` (a row buffer's) is it; the handler's error if not."""
    want = _value_dtype(tid)
    if np.dtype(dtype) != want:
        raise HostCallbackError(
            f"dualemb: {what} are {np.dtype(dtype).name} but table {tid} stores {want.name} "
            "values (the handle's value_dtype does not match the table it names; make the "
            "handle with dualemb.jax.attach or load, which read the table's dtype)")
    return want


def _rows(tid: int, a, what: str) -> np.ndarray:
    """A row operand as a flat contiguous array, after checking its dtype."""
    a = np.asarray(a)
    _check_values(tid, a.dtype, what)
    return np.ascontiguousarray(a).reshape(-1)


def _core_call(what: str, fn, *args):
    try:
        return fn(*args)
    except (ValueError, KeyError, MemoryError) as e:
        raise HostCallbackError(f"dualemb {what}: {e}") from e


def _step_count(step_code, what: str) -> int:
    count = _decode_chunks(step_code)
    if count is None or count > 0x7FFFFFFE:
        raise HostCallbackError(
            f"dualemb {what}: corrupted step count (the table's step leaf is not the 16-bit "
            "chunks of a count): something changed the table's leaves, e.g. an optimizer "
            "update applied to a pytree that holds the table")
    return count


# ---- the handlers ------------------------------------------------------------------------
# Each takes the operands and ``outs``, the (shape, dtype) of every result (as XLA hands the
# FFI handler its result buffers: under vmap they carry the batch axis), and returns the results.
# ``@twin`` files it under its FFI target's name; ``dualemb.jax._ffi`` checks at import that the
# twins are exactly the targets of ``dualemb._jax_ffi`` (listed once, in csrc/jax/ffi_handlers.h).

TWINS: dict = {}  # {FFI target name "dualemb_<fn name>": fn}


def twin(fn):
    """Files ``fn`` as the host twin of the FFI target ``dualemb_<fn.__name__>``."""
    TWINS["dualemb_" + fn.__name__] = fn
    return fn


def _empty(out, fill=0):
    shape, dtype = out
    return np.full(shape, fill, dtype)


def _check_rows(rows: np.ndarray, n: int, dim: int, name: str = "rows"):
    if rows.size != n * dim:
        raise HostCallbackError(f"dualemb: {name} hold {rows.size} values, expected keys ({n}) "
                                f"x dim ({dim})")


def _optional_exists(outs, n: int, op: str):
    """The uint8 buffer for find's / find_or_insert's optional exists result (``outs``: its spec,
    or none), or None where it is not wanted (no result, or an empty one), as the handlers do."""
    if len(outs) > 1:
        raise HostCallbackError(f"dualemb {op}: one exists result at most")
    if not outs or _empty(outs[0]).size == 0:
        return None
    exists = _empty(outs[0]).astype(np.uint8)
    if exists.size != n:
        raise HostCallbackError(f"dualemb {op}: exists must have one entry per key")
    return exists


def _exists_out(exists, spec):
    return _empty(spec) if exists is None else exists.view(bool)


@twin
def find(handle, version, keys, *, outs):
    tid, dim, _, k = _prepare(handle, keys)
    rows = _empty(outs[0], 0)
    exists = _optional_exists(outs[1:], k.size, "find")
    _check_values(tid, rows.dtype, "rows")
    _check_rows(rows, k.size, dim)
    _core_call("find", _core.find, tid, k, rows, exists)
    return (rows,) if len(outs) == 1 else (rows, _exists_out(exists, outs[1]))


@twin
def size(handle, version, *, outs):
    n = _core_call("size", _core.size, table_id(handle))
    shape, dtype = outs[0]
    if np.dtype(dtype) == np.int32:
        n = min(n, 2**31 - 1)
    elif np.dtype(dtype) != np.int64:
        raise HostCallbackError("dualemb size: result must be int32 or int64")
    return (np.full(shape, n, dtype),)


@twin
def export(handle, version, offset, *, outs):
    tid = table_id(handle)
    dim, kd, ns = _dims(tid)
    (kshape, kdtype), (vshape, vdtype), (sshape, sdtype), (cshape, _) = outs
    vdtype = _check_values(tid, vdtype, "values")
    _check_values(tid, sdtype, "slots")
    kdtype = np.dtype(kdtype)
    limit = int(np.prod(kshape)) // (2 if kdtype == np.uint32 else 1)
    if int(np.prod(vshape)) != limit * dim:
        raise HostCallbackError("dualemb export: values must be [limit, dim]")
    want_slots = int(np.prod(sshape)) != 0
    if want_slots and int(np.prod(sshape)) != limit * ns * dim:
        raise HostCallbackError("dualemb export: slots must be [limit, num_slots, dim]")
    off = int(np.asarray(offset).reshape(-1)[0]) if np.size(offset) else 0
    if off < 0:
        raise HostCallbackError("dualemb export: offset must be >= 0")
    if kd == _INT64 and kdtype == np.int32:
        raise HostCallbackError(
            "dualemb export: an int64 table's keys cannot be exported as int32")
    core_keys = np.zeros(limit, np.int64 if kd == _INT64 else np.int32)
    values = np.zeros((limit, dim), vdtype)
    slots = np.zeros((limit, ns if want_slots else 0, dim), vdtype)
    n = _core_call("export", _core.export_page, tid, off, core_keys, values,
                   slots if want_slots else None, None, None)
    keys = np.zeros(limit, np.int32 if kdtype == np.int32 else np.int64)
    keys[:n] = core_keys[:n]  # an int32 table exported as int64 / pairs: widened
    if kdtype == np.uint32:
        keys = keys.view(np.uint32)
    return (keys.reshape(kshape), values.reshape(vshape), slots.reshape(sshape),
            np.full(cshape, n, np.int32))


@twin
def after(version, *values, outs):
    v = np.asarray(version, np.float32).reshape(-1)
    return (np.full(outs[0][0], v[0] if v.size else 0, np.float32),)


@twin
def unique(keys, *, outs):
    k = np.asarray(keys)
    flat = (np.ascontiguousarray(k).view(np.int64).reshape(-1) if k.dtype == np.uint32
            else k.reshape(-1))
    if flat.size:
        uniq, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")  # first-occurrence order, as the handler
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        u = uniq[order]
        inv = rank[inverse.reshape(-1)].astype(np.int32)
    else:
        u, inv = flat[:0], np.zeros(0, np.int32)
    out = np.full(flat.shape, flat[0] if flat.size else 0, flat.dtype)
    out[:u.size] = u
    if k.dtype == np.uint32:
        out = out.view(np.uint32)
    return out.reshape(k.shape), inv, np.asarray(u.size, np.int32)


@twin
def dense_keras_adam(hyper, grads, m, v, *, outs):
    f32 = np.float32
    alpha, omb1, omb2, eps = (f32(x) for x in np.asarray(hyper, f32).reshape(-1)[:4])
    g, m, v = (np.asarray(x, f32) for x in (grads, m, v))
    m = m + (g - m) * omb1  # numpy rounds each operation, as Keras (and the handler) do
    v = v + (np.square(g) - v) * omb2
    return -((m * alpha) / (np.sqrt(v) + eps)), m, v


@twin
def exchange_check(needed, capacity, payload, *, outs):
    n, c = int(np.asarray(needed).reshape(())), int(np.asarray(capacity).reshape(()))
    if n > c:
        raise HostCallbackError(
            f"dualemb sharded exchange overflow: {n} distinct ids of one device's batch belong "
            f"to one shard, but the exchange buffer holds capacity_per_shard={c} ids per "
            "destination; create the sharded table with a larger capacity_per_shard (at most "
            "the local batch size is always enough; see docs/scaling_jax.md). Nothing was "
            "written.")
    return (np.array(payload),)


# ---- writes (the next version token first) ---------------------------------------------------

@twin
def find_or_insert(handle, version, keys, *, outs):
    tid, dim, _, k = _prepare(handle, keys)
    rows = _empty(outs[1])
    exists = _optional_exists(outs[2:], k.size, "find_or_insert")
    _check_values(tid, rows.dtype, "rows")
    _check_rows(rows, k.size, dim)
    _core_call("find_or_insert", _core.find_or_insert, tid, k, rows, exists)
    head = (_next_version(version, outs[0][0]), rows)
    return head if len(outs) == 2 else head + (_exists_out(exists, outs[2]),)


@twin
def insert_or_assign(handle, version, keys, values, *, outs):
    tid, _, _, k = _prepare(handle, keys, values, "rows")
    _core_call("insert_or_assign", _core.insert_or_assign, tid, k, _rows(tid, values, "rows"))
    return (_next_version(version, outs[0][0]),)


@twin
def insert_masked(handle, version, keys, values, mask, *, outs):
    tid, dim, _, k = _prepare(handle, keys, values, "rows")
    v = _rows(tid, values, "rows")
    m = np.asarray(mask, bool).reshape(-1)
    if m.size != k.size:
        raise HostCallbackError("dualemb insert: mask needs one entry per key")
    if m.any():
        _core_call("insert_or_assign", _core.insert_or_assign, tid,
                   np.ascontiguousarray(k[m]), np.ascontiguousarray(v.reshape(-1, dim)[m]))
    return (_next_version(version, outs[0][0]),)


@twin
def accum(handle, version, keys, deltas, exists, *, outs):
    tid, _, _, k = _prepare(handle, keys, deltas, "deltas")
    e = np.asarray(exists, bool).reshape(-1)
    if e.size != k.size:
        raise HostCallbackError("dualemb accum: exists needs one entry per key")
    _core_call("accum", _core.accum, tid, k, _rows(tid, deltas, "deltas"),
               np.ascontiguousarray(e).view(np.uint8))
    return (_next_version(version, outs[0][0]),)


@twin
def erase(handle, version, keys, *, outs):
    tid, _, _, k = _prepare(handle, keys)
    _core_call("erase", _core.erase, tid, k)
    return (_next_version(version, outs[0][0]),)


def _lr(lr) -> float:
    return float(np.asarray(lr, np.float32).reshape(()))


@twin
def apply_gradients(handle, version, keys, grads, lr, step_code, *, outs):
    tid, _, _, k = _prepare(handle, keys, grads, "gradients")
    if np.size(lr) != 1 or np.size(step_code) != 2:
        raise HostCallbackError("dualemb apply_gradients: lr must be a scalar and the step "
                                "count float32[2]")
    count = _step_count(step_code, "apply_gradients")
    _core_call("apply_gradients", _core.apply_gradients, tid, k, _f32(grads), _lr(lr),
               count + 1)
    return (_next_version(version, outs[0][0]),)


@twin
def apply_gradients_first(handle, version, keys, grads, lr, step_code, count, *, outs):
    tid, dim, _, k = _prepare(handle, keys, grads, "gradients")
    if np.size(lr) != 1 or np.size(step_code) != 2 or np.size(count) != 1:
        raise HostCallbackError("dualemb apply_gradients_first: lr and count must be scalars, "
                                "the step float32[2]")
    n = int(np.asarray(count).reshape(()))
    if n < 0 or n > k.size:
        raise HostCallbackError(f"dualemb apply_gradients_first: count {n} outside "
                                f"[0, {k.size}]")
    steps = _step_count(step_code, "apply_gradients")
    if n > 0:
        _core_call("apply_gradients", _core.apply_gradients, tid, np.ascontiguousarray(k[:n]),
                   _f32(grads)[:n * dim].copy(), _lr(lr), steps + 1)
    return (_next_version(version, outs[0][0]),)


# ---- many tables in one call (ffi_many.cc) -------------------------------------------------
# handles float32[T, 4], versions float32[T], then T key operands (apply_gradients_many: lrs
# float32[T], step counts float32[T, 2], T keys, T gradients). Every table is checked first; the
# core's multi-table call then checks its part before any table changes.

def _many(handles, versions, keys, distinct: bool, what: str):
    """([table ids], [dims], [keys]) of a multi-table call, or the handler's error."""
    count = len(keys)
    h = np.asarray(handles, np.float32)
    if h.size != 4 * count or np.size(versions) != count:
        raise HostCallbackError(
            f"dualemb {what}: expected handles float32[{count}, 4] and versions "
            f"float32[{count}] for {count} key operands (vmapping over tables is not "
            "supported)")
    h = h.reshape(count, 4)
    tids, dims, ks = [], [], []
    for t in range(count):
        try:
            tid, dim, _, k = _prepare(h[t], keys[t])
        except HostCallbackError as e:
            raise HostCallbackError(f"table {t} of {count}: {e}") from e
        if distinct and tid in tids:
            raise HostCallbackError(
                f"dualemb {what}: table {t} of {count}: table {tid} appears twice; give each "
                "table once (concatenate its ids and gradients)")
        tids.append(tid)
        dims.append(dim)
        ks.append(k)
    return tids, dims, ks


def _many_rows(tids, dims, ks, outs):
    rows = []
    for t, (tid, dim, k, out) in enumerate(zip(tids, dims, ks, outs)):
        r = _empty(out, 0)
        try:
            _check_values(tid, r.dtype, "rows")
            _check_rows(r, k.size, dim)
        except HostCallbackError as e:
            raise HostCallbackError(f"table {t} of {len(tids)}: {e}") from e
        rows.append(r)
    return rows


def _many_versions(versions, out) -> np.ndarray:
    v = np.asarray(versions, np.float32).reshape(-1)
    nxt = np.where((v + np.float32(1) >= 0) & (v + np.float32(1) < 16777216),
                   v + np.float32(1), np.float32(0)).astype(np.float32)
    shape = out[0]
    return np.resize(nxt, int(np.prod(shape, dtype=np.int64))).reshape(shape)


@twin
def find_many(handles, versions, *keys, outs):
    count = len(keys)
    tids, dims, ks = _many(handles, versions, keys, False, "find_many")
    if len(outs) not in (count, 2 * count):
        raise HostCallbackError("dualemb find_many: expected rows (and exists) per table")
    rows = _many_rows(tids, dims, ks, outs[:count])
    want_exists = any(int(np.prod(o[0], dtype=np.int64)) for o in outs[count:])
    exists = [np.zeros(k.size if want_exists else 0, np.uint8) for k in ks]
    _core_call("find_many", _core.find_many, tids, ks, rows, exists if want_exists else None)
    return tuple(rows) + tuple(e.view(bool).reshape(o[0]) if want_exists else _empty(o)
                               for e, o in zip(exists, outs[count:]))


@twin
def find_or_insert_many(handles, versions, *keys, outs):
    count = len(keys)
    tids, dims, ks = _many(handles, versions, keys, True, "find_or_insert_many")
    rows = _many_rows(tids, dims, ks, outs[1:1 + count])
    exists = [np.zeros(k.size, np.uint8) for k in ks]
    _core_call("find_or_insert_many", _core.find_or_insert_many, tids, ks, rows, exists)
    return ((_many_versions(versions, outs[0]),) + tuple(rows)
            + tuple(e.view(bool).reshape(o[0]) for e, o in zip(exists, outs[1 + count:])))


@twin
def apply_gradients_many(handles, versions, lrs, step_codes, *rest, outs):
    if len(rest) % 2:
        raise HostCallbackError("dualemb apply_gradients_many: expected keys and gradients "
                                "per table")
    count = len(rest) // 2
    tids, dims, ks = _many(handles, versions, rest[:count], True, "apply_gradients_many")
    if np.size(lrs) != count or np.size(step_codes) != 2 * count:
        raise HostCallbackError("dualemb apply_gradients_many: expected lrs float32[T] and "
                                "step counts float32[T, 2]")
    codes = np.asarray(step_codes, np.float32).reshape(count, 2)
    grads, steps = [], []
    for t in range(count):
        g = _f32(rest[count + t])
        try:
            _check_rows(g, ks[t].size, dims[t], "gradients")
            steps.append(_step_count(codes[t], "apply_gradients_many") + 1)
        except HostCallbackError as e:
            raise HostCallbackError(f"table {t} of {count}: {e}") from e
        grads.append(g)
    lr = [float(x) for x in np.asarray(lrs, np.float32).reshape(-1)]
    _core_call("apply_gradients_many", _core.apply_gradients_many, tids, ks, grads, lr, steps)
    return (_many_versions(versions, outs[0]),)

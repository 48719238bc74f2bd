"""The GPU table (``libdualemb_cuda.so``, csrc/cuda) from Python, through ctypes.

Nothing here runs at ``import dualemb``: the CUDA library is loaded on the first call of
:func:`available` or the first :class:`GpuTable`, so dualemb imports and works on machines with no
GPU, no CUDA driver, and builds made without nvcc. :func:`available` says why a GPU table cannot be
made (library not built, no driver, no device) instead of failing later.

``GpuTable`` takes and returns numpy arrays (staged through device buffers: the library's
``dec_*_host`` calls); the device-pointer calls (``dec_find`` ...) serve benchmarks and, later,
the CUDA-platform XLA FFI handlers. Not yet run on a GPU.
"""

from __future__ import annotations

import ctypes
import json
import os

import numpy as np

_LIB_NAME = "libdualemb_cuda.so"
_lib = None
_load_error: str | None = None


def _library_dir() -> str:
    directory = os.environ.get("DUALEMB_NATIVE_DIR")
    if directory:
        return directory
    from dualemb._native import native_dir

    return native_dir()


def _declare(lib) -> None:
    c = ctypes
    i64p, f32p, u8p = c.POINTER(c.c_int64), c.POINTER(c.c_float), c.POINTER(c.c_uint8)
    sigs = {
        "dec_last_error": (c.c_char_p, []),
        "dec_last_error_kind": (c.c_int, []),
        "dec_device_count": (c.c_int, [c.POINTER(c.c_int)]),
        "dec_device_name": (c.c_int, [c.c_char_p, c.c_size_t]),
        "dec_table_create": (c.c_int, [c.c_char_p, c.POINTER(c.c_void_p)]),
        "dec_table_destroy": (c.c_int, [c.c_void_p]),
        "dec_set_optimizer": (c.c_int, [c.c_void_p, c.c_char_p]),
        "dec_size": (c.c_int, [c.c_void_p, i64p]),
        "dec_num_slots": (c.c_int, [c.c_void_p, c.POINTER(c.c_int)]),
        "dec_clear": (c.c_int, [c.c_void_p]),
        "dec_find_host": (c.c_int, [c.c_void_p, i64p, c.c_int64, f32p, u8p]),
        "dec_find_or_insert_host": (c.c_int, [c.c_void_p, i64p, c.c_int64, f32p, u8p]),
        "dec_insert_or_assign_host": (c.c_int, [c.c_void_p, i64p, c.c_int64, f32p]),
        "dec_apply_gradients_host": (c.c_int, [c.c_void_p, i64p, c.c_int64, f32p, c.c_float,
                                               c.c_int64]),
        "dec_erase_host": (c.c_int, [c.c_void_p, i64p, c.c_int64]),
        "dec_export_host": (c.c_int, [c.c_void_p, c.c_int64, c.c_int64, i64p, f32p, f32p, i64p,
                                      i64p, i64p]),
        "dec_malloc": (c.c_int, [c.POINTER(c.c_void_p), c.c_size_t]),
        "dec_free": (c.c_int, [c.c_void_p]),
        "dec_memcpy": (c.c_int, [c.c_void_p, c.c_void_p, c.c_size_t, c.c_int]),
        "dec_synchronize": (c.c_int, []),
        "dec_copy_bandwidth": (c.c_int, [c.c_size_t, c.c_int, c.POINTER(c.c_double)]),
        "dec_find": (c.c_int, [c.c_void_p, c.c_void_p, c.c_int64, c.c_void_p, c.c_void_p,
                               c.c_void_p]),
        "dec_find_or_insert": (c.c_int, [c.c_void_p, c.c_void_p, c.c_int64, c.c_void_p,
                                         c.c_void_p, c.c_void_p, i64p]),
        "dec_insert_or_assign": (c.c_int, [c.c_void_p, c.c_void_p, c.c_int64, c.c_void_p,
                                           c.c_void_p, i64p]),
        "dec_apply_gradients": (c.c_int, [c.c_void_p, c.c_void_p, c.c_int64, c.c_void_p,
                                          c.c_float, c.c_int64, c.c_void_p, i64p]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes


def library():
    """The loaded ``libdualemb_cuda.so``; raises RuntimeError naming why it cannot be loaded."""
    global _lib, _load_error
    if _lib is not None:
        return _lib
    if _load_error is None:
        path = os.path.join(_library_dir(), _LIB_NAME)
        if not os.path.exists(path):
            _load_error = (f"{_LIB_NAME} is not built ({path} does not exist): dualemb was built "
                           "where CMake found no CUDA compiler (nvcc)")
        else:
            try:
                lib = ctypes.CDLL(path)
                _declare(lib)
                _lib = lib
                return lib
            except OSError as e:
                _load_error = f"cannot load {path}: {e}"
    raise RuntimeError(_load_error)


def _check(rc: int) -> None:
    if rc != 0:
        lib = library()
        msg, kind = lib.dec_last_error().decode(), lib.dec_last_error_kind()
        raise {1: ValueError, 2: MemoryError}.get(kind, RuntimeError)(msg)


def available() -> tuple[bool, str]:
    """(True, device name) when a GPU table can be made, else (False, the reason)."""
    try:
        lib = library()
    except RuntimeError as e:
        return False, str(e)
    count = ctypes.c_int(0)
    if lib.dec_device_count(ctypes.byref(count)) != 0:
        return False, f"no usable CUDA device: {lib.dec_last_error().decode()}"
    if count.value < 1:
        return False, "no CUDA device"
    buf = ctypes.create_string_buffer(256)
    _check(lib.dec_device_name(buf, 256))
    return True, buf.value.decode()


def _ptr(a: np.ndarray, ctype):
    return a.ctypes.data_as(ctypes.POINTER(ctype))


def _keys(keys) -> np.ndarray:
    k = np.asarray(keys)
    if k.dtype != np.int64:
        if not np.issubdtype(k.dtype, np.integer):
            raise TypeError(f"GPU table keys must be integers, got {k.dtype}")
        k = k.astype(np.int64)
    if k.ndim != 1:
        raise ValueError(f"GPU table keys must be 1-D, got shape {k.shape}")
    return np.ascontiguousarray(k)


class GpuTable:
    """A float32 table resident in GPU memory; numpy in and out (see gpu_table.h)."""

    def __init__(self, dim: int, initializer: str = "zeros", optimizer=None, **config):
        lib = library()
        cfg = {"dim": int(dim), "initializer": initializer, **config}
        self.dim = int(dim)
        self._h = ctypes.c_void_p()
        _check(lib.dec_table_create(json.dumps(cfg).encode(), ctypes.byref(self._h)))
        self.num_slots = 0
        if optimizer is not None:
            from dualemb.core.optimizers import spec_string

            try:
                _check(lib.dec_set_optimizer(self._h, spec_string(optimizer).encode()))
            except Exception:
                self.destroy()
                raise
            n = ctypes.c_int(0)
            _check(lib.dec_num_slots(self._h, ctypes.byref(n)))
            self.num_slots = n.value

    def destroy(self) -> None:
        if self._h:
            library().dec_table_destroy(self._h)
            self._h = ctypes.c_void_p()

    def __del__(self):
        try:
            self.destroy()
        except Exception:
            pass

    def _rows(self, values, n: int) -> np.ndarray:
        v = np.ascontiguousarray(np.asarray(values, np.float32))
        if v.shape != (n, self.dim):
            raise ValueError(f"expected rows of shape {(n, self.dim)}, got {v.shape}")
        return v

    def find(self, keys):
        k = _keys(keys)
        values = np.empty((len(k), self.dim), np.float32)
        exists = np.empty(len(k), np.uint8)
        _check(library().dec_find_host(self._h, _ptr(k, ctypes.c_int64), len(k),
                                       _ptr(values, ctypes.c_float), _ptr(exists, ctypes.c_uint8)))
        return values, exists.astype(bool)

    def find_or_insert(self, keys):
        k = _keys(keys)
        values = np.empty((len(k), self.dim), np.float32)
        exists = np.empty(len(k), np.uint8)
        _check(library().dec_find_or_insert_host(self._h, _ptr(k, ctypes.c_int64), len(k),
                                                 _ptr(values, ctypes.c_float),
                                                 _ptr(exists, ctypes.c_uint8)))
        return values, exists.astype(bool)

    def insert_or_assign(self, keys, values) -> None:
        k = _keys(keys)
        v = self._rows(values, len(k))
        _check(library().dec_insert_or_assign_host(self._h, _ptr(k, ctypes.c_int64), len(k),
                                                   _ptr(v, ctypes.c_float)))

    def apply_gradients(self, keys, grads, lr: float, step: int) -> None:
        k = _keys(keys)
        g = self._rows(grads, len(k))
        _check(library().dec_apply_gradients_host(self._h, _ptr(k, ctypes.c_int64), len(k),
                                                  _ptr(g, ctypes.c_float), float(lr), int(step)))

    def erase(self, keys) -> None:
        k = _keys(keys)
        _check(library().dec_erase_host(self._h, _ptr(k, ctypes.c_int64), len(k)))

    def clear(self) -> None:
        _check(library().dec_clear(self._h))

    def size(self) -> int:
        n = ctypes.c_int64(0)
        _check(library().dec_size(self._h, ctypes.byref(n)))
        return n.value

    def export(self, page: int = 1 << 16) -> dict:
        """Every row, in pages of ``page`` rows: keys, values, slots [n, num_slots, dim],
        last_update, update_count."""
        num_slots = self.num_slots
        parts = []
        offset = 0
        while True:
            keys = np.empty(page, np.int64)
            values = np.empty((page, self.dim), np.float32)
            slots = np.empty((page, num_slots, self.dim), np.float32)
            lu = np.empty(page, np.int64)
            uc = np.empty(page, np.int64)
            written = ctypes.c_int64(0)
            _check(library().dec_export_host(
                self._h, offset, page, _ptr(keys, ctypes.c_int64), _ptr(values, ctypes.c_float),
                _ptr(slots, ctypes.c_float) if num_slots else None, _ptr(lu, ctypes.c_int64),
                _ptr(uc, ctypes.c_int64), ctypes.byref(written)))
            m = written.value
            parts.append((keys[:m], values[:m], slots[:m], lu[:m], uc[:m]))
            offset += m
            if m < page:
                break
        cat = [np.concatenate([p[i] for p in parts]) for i in range(5)]
        return dict(zip(("keys", "values", "slots", "last_update", "update_count"), cat))

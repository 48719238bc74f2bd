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
        "dec_find_or_insert_host": (c.c_int, [c.c_void_p, i64p, c.c_int64, f32p, u8p, i64p]),
        "dec_insert_or_assign_host": (c.c_int, [c.c_void_p, i64p, c.c_int64, f32p, i64p]),
        "dec_apply_gradients_host": (c.c_int, [c.c_void_p, i64p, c.c_int64, f32p, c.c_float,
                                               c.c_int64, i64p]),
        "dec_accum_host": (c.c_int, [c.c_void_p, i64p, c.c_int64, f32p, f32p, u8p, i64p]),
        "dec_import_host": (c.c_int, [c.c_void_p, i64p, c.c_int64, f32p, f32p, i64p, i64p,
                                      i64p]),
        "dec_restrict": (c.c_int, [c.c_void_p, c.c_int64, c.c_int, i64p, f32p, c.c_int64,
                                   i64p]),
        "dec_get_clock": (c.c_int, [c.c_void_p, i64p]),
        "dec_set_clock": (c.c_int, [c.c_void_p, c.c_int64]),
        "dec_evicted_total": (c.c_int, [c.c_void_p, i64p]),
        "dec_dim": (c.c_int, [c.c_void_p, i64p]),
        "dec_reserve": (c.c_int, [c.c_void_p, c.c_int64]),
        "dec_table_id": (c.c_int, [c.c_void_p, i64p]),
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
            except AttributeError as e:  # a library from an older build lacks a function
                _load_error = (f"{path} is stale ({e}): it is not the build of this dualemb; "
                               "rebuild dualemb")
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


_POLICIES = {"recency": 0, "frequency": 1}
_INIT_KEYS = ("initializer", "seed", "mean", "stddev", "minval", "maxval", "value", "values")


def _i64(a, n: int, name: str):
    """An int64 metadata array of n entries, or None."""
    if a is None:
        return None
    a = np.ascontiguousarray(np.asarray(a), np.int64)
    if a.shape != (n,):
        raise ValueError(f"{name} has shape {a.shape}, expected ({n},)")
    return a


class GpuTable:
    """A float32 table resident in GPU memory; numpy in and out (see gpu_table.h).

    Its interface is the CPU :class:`dualemb.core.Table`'s where the GPU table has the
    operation (find, find_or_insert, insert_or_assign, accum, accum_rows, erase, clear, size,
    reserve, apply_gradients, restrict, export, import_rows, clock, evicted_total, describe,
    slot_names), so ``dualemb.core.checkpoint.save`` writes it in the common format and
    ``dualemb.core.checkpoint.load(path, tables={name: gpu_table})`` reads any checkpoint of a
    float32 int64-key table into it. Writes return the number of rows a capacity evicted.
    """

    # The GPU table keeps no stepped mark (issue 24's RowMeta bit): its exports have no
    # "stepped" column, so a checkpoint of it leaves the optional tensor out and its rows load by
    # the format's default rule (stepped where the slots differ from the initial slots).
    has_stepped = False

    def __init__(self, dim: int, initializer=None, optimizer=None, *, capacity: int = 0,
                 evict_policy: str = "recency", key_dtype="int64", value_dtype="float32",
                 name=None, capacity_hint: int | None = None, max_load: float | None = None,
                 **initializer_members):
        if str(np.dtype(key_dtype)) != "int64":
            raise ValueError(f"a GPU table has int64 keys, got key_dtype {key_dtype!r}")
        if str(value_dtype) != "float32":
            raise ValueError(f"a GPU table stores float32 values, got value_dtype "
                             f"{value_dtype!r} (float16/bfloat16/float64 stay on the CPU tables)")
        del name  # accepted for the checkpoint loader's calls; GPU tables are not named
        if initializer_members:  # GpuTable(8, initializer="normal", seed=7, stddev=0.5)
            if not isinstance(initializer, (str, type(None))):
                raise TypeError(f"unexpected arguments {sorted(initializer_members)}")
            initializer = {"initializer": initializer or "zeros", **initializer_members}
        lib = library()
        # The CPU core parses the same arguments: its description (canonical initializer and
        # optimizer) is this table's, and a bad argument fails the same way on both.
        from dualemb.core.table import Table as _CpuTable

        twin = _CpuTable(int(dim), initializer=initializer, optimizer=optimizer,
                         capacity=capacity, evict_policy=evict_policy)
        try:
            self._description = twin.describe()
            self._slot_names = list(twin.slot_names)
        finally:
            twin.destroy()
        config = self._description[0]
        cfg = {k: config[k] for k in _INIT_KEYS if k in config}
        cfg.update(dim=int(dim), capacity=int(config.get("capacity", 0)),
                   evict_policy=str(config.get("evict_policy", "recency")))
        if capacity_hint is not None:
            cfg["capacity_hint"] = int(capacity_hint)
        if max_load is not None:
            cfg["max_load"] = float(max_load)
        self.dim = int(dim)
        self._h = ctypes.c_void_p()
        _check(lib.dec_table_create(json.dumps(cfg).encode(), ctypes.byref(self._h)))
        self.num_slots = 0
        self.last_evicted = 0
        if optimizer is not None:
            try:
                self._attach(optimizer)
            except Exception:
                self.destroy()
                raise

    # -- description (what the checkpoint writer and loader read) ----------------------------

    key_dtype = np.dtype(np.int64)
    key_dtype_name = "int64"
    value_dtype = np.dtype(np.float32)

    @property
    def id(self) -> int:
        """The table's id in the GPU registry (what a JAX handle of it holds)."""
        out = ctypes.c_int64(0)
        _check(library().dec_table_id(self._h, ctypes.byref(out)))
        return out.value

    def describe(self) -> tuple[dict, dict | None]:
        """(config, optimizer spec or None), as the CPU core describes the same table."""
        config, opt = self._description
        return dict(config), (None if opt is None else dict(opt))

    @property
    def slot_names(self) -> list[str]:
        return list(self._slot_names)

    @property
    def optimizer(self) -> dict | None:
        return self._description[1]

    def _attach(self, optimizer) -> None:
        from dualemb.core.optimizers import spec_string

        spec = spec_string(optimizer) if optimizer is not None else ""
        _check(library().dec_set_optimizer(self._h, spec.encode()))
        n = ctypes.c_int(0)
        _check(library().dec_num_slots(self._h, ctypes.byref(n)))
        self.num_slots = n.value

    def set_optimizer(self, optimizer) -> None:
        """Attaches (None: detaches) a fused optimizer, as the CPU table does: the same one again
        keeps the slots, another gives every row its initial slots."""
        from dualemb.core.table import Table as _CpuTable

        config, _ = self._description
        keep = {k: v for k, v in config.items() if k not in ("dim", "num_threads")}
        twin = _CpuTable(self.dim, optimizer=optimizer, **_cpu_config(keep))
        try:
            description, slot_names = twin.describe(), list(twin.slot_names)
        finally:
            twin.destroy()
        self._attach(optimizer)
        self._description, self._slot_names = description, slot_names

    def destroy(self) -> None:
        if self._h:
            library().dec_table_destroy(self._h)
            self._h = ctypes.c_void_p()

    def __del__(self):
        try:
            self.destroy()
        except Exception:
            pass

    def _rows(self, values, n: int, what: str = "rows") -> np.ndarray:
        v = np.ascontiguousarray(np.asarray(values, np.float32))
        if v.shape != (n, self.dim):
            raise ValueError(f"expected {what} of shape {(n, self.dim)}, got {v.shape}")
        return v

    def _evicted(self, out: ctypes.c_int64) -> int:
        self.last_evicted = out.value
        return out.value

    # -- batched operations --------------------------------------------------------------------

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
        ev = ctypes.c_int64(0)
        _check(library().dec_find_or_insert_host(self._h, _ptr(k, ctypes.c_int64), len(k),
                                                 _ptr(values, ctypes.c_float),
                                                 _ptr(exists, ctypes.c_uint8), ctypes.byref(ev)))
        self._evicted(ev)
        return values, exists.astype(bool)

    def insert_or_assign(self, keys, values) -> int:
        k = _keys(keys)
        v = self._rows(values, len(k))
        ev = ctypes.c_int64(0)
        _check(library().dec_insert_or_assign_host(self._h, _ptr(k, ctypes.c_int64), len(k),
                                                   _ptr(v, ctypes.c_float), ctypes.byref(ev)))
        return self._evicted(ev)

    def _accum(self, keys, new_values, old_values, exists) -> int:
        k = _keys(keys)
        d = self._rows(new_values, len(k), "deltas")
        o = None if old_values is None else self._rows(old_values, len(k), "old values")
        e = np.ascontiguousarray(np.asarray(exists))
        if e.dtype != np.bool_ or e.shape != (len(k),):
            raise ValueError(f"exists must be a bool array of shape ({len(k)},)")
        e = e.astype(np.uint8)
        ev = ctypes.c_int64(0)
        _check(library().dec_accum_host(self._h, _ptr(k, ctypes.c_int64), len(k),
                                        _ptr(d, ctypes.c_float),
                                        None if o is None else _ptr(o, ctypes.c_float),
                                        _ptr(e, ctypes.c_uint8), ctypes.byref(ev)))
        return self._evicted(ev)

    def accum(self, keys, deltas, exists) -> int:
        """TFRA's accum rule (the CPU table's ``accum``)."""
        return self._accum(keys, deltas, None, exists)

    def accum_rows(self, keys, old_values, new_values, exists) -> int:
        """accum with delta = new - old where exists, else new (the CPU's ``accum_rows``)."""
        return self._accum(keys, new_values, old_values, exists)

    def apply_gradients(self, keys, grads, lr: float, step: int) -> int:
        k = _keys(keys)
        g = self._rows(grads, len(k), "gradients")
        if isinstance(step, bool) or int(step) != step:
            raise TypeError(f"step must be an integer, got {step!r}")
        ev = ctypes.c_int64(0)
        _check(library().dec_apply_gradients_host(self._h, _ptr(k, ctypes.c_int64), len(k),
                                                  _ptr(g, ctypes.c_float), float(lr), int(step),
                                                  ctypes.byref(ev)))
        return self._evicted(ev)

    def erase(self, keys) -> None:
        k = _keys(keys)
        _check(library().dec_erase_host(self._h, _ptr(k, ctypes.c_int64), len(k)))

    def clear(self) -> None:
        _check(library().dec_clear(self._h))

    def size(self) -> int:
        n = ctypes.c_int64(0)
        _check(library().dec_size(self._h, ctypes.byref(n)))
        return n.value

    def __len__(self) -> int:
        return self.size()

    def reserve(self, n: int) -> None:
        _check(library().dec_reserve(self._h, int(n)))

    def restrict(self, num_reserved: int, by="recency", keys=None, scores=None) -> int:
        """The CPU table's ``restrict``: keeps the num_reserved best rows; returns how many
        were erased."""
        removed = ctypes.c_int64(0)
        if by == "custom":
            if keys is None or scores is None:
                raise ValueError("restrict(by='custom') needs keys and scores")
            k = _keys(np.asarray(keys).reshape(-1))
            sc = np.ascontiguousarray(np.asarray(scores, np.float32).reshape(-1))
            if sc.shape != k.shape:
                raise ValueError("scores must have one entry per key")
            _check(library().dec_restrict(self._h, int(num_reserved), 2, _ptr(k, ctypes.c_int64),
                                          _ptr(sc, ctypes.c_float), len(k), ctypes.byref(removed)))
            return removed.value
        if by not in _POLICIES:
            raise ValueError(f"unknown restrict policy {by!r} (recency, frequency, custom)")
        _check(library().dec_restrict(self._h, int(num_reserved), _POLICIES[by], None, None, 0,
                                      ctypes.byref(removed)))
        return removed.value

    @property
    def clock(self) -> int:
        out = ctypes.c_int64(0)
        _check(library().dec_get_clock(self._h, ctypes.byref(out)))
        return out.value

    @clock.setter
    def clock(self, value: int) -> None:
        _check(library().dec_set_clock(self._h, int(value)))

    @property
    def evicted_total(self) -> int:
        out = ctypes.c_int64(0)
        _check(library().dec_evicted_total(self._h, ctypes.byref(out)))
        return out.value

    # -- paged export / import (the checkpoint's pages) ------------------------------------------

    def export(self, offset: int = 0, limit: int | None = None) -> dict:
        """Rows [offset, offset + limit) of the slot order (stable while the table is not
        written): keys, values, slots [n, num_slots, dim], last_update, update_count."""
        offset = int(offset)
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        if limit is None:
            limit = max(0, self.size() - offset)
        limit = int(limit)
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        ns = self.num_slots
        keys = np.empty(limit, np.int64)
        values = np.empty((limit, self.dim), np.float32)
        slots = np.empty((limit, ns, self.dim), np.float32)
        lu = np.empty(limit, np.int64)
        uc = np.empty(limit, np.int64)
        written = ctypes.c_int64(0)
        if limit:
            _check(library().dec_export_host(
                self._h, offset, limit, _ptr(keys, ctypes.c_int64), _ptr(values, ctypes.c_float),
                _ptr(slots, ctypes.c_float) if ns else None, _ptr(lu, ctypes.c_int64),
                _ptr(uc, ctypes.c_int64), ctypes.byref(written)))
        m = written.value
        return {"keys": keys[:m], "values": values[:m], "slots": slots[:m],
                "last_update": lu[:m], "update_count": uc[:m]}

    def export_pages(self, page_size: int = 1 << 16):
        offset = 0
        while True:
            page = self.export(offset, page_size)
            if len(page["keys"]) == 0:
                return
            yield page
            offset += len(page["keys"])

    def import_rows(self, keys, values, slots=None, last_update=None, update_count=None,
                    stepped=None) -> int:
        """The CPU table's ``import_rows``: rows with optional slots [n, num_slots, dim] and
        metadata; the last of duplicate keys wins. Returns the rows a capacity evicted.
        ``stepped`` (the checkpoint loader passes a checkpoint's marks) is accepted and dropped:
        the GPU table keeps no stepped marks (see ``has_stepped``)."""
        del stepped
        k = _keys(keys)
        v = self._rows(values, len(k), "values")
        s = None
        if slots is not None:
            s = np.ascontiguousarray(np.asarray(slots, np.float32))
            if s.shape != (len(k), self.num_slots, self.dim):
                raise ValueError(f"slots have shape {s.shape}, expected "
                                 f"({len(k)}, {self.num_slots}, {self.dim}) (the table's slots)")
        lu = _i64(last_update, len(k), "last_update")
        uc = _i64(update_count, len(k), "update_count")
        ev = ctypes.c_int64(0)
        _check(library().dec_import_host(
            self._h, _ptr(k, ctypes.c_int64), len(k), _ptr(v, ctypes.c_float),
            None if s is None or not self.num_slots else _ptr(s, ctypes.c_float),
            None if lu is None else _ptr(lu, ctypes.c_int64),
            None if uc is None else _ptr(uc, ctypes.c_int64), ctypes.byref(ev)))
        return self._evicted(ev)


def _cpu_config(config: dict) -> dict:
    """A described config's members as the CPU Table's keyword arguments."""
    out = {k: v for k, v in config.items() if k not in _INIT_KEYS}
    out["initializer"] = {k: v for k, v in config.items() if k in _INIT_KEYS}
    return out

"""``Table``: the numpy interface of one core table.

Every method validates its arguments before calling into C++, so bad input raises a clear
exception and leaves the table unchanged; any number of Python threads may share a table (the
GIL is released while C++ works). Keys may have any shape; rows come back as
``keys.shape + (dim,)`` in the table's ``value_dtype``. A ``Table`` is a handle: several handles
(and the TF and JAX front ends) may share one core table, and a handle caches only what never
changes (id, dim, key dtype). Evictions, value dtypes, string values and memory:
docs/core.md.
"""

from __future__ import annotations

import threading
from typing import Iterator

import numpy as np

from dualemb._native import load_extension
from dualemb.core import _string_keys
from dualemb.core._table_changes import ChangeTracking
from dualemb.core import initializers as _inits
from dualemb.core import optimizers as _opts
from dualemb.core import value_dtypes as _vd
from dualemb.core.spec import parse_description, to_spec

_core = load_extension("_core")

# String keys are held as an object array of bytes (dualemb/core/_string_keys.py).
KEY_DTYPES = {"int64": np.dtype(np.int64), "int32": np.dtype(np.int32),
              "string": np.dtype(object)}
_KEY_DTYPE_CODES = {0: "int64", 1: "int32", 2: "string"}  # dualemb_core.h DE_KEY_*
_POLICIES = {"recency": 0, "frequency": 1}


def _count(x, name: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {x!r}")
    if x < 0:
        raise ValueError(f"{name} must be >= 0, got {x}")
    return int(x)


def _key_dtype_name(key_dtype) -> str:
    name = np.dtype(key_dtype).name if not isinstance(key_dtype, str) else key_dtype
    if name not in KEY_DTYPES:
        raise TypeError(f"unsupported key dtype {name!r} (supported: int64, int32, string)")
    return name


def _backend_members(backend) -> dict:
    """The table config members that choose the storage backend."""
    if backend is None or backend == "memory":
        return {}
    if isinstance(backend, dict) and len(backend) == 1 and "redis" in backend:
        if not isinstance(backend["redis"], dict):
            raise TypeError(f"backend['redis'] must be a dict, got {backend['redis']!r}")
        return {"backend": "redis", "redis": dict(backend["redis"])}
    raise ValueError(f"unknown backend {backend!r} (None, 'memory' or {{'redis': {{...}}}})")


def _initializer_members(initializer, value_dtype: str) -> dict:
    """The initializer's config members. Numbers given for a non-float32 table keep their exact
    value (an int stays an int, a float64 is not rounded to float32); the core checks that they
    are exact in the dtype."""
    if value_dtype == _vd.STRING:
        return _inits.string_default(initializer)
    if value_dtype != "float32" and not isinstance(initializer, (dict, str, type(None))):
        if isinstance(initializer, (int, np.integer)) and not isinstance(initializer, bool):
            return {"initializer": "constant", "value": int(initializer)}
        if isinstance(initializer, (list, tuple, np.ndarray)):
            arr = np.asarray(initializer).reshape(-1)
            if arr.dtype.kind in "iu":
                return {"initializer": "vector", "values": [int(v) for v in arr]}
            if arr.dtype.kind == "f":
                return {"initializer": "vector", "values": [float(v) for v in arr]}
    return _inits.canonical(initializer)


class Table(ChangeTracking):
    """A dynamic embedding table in the process-wide registry of libdualemb_core.

    Args:
      dim: length of each row (>= 1).
      key_dtype: "int64" (default), "int32" or "string" (keys are byte strings compared by
        their bytes; str keys are UTF-8 encoded; export returns an object array of bytes; see
        dualemb/core/_string_keys.py).
      value_dtype: "float32" (default), "float16", "bfloat16", "float64", "int8", "int32",
        "int64" (or the numpy / ml_dtypes type) or "string" (rows of byte strings; see the
        module doc): the dtype rows and slots are stored and returned in.
      initializer: row a missing key reads as, and a new key starts from: None (zeros), a number,
        an array of length dim or 1, or a ``dualemb.core.initializers`` spec.
      optimizer: optional ``dualemb.core.optimizers`` spec (dict, JSON text, or a name); its
        slots are stored beside every row.
      capacity: if > 0, writes that grow the table past it evict keys by ``evict_policy``
        ("recency" or "frequency"; equal scores keep the smaller keys) and report how many in
        ``last_evicted`` (the int-returning writes also return it).
      num_threads: threads a batched call may use (0 = all cores).
      table_id: attach to (or create under) this id; 0 draws a fresh random id.
      backend: where the rows live: None (in this process' memory, the default) or
        ``{"redis": {...}}`` for a Redis server or cluster, with the members of docs/redis.md
        (at least ``name``; ``addresses`` defaults to ``["127.0.0.1:6379"]``). A Redis table
        outlives the process: another process with the same name, model_tag, shard and db sees
        its rows.
    """

    def __init__(self, dim: int, key_dtype="int64", value_dtype="float32", initializer=None,
                 optimizer=None, capacity: int = 0, evict_policy: str = "recency",
                 num_threads: int = 0, table_id: int = 0, name: str | None = None,
                 backend=None):
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim <= 0:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        kd = _key_dtype_name(key_dtype)
        vd = _vd.name_of(value_dtype)
        init = _initializer_members(initializer, vd)
        config = {"dim": int(dim), "key_dtype": kd, "value_dtype": vd, **init}
        if capacity:
            config.update(capacity=int(capacity), evict_policy=evict_policy)
        if num_threads:
            config["num_threads"] = int(num_threads)
        config.update(_backend_members(backend))
        opt_spec = _opts.spec_string(optimizer)
        new = not (table_id and _core.exists(int(table_id)))
        self._id = _core.create(int(table_id), to_spec(config))
        if opt_spec and new:
            try:
                _core.set_optimizer(self._id, opt_spec)
            except Exception:
                _core.destroy(self._id)
                raise
        elif opt_spec:
            self.set_optimizer(optimizer)
        self.name = name
        self._read_dims()

    @classmethod
    def attach(cls, table_id: int, name: str | None = None) -> "Table":
        """The existing table with this id (created by any front end in this process)."""
        if not _core.exists(int(table_id)):
            raise KeyError(f"unknown table id {table_id} (not created or loaded in this process)")
        t = cls.__new__(cls)
        t._id = int(table_id)
        t.name = name
        t._read_dims()
        return t

    def _read_dims(self):
        # Only the immutable facts are cached: another handle may change the optimizer.
        dim, kd, _ = _core.dims(self._id)
        self._dim = int(dim)
        self._key_dtype_name = _KEY_DTYPE_CODES[int(kd)]
        self._key_dtype = KEY_DTYPES[self._key_dtype_name]
        self._value_dtype_name = _vd.CODES[_core.value_dtype(self._id)]
        self._value_dtype = _vd.NUMPY[self._value_dtype_name]
        self._evicted = threading.local()

    def _record_evicted(self, n: int) -> int:
        self._evicted.count = int(n)
        return int(n)

    @property
    def last_evicted(self) -> int:
        """Keys evicted by the capacity in this thread's last write through this handle (or 0)."""
        return getattr(self._evicted, "count", 0)

    # ---- description -------------------------------------------------------------------------
    @property
    def id(self) -> int:
        return self._id

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def key_dtype(self) -> np.dtype:
        """int64, int32, or object for a string table (see key_dtype_name)."""
        return self._key_dtype

    @property
    def key_dtype_name(self) -> str:
        """"int64", "int32" or "string" (the name the config and checkpoints use)."""
        return self._key_dtype_name

    def string_keys_stats(self) -> tuple[int, int]:
        """A string table's key map: (strings held, their total bytes). Strings whose rows
        were evicted by the capacity are dropped in amortised passes, so this stays within
        about 2 * size() + 1024 strings."""
        return tuple(_core.string_keys_stats(self._id))

    @property
    def value_dtype(self) -> np.dtype:
        """The dtype rows and slots are stored and returned in."""
        return self._value_dtype

    @property
    def num_slots(self) -> int:
        """Slots per row of the attached optimizer (read from the core: it may change)."""
        return int(_core.dims(self._id)[2])

    @property
    def slot_names(self) -> list[str]:
        names = _core.slot_names(self._id)
        return names.split(",") if names else []

    def describe(self) -> tuple[dict, dict | None]:
        """(table config, optimizer spec or None) as the core records them."""
        return parse_description(_core.describe(self._id))

    @property
    def initializer(self) -> dict:
        config, _ = self.describe()
        keep = ("initializer", "seed", "mean", "stddev", "minval", "maxval", "value", "values")
        return {k: v for k, v in config.items() if k in keep}

    @property
    def optimizer(self) -> dict | None:
        return self.describe()[1]

    def set_optimizer(self, optimizer) -> None:
        """Attaches (or with None detaches) a fused optimizer. Existing rows get its initial slots
        unless the same optimizer is already attached."""
        _core.set_optimizer(self._id, _opts.spec_string(optimizer))

    def set_num_threads(self, n: int) -> None:
        _core.set_num_threads(self._id, int(n))

    # ---- argument checks ---------------------------------------------------------------------
    def _keys(self, keys) -> np.ndarray:
        if self._key_dtype_name == _string_keys.STRING:
            return _string_keys.as_string_keys(keys)
        if isinstance(keys, (list, tuple)) and np.size(keys) == 0:
            # [] is an empty batch (numpy alone would make it float64).
            keys = np.asarray(keys, self._key_dtype)
        arr = np.asarray(keys)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"keys must be integers, got dtype {arr.dtype} (this table has "
                            f"{self._key_dtype_name} keys)")
        if arr.dtype != self._key_dtype:
            if arr.size and self._key_dtype == np.int32 and (
                    arr.min() < np.iinfo(np.int32).min or arr.max() > np.iinfo(np.int32).max):
                raise ValueError("keys do not fit the table's int32 key dtype")
            if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
                raise ValueError("uint64 keys above 2**63-1 do not fit int64 keys")
            arr = arr.astype(self._key_dtype)
        # np.require keeps a 0-d key 0-d (np.ascontiguousarray would make it shape (1,)).
        return np.require(arr, requirements="C")

    def _rows(self, values, keys: np.ndarray, what: str, dtype: str | None = None) -> np.ndarray:
        """`values` shaped keys.shape + (dim,), in value dtype `dtype` (default: the table's)."""
        dtype = dtype or self._value_dtype_name
        if dtype == _vd.STRING and not isinstance(values, np.ndarray):
            # dtype=object: numpy's own S/U conversion would drop trailing NULs.
            arr = np.array(values, dtype=object)
        else:
            arr = np.asarray(values)
        if arr.size == 0 and keys.size == 0 and isinstance(values, (list, tuple)):
            arr = np.zeros(keys.shape + (self._dim,), _vd.NUMPY[dtype])  # [] rows for [] keys
        want = keys.shape + (self._dim,)
        if arr.shape != want:
            raise ValueError(f"{what} have shape {arr.shape}, expected keys.shape + (dim,) = {want}")
        return _vd.as_values(arr, dtype, what)

    # ---- batched operations ------------------------------------------------------------------
    def find(self, keys) -> tuple[np.ndarray, np.ndarray]:
        """Rows of `keys` and whether each exists. Missing keys read as their initializer row
        and are not inserted."""
        k = self._keys(keys)
        values = np.empty(k.shape + (self._dim,), self._value_dtype)
        exists = np.empty(k.shape, np.uint8)
        _core.find(self._id, k, values, exists)
        return values, exists.view(bool)

    def find_or_insert(self, keys) -> tuple[np.ndarray, np.ndarray]:
        """Like find, but missing keys are inserted with their initializer row. The keys a
        capacity evicted are in ``last_evicted`` (this returns the rows and exists flags)."""
        k = self._keys(keys)
        values = np.empty(k.shape + (self._dim,), self._value_dtype)
        exists = np.empty(k.shape, np.uint8)
        self._record_evicted(_core.find_or_insert(self._id, k, values, exists))
        return values, exists.view(bool)

    def insert_or_assign(self, keys, values) -> int:
        """Writes rows (the last of duplicate keys wins). Returns keys evicted by a capacity."""
        k = self._keys(keys)
        return self._record_evicted(
            _core.insert_or_assign(self._id, k, self._rows(values, k, "values")))

    def accum(self, keys, deltas, exists) -> int:
        """TFRA's accum: a key absent with exists False is inserted with its delta; a key present
        with exists True gets row += delta; anything else is ignored. Integer rows wrap around
        on overflow (two's complement); float16/bfloat16 add in float32 and round."""
        k = self._keys(keys)
        e = self._exists(exists, k)
        return self._record_evicted(_core.accum(self._id, k, self._rows(deltas, k, "deltas"),
                                                np.require(e, requirements="C").view(np.uint8)))

    @staticmethod
    def _exists(exists, k) -> np.ndarray:
        e = np.asarray(exists)
        if e.size == 0 and isinstance(exists, (list, tuple)):
            e = e.astype(bool)
        if e.shape != k.shape or e.dtype != bool:
            raise ValueError(f"exists must be a bool array of shape {k.shape}")
        return e

    def accum_rows(self, keys, old_values, new_values, exists) -> int:
        """``accum`` with the deltas still to compute, TFRA's ``Variable.accum(keys, old, new,
        exists)``: delta = new - old where ``exists``, else new, in the value dtype's arithmetic
        (the same result as computing the deltas and calling ``accum``), formed by the core as it
        adds them."""
        k = self._keys(keys)
        e = self._exists(exists, k)
        return self._record_evicted(_core.accum_rows(
            self._id, k, self._rows(old_values, k, "old_values"),
            self._rows(new_values, k, "new_values"), np.require(e, requirements="C").view(np.uint8)))

    def erase(self, keys) -> None:
        """Erases keys (absent ones are ignored). Emptied row chunks go back to the OS (one spare
        per shard is kept for reuse), and a shard's index shrinks once under 1/8 full."""
        _core.erase(self._id, self._keys(keys))

    def clear(self) -> None:
        """Erases every key and frees all row and index memory (memory_bytes() drops to the
        empty table's few KiB); capacity reserved with reserve() is released too."""
        _core.clear(self._id)

    def size(self) -> int:
        return _core.size(self._id)

    def __len__(self) -> int:
        return self.size()

    def reserve(self, n: int) -> None:
        """Makes room for n keys. Raises MemoryError (naming the size) if that needs more than
        this machine's memory (physical RAM, or the cgroup limit if lower) or an allocation
        fails, and ValueError past the core's 2**32 - 1 rows per shard (64 shards); the table's
        content is unchanged either way."""
        if isinstance(n, bool) or int(n) != n:
            raise TypeError(f"reserve needs an integer, got {n!r}")
        if n < 0:
            raise ValueError(f"reserve needs n >= 0, got {n}")
        if n > np.iinfo(np.int64).max:
            raise ValueError(f"reserve({n}) is beyond any table's size")
        _core.reserve(self._id, int(n))

    def apply_gradients(self, keys, grads, lr: float, step: int) -> int:
        """One fused optimizer step on the rows of `keys` (duplicates' gradients summed; missing
        keys inserted from the initializer first). `step` is the 1-based update count.
        Gradients are float32 whatever the value dtype; a table of a dtype that cannot be
        trained (float64, integers) raises ValueError, unchanged."""
        k = self._keys(keys)
        g = self._rows(grads, k, "gradients", "float32")
        if isinstance(step, bool) or int(step) != step:
            raise TypeError(f"step must be an integer, got {step!r}")
        return self._record_evicted(_core.apply_gradients(self._id, k, g, float(lr), int(step)))

    def restrict(self, num_reserved: int, by="recency", keys=None, scores=None) -> int:
        """Keeps the `num_reserved` best keys and erases the rest with their slots. `by` is
        "recency" (last update), "frequency" (update count) or "custom" with `scores` for `keys`
        (unlisted keys score -inf; the last score of a repeated key counts). Equal scores rank the
        smaller key first, so exactly min(num_reserved, size) keys remain. NaN scores raise
        ValueError (table unchanged). Returns how many keys were erased."""
        if by == "custom":
            if keys is None or scores is None:
                raise ValueError("restrict(by='custom') needs keys and scores")
            k = self._keys(keys).reshape(-1)
            s = np.ascontiguousarray(np.asarray(scores, np.float32).reshape(-1))
            if s.shape != k.shape:
                raise ValueError("scores must have one entry per key")
            return _core.restrict(self._id, int(num_reserved), 2, k, s)
        if by not in _POLICIES:
            raise ValueError(f"unknown restrict policy {by!r} (recency, frequency, custom)")
        return _core.restrict(self._id, int(num_reserved), _POLICIES[by], None, None)

    def export(self, offset: int = 0, limit: int | None = None) -> dict:
        """Rows [offset, offset+limit) in table order: keys, values, slots [n, num_slots, dim],
        last_update, update_count, stepped (bool: an optimizer step has updated the row since its
        slots were initialised). The order is stable while the table is not modified."""
        offset, limit = self._page_range(offset, limit)
        if self._key_dtype_name == _string_keys.STRING:
            return self._export_strings(offset, limit)
        no_slots = self._value_dtype_name == _vd.STRING
        return self._export_fixed(
            limit, "slots", lambda: np.empty((limit, self.num_slots, self._dim), self._value_dtype),
            lambda slots, n: slots[:n],
            lambda keys, values, slots, *meta: _core.export_page(
                self._id, offset, keys, values, None if no_slots else slots, *meta))

    def export_slot_columns(self, offset: int = 0, limit: int | None = None) -> dict:
        """As :meth:`export`, with each optimizer slot in its own [n, dim] array: the list
        "slot_columns" (in ``slot_names`` order) instead of "slots". It is the layout of a
        checkpoint's tensors, made without a second pass over the slot bytes (splitting
        [n, num_slots, dim] afterwards reads and writes every slot byte once more)."""
        offset, limit = self._page_range(offset, limit)
        if self._key_dtype_name == _string_keys.STRING or self._value_dtype_name == _vd.STRING:
            page = self.export(offset, limit)
            slots = page.pop("slots")
            page["slot_columns"] = [np.ascontiguousarray(slots[:, j])
                                    for j in range(slots.shape[1])]
            return page
        return self._export_fixed(
            limit, "slot_columns",
            lambda: [np.empty((limit, self._dim), self._value_dtype) for _ in range(self.num_slots)],
            lambda columns, n: [c[:n] for c in columns],
            lambda *bufs: _core.export_slot_columns(self._id, offset, *bufs))

    def _page_range(self, offset, limit) -> tuple[int, int]:
        # export's arguments: limit None means every row from offset on.
        offset = _count(offset, "offset")
        if limit is None:
            limit = max(0, self.size() - offset)
        return offset, _count(limit, "limit")

    def _export_fixed(self, limit: int, slots_name: str, make_slots, cut_slots,
                      export_call) -> dict:
        # One page of a fixed-width-key table into fresh buffers: export_call(keys, values,
        # slots, last_update, update_count, stepped) -> rows written (the core's argument order);
        # the slot buffers come from make_slots() and enter the page as cut_slots(slots, n)
        # under slots_name.
        keys = np.empty(limit, self._key_dtype)
        values = np.empty((limit, self._dim), self._value_dtype)
        last = np.empty(limit, np.int64)
        count = np.empty(limit, np.int64)
        stepped = np.empty(limit, np.uint8)
        for attempt in range(3):
            # The core refuses (under its lock) a slots buffer sized for another slot count; an
            # optimizer attached in between through another handle is read again.
            slots = make_slots()
            try:
                n = export_call(keys, values, slots, last, count, stepped)
                break
            except ValueError as e:
                if "slots buffer sized for" not in str(e) or attempt == 2:
                    raise
        return {"keys": keys[:n], "values": values[:n], slots_name: cut_slots(slots, n),
                "last_update": last[:n], "update_count": count[:n],
                "stepped": stepped[:n].astype(bool)}

    def _export_strings(self, offset: int, limit: int) -> dict:
        # As export, with the keys as an object array of bytes (one call: rows and keys are read
        # together under the table's string lock).
        values = np.empty((limit, self._dim), self._value_dtype)
        last = np.empty(limit, np.int64)
        count = np.empty(limit, np.int64)
        stepped = np.empty(limit, np.uint8)
        for attempt in range(3):
            ns = self.num_slots
            slots = np.empty((limit, ns, self._dim), self._value_dtype)
            try:
                n, keys = _core.export_page_strings(self._id, offset, limit, values, slots, ns,
                                                    last, count, stepped)
                break
            except ValueError as e:
                if "slots buffer sized for" not in str(e) or attempt == 2:
                    raise
        key_array = np.empty(n, object)
        key_array[:] = keys
        return {"keys": key_array, "values": values[:n], "slots": slots[:n],
                "last_update": last[:n], "update_count": count[:n],
                "stepped": stepped[:n].astype(bool)}

    def export_keys(self, offset: int = 0, limit: int | None = None) -> np.ndarray:
        """The keys of rows [offset, offset+limit) alone (table order, as in export). For a
        string table an object array of bytes."""
        offset = _count(offset, "offset")
        if limit is None:
            limit = max(0, self.size() - offset)
        limit = _count(limit, "limit")
        if self._key_dtype_name == _string_keys.STRING:
            _, keys = _core.export_page_strings(self._id, offset, limit, None, None, 0, None, None)
            out = np.empty(len(keys), object)
            out[:] = keys
            return out
        keys = np.empty(limit, self._key_dtype)
        n = _core.export_page(self._id, offset, keys, None, None, None, None)
        return keys[:n]

    def export_pages(self, page_size: int = 1 << 16) -> Iterator[dict]:
        """Export in pages of at most page_size (>= 1) rows, so a large table is never copied
        whole. A bad page_size raises here, not at the first page."""
        page_size = _count(page_size, "page_size")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        return self._pages(page_size)

    def _pages(self, page_size: int) -> Iterator[dict]:
        offset = 0
        while True:
            page = self.export(offset, page_size)
            if len(page["keys"]) == 0:
                return
            yield page
            offset += len(page["keys"])

    def import_rows(self, keys, values, slots=None, last_update=None, update_count=None,
                    stepped=None) -> int:
        """Inserts or overwrites rows with optional slots [n, num_slots, dim] and metadata.
        Slots must match the table's slot count at the time of the call (checked in the core,
        under the table's lock); rows imported without slots keep theirs (new rows start from
        the optimizer's initial slots). ``stepped`` (bool [n], as ``export`` gives it) marks the
        rows an optimizer has stepped; None: a row given slots is marked where they differ from
        the initial slots, a row given none keeps its mark. Returns keys evicted by a capacity."""
        shaped = self._keys(keys)
        v = self._rows(values, shaped, "values").reshape(-1, self._dim)
        k = shaped.reshape(-1)
        s = None
        if slots is not None and self._value_dtype_name == _vd.STRING:
            if np.shape(slots)[1:2] != (0,):
                raise ValueError("a table of value dtype string has no optimizer slots")
            slots = None
        if slots is not None:
            s = np.asarray(slots)
            if s.ndim != 3 or s.shape[0] != k.shape[0] or s.shape[2] != self._dim:
                raise ValueError(f"slots have shape {s.shape}, expected "
                                 f"({k.shape[0]}, num_slots, {self._dim})")
            s = _vd.as_values(s, self._value_dtype_name, "slots")

        def meta(a, name):
            if a is None:
                return None
            a = np.ascontiguousarray(np.asarray(a), np.int64)
            if a.shape != k.shape:
                raise ValueError(f"{name} has shape {a.shape}, expected {k.shape}")
            return a

        flags = None
        if stepped is not None:
            flags = np.ascontiguousarray(np.asarray(stepped).astype(bool), np.uint8)
            if flags.shape != k.shape:
                raise ValueError(f"stepped has shape {flags.shape}, expected {k.shape}")
        return self._record_evicted(
            _core.import_rows(self._id, k, v, s, meta(last_update, "last_update"),
                              meta(update_count, "update_count"), flags))

    def initial_values(self, keys) -> np.ndarray:
        """The initializer's rows for keys (pure function of seed and key; table untouched)."""
        k = self._keys(keys)
        values = np.empty(k.shape + (self._dim,), self._value_dtype)
        _core.initial_values(self._id, k, values)
        return values

    @property
    def clock(self) -> int:
        return _core.clock(self._id)

    @clock.setter
    def clock(self, value: int) -> None:
        _core.set_clock(self._id, int(value))

    @property
    def evicted_total(self) -> int:
        return _core.evicted_total(self._id)

    def memory_bytes(self) -> int:
        """Bytes the table's rows, slots, metadata and index hold now (falls after clear and
        erase, which give memory back to the OS)."""
        return _core.memory_bytes(self._id)

    def clone(self, name: str | None = None) -> "Table":
        """A new table holding a copy of this one as of the call: rows, optimizer slots, per-key
        metadata, initializer, optimizer, capacity and logical clock (``clock``). The copy is
        taken in the core while writers to this table are held off (lookups go on), so no write
        is half in it; afterwards the two tables are independent. It costs one copy of the
        table's memory (``memory_bytes()``) and a pass over it; free it with ``destroy()``.
        Background checkpoint saves write such a copy. ``name``: the copy's name (default: this
        handle's). A Redis-backed table cannot be copied (its rows live in the server):
        ValueError."""
        return Table.attach(_core.clone(self._id), name=self.name if name is None else name)

    def destroy(self) -> None:
        """Removes the table from the registry (memory is freed once no call uses it)."""
        _core.destroy(self._id)

    def __repr__(self) -> str:
        return (f"Table(id={self._id}, dim={self._dim}, key_dtype={self._key_dtype_name}, "
                f"value_dtype={self._value_dtype_name}, size={self.size()})")


# ---- many tables in one call ---------------------------------------------------------------
# The per-table methods on a list of tables, in one core call (dualemb_core.h, "Multi-table
# calls"): the same results bit for bit, the tables run in parallel on the core's threads. Input
# errors in any table raise before any table changes; a table listed several times runs its
# entries in list order.

def _many_args(tables, keys, name: str):
    tables, keys = list(tables), list(keys)
    if len(tables) != len(keys):
        raise ValueError(f"{name}: {len(tables)} tables but {len(keys)} key arrays")
    for t in tables:
        if not isinstance(t, Table):
            raise TypeError(f"{name} takes dualemb.core.Table objects, got {type(t).__name__}")
    return tables, [t._keys(k) for t, k in zip(tables, keys)]


def find_many(tables, keys) -> list[tuple[np.ndarray, np.ndarray]]:
    """``[t.find(k) for t, k in zip(tables, keys)]`` in one core call."""
    tables, ks = _many_args(tables, keys, "find_many")
    values = [np.empty(k.shape + (t._dim,), t._value_dtype) for t, k in zip(tables, ks)]
    exists = [np.empty(k.shape, np.uint8) for k in ks]
    _core.find_many([t._id for t in tables], ks, values, exists)
    return [(v, e.view(bool)) for v, e in zip(values, exists)]


def find_or_insert_many(tables, keys) -> list[tuple[np.ndarray, np.ndarray]]:
    """``[t.find_or_insert(k) for t, k in zip(tables, keys)]`` in one core call (each table's
    ``last_evicted`` is set as its own call sets it)."""
    tables, ks = _many_args(tables, keys, "find_or_insert_many")
    values = [np.empty(k.shape + (t._dim,), t._value_dtype) for t, k in zip(tables, ks)]
    exists = [np.empty(k.shape, np.uint8) for k in ks]
    evicted = _core.find_or_insert_many([t._id for t in tables], ks, values, exists)
    for t, n in zip(tables, evicted):
        t._record_evicted(n)
    return [(v, e.view(bool)) for v, e in zip(values, exists)]


def apply_gradients_many(tables, keys, grads, lrs, steps) -> list[int]:
    """``[t.apply_gradients(k, g, lr, step) for ...]`` in one core call; returns each table's
    evicted count. ``lrs`` and ``steps``: one per table (or one for all)."""
    tables, ks = _many_args(tables, keys, "apply_gradients_many")
    n = len(tables)
    grads = list(grads)
    if len(grads) != n:
        raise ValueError(f"apply_gradients_many: {n} tables but {len(grads)} gradient arrays")
    lrs = [lrs] * n if np.ndim(lrs) == 0 else list(lrs)
    steps = [steps] * n if np.ndim(steps) == 0 else list(steps)
    if len(lrs) != n or len(steps) != n:
        raise ValueError(f"apply_gradients_many: give one lr and one step per table ({n})")
    for s in steps:
        if isinstance(s, bool) or int(s) != s:
            raise TypeError(f"step must be an integer, got {s!r}")
    gs = [t._rows(g, k, "gradients", "float32") for t, k, g in zip(tables, ks, grads)]
    evicted = _core.apply_gradients_many([t._id for t in tables], ks, gs,
                                         [float(x) for x in lrs], [int(s) for s in steps])
    return [t._record_evicted(e) for t, e in zip(tables, evicted)]

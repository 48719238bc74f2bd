"""``Table``: the numpy interface of one core table.

Every method validates its arguments before calling into C++, so bad input raises a clear
exception and leaves the table unchanged. The GIL is released while C++ works, and batched
calls fan out on several cores internally; any number of Python threads may share a table.
Keys may have any shape; rows come back as ``keys.shape + (dim,)``.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from dualemb._native import load_extension
from dualemb.core import initializers as _inits
from dualemb.core import optimizers as _opts
from dualemb.core.spec import parse_description, to_spec

_core = load_extension("_core")

KEY_DTYPES = {"int64": np.dtype(np.int64), "int32": np.dtype(np.int32)}
_POLICIES = {"recency": 0, "frequency": 1}


def _key_dtype(key_dtype) -> np.dtype:
    name = np.dtype(key_dtype).name if not isinstance(key_dtype, str) else key_dtype
    if name not in KEY_DTYPES:
        raise TypeError(f"unsupported key dtype {name!r} (supported: int64, int32)")
    return KEY_DTYPES[name]


class Table:
    """A dynamic embedding table in the process-wide registry of libdualemb_core.

    Args:
      dim: length of each row (>= 1).
      key_dtype: "int64" (default) or "int32".
      initializer: row a missing key reads as, and a new key starts from: None (zeros), a number,
        an array of length dim or 1, or a ``dualemb.core.initializers`` spec.
      optimizer: optional ``dualemb.core.optimizers`` spec (dict, JSON text, or a name); its
        slots are stored beside every row.
      capacity: if > 0, writes that grow the table past it evict keys by ``evict_policy``
        ("recency" or "frequency") and report how many.
      num_threads: threads a batched call may use (0 = all cores).
      table_id: attach to (or create under) this id; 0 draws a fresh random id.
    """

    def __init__(self, dim: int, key_dtype="int64", value_dtype="float32", initializer=None,
                 optimizer=None, capacity: int = 0, evict_policy: str = "recency",
                 num_threads: int = 0, table_id: int = 0, name: str | None = None):
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim <= 0:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        kd = _key_dtype(key_dtype)
        if np.dtype(value_dtype) != np.float32:
            raise TypeError(f"unsupported value dtype {value_dtype!r} (supported: float32)")
        init = _inits.canonical(initializer)
        config = {"dim": int(dim), "key_dtype": kd.name, **init}
        if capacity:
            config.update(capacity=int(capacity), evict_policy=evict_policy)
        if num_threads:
            config["num_threads"] = int(num_threads)
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
        dim, kd, ns = _core.dims(self._id)
        self._dim = int(dim)
        self._key_dtype = np.dtype(np.int64) if kd == 0 else np.dtype(np.int32)
        self._num_slots = int(ns)

    # ---- description -------------------------------------------------------------------------
    @property
    def id(self) -> int:
        return self._id

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def key_dtype(self) -> np.dtype:
        return self._key_dtype

    @property
    def num_slots(self) -> int:
        return self._num_slots

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
        self._read_dims()

    def set_num_threads(self, n: int) -> None:
        _core.set_num_threads(self._id, int(n))

    # ---- argument checks ---------------------------------------------------------------------
    def _keys(self, keys) -> np.ndarray:
        arr = np.asarray(keys)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"keys must be integers, got dtype {arr.dtype}")
        if arr.dtype != self._key_dtype:
            if arr.size and self._key_dtype == np.int32 and (
                    arr.min() < np.iinfo(np.int32).min or arr.max() > np.iinfo(np.int32).max):
                raise ValueError("keys do not fit the table's int32 key dtype")
            if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
                raise ValueError("uint64 keys above 2**63-1 do not fit int64 keys")
            arr = arr.astype(self._key_dtype)
        return np.ascontiguousarray(arr)

    def _rows(self, values, keys: np.ndarray, what: str) -> np.ndarray:
        arr = np.asarray(values)
        if arr.dtype.kind != "f":
            raise TypeError(f"{what} must be floating point, got dtype {arr.dtype}")
        want = keys.shape + (self._dim,)
        if arr.shape != want:
            raise ValueError(f"{what} have shape {arr.shape}, expected keys.shape + (dim,) = {want}")
        return np.ascontiguousarray(arr, dtype=np.float32)

    # ---- batched operations ------------------------------------------------------------------
    def find(self, keys) -> tuple[np.ndarray, np.ndarray]:
        """Rows of `keys` and whether each exists. Missing keys read as their initializer row
        and are not inserted."""
        k = self._keys(keys)
        values = np.empty(k.shape + (self._dim,), np.float32)
        exists = np.empty(k.shape, np.uint8)
        _core.find(self._id, k, values, exists)
        return values, exists.view(bool)

    def find_or_insert(self, keys) -> tuple[np.ndarray, np.ndarray]:
        """Like find, but missing keys are inserted with their initializer row."""
        k = self._keys(keys)
        values = np.empty(k.shape + (self._dim,), np.float32)
        exists = np.empty(k.shape, np.uint8)
        _core.find_or_insert(self._id, k, values, exists)
        return values, exists.view(bool)

    def insert_or_assign(self, keys, values) -> int:
        """Writes rows (the last of duplicate keys wins). Returns keys evicted by a capacity."""
        k = self._keys(keys)
        return _core.insert_or_assign(self._id, k, self._rows(values, k, "values"))

    def accum(self, keys, deltas, exists) -> int:
        """TFRA's accum: a key absent with exists False is inserted with its delta; a key present
        with exists True gets row += delta; anything else is ignored."""
        k = self._keys(keys)
        e = np.asarray(exists)
        if e.shape != k.shape or e.dtype != bool:
            raise ValueError(f"exists must be a bool array of shape {k.shape}")
        return _core.accum(self._id, k, self._rows(deltas, k, "deltas"),
                           np.ascontiguousarray(e).view(np.uint8))

    def erase(self, keys) -> None:
        _core.erase(self._id, self._keys(keys))

    def clear(self) -> None:
        _core.clear(self._id)

    def size(self) -> int:
        return _core.size(self._id)

    def __len__(self) -> int:
        return self.size()

    def reserve(self, n: int) -> None:
        _core.reserve(self._id, int(n))

    def apply_gradients(self, keys, grads, lr: float, step: int) -> int:
        """One fused optimizer step on the rows of `keys` (duplicates' gradients summed; missing
        keys inserted from the initializer first). `step` is the 1-based update count."""
        k = self._keys(keys)
        g = self._rows(grads, k, "gradients")
        if isinstance(step, bool) or int(step) != step:
            raise TypeError(f"step must be an integer, got {step!r}")
        return _core.apply_gradients(self._id, k, g, float(lr), int(step))

    def restrict(self, num_reserved: int, by="recency", keys=None, scores=None) -> int:
        """Keeps the `num_reserved` best keys and erases the rest with their slots. `by` is
        "recency" (last update), "frequency" (update count) or "custom" with `scores` for `keys`
        (unlisted keys rank lowest). Returns how many keys were erased."""
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
        last_update, update_count. The order is stable while the table is not modified."""
        if limit is None:
            limit = max(0, self.size() - offset)
        keys = np.empty(limit, self._key_dtype)
        values = np.empty((limit, self._dim), np.float32)
        slots = np.empty((limit, self._num_slots, self._dim), np.float32)
        last = np.empty(limit, np.int64)
        count = np.empty(limit, np.int64)
        n = _core.export_page(self._id, int(offset), keys, values, slots, last, count)
        return {"keys": keys[:n], "values": values[:n], "slots": slots[:n],
                "last_update": last[:n], "update_count": count[:n]}

    def export_pages(self, page_size: int = 1 << 16) -> Iterator[dict]:
        """Export in pages of at most page_size rows, so a large table is never copied whole."""
        offset = 0
        while True:
            page = self.export(offset, page_size)
            if len(page["keys"]) == 0:
                return
            yield page
            offset += len(page["keys"])

    def import_rows(self, keys, values, slots=None, last_update=None, update_count=None) -> int:
        """Inserts or overwrites rows with optional slots [n, num_slots, dim] and metadata."""
        shaped = self._keys(keys)
        v = self._rows(values, shaped, "values").reshape(-1, self._dim)
        k = shaped.reshape(-1)
        s = None
        if slots is not None and self._num_slots:
            s = np.asarray(slots)
            want = (k.shape[0], self._num_slots, self._dim)
            if s.shape != want or s.dtype.kind != "f":
                raise ValueError(f"slots have shape {s.shape}, expected {want}")
            s = np.ascontiguousarray(s, np.float32)

        def meta(a, name):
            if a is None:
                return None
            a = np.ascontiguousarray(np.asarray(a), np.int64)
            if a.shape != k.shape:
                raise ValueError(f"{name} has shape {a.shape}, expected {k.shape}")
            return a

        return _core.import_rows(self._id, k, v, s, meta(last_update, "last_update"),
                                 meta(update_count, "update_count"))

    def initial_values(self, keys) -> np.ndarray:
        """The initializer's rows for keys (pure function of seed and key; table untouched)."""
        k = self._keys(keys)
        values = np.empty(k.shape + (self._dim,), np.float32)
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
        return _core.memory_bytes(self._id)

    def destroy(self) -> None:
        """Removes the table from the registry (memory is freed once no call uses it)."""
        _core.destroy(self._id)

    def __repr__(self) -> str:
        return f"Table(id={self._id}, dim={self._dim}, key_dtype={self._key_dtype.name}, size={self.size()})"

"""String keys of a ``Table(key_dtype="string")``: what the table accepts and how it hands keys
to the core.

A string key is a byte string, compared by its bytes (no hashing collisions: the core keeps the
bytes). ``str`` keys are encoded as UTF-8, so ``"é"`` and ``"é".encode()`` are one key. Accepted:
``str``/``bytes`` scalars, numpy ``S`` (bytes) and ``U`` (str) arrays, object arrays and (nested)
lists of ``str``/``bytes``. numpy's fixed-width ``S``/``U`` arrays cannot hold trailing NUL
characters (numpy drops them), so keys ending in ``b"\\0"`` must come as ``bytes`` in a list or
an object array.

Keys go to the core as a C-contiguous object array of ``bytes`` (the pybind11 module packs them
into the C ABI's ``de_string_keys``); export returns the same form: an object array of ``bytes``,
because the keys are bytes in the table (a key need not be valid UTF-8) and an object array keeps
each key's exact length (embedded and trailing NULs included).
"""

from __future__ import annotations

import numpy as np

STRING = "string"


def _as_bytes(x, position: int) -> bytes:
    if isinstance(x, bytes):  # includes np.bytes_
        return bytes(x)
    if isinstance(x, str):  # includes np.str_
        return x.encode("utf-8")
    raise TypeError(f"string table keys must be str or bytes; element {position} is "
                    f"{type(x).__name__} ({x!r})")


def as_string_keys(keys) -> np.ndarray:
    """``keys`` as a C-contiguous object array of bytes with the same shape (a scalar gives a
    0-d array). Raises TypeError for anything but str/bytes keys."""
    if isinstance(keys, (str, bytes)):
        out = np.empty((), object)
        out[()] = _as_bytes(keys, 0)
        return out
    if isinstance(keys, np.ndarray):
        arr = keys
    else:
        # dtype=object: numpy's own S/U conversion would drop trailing NULs.
        arr = np.array(keys, dtype=object)
    if arr.dtype.kind not in "SUO":
        raise TypeError(f"string table keys must be str or bytes, got dtype {arr.dtype}")
    flat = arr.reshape(-1).tolist()
    out = np.empty(len(flat), object)
    out[:] = [_as_bytes(x, i) for i, x in enumerate(flat)]
    return out.reshape(arr.shape)


def fingerprints(keys) -> np.ndarray:
    """int64 fingerprints of string keys (same shape): FNV-1a 64 of the bytes, the splitmix64
    finalizer, masked to 63 bits (dualemb_core.h, de_string_fingerprint). A string table starts a
    new key from the initializer row of this int64 key. As ids for an integer table they are a
    hash: two distinct strings collide with probability about n**2 / 2**64."""
    from dualemb._native import load_extension  # the extension loads on first use only

    arr = as_string_keys(keys)
    flat = np.require(arr.reshape(-1), requirements="C")
    return load_extension("_core").string_fingerprints(flat).reshape(arr.shape)


def pack(keys) -> tuple[np.ndarray, np.ndarray]:
    """String keys as two numeric arrays, for stores that hold no strings (HDF5 via Keras,
    safetensors): ``offsets`` (int64 [n + 1], key i is ``data[offsets[i]:offsets[i + 1]]``,
    ``offsets[0] == 0``) and ``data`` (uint8, the keys' bytes concatenated). The common
    checkpoint format's ``key_offsets`` / ``key_bytes`` encoding (docs/checkpoint_format.md)."""
    flat = as_string_keys(keys).reshape(-1)
    offsets = np.zeros(len(flat) + 1, np.int64)
    if len(flat):
        offsets[1:] = np.cumsum(np.fromiter((len(k) for k in flat), np.int64, len(flat)))
    data = np.frombuffer(b"".join(flat.tolist()), np.uint8).copy()
    return offsets, data


def unpack(offsets, data, where: str = "string keys") -> np.ndarray:
    """The inverse of :func:`pack`: an object array of bytes. Raises ValueError naming ``where``
    for offsets that are not non-decreasing from 0 to ``len(data)`` (a corrupt store)."""
    offsets = np.asarray(offsets)
    data = np.asarray(data)
    if offsets.ndim != 1 or offsets.dtype.kind not in "iu" or data.ndim != 1 \
            or data.dtype != np.uint8:
        raise ValueError(f"{where}: expected int64 offsets [n + 1] and uint8 bytes, got "
                         f"{offsets.dtype} {offsets.shape} and {data.dtype} {data.shape}")
    if len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(data) \
            or np.any(np.diff(offsets) < 0):
        raise ValueError(f"{where}: the key offsets are not non-decreasing offsets from 0 to "
                         f"the {len(data)} key bytes")
    raw = data.tobytes()
    out = np.empty(len(offsets) - 1, object)
    out[:] = [raw[int(a):int(b)] for a, b in zip(offsets[:-1], offsets[1:])]
    return out

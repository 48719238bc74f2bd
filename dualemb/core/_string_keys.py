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

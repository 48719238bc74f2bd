"""The value dtypes a table stores its rows (and optimizer slots) in, and how inputs convert.

``CODES`` mirrors the ``DE_VALUE_*`` enum of ``csrc/core/dualemb_core.h`` (the code is the
index). bfloat16 is ``ml_dtypes.bfloat16`` (numpy has none).

Inputs convert to a table's dtype by one rule (``as_values``):
  * float tables (float32, float16, bfloat16, float64) take any float input, rounded to nearest
    as numpy's ``astype`` does (float64 rows into a float32 table have always been accepted); a
    finite input that overflows the dtype (1e6 into float16) raises TypeError instead of becoming
    inf. Integer inputs raise TypeError, as they always have for float32.
  * integer tables (int8, int32, int64) take integer inputs whose every value fits the dtype
    exactly; floats, bools and out-of-range values raise TypeError naming both dtypes.
  * string tables hold ``dim`` byte strings per row, as numpy object arrays of ``bytes``; inputs
    may be ``bytes`` or ``str`` (encoded as UTF-8, as string keys are), in an object array or
    (nested) lists (numpy's fixed-width ``S``/``U`` arrays drop trailing NULs, so strings ending
    in ``b"\\0"`` must come in lists or object arrays). Everything else raises TypeError.
Training (optimizers) needs float32, float16 or bfloat16 (``TRAINABLE``); gradients are float32.
String tables serve lookups, writes, erase, export and save/load; accum and training refuse them.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

# Index = DE_VALUE_* code in dualemb_core.h.
CODES = ("float32", "float16", "bfloat16", "float64", "int8", "int32", "int64", "string")
NUMPY = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float64": np.dtype(np.float64),
    "int8": np.dtype(np.int8),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "string": np.dtype(object),  # an object array of bytes
}
STRING = "string"
FLOATS = frozenset({"float32", "float16", "bfloat16", "float64"})
INTEGERS = frozenset({"int8", "int32", "int64"})
TRAINABLE = frozenset({"float32", "float16", "bfloat16"})


def name_of(value_dtype) -> str:
    """The canonical name of a value dtype given as a name, a numpy dtype or scalar type
    (``np.float16``, ``ml_dtypes.bfloat16``), or anything with a ``.name`` such as ``tf.int32``.
    Raises TypeError for an unsupported one."""
    if isinstance(value_dtype, str):
        name = value_dtype
    elif value_dtype in (bytes, str, np.bytes_, np.str_):
        name = STRING
    else:
        try:
            dt = np.dtype(value_dtype)
            # An object array is how a string table's rows come back (Table.value_dtype).
            name = STRING if dt == np.dtype(object) else dt.name
        except TypeError:
            name = str(getattr(value_dtype, "name", value_dtype))
    if name not in NUMPY:
        raise TypeError(f"unsupported value dtype {value_dtype!r} (supported: {', '.join(CODES)})")
    return name


def as_string_values(values, what: str) -> np.ndarray:
    """``values`` as a C-contiguous object array of ``bytes`` (same shape); ``str`` elements are
    encoded as UTF-8. TypeError names the first element that is neither."""
    arr = values if isinstance(values, np.ndarray) else np.array(values, dtype=object)
    if arr.dtype.kind not in "SUO":
        raise TypeError(f"{what} must be bytes or str for a string table, got dtype {arr.dtype}")
    flat = arr.reshape(-1).tolist()
    out = np.empty(len(flat), object)
    for i, x in enumerate(flat):
        if isinstance(x, bytes):
            out[i] = bytes(x)
        elif isinstance(x, str):
            out[i] = x.encode("utf-8")
        else:
            raise TypeError(f"{what} of a string table must be bytes or str; element {i} is "
                            f"{type(x).__name__} ({x!r})")
    return out.reshape(arr.shape)


def is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype == NUMPY["bfloat16"]


def as_values(arr: np.ndarray, name: str, what: str) -> np.ndarray:
    """`arr` converted to value dtype `name` (C-contiguous) by the rule in the module doc."""
    if name == STRING:
        return as_string_values(arr, what)
    if arr.dtype.kind in "SUO":
        raise TypeError(f"{what} of dtype {arr.dtype} (strings) cannot go into a {name} table")
    want = NUMPY[name]
    if arr.dtype == want:
        return np.require(arr, requirements="C")
    if name in FLOATS:
        if not is_float(arr.dtype):
            raise TypeError(f"{what} must be floating point for a {name} table, got dtype "
                            f"{arr.dtype}")
        with np.errstate(over="ignore"):
            out = np.require(arr.astype(want), requirements="C")
        overflow = np.isinf(out) & np.isfinite(arr.astype(np.float64))
        if overflow.any():
            bad = arr.reshape(-1)[np.flatnonzero(overflow.reshape(-1))[0]]
            raise TypeError(f"{what} of dtype {arr.dtype} hold {bad!r}, beyond the range of the "
                            f"table's value dtype {name}")
        return out
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{what} must be integers for an {name} table (exact values), got dtype "
                        f"{arr.dtype}")
    info = np.iinfo(want)
    if arr.size and (int(arr.min()) < info.min or int(arr.max()) > info.max):
        raise TypeError(f"{what} of dtype {arr.dtype} hold values in [{arr.min()}, {arr.max()}], "
                        f"outside the table's value dtype {name} [{info.min}, {info.max}]")
    return np.require(arr.astype(want), requirements="C")

"""String values in the common checkpoint format (docs/checkpoint_format.md, "String values").

A table of value dtype "string" has dim byte strings per row. safetensors has no string dtype, so
its shard file stores the n * dim strings (row-major: element i * dim + j is row i, column j) as
two tensors instead of `values`, in the layout string keys use: `value_offsets` (I64,
[n * dim + 1], element e is bytes [value_offsets[e], value_offsets[e+1]) of `value_bytes`,
value_offsets[0] = 0, non-decreasing) and `value_bytes` (U8, [value_offsets[-1]]). numpy alone
reads them back. Readers that predate string values refuse the table by its value_dtype name.
"""

from __future__ import annotations

import numpy as np

from dualemb.core.checkpoint import _string_keys as _sk

STRING = "string"
OFFSETS = "value_offsets"
BYTES = "value_bytes"
CorruptValues = _sk.CorruptKeys


def is_string(entry_or_name) -> bool:
    name = entry_or_name.get("value_dtype") if isinstance(entry_or_name, dict) else entry_or_name
    return name == STRING


def count_value_bytes(table, n: int, page_rows: int) -> int:
    """Total bytes of the strings of the first n rows (a pass before writing, since the file's
    tensor sizes are fixed up front)."""
    total = 0
    for offset in range(0, n, page_rows):
        values = table.export(offset, min(page_rows, n - offset))["values"]
        total += sum(len(v) for v in values.reshape(-1).tolist())
    return total


def tensors(n: int, dim: int, total_bytes: int) -> list:
    return [(OFFSETS, np.int64, (n * dim + 1,)), (BYTES, np.uint8, (total_bytes,))]


class ValueWriter:
    """Writes pages of rows' strings (in table order) into the two tensors of one shard file."""

    def __init__(self, writer, dim: int, total_bytes: int):
        self._dim = dim
        self._strings = _sk.KeyWriter(writer, total_bytes, OFFSETS, BYTES)

    def write_page(self, row0: int, values: np.ndarray) -> None:
        self._strings.write_page(row0 * self._dim, values.reshape(-1).tolist())

    def complete(self) -> bool:
        return self._strings.complete()


def read_page(reader, row0: int, m: int, dim: int, label: str) -> np.ndarray:
    """Rows [row0, row0 + m) as an object array of bytes [m, dim]; refuses corrupt offsets."""
    flat = _sk.read_page(reader, row0 * dim, m * dim, label, OFFSETS, BYTES)
    return flat.reshape(m, dim)

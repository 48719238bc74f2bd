"""String keys in the common checkpoint format (docs/checkpoint_format.md, "String keys").

safetensors has no string dtype, so a string table's shard file stores its n keys as two
tensors instead of `keys`: `key_offsets` (I64, [n + 1], key i is bytes
[key_offsets[i], key_offsets[i+1]) of `key_bytes`, key_offsets[0] = 0, non-decreasing) and
`key_bytes` (U8, [key_offsets[n]], the keys' bytes concatenated). numpy alone reads them back.
"""

from __future__ import annotations

import numpy as np

STRING = "string"
OFFSETS = "key_offsets"
BYTES = "key_bytes"


class CorruptKeys(ValueError):
    pass


def is_string(entry_or_name) -> bool:
    name = entry_or_name.get("key_dtype") if isinstance(entry_or_name, dict) else entry_or_name
    return name == STRING


def live_key_dtype_name(table) -> str:
    """"int64", "int32" or "string" for any Table-like live table."""
    name = getattr(table, "key_dtype_name", None)
    return name if name is not None else np.dtype(table.key_dtype).name


def count_key_bytes(table, n: int, page_rows: int) -> int:
    """Total bytes of the first n keys of a string table (a keys-only pass before writing,
    since the file's tensor sizes are fixed up front)."""
    total = 0
    for offset in range(0, n, page_rows):
        keys = table.export_keys(offset, min(page_rows, n - offset))
        total += sum(len(k) for k in keys)
    return total


def tensors(n: int, total_bytes: int) -> list:
    return [(OFFSETS, np.int64, (n + 1,)), (BYTES, np.uint8, (total_bytes,))]


class KeyWriter:
    """Writes pages of keys (in table order) into the two tensors of one shard file. The same
    layout stores a string table's values (checkpoint/_string_values.py) under other names."""

    def __init__(self, writer, total_bytes: int, offsets: str = OFFSETS, data: str = BYTES):
        self._writer = writer
        self._total = total_bytes
        self._used = 0
        self._offsets, self._data = offsets, data
        writer.write_at(offsets, 0, np.zeros(1, np.int64))

    def write_page(self, row0: int, keys) -> None:
        """`keys`: the strings of elements [row0, row0 + len(keys))."""
        lengths = np.fromiter((len(k) for k in keys), np.int64, len(keys))
        ends = self._used + np.cumsum(lengths)
        if len(keys) and ends[-1] > self._total:
            raise CorruptKeys(f"{self._data} grew while the table was being saved")
        self._writer.write_at(self._offsets, 8 * (row0 + 1), ends)
        data = b"".join(keys)
        if data:
            self._writer.write_at(self._data, self._used, np.frombuffer(data, np.uint8))
        self._used += len(data)

    def complete(self) -> bool:
        return self._used == self._total


def expected_shapes(rows: int, tensors_entry: dict) -> dict:
    """tensor name -> (dtype code, shape) of a string shard's key tensors."""
    nbytes = tensors_entry.get(BYTES, {}).get("shape", [0])
    return {OFFSETS: ("I64", [rows + 1]), BYTES: ("U8", list(nbytes) if len(nbytes) == 1 else [-1])}


def read_page(reader, row0: int, m: int, label: str, offsets: str = OFFSETS,
              data_name: str = BYTES) -> np.ndarray:
    """Keys [row0, row0 + m) as an object array of bytes; refuses offsets that are not
    non-decreasing or point past key_bytes (a corrupt file that passed its checksum). With other
    tensor names it reads string values the same way (elements instead of rows)."""
    offs = np.empty(m + 1, np.int64)
    reader.read(offsets, row0, offs)
    total = reader.shape(data_name)[0]
    if (row0 == 0 and offs[0] != 0) or np.any(np.diff(offs) < 0) or offs[0] < 0 \
            or offs[-1] > total:
        raise CorruptKeys(f"{label}: {offsets} are not non-decreasing offsets into {data_name}")
    data = np.empty(int(offs[-1] - offs[0]), np.uint8)
    reader.read(data_name, int(offs[0]), data)
    raw = data.tobytes()
    base = int(offs[0])
    out = np.empty(m, object)
    out[:] = [raw[int(a) - base:int(b) - base] for a, b in zip(offs[:-1], offs[1:])]
    return out

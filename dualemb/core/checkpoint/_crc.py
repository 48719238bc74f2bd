"""The CRC-32 of checkpoint files (docs/checkpoint_format.md §4: zlib's CRC-32, polynomial
0xEDB88320), from the fastest implementation at hand.

zlib's ``crc32`` (CPython's zlib module, zlib 1.2.x) sums well under 1 GB/s: for a 1M x 64 Adam
table (792 MB of tensors) it was the largest part of a save's CPU time, and a background save
spends that time beside training. ISA-L (the ``isal`` package, optional: ``pip install
dualemb[fast-crc]``) computes the same checksum with carry-less multiplication, more than ten
times faster. Both give the same value for the same bytes (tests/checkpoint/test_checkpoint_crc.py
checks it whenever ``isal`` is installed), so the choice changes no file and no manifest.
"""

from __future__ import annotations

import zlib

try:
    from isal.isal_zlib import crc32 as _isal_crc32
except ImportError:  # optional: zlib's gives the same checksum, slower
    _isal_crc32 = None

# crc32(data, value=0) -> the CRC-32 of `data` continuing from `value`, as zlib.crc32.
crc32 = _isal_crc32 if _isal_crc32 is not None else zlib.crc32
IMPLEMENTATION = "isal" if _isal_crc32 is not None else "zlib"

__all__ = ["crc32", "IMPLEMENTATION"]

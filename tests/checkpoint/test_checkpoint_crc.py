"""The checkpoint's CRC-32 (docs/checkpoint_format.md §4) from whichever implementation
``_crc`` picks (ISA-L's when the ``isal`` package is installed, else zlib's) is the format's
CRC-32: checked against a bitwise reference of the polynomial written here, in whole and in
continued pieces, and a saved file's tensors against zlib's sum of the file's bytes."""

import json
import zlib

import numpy as np
import pytest

from dualemb.core import Table, checkpoint
from dualemb.core.checkpoint import _crc


def reference_crc32(data: bytes, crc: int = 0) -> int:
    """CRC-32, reflected polynomial 0xEDB88320, bit by bit (the definition, not a library)."""
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xEDB88320 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


@pytest.mark.parametrize("size", [0, 1, 7, 64, 1000, 4099])
def test_crc32_is_the_formats_crc(size):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    assert _crc.crc32(data) == reference_crc32(data)
    cut = size // 3  # continued from the sum of a first piece, as the reader streams a tensor
    assert _crc.crc32(data[cut:], _crc.crc32(data[:cut])) == reference_crc32(data)
    assert _crc.crc32(memoryview(data)) == reference_crc32(data)


def test_the_fast_implementation_is_used_when_installed():
    try:
        import isal.isal_zlib  # noqa: F401
    except ImportError:
        pytest.skip("the isal package is not installed: zlib's crc32 is used")
    assert _crc.IMPLEMENTATION == "isal"
    big = np.random.default_rng(1).integers(0, 256, 3 << 20, dtype=np.uint8)
    assert _crc.crc32(big) == zlib.crc32(big)


def test_saved_tensors_carry_zlibs_crc_of_their_bytes(tmp_path):
    t = Table(16, optimizer={"name": "adam"})
    t.apply_gradients(np.arange(500), np.ones((500, 16), np.float32), 0.1, 1)
    checkpoint.save(str(tmp_path / "c"), {"t": t}, steps=1)
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    (shard,) = manifest["tables"][0]["shards"]
    data = (tmp_path / "c" / shard["file"]).read_bytes()
    assert zlib.crc32(data[:shard["header_bytes"]]) == shard["header_crc32"]
    for name, tensor in shard["tensors"].items():
        begin, end = (shard["header_bytes"] + o for o in tensor["data_offsets"])
        assert zlib.crc32(data[begin:end]) == tensor["crc32"], name

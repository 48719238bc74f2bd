"""Streaming reader and writer for the safetensors file layout, with per-tensor CRC-32.

Layout (https://github.com/huggingface/safetensors): 8-byte little-endian header length N, N
bytes of UTF-8 JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{str: str}}`` padded with spaces so that 8 + N is a multiple of 8, then the tensors' raw
little-endian C-order bytes, whose offsets are relative to byte 8 + N.

The writer knows every tensor's dtype and shape up front, so it writes the header first and then
streams each tensor's bytes to its place (``os.pwrite``), page by page, updating a CRC-32 per
tensor as it goes. Nothing here ever holds a whole tensor.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import struct
import sys
import threading
from typing import Iterable, Mapping

import numpy as np

from dualemb.core.checkpoint import _objects
from dualemb.core.checkpoint._crc import crc32
from dualemb.core.checkpoint._manifest import CheckpointError

# numpy dtype name -> safetensors dtype code
_CODES = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "uint16": "U16", "int16": "I16",
          "float16": "F16", "bfloat16": "BF16", "uint32": "U32", "int32": "I32",
          "float32": "F32", "uint64": "U64", "int64": "I64", "float64": "F64"}
_NAMES = {v: k for k, v in _CODES.items()}
_MAX_HEADER = 100_000_000  # what the safetensors library itself accepts

if sys.byteorder != "little":  # pragma: no cover
    raise ImportError("dualemb checkpoints are written on little-endian machines only")


def dtype_code(dtype) -> str:
    name = np.dtype(dtype).name
    if name not in _CODES:
        raise TypeError(f"dtype {name} cannot be stored in safetensors")
    return _CODES[name]


def numpy_dtype(code: str) -> np.dtype:
    if code not in _NAMES:
        raise CheckpointError(f"unsupported safetensors dtype {code!r}")
    name = _NAMES[code]
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError as e:
            raise CheckpointError("reading bfloat16 tensors needs the ml_dtypes package") from e
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


# ---- CRC-32 of concatenations (zlib's crc32_combine), so chunks can be summed in parallel ----
def _gf2_times(mat: list, vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_compose(a: list, b: list) -> list:
    """The matrix applying b, then a."""
    return [_gf2_times(a, col) for col in b]


@functools.lru_cache(maxsize=256)
def _zeros_operator(nbytes: int) -> tuple:
    """The GF(2) matrix that maps crc(A) to crc(A + nbytes zero bytes) (before the final xor)."""
    one_bit = [0xEDB88320] + [1 << n for n in range(31)]
    op = [1 << n for n in range(32)]
    power = _gf2_compose(one_bit, one_bit)  # 2 zero bits
    power = _gf2_compose(power, power)      # 4
    power = _gf2_compose(power, power)      # 8 bits = 1 zero byte
    while nbytes:
        if nbytes & 1:
            op = _gf2_compose(power, op)
        nbytes >>= 1
        if nbytes:
            power = _gf2_compose(power, power)
    return tuple(op)


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """crc32(A + B) from crc1 = crc32(A), crc2 = crc32(B) and len2 = len(B)."""
    if len2 == 0:
        return crc1
    return _gf2_times(_zeros_operator(len2), crc1) ^ crc2


def _bytes_view(arr: np.ndarray) -> memoryview:
    """A flat byte view of a C-contiguous array (no copy)."""
    return memoryview(arr.reshape(-1).view(np.uint8))


def pwrite_all(fd: int, data, offset: int) -> None:
    view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data
    while len(view):
        n = os.pwrite(fd, view, offset)
        if n <= 0:  # pragma: no cover
            raise OSError("pwrite wrote nothing")
        view = view[n:]
        offset += n


def pread_into(fd, view: memoryview, offset: int, path: str) -> None:
    """Fills ``view`` from ``offset`` of ``fd`` (a descriptor, or an ``_objects`` file)."""
    while len(view):
        n = os.preadv(fd, [view], offset) if isinstance(fd, int) else fd.pread_into(view, offset)
        if n <= 0:
            raise CheckpointError(f"{path}: file ends early at byte {offset} (truncated?)")
        view = view[n:]
        offset += n


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Writer:
    """Writes one safetensors file whose tensors' dtypes and shapes are known in advance.

    ``tensors`` is an ordered list of (name, numpy dtype, shape); the data is laid out in that
    order. ``write(name, data)`` appends the next bytes of a tensor (callers write each tensor's
    bytes in order, tensors may interleave); ``finish()`` checks every tensor is complete, fsyncs
    and returns the file's manifest entry.
    """

    def __init__(self, path: str, tensors: Iterable[tuple[str, np.dtype, tuple]],
                 metadata: Mapping[str, str] | None = None):
        if _objects.is_remote(path):  # os.open would make a local ./gs:/... file of it
            raise ValueError(f"{path}: the safetensors writer writes local files; a checkpoint "
                             "file on an object store is written at the local path that "
                             "Staging.new_file gives, which uploads it")
        self.path = path
        header: dict = {}
        if metadata:
            header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
        self._info = {}
        offset = 0
        for name, dtype, shape in tensors:
            if name == "__metadata__" or name in self._info:
                raise ValueError(f"invalid or duplicate tensor name {name!r}")
            dtype = np.dtype(dtype)
            shape = [int(d) for d in shape]
            nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            header[name] = {"dtype": dtype_code(dtype), "shape": shape,
                            "data_offsets": [offset, offset + nbytes]}
            self._info[name] = [offset, offset + nbytes]
            offset += nbytes
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        text += b" " * (-(8 + len(text)) % 8)
        self._header = struct.pack("<Q", len(text)) + text
        self._base = len(self._header)
        self._total = self._base + offset
        self._header_json = header
        self._pos = {name: 0 for name in self._info}
        self._chunks = {name: {} for name in self._info}  # byte offset -> (length, crc)
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                           0o644)
        try:
            if self._total > self._base and hasattr(os, "posix_fallocate"):
                try:  # reserve the space now: a full disk fails here, not half way through
                    os.posix_fallocate(self._fd, 0, self._total)
                except OSError as e:
                    if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # not supported here
                        raise
            pwrite_all(self._fd, self._header, 0)
        except BaseException:
            os.close(self._fd)
            raise

    def write(self, name: str, data) -> None:
        """Appends the next bytes of tensor `name`."""
        view = data if isinstance(data, memoryview) else _bytes_view(np.ascontiguousarray(data))
        pos = self._pos[name]
        self._pos[name] = pos + len(view)
        self.write_at(name, pos, view)

    def write_at(self, name: str, pos: int, data) -> None:
        """Writes bytes [pos, pos + len(data)) of tensor `name`. Thread-safe: chunks of one file
        may be written concurrently and in any order; their CRC-32s are combined in finish()."""
        view = data if isinstance(data, memoryview) else _bytes_view(np.ascontiguousarray(data))
        begin, end = self._info[name]
        if pos < 0 or pos + len(view) > end - begin:
            raise ValueError(f"{self.path}: bytes [{pos}, {pos + len(view)}) are outside tensor "
                             f"{name!r} ({end - begin} bytes)")
        if not len(view):
            return
        crc = crc32(view)
        pwrite_all(self._fd, view, self._base + begin + pos)
        with self._lock:
            if pos in self._chunks[name]:
                raise ValueError(f"{self.path}: tensor {name!r} byte {pos} written twice")
            self._chunks[name][pos] = (len(view), crc)

    def _tensor_crc(self, name: str) -> int:
        begin, end = self._info[name]
        crc, pos = 0, 0
        for start in sorted(self._chunks[name]):
            length, c = self._chunks[name][start]
            if start != pos:
                break
            crc = crc32_combine(crc, c, length)
            pos += length
        if pos != end - begin:
            raise ValueError(f"{self.path}: tensor {name!r} got {pos} contiguous bytes of "
                             f"{end - begin}")
        return crc

    def finish(self) -> dict:
        crcs = {name: self._tensor_crc(name) for name in self._info}
        os.fsync(self._fd)
        self.close()
        tensors = {}
        for name, (begin, end) in self._info.items():
            h = self._header_json[name]
            tensors[name] = {"dtype": h["dtype"], "shape": h["shape"], "data_offsets": [begin, end],
                             "crc32": crcs[name]}
        return {"file": os.path.basename(self.path), "bytes": self._total,
                "header_bytes": self._base, "header_crc32": crc32(self._header),
                "tensors": tensors}

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class Reader:
    """Opens one safetensors file of a checkpoint and checks it against its manifest entry: the
    file's size, the exact header bytes (by CRC-32) and each tensor's dtype, shape and offsets.
    ``verify()`` then streams every tensor through CRC-32; ``read(name, row0, out)`` fills `out`
    with rows [row0, row0 + len(out)) of a tensor."""

    def __init__(self, path: str, entry: dict, label: str):
        self.path = path
        self.label = label
        self.entry = entry
        self._fd = None
        try:
            # A local descriptor or an object read by ranges (``_objects``): opened once, here.
            self._fd = _objects.open_read(path)
        except FileNotFoundError:
            raise CheckpointError(f"{label}: file {path} is missing") from None
        try:
            self._check_header()
        except BaseException:
            self.close()
            raise

    def _fail(self, what: str):
        raise CheckpointError(f"{self.label}: {self.path}: {what}")

    def _check_header(self) -> None:
        size = self._fd.size()
        want = self.entry["bytes"]
        if size != want:
            self._fail(f"file has {size} bytes, the manifest records {want} "
                       f"({'truncated' if size < want else 'extra data'})")
        hb = self.entry["header_bytes"]
        head = bytearray(hb)
        pread_into(self._fd, memoryview(head), 0, self.path)
        (n,) = struct.unpack_from("<Q", head, 0)
        if n + 8 != hb or n > _MAX_HEADER:
            self._fail(f"header length {n} does not match the manifest ({hb - 8})")
        if crc32(head) != self.entry["header_crc32"]:
            self._fail("header checksum mismatch (corrupt header)")
        try:
            header = json.loads(bytes(head[8:]).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            self._fail(f"header is not valid JSON ({e})")
        header.pop("__metadata__", None)
        tensors = self.entry["tensors"]
        if set(header) != set(tensors):
            self._fail(f"tensors {sorted(header)} do not match the manifest's {sorted(tensors)}")
        self._info = {}
        for name, t in tensors.items():
            h = header[name]
            if (h.get("dtype") != t["dtype"] or h.get("shape") != t["shape"]
                    or h.get("data_offsets") != t["data_offsets"]):
                self._fail(f"tensor {name!r} header {h} does not match the manifest")
            dtype = numpy_dtype(t["dtype"])
            begin, end = t["data_offsets"]
            shape = tuple(t["shape"])
            if dtype.itemsize * int(np.prod(shape, dtype=np.int64)) != end - begin:
                self._fail(f"tensor {name!r}: shape {list(shape)} and dtype {t['dtype']} do not "
                           f"fill data_offsets {t['data_offsets']}")
            if hb + end > size:
                self._fail(f"tensor {name!r} extends past the end of the file")
            self._info[name] = (hb + begin, hb + end, dtype, shape)

    def shape(self, name: str) -> tuple:
        return self._info[name][3]

    def dtype(self, name: str) -> np.dtype:
        return self._info[name][2]

    def segments(self, max_bytes: int) -> list:
        """(tensor name, begin, end) byte ranges, relative to the tensor, covering every tensor;
        each at most max_bytes long (a multiple of 8) except tensors split only at item edges."""
        out = []
        for name, (begin, end, _, _) in self._info.items():
            size = end - begin
            pos = 0
            while True:
                m = min(max_bytes, size - pos)
                out.append((name, pos, pos + m))
                pos += m
                if pos >= size:
                    break
        return out

    def crc_range(self, name: str, lo: int, hi: int, buffer: bytearray, on_chunk=None) -> int:
        """CRC-32 of bytes [lo, hi) of tensor `name`, read through `buffer`."""
        begin = self._info[name][0]
        mv = memoryview(buffer)
        crc, pos = 0, lo
        while pos < hi:
            m = min(len(mv), hi - pos)
            chunk = mv[:m]
            pread_into(self._fd, chunk, begin + pos, self.path)
            crc = crc32(chunk, crc)
            if on_chunk is not None:
                on_chunk(name, chunk)
            pos += m
        return crc

    def check_crc(self, name: str, crc: int) -> None:
        if crc != self.entry["tensors"][name]["crc32"]:
            self._fail(f"checksum mismatch in tensor {name!r} (corrupt data)")

    def verify(self, buffer: bytearray, on_chunk=None) -> None:
        """CRC-32 of every tensor, streamed through `buffer`. `on_chunk(name, memoryview)` sees
        each chunk (chunks hold whole items: the buffer length is a multiple of 8)."""
        mv = memoryview(buffer)
        for name, (begin, end, _, _) in self._info.items():
            crc = 0
            pos = begin
            while pos < end:
                m = min(len(mv), end - pos)
                chunk = mv[:m]
                pread_into(self._fd, chunk, pos, self.path)
                crc = crc32(chunk, crc)
                if on_chunk is not None:
                    on_chunk(name, chunk)
                pos += m
            if crc != self.entry["tensors"][name]["crc32"]:
                self._fail(f"checksum mismatch in tensor {name!r} (corrupt data)")

    def read(self, name: str, row0: int, out: np.ndarray) -> None:
        begin, end, dtype, shape = self._info[name]
        if out.dtype != dtype:
            raise TypeError(f"{name}: reading {dtype} into {out.dtype}")
        row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
        view = _bytes_view(out)
        start = begin + row0 * row_bytes
        if start + len(view) > end:
            raise IndexError(f"{name}: rows past the end of the tensor")
        pread_into(self._fd, view, start, self.path)

    def read_all(self, name: str) -> np.ndarray:
        begin, end, dtype, shape = self._info[name]
        out = np.empty(shape, dtype)
        if out.size:
            pread_into(self._fd, _bytes_view(out), begin, self.path)
        return out

    def close(self) -> None:
        if getattr(self, "_fd", None) is not None:
            self._fd.close()
            self._fd = None

    def __del__(self):
        self.close()

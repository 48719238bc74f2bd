"""The file operations a checkpoint needs, on local disk or on an object store.

A checkpoint path is a local path (or a ``file://`` URL), or the URL of any fsspec file system:
``gs://bucket/ckpt`` (gcsfs), ``s3://bucket/ckpt`` (s3fs), ``memory://ckpt``, ... Local paths
go through ``os`` exactly as before and never import fsspec; URLs go through
``fsspec.core.url_to_fs``, so credentials and endpoints are configured the fsspec way
(``fsspec.config.conf``, ``FSSPEC_<PROTOCOL>_<OPTION>`` environment variables, or the backend's
own: ``AWS_*``, ``GOOGLE_APPLICATION_CREDENTIALS``, ``STORAGE_EMULATOR_HOST``; see
docs/checkpoint_format.md §6).

Nothing here imports the rest of the package, so every layer (manifest, safetensors files,
staging, publication) may use it without an import cycle.
"""

from __future__ import annotations

import os
import posixpath
import re
import socket

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
INSTALL_HINT = "pip install 'dualemb[object-store]'"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host still runs (one we may not signal counts as running):
    how the next save tells a dead save's leftovers from a live one's."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def host() -> str:
    """This machine's name as it appears in staging names (alphanumerics and ``_`` only)."""
    return "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:32] or "host"


def text_of(path) -> str:
    """``path`` (str, bytes, os.PathLike such as ``etils.epath.Path``) as text."""
    return os.fsdecode(os.fspath(path))


def scheme(path) -> str | None:
    """The lower-case URL scheme of an object-store path; None for a local path or file:// URL."""
    m = _URL.match(text_of(path))
    if m is None or m.group(1).lower() == "file":
        return None
    return m.group(1).lower()


def is_remote(path) -> bool:
    return scheme(path) is not None


def canonical_url(path) -> str:
    """The URL with a lower-case scheme and no trailing slash (one spelling per checkpoint)."""
    text = text_of(path)
    m = _URL.match(text)
    rest = text[len(m.group(0)):].rstrip("/")
    return f"{m.group(1).lower()}://{rest}"


def filesystem(url: str):
    """(fsspec file system, path inside it) of an object-store URL; a ValueError naming what is
    missing when fsspec or the scheme's backend is not installed."""
    proto = scheme(url)
    try:
        import fsspec
    except ImportError:
        raise ValueError(f"checkpoint path {url!r} is on an object store ('{proto}://'), which "
                         f"needs the fsspec package: {INSTALL_HINT}") from None
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as e:
        raise ValueError(f"checkpoint path {url!r}: the fsspec backend for '{proto}://' is not "
                         f"installed ({e}); {INSTALL_HINT} installs s3fs and gcsfs") from None
    except ValueError as e:
        if "protocol" in str(e).lower():
            raise ValueError(f"checkpoint path {url!r}: fsspec knows no file system for the "
                             f"URL scheme '{proto}://' ({e})") from None
        raise


def join(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}" if is_remote(base) else os.path.join(base, name)


def relative(target: str, start: str) -> str:
    """The relative path from the directory ``start`` to ``target`` (a delta's ``base.path``),
    both local or both URLs of one scheme; ValueError otherwise (nothing relative joins a local
    directory to a bucket, or two schemes)."""
    if is_remote(target) != is_remote(start) or scheme(target) != scheme(start):
        raise ValueError(f"{target} and {start} are not on one file system (local, or one "
                         "object-store scheme): a relative path cannot join them")
    if not is_remote(start):
        return os.path.relpath(target, os.path.abspath(start))
    # Object keys are '/'-separated names under the bucket (the first component).
    return posixpath.relpath("/" + _rest(target), "/" + _rest(start))


def resolve_relative(start: str, rel: str) -> str:
    """``start`` joined with the relative path ``rel`` (as :func:`relative` made it), normalized;
    ValueError if ``rel`` climbs above a URL's bucket."""
    if not is_remote(start):
        return os.path.normpath(os.path.join(start, rel))
    joined = posixpath.normpath(posixpath.join("/" + _rest(start), rel))
    if joined == "/":
        raise ValueError(f"{rel!r} from {start} climbs above the bucket")
    return f"{scheme(start)}://{joined.lstrip('/')}"


def _rest(url: str) -> str:
    """The part of an object-store URL after ``scheme://``, without a trailing slash."""
    return canonical_url(url).split("://", 1)[1]


def read_bytes(path: str) -> bytes:
    """The whole (small) file at ``path``; FileNotFoundError if it does not exist."""
    if not is_remote(path):
        with open(path, "rb") as f:
            return f.read()
    fs, p = filesystem(path)
    return fs.cat_file(p)


def exists(path: str) -> bool:
    """Whether the file (object) ``path`` exists now (not from a listing cache)."""
    if not is_remote(path):
        return os.path.exists(path)
    fs, p = filesystem(path)
    fs.invalidate_cache(p)
    return fs.exists(p)


def write_bytes(url: str, data: bytes) -> None:
    """Writes a whole object in one request: on S3, GCS and the like it appears complete or not
    at all, never partly written."""
    fs, p = filesystem(url)
    fs.pipe_file(p, bytes(data))


def upload(local: str, url: str) -> None:
    """Copies the local file to ``url``, streamed in blocks (a multipart / resumable upload on
    S3 / GCS): never all in memory. The object becomes visible only once complete."""
    fs, p = filesystem(url)
    fs.put_file(local, p)


def remove_tree(url: str, first: str | None = None) -> None:
    """Deletes every object under the prefix ``url`` (``first`` among them before the others)."""
    fs, p = filesystem(url)
    if first is not None:
        try:
            fs.rm_file(f"{p.rstrip('/')}/{first}")
        except FileNotFoundError:
            pass
    try:
        fs.rm(p, recursive=True)
    except FileNotFoundError:
        pass


def list_prefix(url: str) -> list:
    """fsspec ``ls(detail=True)`` entries directly under ``url`` (fresh, not from a cache:
    another process may have written since); [] if there are none."""
    fs, p = filesystem(url)
    fs.invalidate_cache(p)
    try:
        entries = fs.ls(p, detail=True)
    except FileNotFoundError:
        return []
    base = p.rstrip("/")
    # Some backends list the prefix itself; a checkpoint's children are what is below it.
    return [e for e in entries if e["name"].rstrip("/") != base]


def modified_unix(entry: dict) -> float | None:
    """An fsspec entry's modification time in seconds since the epoch, where the backend says."""
    for key in ("mtime", "LastModified", "updated", "last_modified", "created"):
        v = entry.get(key)
        if v is None:
            continue
        if isinstance(v, (int, float)):
            return float(v)
        if hasattr(v, "timestamp"):
            return float(v.timestamp())
        if isinstance(v, str):
            from datetime import datetime
            try:
                return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


class LocalFile:
    """A local file opened for reading by offset (``os.pread``; one descriptor, thread-safe)."""

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def pread_into(self, view: memoryview, offset: int) -> int:
        """Reads up to len(view) bytes at ``offset`` into ``view``; returns how many."""
        return os.preadv(self._fd, [view], offset)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class RemoteFile:
    """An object read by byte ranges (one ranged GET per read; thread-safe, holds no buffer).

    Its size is taken when it is opened; a read that finds the object changed size or gone (a
    concurrent save deleted the generation being read) is a short read, which the caller
    reports as a truncated file."""

    def __init__(self, url: str):
        self.path = url
        self._fs, self._p = filesystem(url)
        self._size = int(self._fs.size(self._p))

    def size(self) -> int:
        return self._size

    def pread_into(self, view: memoryview, offset: int) -> int:
        end = min(offset + len(view), self._size)
        if end <= offset:
            return 0
        try:
            data = self._fs.cat_file(self._p, start=offset, end=end)
        except FileNotFoundError:
            return 0
        view[:len(data)] = data
        return len(data)

    def close(self) -> None:
        pass


def open_read(path: str):
    """A LocalFile or RemoteFile; FileNotFoundError if it does not exist."""
    return RemoteFile(path) if is_remote(path) else LocalFile(path)

"""Crash-safe publication of a checkpoint directory, and finding the complete one at a path.

A save writes everything into a staging directory beside the path (``_staging.py``: its name,
its lock, and the removal of dead saves' leftovers), fsyncs every file and the directory
(``manifest.json`` last), then publishes it:

* ``path`` absent: ``rename(tmp, path)``.
* ``path`` present: ``renameat2(tmp, path, RENAME_EXCHANGE)`` swaps the two atomically, so
  ``path`` always names a complete checkpoint; the old one (now at the temporary name) loses its
  manifest first and is then deleted.
* Where the exchange is unsupported (not Linux, or a filesystem without it): ``rename(path,
  .<name>.old)``, ``rename(tmp, path)``, delete ``.<name>.old``. A crash between the two renames
  leaves only ``.<name>.old``; ``resolve`` (used by every reader) falls back to it, and the next
  save to ``path`` deletes it once a new checkpoint is in place.

The parent directory is fsynced after each rename.

An object-store URL (``gs://``, ``s3://``, any fsspec scheme) has no rename: ``normalize`` keeps
it as a URL, ``resolve`` follows its commit marker, and ``_object_store.py`` publishes it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import warnings

from dualemb.core.checkpoint import _object_store, _objects
from dualemb.core.checkpoint._manifest import MANIFEST, CheckpointError
from dualemb.core.checkpoint._safetensors import fsync_dir

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _host() -> str:
    return _objects.host()


def tmp_prefix(path: str) -> str:
    parent, base = os.path.split(path)
    return os.path.join(parent, f".{base}.tmp-")


def aside_path(path: str) -> str:
    parent, base = os.path.split(path)
    return os.path.join(parent, f".{base}.old")


def local_path(path) -> str:
    """``path`` as a local filesystem path; ``file://`` URLs are accepted. An object-store URL
    (``gs://``, ``s3://``...) is a ``ValueError`` naming its scheme: treating it as a relative
    local path would silently write to ``./gs:/bucket/...``."""
    text = _objects.text_of(path)
    remote = _objects.scheme(text)
    if remote is not None:
        raise ValueError(f"{text!r} uses the URL scheme '{remote}://', not a local path")
    m = re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text)
    if m is None:
        return text
    rest = text[len(m.group(0)):]
    if not rest.startswith("/"):
        raise ValueError(f"file URL {text!r} must name an absolute path (file:///dir/ckpt)")
    return rest


def normalize(path) -> str:
    """The one spelling of a checkpoint path: an absolute local path, or an object-store URL
    (any fsspec scheme; ``_object_store.py``) with a lower-case scheme and no trailing slash."""
    if _objects.is_remote(path):
        url = _objects.canonical_url(path)
        name = url.split("://", 1)[1].rsplit("/", 1)[-1]
        if name in ("", ".", ".."):
            raise ValueError(f"invalid checkpoint path {path!r}")
        _objects.filesystem(url)  # the backend is installed (else a ValueError naming it)
        return url
    p = os.path.abspath(local_path(path))
    if os.path.basename(p) in ("", ".", ".."):
        raise ValueError(f"invalid checkpoint path {path!r}")
    return p


def is_complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, MANIFEST))


def resolve(path: str) -> str:
    """The directory holding the complete checkpoint saved at `path`: `path` itself, or its
    aside copy if a save was interrupted between its two renames; on an object store, the
    generation its commit marker names (``_object_store.resolve``). FileNotFoundError if none."""
    if _objects.is_remote(path):
        return _object_store.resolve(path)
    if os.path.isdir(path):
        if not is_complete(path):
            raise CheckpointError(f"{path}: no {MANIFEST}; not a complete dualemb checkpoint")
        return path
    if os.path.exists(path):
        raise CheckpointError(f"{path} is not a directory; a dualemb checkpoint is a directory")
    aside = aside_path(path)
    if os.path.isdir(aside) and is_complete(aside):
        warnings.warn(f"{path} is missing; reading {aside}, the checkpoint an interrupted save "
                      "had moved aside", RuntimeWarning, stacklevel=3)
        return aside
    raise FileNotFoundError(errno.ENOENT, "no dualemb checkpoint at this path", path)


def prepare_target(path: str) -> None:
    """Checks that a save may write `path` (not a symbolic link; absent, empty, or a complete
    checkpoint it replaces) and makes its parent."""
    if os.path.islink(path):
        raise CheckpointError(f"{path} is a symbolic link; save to the directory it points to "
                              "(or remove the link)")
    if os.path.lexists(path) and not (os.path.isdir(path) and
                                      (is_complete(path) or not os.listdir(path))):
        raise CheckpointError(f"{path} exists and is not a dualemb checkpoint; refusing to "
                              "overwrite it")
    os.makedirs(os.path.dirname(path), exist_ok=True)


def remove_tree(path: str) -> None:
    """Deletes a checkpoint directory, its manifest first (so it never looks complete)."""
    if os.path.islink(path):
        os.unlink(path)
        return
    try:
        os.unlink(os.path.join(path, MANIFEST))
    except FileNotFoundError:
        pass
    shutil.rmtree(path, ignore_errors=True)


def _rename_exchange(a: str, b: str) -> bool:
    """Atomically swaps two paths; False if this OS or filesystem cannot."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), b)


def publish(tmp: str, path: str) -> None:
    """Moves the complete (fsynced) checkpoint directory `tmp` to `path`, crash-safely."""
    parent = os.path.dirname(path)
    if not os.path.lexists(path):
        os.rename(tmp, path)
        fsync_dir(parent)
    elif exchange(tmp, path):
        fsync_dir(parent)
        remove_tree(tmp)  # now the previous checkpoint
    else:
        aside = aside_path(path)
        if os.path.lexists(aside):
            remove_tree(aside)  # stale: `path` is complete (checked by the caller)
        os.rename(path, aside)
        fsync_dir(parent)
        os.rename(tmp, path)
        fsync_dir(parent)
        remove_tree(aside)
    aside = aside_path(path)
    if os.path.isdir(aside):  # left by an earlier interrupted save; `path` is complete now
        remove_tree(aside)


# Indirection so tests can force the portable rename-aside scheme.
exchange = _rename_exchange

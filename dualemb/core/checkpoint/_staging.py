"""A checkpoint being written: its staging directory, the lock that says its writer is alive, and
its publication (docs/checkpoint_format.md §6).

Every save writes into a staging directory beside the checkpoint path,
``.<name>.tmp-<host>-<pid>-<token>`` (host and pid of the process that made it, the coordinator;
``token`` a random positive 31-bit number, which a multi-writer save hands to its other writers),
and publishes it with :meth:`Staging.commit`: part records removed, ``manifest.json`` written
last, fsync, atomic rename (``_fs.publish``). A crash before that leaves the previous checkpoint
at the path, and the staging directory as debris that the next save removes.

Liveness. The coordinator holds an exclusive ``flock`` on ``<staging>.lock`` (beside the staging
directory, so it is never published) for as long as its save runs. The kernel drops the lock
when the process ends, however it ends (SIGKILL included), so a lock that can be taken belongs
to a dead save. Unlike a pid, it is not mistaken for a live one after pid reuse (a restarted
container often has the same host name and pid). :func:`clean_stale`, which every save runs
before it starts, removes:

* a staging directory whose lock it can take, when it was made on this host; when made on another
  host, only if it is also untouched for ``FOREIGN_STALE_S`` (a shared file system may keep
  locks per client: NFS mounted with ``local_lock``, some FUSE file systems);
* a staging directory without a usable lock (made by an older dualemb, or on a file system
  without ``flock``): on this host when its pid is gone, otherwise when untouched for
  ``FOREIGN_STALE_S``;
* a lock file whose directory is gone (its process died between the two), once it can be taken
  and is older than ``_ORPHAN_LOCK_S``.

A directory whose lock is held is never removed, whoever holds it. Writers other than the
coordinator (:meth:`Staging.join`) only add files; they never own, publish or remove it.

What a backend needs to offer this protocol: create a private staging area, write files into it
(:meth:`Staging.new_file`), a part record per writer, and publish with the manifest as the last
thing written. An object-store URL gets ``_object_store.ObjectStaging`` from :meth:`begin` and
:meth:`join` instead: a fresh generation prefix published by a commit marker written last (no
rename), liveness by a heartbeat object instead of a lock; the callers (``_commit.py``) stay.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import json
import os
import re
import secrets
import time

from dualemb.core.checkpoint import _fs, _manifest, _objects
from dualemb.core.checkpoint._object_store import ObjectStaging
from dualemb.core.checkpoint._manifest import FORMAT, CheckpointError
from dualemb.core.checkpoint._safetensors import fsync_dir
from dualemb.core.checkpoint._write import write_new_file

LOCK_SUFFIX = ".lock"
# A staging directory made on another host, whose lock this host may not see, is removed only
# once nothing in it changed for this long (a live save writes its files continuously).
FOREIGN_STALE_S = 3600.0
# A lock file without its directory is removed only when older than this (its maker creates the
# directory right after the lock).
_ORPHAN_LOCK_S = 60.0
_PART = ".part-{:05d}.json"  # hidden: never mistaken for a checkpoint file; removed on commit
_PART_RE = re.compile(r"^\.part-\d{5}\.json(\.tmp-\d+)?$")
_CANNOT_LOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS)


def _new_token() -> int:
    # Positive and below 2**31: it travels through any collective (JAX's default int32 too), and
    # 0 can mean "the coordinator failed".
    return secrets.randbelow(2 ** 31 - 1) + 1


def _directory_name(path: str, token: int) -> str:
    return f"{_fs.tmp_prefix(path)}{_fs._host()}-{os.getpid()}-{token:016x}"


class Staging:
    """The staging directory of one save to ``path``.

    The coordinator makes it with :meth:`begin` (and owns it: it alone may :meth:`commit` or
    :meth:`abort`); other writers of a multi-writer save find it with :meth:`join`. Files are
    written at :meth:`file` paths; each writer then lists what it wrote, with checksums, in a
    part record (:meth:`write_record`), which the coordinator reads (:meth:`read_records`) to
    build the manifest.
    """

    def __init__(self, path: str, directory: str, token: int, lock_fd):
        self.path = path
        self.directory = directory
        self.token = token
        self._lock_fd = lock_fd  # None: joined (not the owner), or released

    @classmethod
    def begin(cls, path) -> "Staging":
        """Coordinator: checks that a save may write ``path`` (``_fs.prepare_target``), removes
        stale staging directories of dead saves to it, and makes a new one, locked. An
        object-store URL gets an ``ObjectStaging`` (same interface)."""
        path = _fs.normalize(path)
        if _objects.is_remote(path):
            return ObjectStaging.begin(path)
        _fs.prepare_target(path)
        clean_stale(path)
        token = _new_token()
        directory = _directory_name(path, token)
        fd = _take_lock(directory + LOCK_SUFFIX)
        try:
            os.mkdir(directory, 0o755)
        except BaseException:
            _drop_lock(directory + LOCK_SUFFIX, fd)
            raise
        return cls(path, directory, token, fd)

    @classmethod
    def join(cls, path, token: int) -> "Staging":
        """Any other writer: the staging directory the coordinator made for ``token``."""
        path = _fs.normalize(path)
        if _objects.is_remote(path):
            return ObjectStaging.join(path, token)
        found = glob.glob(glob.escape(_fs.tmp_prefix(path)) + f"*-{int(token):016x}")
        found = [d for d in found if os.path.isdir(d)]
        if len(found) != 1:
            raise CheckpointError(
                f"{path}: the staging directory of this save is not visible from this process "
                f"(found {found}); every process of the job must see the same directory (one "
                "machine or a shared file system)")
        return cls(path, found[0], int(token), None)

    @property
    def owner(self) -> bool:
        return self._lock_fd is not None

    def file(self, name: str) -> str:
        return os.path.join(self.directory, name)

    @contextlib.contextmanager
    def new_file(self, name: str):
        """The path to write the checkpoint's file ``name`` at: here, in the staging directory
        itself (an object store's staging spools it locally and uploads it after the block)."""
        yield self.file(name)

    def write_record(self, part: int, record: dict) -> None:
        """Writes writer ``part``'s record (JSON; the files it wrote and their checksums) so that
        it is either complete or absent: temporary name, fsync, rename, fsync the directory."""
        final = self.file(_PART.format(int(part)))
        tmp = final + f".tmp-{os.getpid()}"
        body = {"format": FORMAT, "part": int(part), **record}
        write_new_file(tmp, json.dumps(body, allow_nan=False).encode("utf-8"))
        os.rename(tmp, final)
        fsync_dir(self.directory)

    def read_records(self, num_parts: int) -> list:
        """The records of writers 0..num_parts-1 (coordinator, after every writer wrote its)."""
        records = []
        for k in range(num_parts):
            p = self.file(_PART.format(k))
            try:
                with open(p, "rb") as f:
                    rec = json.loads(f.read())
            except FileNotFoundError:
                raise CheckpointError(f"{self.directory}: process {k} did not write its part of "
                                      "the checkpoint (is the directory shared by every "
                                      "process?)") from None
            if rec.get("format") != FORMAT or rec.get("part") != k:
                raise CheckpointError(f"{p}: not part {k} of a dualemb checkpoint")
            records.append(rec)
        return records

    def commit(self, manifest: dict) -> None:
        """Owner: removes the part records, writes the manifest (last), fsyncs and publishes the
        directory at ``path``, atomically replacing the checkpoint there. On failure the staging
        directory is removed and ``path`` is untouched."""
        self._require_owner("commit")
        try:
            for name in os.listdir(self.directory):
                if _PART_RE.match(name):
                    os.unlink(self.file(name))
            _manifest.write_files(self.directory, manifest, write_new_file)
            fsync_dir(self.directory)
            if os.path.lexists(self.path) and not _fs.is_complete(self.path):
                os.rmdir(self.path)  # an empty directory (prepare_target refused anything else)
            _fs.publish(self.directory, self.path)
        except BaseException:
            self.abort()
            raise
        self._release()

    def abort(self) -> None:
        """Owner: removes the staging directory (a no-op for a joined writer, or once done)."""
        if self.owner:
            _fs.remove_tree(self.directory)
            self._release()

    def _require_owner(self, what: str) -> None:
        if not self.owner:
            raise RuntimeError(f"only the process that began the save may {what} it")

    def _release(self) -> None:
        _drop_lock(self.directory + LOCK_SUFFIX, self._lock_fd)
        self._lock_fd = None


def _take_lock(lock_path: str) -> int:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        # Blocking: a cleaner may hold it for an instant (it leaves a fresh lock file alone).
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as e:
        if e.errno not in _CANNOT_LOCK:
            os.close(fd)
            raise
        # This file system cannot lock: cleaners fall back to the pid and age rules.
    return fd


def _drop_lock(lock_path: str, fd) -> None:
    if fd is None:
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(lock_path)  # while still holding it: nobody can take it for a dead save
    os.close(fd)


@contextlib.contextmanager
def _probe(lock_path: str):
    """Yields True while holding the lock of a dead save, False if a live process holds it, None
    when there is no lock file or this file system cannot lock it."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        yield None
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = True
        except BlockingIOError:
            held = False
        except OSError as e:
            if e.errno not in _CANNOT_LOCK:
                raise
            held = None
        yield held
    finally:
        os.close(fd)


def _idle_seconds(directory: str) -> float:
    """Seconds since anything in the (flat) directory last changed."""
    newest = os.stat(directory).st_mtime
    with os.scandir(directory) as it:
        for entry in it:
            with contextlib.suppress(FileNotFoundError):
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    return time.time() - newest


def _made_here(owner: str) -> tuple:
    """(made on this host, its pid) from ``<host>-<pid>-<token>``."""
    host, _, rest = owner.partition("-")
    pid = rest.split("-")[0]
    if host == _fs._host() and pid.isdigit():
        return True, int(pid)
    return False, None


def _is_stale(directory: str, owner: str, lock_state) -> bool:
    """Whether the staging directory ``directory`` belongs to a dead save. ``owner``: what its
    name says after the prefix (``<host>-<pid>-<token>``, or ``job-<hex>`` from older
    dualemb.jax); ``lock_state``: what :func:`_probe` found."""
    if lock_state is False:
        return False  # a live save holds it
    here, pid = _made_here(owner)
    if here and lock_state is True:
        return True
    if here and lock_state is None:
        return not _objects.pid_alive(pid)
    return _idle_seconds(directory) > FOREIGN_STALE_S


def clean_stale(path: str) -> None:
    """Removes the staging directories of dead saves to ``path`` (rules in the module docstring),
    and the aside copy of an interrupted publication when ``path`` holds a complete checkpoint."""
    parent, base = os.path.split(path)
    prefix = f".{base}.tmp-"
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return
    for name in names:
        if not name.startswith(prefix):
            continue
        full = os.path.join(parent, name)
        here, pid = _made_here(name[len(prefix):])
        if here and pid == os.getpid():
            # This process's own save (another thread). Not even probed: where flock is
            # emulated by POSIX locks (NFS), closing any descriptor of the file would release
            # this process's lock on it.
            continue
        if name.endswith(LOCK_SUFFIX):
            if not os.path.lexists(full[:-len(LOCK_SUFFIX)]):
                with _probe(full) as state, contextlib.suppress(FileNotFoundError):
                    if state is True and time.time() - os.stat(full).st_mtime > _ORPHAN_LOCK_S:
                        os.unlink(full)
            continue
        if os.path.islink(full) or not os.path.isdir(full):
            continue
        lock = full + LOCK_SUFFIX
        with _probe(lock) as state:
            try:
                stale = _is_stale(full, name[len(prefix):], state)
            except FileNotFoundError:
                continue  # published or removed meanwhile
            if stale:
                _fs.remove_tree(full)
                if state is True:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(lock)
    if _fs.is_complete(path) and os.path.isdir(_fs.aside_path(path)):
        _fs.remove_tree(_fs.aside_path(path))

"""Checkpoints on an object store (``gs://``, ``s3://``, any fsspec URL): the layout, its commit
marker, and the staging area of a save (docs/checkpoint_format.md §6, "On an object store").

Object stores have no rename of a prefix, so a save is published by an object written last
instead (as Orbax does on object stores)::

    <url>/commit.json                  the commit marker: {"format", "generation": "gen-..."}
    <url>/gen-<host>-<pid>-<token>/    one complete checkpoint directory (§1), manifest last

A save writes every file of a new checkpoint under a fresh generation prefix that nothing names
yet, then ``manifest.crc32.json`` and ``manifest.json`` in it, and then overwrites
``commit.json`` to name it. One PUT of a whole object is atomic on S3, GCS and Azure (a reader
sees the old object or the new one, never a mix), so a reader of ``<url>`` (``resolve``) always
finds a complete checkpoint: the previous one until the marker is written, the new one after.
Only then is the previous generation deleted (its manifest first).

Why a fresh prefix per save rather than deleting and rewriting the files in place: deleting
first leaves no checkpoint at all until the new one is complete, so a crash mid-save (or a
server that dies) would lose the last good checkpoint; overwriting files in place lets a reader
combine old and new files. A fresh prefix costs the space of two checkpoints only between the
marker's write and the old generation's deletion.

What a dead save leaves (a generation that the marker does not name) is removed by the next
save to the same URL, never one that a live save is writing. There are no locks on an object
store; a generation belongs to a dead save when:

* it was made by this process (host and pid in its name) and this process is not writing it;
* it was made on this host by a process that is gone;
* otherwise, when nothing under it changed for ``STALE_S`` (a live save rewrites its
  ``.heartbeat`` object every ``HEARTBEAT_S``, and writes its files continuously).

Files are written to a local spool file by the same streaming writer as a local save (pages of
at most 4 MiB, never a whole table in memory), then uploaded in blocks (fsspec's ``put_file``:
an S3 multipart or GCS resumable upload) and the spool file deleted, one file at a time: the
local disk holds at most one shard file (``TMPDIR``; a killed process's spool is removed by the
next save on the machine). The bytes are those of a local save.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import tempfile
import threading
import time
import warnings

from dualemb.core.checkpoint import _manifest, _objects
from dualemb.core.checkpoint._manifest import FORMAT, MANIFEST, CheckpointError

COMMIT = "commit.json"
GENERATION_PREFIX = "gen-"
HEARTBEAT = ".heartbeat"
HEARTBEAT_S = 60.0
# A generation of another host (or of a pid that may have been reused) is removed only once
# nothing in it changed for this long; a live save touches its heartbeat every HEARTBEAT_S.
STALE_S = 3600.0
_PART = ".part-{:05d}.json"
# Local spool directories: <tmp>/dualemb-spool-<pid>-<random>; a process killed mid-upload leaves
# one, which the next save on this machine removes (remove_dead_spools).
SPOOL_PREFIX = "dualemb-spool-"

# Generations this process is writing: its own leftovers (a save that failed and could not clean
# up, e.g. because the server was down) are told apart from its saves running in other threads.
_live: set = set()
_live_lock = threading.Lock()


def _generation_name(token: int) -> str:
    return f"{GENERATION_PREFIX}{_objects.host()}-{os.getpid()}-{token:016x}"


def _parse_generation(name: str):
    """(host, pid, token) from ``gen-<host>-<pid>-<token>``; None if it is not such a name."""
    if not name.startswith(GENERATION_PREFIX):
        return None
    parts = name[len(GENERATION_PREFIX):].rsplit("-", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    try:
        return parts[0], int(parts[1]), int(parts[2], 16)
    except ValueError:
        return None


def _basename(entry: dict) -> str:
    return entry["name"].rstrip("/").rsplit("/", 1)[-1]


def read_commit(url: str) -> str | None:
    """The generation that ``<url>/commit.json`` names; None when there is no marker."""
    where = _objects.join(url, COMMIT)
    try:
        data = _objects.read_bytes(where)
    except FileNotFoundError:
        return None
    try:
        marker = json.loads(data.decode("utf-8"))
        gen = marker["generation"]
        ok = marker.get("format") == FORMAT and _parse_generation(gen) is not None
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise CheckpointError(f"{where}: not a dualemb commit marker (corrupt?); nothing at "
                              f"{url} is read or replaced until it is repaired or removed")
    return gen


def resolve(url: str) -> str:
    """The prefix holding the complete checkpoint at ``url``: the generation its commit marker
    names, or ``url`` itself for a checkpoint directory copied onto the store as is (``gsutil
    cp -r``). FileNotFoundError if neither."""
    gen = read_commit(url)
    if gen is not None:
        return _objects.join(url, gen)
    fs, p = _objects.filesystem(url)
    if fs.exists(f"{p}/{MANIFEST}"):
        return url
    raise FileNotFoundError(2, "no dualemb checkpoint at this path (no commit.json)", url)


def _check_target(url: str) -> None:
    """A save may write ``url``: no object of that name, and nothing under it but a previous
    save's marker and generations (never overwrite what is not a dualemb checkpoint)."""
    fs, p = _objects.filesystem(url)
    if fs.isfile(p):
        raise CheckpointError(f"{url} is an object, not a prefix; refusing to overwrite it")
    foreign = [_basename(e) for e in _objects.list_prefix(url)
               if _basename(e) != COMMIT and _parse_generation(_basename(e)) is None]
    if foreign:
        raise CheckpointError(f"{url} holds {sorted(foreign)[:5]}, which are not parts of a "
                              "dualemb checkpoint saved to an object store; refusing to write "
                              "there (a directory copied onto the store is read as it is, but "
                              "saved to only at an empty prefix)")


def _idle_seconds(url: str) -> float:
    """Seconds since anything under ``url`` changed (0 when the store gives no times: then it is
    never judged idle)."""
    fs, p = _objects.filesystem(url)
    fs.invalidate_cache(p)
    times = [_objects.modified_unix(e) for e in fs.find(p, detail=True).values()]
    times = [t for t in times if t is not None]
    return time.time() - max(times) if times else 0.0


def _is_stale(url: str, name: str) -> bool:
    host, pid, _ = _parse_generation(name)
    if host == _objects.host() and pid == os.getpid():
        with _live_lock:
            return name not in _live
    if host == _objects.host() and not _objects.pid_alive(pid):
        return True
    return _idle_seconds(_objects.join(url, name)) > STALE_S


def clean_stale(url: str) -> None:
    """Removes the generations of dead saves to ``url`` (rules in the module docstring); never
    the one the commit marker names."""
    committed = read_commit(url)
    for e in _objects.list_prefix(url):
        name = _basename(e)
        if name == committed or e.get("type") != "directory" or _parse_generation(name) is None:
            continue
        if _is_stale(url, name):
            _objects.remove_tree(_objects.join(url, name), first=MANIFEST)


def remove_dead_spools() -> None:
    """Removes the spool directories of processes of this machine that are gone."""
    tmp = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(tmp):
            pid = name[len(SPOOL_PREFIX):].split("-", 1)[0]
            if name.startswith(SPOOL_PREFIX) and pid.isdigit() and not _objects.pid_alive(int(pid)):
                shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)


class ObjectStaging:
    """The generation prefix of one save to an object-store URL: the same interface as the local
    ``_staging.Staging`` (``begin``/``join``, ``file``, ``new_file``, part records, ``commit``,
    ``abort``), published by the commit marker instead of a rename."""

    def __init__(self, path: str, generation: str, token: int, owner: bool):
        self.path = path
        self.generation = generation
        self.directory = _objects.join(path, generation)
        self.token = token
        self._owner = owner
        self._stop = threading.Event()
        self._beat = None
        self._keep = False  # True once this generation may be the published one

    @classmethod
    def begin(cls, path: str) -> "ObjectStaging":
        _check_target(path)
        clean_stale(path)
        remove_dead_spools()
        token = secrets.randbelow(2 ** 31 - 1) + 1  # as _staging: positive, below 2**31
        gen = _generation_name(token)
        with _live_lock:
            _live.add(gen)
        staging = cls(path, gen, token, True)
        try:
            staging._touch()  # makes the prefix visible to joining writers
        except BaseException:
            staging._forget()
            raise
        staging._beat = threading.Thread(target=staging._heartbeat, daemon=True,
                                         name="dualemb-ckpt-heartbeat")
        staging._beat.start()
        return staging

    @classmethod
    def join(cls, path: str, token: int) -> "ObjectStaging":
        suffix = f"-{int(token):016x}"
        found = [_basename(e) for e in _objects.list_prefix(path)
                 if _basename(e).endswith(suffix) and _parse_generation(_basename(e))]
        if len(found) != 1:
            raise CheckpointError(f"{path}: the generation of this save is not visible from this "
                                  f"process (found {found}); every process must reach the same "
                                  "bucket")
        return cls(path, found[0], int(token), False)

    @property
    def owner(self) -> bool:
        return self._owner

    def file(self, name: str) -> str:
        return _objects.join(self.directory, name)

    @contextlib.contextmanager
    def new_file(self, name: str):
        """A local spool path to write file ``name`` at; uploaded under the generation prefix
        when the block ends without an exception, and deleted in any case."""
        spool = tempfile.mkdtemp(prefix=f"{SPOOL_PREFIX}{os.getpid()}-")
        try:
            local = os.path.join(spool, name)
            yield local
            _objects.upload(local, self.file(name))
        finally:
            shutil.rmtree(spool, ignore_errors=True)

    def write_record(self, part: int, record: dict) -> None:
        body = {"format": FORMAT, "part": int(part), **record}
        _objects.write_bytes(self.file(_PART.format(int(part))),
                             json.dumps(body, allow_nan=False).encode("utf-8"))

    def read_records(self, num_parts: int) -> list:
        records = []
        for k in range(num_parts):
            where = self.file(_PART.format(k))
            try:
                rec = json.loads(_objects.read_bytes(where))
            except FileNotFoundError:
                raise CheckpointError(f"{self.directory}: process {k} did not write its part of "
                                      "the checkpoint") from None
            if rec.get("format") != FORMAT or rec.get("part") != k:
                raise CheckpointError(f"{where}: not part {k} of a dualemb checkpoint")
            records.append(rec)
        return records

    def commit(self, manifest: dict) -> None:
        """Owner: writes the manifest (last in the generation), then the commit marker naming
        the generation (the publication), then deletes the previous generation."""
        if not self._owner:
            raise RuntimeError("only the process that began the save may commit it")
        try:
            self._stop_heartbeat()
            fs, p = _objects.filesystem(self.directory)
            fs.invalidate_cache(p)
            for name in [_basename(e) for e in _objects.list_prefix(self.directory)]:
                if name == HEARTBEAT or (name.startswith(".part-") and name.endswith(".json")):
                    fs.rm_file(f"{p}/{name}")
            _manifest.write_files(self.directory, manifest, _objects.write_bytes)
            previous = read_commit(self.path)
            marker = {"format": FORMAT, "generation": self.generation,
                      "created_unix": time.time()}
            self._write_marker(json.dumps(marker, sort_keys=True).encode("utf-8") + b"\n")
        except BaseException:
            self.abort()
            raise
        self._forget()
        if previous is not None and previous != self.generation:
            try:
                _objects.remove_tree(_objects.join(self.path, previous), first=MANIFEST)
            except Exception as e:  # noqa: BLE001 - published; the next save removes it
                warnings.warn(f"{self.path}: the previous checkpoint {previous} could not be "
                              f"deleted ({e}); the next save removes it", RuntimeWarning)

    def _write_marker(self, data: bytes) -> None:
        try:
            _objects.write_bytes(_objects.join(self.path, COMMIT), data)
        except BaseException as e:
            # The request may have been applied before it failed (a lost response): never delete
            # a generation that the marker may name.
            try:
                named = read_commit(self.path)
            except BaseException:
                self._keep = True
                raise CheckpointError(
                    f"{self.path}: writing {COMMIT} failed ({e!r}) and it cannot be read back: "
                    f"whether {self.generation} was published is unknown; it is kept (the next "
                    "save removes it if it is not)") from e
            if named == self.generation:
                return
            raise

    def abort(self) -> None:
        """Owner: deletes the generation (a no-op for a joined writer, or once published).
        Best effort: on a store that cannot be reached the generation stays, and the next save
        removes it."""
        if not self._owner or self.generation not in _live:
            return
        self._stop_heartbeat()
        if not self._keep:
            try:
                _objects.remove_tree(self.directory, first=MANIFEST)
            except Exception as e:  # noqa: BLE001 - the save's own error is the one to raise
                warnings.warn(f"{self.directory}: could not remove this failed save's files "
                              f"({e}); the next save removes them", RuntimeWarning)
        self._forget()

    def _forget(self) -> None:
        with _live_lock:
            _live.discard(self.generation)

    def _touch(self) -> None:
        _objects.write_bytes(self.file(HEARTBEAT), f"{time.time()}\n".encode("ascii"))

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(Exception):  # a missed beat is harmless: STALE_S is an hour
                self._touch()

    def _stop_heartbeat(self) -> None:
        self._stop.set()
        if self._beat is not None and self._beat is not threading.current_thread():
            self._beat.join()
        self._beat = None

"""checkpoint.Follower: a serving process keeps its live tables at the newest checkpoint of a
directory that a trainer publishes into (``checkpoint.Publisher``, or any saves into one
directory), applying deltas and full checkpoints in place while lookups go on (``_apply.py``).

What a poll does:

1. Lists the directory's complete checkpoints: its sub-directories with a ``manifest.json``
   whose name does not start with "." (the commit protocol stages and moves aside under dotted
   names and renames a checkpoint into place only once it is complete, so a half-written save is
   never listed). Manifests are read once per directory entry (cached by the file's identity).
   On an object store: the prefixes whose commit marker names a complete generation (the
   generation is the entry's identity; ``_remote_entries``).
2. Picks the target: the checkpoint with the highest step (the largest step of the followed
   tables; then the largest name) above the step of the checkpoint the tables hold.
3. Walks back from the target along its chain (each delta's base found by its manifest SHA-256
   among the listed checkpoints) until it reaches the checkpoint the tables hold or a full
   checkpoint. A base that is neither listed nor held is a broken chain: ``CheckpointError``
   naming it, before any table is touched.
4. Applies the path oldest first, one checkpoint at a time (``checkpoint.apply``): the tables
   are at a complete checkpoint after each, so an error part way leaves them at the last one
   applied, never between two.

So a full checkpoint replaces a chain when the newest checkpoint descends from it and not from
what the tables hold (a trainer that restarted, or compacted and started a new chain); otherwise
the follower takes the deltas.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping

from dualemb.core.checkpoint import _apply, _fs, _manifest, _object_store, _objects
from dualemb.core.checkpoint._delta import MAX_CHAIN
from dualemb.core.checkpoint._manifest import MANIFEST, CheckpointError
from dualemb.core.checkpoint._write import shards_of

_log = logging.getLogger("dualemb.checkpoint")


class _Listed:
    __slots__ = ("name", "path", "digest", "base", "step")

    def __init__(self, name, path, manifest, digest, tables):
        self.name = name
        self.path = path
        self.digest = digest
        self.base = (manifest.get("base") or {}).get("manifest_sha256")
        steps = [t.get("step") for t in manifest["tables"] if t["name"] in tables]
        steps = [s for s in steps if s is not None]
        self.step = max(steps) if steps else -1

    @property
    def order(self):
        return (self.step, self.name)


class Follower:
    """Keeps live ``tables`` (name -> Table or list of live shards) at the newest checkpoint in
    ``directory``: ``poll()`` once, or ``start(interval)`` / ``stop()`` a background thread.

    ``partitioner`` routes keys to live shards as in ``checkpoint.load``. The tables may start
    empty (the first poll applies the newest full checkpoint and its deltas) or loaded from any
    checkpoint of the chain (``checkpoint.load`` labels them with it).
    """

    def __init__(self, directory, tables: Mapping, *, partitioner=None):
        if not isinstance(tables, Mapping) or not tables:
            raise TypeError("tables must be a non-empty mapping name -> Table (or list of shards)")
        self.directory = _fs.normalize(directory)
        # On an object store a prefix exists only once something is saved under it, so a
        # server may start following before the trainer's first publish.
        self._remote = _objects.is_remote(self.directory)
        if not self._remote and not os.path.isdir(self.directory):
            raise FileNotFoundError(f"{self.directory}: no such checkpoint directory")
        self.tables = dict(tables)
        self._shards = [t for n, v in self.tables.items() for t in shards_of(n, v)]
        self._partitioner = partitioner
        self._cache: dict = {}   # name -> (manifest.json identity, _Listed)
        self._poll_lock = threading.Lock()
        self._thread = None
        self._stop = threading.Event()
        self.error = None        # the background thread's last error (None once a poll works)
        self.applied: list = []  # every Applied, oldest first

    # ---- one poll -----------------------------------------------------------------------------

    @property
    def held(self) -> str:
        """The manifest SHA-256 of the checkpoint the tables hold ("" for none, or when they
        disagree, e.g. after a failed apply: then only a full checkpoint applies)."""
        return _apply.held_label(self._shards)

    def poll(self) -> list:
        """Applies whatever complete checkpoints are newer than the one the tables hold; returns
        their ``Applied`` records (oldest first; empty when there is nothing new)."""
        with self._poll_lock:
            listed = self._list()
            held = self.held
            by_digest = {c.digest: c for c in listed}
            current = by_digest.get(held)
            newer = [c for c in listed if current is None or c.order > current.order]
            if not newer:
                return []
            target = max(newer, key=lambda c: c.order)
            path = self._path_to(target, held, by_digest)
            done = []
            for c in path:
                done.append(_apply.apply(c.path, self.tables, partitioner=self._partitioner))
                self.applied.append(done[-1])
            return done

    def _path_to(self, target: _Listed, held: str, by_digest: dict) -> list:
        path = [target]
        while path[-1].digest != held and path[-1].base is not None:
            if len(path) > MAX_CHAIN:
                raise CheckpointError(f"{target.path}: the chain of bases is longer than "
                                      f"{MAX_CHAIN} (a cycle?)")
            base = by_digest.get(path[-1].base)
            if base is None:
                if path[-1].base == held:
                    break
                raise CheckpointError(
                    f"{path[-1].path}: broken chain: its base (manifest SHA-256 "
                    f"{path[-1].base}) is not in {self.directory} and not the checkpoint the "
                    f"tables hold ({held or 'none'}); the tables are unchanged")
            path.append(base)
        if path[-1].digest == held:
            path.pop()
        return path[::-1]

    def _entries(self):
        """(name, path, identity) of each complete checkpoint in the directory; the identity
        changes whenever a save replaces the checkpoint of that name."""
        if self._remote:
            yield from self._remote_entries()
            return
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.directory}: the checkpoint directory is gone") from None
        for name in sorted(names):
            if name.startswith("."):  # staging (.x.tmp-*) and moved-aside (.x.old) directories
                continue
            path = os.path.join(self.directory, name)
            try:
                st = os.stat(os.path.join(path, MANIFEST))
            except (FileNotFoundError, NotADirectoryError):
                continue  # not a checkpoint, or replaced by a save right now
            yield name, path, (st.st_ino, st.st_mtime_ns, st.st_size)

    def _remote_entries(self):
        """On an object store (docs/checkpoint_format.md §6) a checkpoint is a prefix whose
        commit marker names its complete generation: one LIST of the directory and one GET of
        each marker per poll. The path is the generation itself (what the marker named when
        listed), so the checkpoint applied is the one whose manifest was read, even if a save
        to the same name publishes another generation meanwhile."""
        names = sorted(e["name"].rstrip("/").rsplit("/", 1)[-1]
                       for e in _objects.list_prefix(self.directory))
        for name in names:
            if name.startswith("."):
                continue
            try:
                root = _object_store.resolve(_objects.join(self.directory, name))
            except FileNotFoundError:
                continue  # no commit marker yet: its first save is still being written
            yield name, root, root

    def _list(self) -> list:
        out, seen = [], set()
        for name, path, ident in self._entries():
            seen.add(name)
            hit = self._cache.get(name)
            if hit is None or hit[0] != ident:
                try:
                    manifest, digest = _manifest.read_with_digest(path)
                except FileNotFoundError:
                    continue
                except CheckpointError:
                    if self._remote and not _objects.exists(_objects.join(path, MANIFEST)):
                        continue  # a newer save of this name deleted the generation just listed
                    raise
                hit = (ident, _Listed(name, path, manifest, digest, self.tables))
                self._cache[name] = hit
            out.append(hit[1])
        for name in set(self._cache) - seen:
            del self._cache[name]
        return out

    # ---- the background thread ----------------------------------------------------------------

    def start(self, interval: float = 1.0) -> "Follower":
        """Polls every ``interval`` seconds on a daemon thread until ``stop()``. An error is
        logged (logger ``dualemb.checkpoint``) and kept in ``error``; polling goes on (a later
        full checkpoint can repair a broken chain)."""
        if self._thread is not None:
            raise RuntimeError("this Follower is already started")
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        self._stop.clear()

        def run():
            while not self._stop.is_set():
                try:
                    self.poll()
                    self.error = None
                except Exception as exc:  # kept and logged: serving goes on with what it has
                    if str(exc) != str(self.error):
                        _log.error("checkpoint follower of %s: %s", self.directory, exc)
                    self.error = exc
                self._stop.wait(interval)

        self._thread = threading.Thread(target=run, name="dualemb-follower", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stops the background thread (after the apply it may be running) and waits for it."""
        t, self._thread = self._thread, None
        if t is not None:
            self._stop.set()
            t.join(timeout)
            if t.is_alive():
                raise TimeoutError(f"the follower thread did not stop within {timeout} s")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

"""checkpoint.Publisher: the trainer's side of live serving updates. It saves the tables into
one directory, each checkpoint named by its step (``step-000000001200``): a full checkpoint
first and every ``full_every`` publishes, deltas on the previous checkpoint in between. Every
save runs the ordinary commit protocol (staging under a dotted name, renamed into place once
complete), so a ``Follower`` reading the directory sees only complete checkpoints."""

from __future__ import annotations

import os
from collections.abc import Mapping

from dualemb.core.checkpoint import _fs, _objects
from dualemb.core.checkpoint._background import save


def step_name(step: int) -> str:
    """The directory name of the checkpoint of ``step`` (zero-padded: names sort by step)."""
    return f"step-{int(step):012d}"


class Publisher:
    """Publishes ``tables`` (name -> Table or list of shards, as ``checkpoint.save`` takes them)
    into ``directory``. ``full_every``: a full checkpoint every that many publishes (1: only full
    ones); a full one also follows a failed publish, since a delta needs its base published."""

    def __init__(self, directory, tables: Mapping, *, full_every: int = 10):
        if isinstance(full_every, bool) or int(full_every) != full_every or full_every < 1:
            raise ValueError(f"full_every must be an integer >= 1, got {full_every!r}")
        self.directory = _fs.normalize(directory)
        if not _objects.is_remote(self.directory):  # an object store has no directories
            os.makedirs(self.directory, exist_ok=True)
        self.tables = tables
        self.full_every = int(full_every)
        self._base = None       # the last published checkpoint's path
        self._since_full = 0
        self._pending = None    # the last background save's handle
        self._last_step = None

    def publish(self, step: int, *, dense=None, metadata=None, blocking: bool = True,
                tables: Mapping | None = None, steps=None):
        """Saves the tables at ``step`` (a delta on the last publish, or a full checkpoint)
        into ``step_name(step)``; returns the path, or with ``blocking=False`` the
        ``SaveHandle``. ``tables`` replaces the tables given at construction from now on (the
        same core tables under new handles, as a front end passes them); ``steps`` (an integer
        or name -> integer) is recorded as the tables' steps instead of ``step``."""
        if isinstance(step, bool) or int(step) != step:
            raise TypeError(f"step must be an integer, got {step!r}")
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(f"step {step} is not after the last published step "
                             f"{self._last_step}: checkpoints are named and ordered by step")
        if tables is not None:
            self.tables = tables
        if self._pending is not None and self._pending.exception() is not None:
            self._base = None  # its error was raised by exception(): start a new chain
        self._pending = None
        path = _objects.join(self.directory, step_name(step))
        full = self._base is None or self._since_full >= self.full_every
        try:
            out = save(path, self.tables, steps=int(step) if steps is None else steps,
                       dense=dense, metadata=metadata,
                       base=None if full else self._base, blocking=blocking)
        except BaseException:
            self._base = None
            raise
        self._base = path
        self._last_step = int(step)
        self._since_full = 1 if full else self._since_full + 1
        if not blocking:
            self._pending = out
            return out
        return path

"""Background (non-blocking) saves: ``checkpoint.save(..., blocking=False)`` returns a
:class:`SaveHandle` at once and writes the checkpoint on a background thread while training goes
on (docs/online_learning.md).

The state written is the state as of the call: the call takes a snapshot — ``Table.clone()`` of
every table shard (a copy in the core, taken while writers are held off), the dense arrays copied,
steps and metadata read — and the background thread runs the one writer (``_save.save``: the same
files, the same commit protocol, the same crash safety) over the copies, which it frees at the end.
The snapshot costs one copy of the tables' memory while the save runs.

Rules:
* one background save runs at a time in a process: a save (blocking or not) first waits for the
  running one, so at most one snapshot is held and saves publish in call order;
* an error in the background is raised by :meth:`SaveHandle.wait` (and returned by
  ``exception()``); if nobody asked for it, the next save raises it instead of starting, and at
  interpreter exit (which waits for a running save: the thread is not a daemon) it is logged;
* :meth:`SaveHandle.cancel` stops the save before it publishes: its staging directory is
  removed and the checkpoint at the path stays what it was.
"""

from __future__ import annotations

import atexit
import copy
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping

import numpy as np

from dualemb.core.checkpoint import _commit, _fs
from dualemb.core.checkpoint import _save as _blocking
from dualemb.core.checkpoint._manifest import CheckpointError, dumps
from dualemb.core.checkpoint._write import dense_arrays, describe, int_or_none, shards_of

__all__ = ["save", "SaveHandle", "SaveCancelled", "snapshot_tables", "start", "wait_running"]

_log = logging.getLogger("dualemb.checkpoint")

# How many steps lower than the caller's the writer's CPU priority is (Linux nice; the result is
# capped at 19), unless the environment variable DUALEMB_BACKGROUND_SAVE_NICE says otherwise (0:
# the caller's priority). The writer thread and every thread it starts (its pools inherit the
# value) run at this priority, so training keeps the cores it keeps busy and the save takes what
# is left: training runs faster during the save, the save takes longer, and on a machine whose
# other processes keep every core busy it can take much longer (docs/online_learning.md,
# "Background saves"). Blocking saves keep the caller's priority.
WRITER_NICE = 10
NICE_ENV = "DUALEMB_BACKGROUND_SAVE_NICE"


def _env_setting(name: str, default, parse, valid, expected: str):
    """The value of environment variable `name` read by `parse`, or `default` when it is unset or
    blank; a ValueError naming `expected` when it does not parse or `valid` refuses it."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = parse(raw)
    except ValueError:
        value = None
    if value is None or not valid(value):
        raise ValueError(f"{name} must be {expected}, got {raw!r}")
    return value


def writer_nice() -> int:
    """The nice steps of the writer: DUALEMB_BACKGROUND_SAVE_NICE if set (an integer >= 0), else
    WRITER_NICE."""
    return _env_setting(NICE_ENV, WRITER_NICE, int, lambda v: v >= 0,
                        "an integer >= 0 (nice steps)")


# The fraction of wall time the writer works, unless DUALEMB_BACKGROUND_SAVE_DUTY says otherwise
# (a number in (0, 1]; 1: no pauses). After each page it pauses, (1 - duty) / duty times as long as
# it worked on that page, and leaves training the memory bandwidth and the cores meanwhile: the
# copying, checksumming and writing of a page slow training down whatever the writer's CPU
# priority (docs/online_learning.md, "Background saves"). The pages' work takes 1 / duty times as
# long (not the snapshot or the flush to disk); the snapshot is taken in the call all the same,
# so what is written does not change.
# 0.15: on the idle 2-core machine (1M x 64 Adam table, docs/benchmarks.md "Online learning")
# training kept 0.70x / 0.78x of its speed during a save at 0.15, 0.59-0.70x at 0.3, 0.47-0.51x
# unpaced; the save took 7-8 s instead of 4 s.
WRITER_DUTY = 0.15
DUTY_ENV = "DUALEMB_BACKGROUND_SAVE_DUTY"


def writer_duty() -> float:
    """The writer's duty cycle: DUALEMB_BACKGROUND_SAVE_DUTY if set (a number in (0, 1]), else
    WRITER_DUTY."""
    return _env_setting(DUTY_ENV, WRITER_DUTY, float, lambda v: 0 < v <= 1,  # nan, inf fail
                        "a number in (0, 1] (the fraction of time the background save works)")


class _Pacer:
    """Keeps the writer working at most `duty` of the wall time: called before each page, it
    waits (1 - duty) / duty times the time since its last return (the previous page: its export,
    and the wait for the writes of the page before it). Once `hurry` is set (by a cancel, or by
    the next save, which waits for this one) it ends the pause and makes no more."""

    def __init__(self, duty: float, hurry: threading.Event):
        self._rest_per_work = (1.0 - duty) / duty
        self._hurry = hurry
        self._mark: float | None = None

    def __call__(self) -> None:
        if self._mark is not None and self._rest_per_work > 0 and not self._hurry.is_set():
            self._hurry.wait((time.monotonic() - self._mark) * self._rest_per_work)
        self._mark = time.monotonic()


def _lower_priority(steps: int) -> None:
    """Lowers the calling thread's CPU priority by `steps` (Linux: nice is per thread, and
    threads this one starts inherit it). Best effort: elsewhere, or if refused, nothing changes.
    The core's worker pool keeps its priority: its threads are started by the first parallel
    call of the process, which the snapshot (``Table.clone()``, on the caller's thread) has made
    by then at the latest."""
    if not sys.platform.startswith("linux") or steps <= 0:
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + steps))
    except OSError:  # pragma: no cover - e.g. a seccomp policy; the save runs as it is
        pass


class SaveCancelled(CheckpointError):
    """Raised by :meth:`SaveHandle.wait` of a save stopped by :meth:`SaveHandle.cancel`."""


class SaveHandle:
    """A save running in the background (``checkpoint.save(..., blocking=False)``).

    ``wait(timeout=None)`` blocks until it ends and raises its error (``SaveCancelled`` if it was
    cancelled; ``TimeoutError`` if ``timeout`` seconds pass first); ``done()`` says whether it
    ended; ``exception(timeout=None)`` returns its error or None; ``cancel()`` asks it to stop
    before it publishes and says whether it will (False once it is publishing or has ended);
    ``path`` is where it writes."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._cancel = False      # cancel() asked, in time
        self._committing = False  # past the last point where a cancel can stop it
        self._error: BaseException | None = None
        self._observed = False    # someone was given the outcome (wait / exception)
        # Set by cancel() and by the next save (which waits for this one, and its caller with
        # it): the writer stops pausing (_Pacer). wait() does not set it: a thread may wait
        # beside training (Orbax's commit thread does), which the pauses are for.
        self._hurry = threading.Event()

    def done(self) -> bool:
        return self._ended.is_set()

    def cancelled(self) -> bool:
        """Whether the save was (or will be) stopped by :meth:`cancel`."""
        return self._cancel

    def wait(self, timeout: float | None = None) -> None:
        error = self.exception(timeout)
        if error is not None:
            raise error

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._ended.wait(timeout):
            raise TimeoutError(f"the background save to {self.path} is still running after "
                               f"{timeout} s")
        self._observed = True
        return self._error

    def cancel(self) -> bool:
        with self._lock:
            if self._cancel:
                return True
            if self._committing or self._ended.is_set():
                return False
            self._cancel = True
            self._hurry.set()
            return True

    def __repr__(self) -> str:
        state = ("cancelled" if self._cancel else "failed" if self._error else "done") \
            if self.done() else ("cancelling" if self._cancel else "running")
        return f"SaveHandle({self.path!r}, {state})"

    # ---- the background thread's side --------------------------------------------------------
    def _stop_if_cancelled(self) -> None:
        if self._cancel:
            raise SaveCancelled(f"the background save to {self.path} was cancelled; the "
                                "checkpoint there is unchanged")

    def _hook(self, final: bool) -> None:
        """The commit protocol's checkpoint hook (``_commit.set_checkpoint_hook``)."""
        with self._lock:
            self._stop_if_cancelled()
            if final:
                self._committing = True

    def _finish(self, error: BaseException | None) -> None:
        if isinstance(error, SaveCancelled) or (error is not None and self._cancel):
            error = SaveCancelled(f"the background save to {self.path} was cancelled; the "
                                  "checkpoint there is unchanged")
            self._observed = True  # asked for: never reported as a failure
        self._error = error
        self._ended.set()


class _Snapshot:
    """A table copy whose pages are paced (``_Pacer``) and that stops the save at its next page
    once the save is cancelled (the copy is a ``Table``; every other attribute is the copy's
    own, and the copy's missing ones are missing here too)."""

    _PAGES = ("export", "export_slot_columns", "export_keys", "export_changed")

    def __init__(self, table, handle: SaveHandle, pace):
        self._table = table
        self._handle = handle
        self._pace = pace

    def __getattr__(self, name):
        attr = getattr(self._table, name)
        if name not in self._PAGES:
            return attr

        def page(*args, **kwargs):
            self._pace()
            self._handle._stop_if_cancelled()
            return attr(*args, **kwargs)
        return page


# The save running in the background (or the last one), guarded by _lock. _turn is held by the
# caller of a save from its wait for the previous save until its own has started, so two callers
# (two threads) start their saves one after the other.
_lock = threading.Lock()
_turn = threading.Lock()
_last: SaveHandle | None = None
_thread: threading.Thread | None = None


def wait_running() -> None:
    """Waits for the background save of this process, if one runs; raises the error of the
    last one if it failed and nobody was told (``wait``/``exception``), as ``CheckpointError``
    naming it. Every save calls this first."""
    with _lock:
        last, thread = _last, _thread
    if thread is not None:
        if last is not None:
            last._hurry.set()  # the caller (and its training) waits: no more pauses
        thread.join()
    if last is not None and not last._observed:
        last._observed = True
        if last._error is not None:
            raise CheckpointError(f"the background save to {last.path} failed (and was never "
                                  f"waited for): {last._error}; this save was not started") \
                from last._error


def snapshot_tables(tables: Mapping) -> dict:
    """name -> [copies of the table's shards] (``Table.clone()``: the state as of this call).
    Frees the copies already made if one fails."""
    out: dict = {}
    try:
        for name, value in tables.items():
            shards = shards_of(name, value)
            out[name] = []
            for t in shards:
                if not hasattr(t, "clone"):
                    raise TypeError(f"table {name!r}: {type(t).__name__} cannot be copied for a "
                                    "background save (it has no clone())")
                out[name].append(t.clone())
    except BaseException:
        destroy(out)
        raise
    return out


def destroy(tables: Mapping) -> None:
    for shards in tables.values():
        for t in shards:
            t.destroy()


def start(path: str, tables: Mapping, write: Callable[[dict], None]) -> SaveHandle:
    """Runs ``write(snapshots)`` on a background thread over copies of ``tables`` (name -> Table
    or list of shards) taken now, after the running background save ends. ``write`` gets name ->
    list of the copies (which stop the save at their next page once it is cancelled) and runs the
    commit protocol (a cancel stops it there too); the copies are freed when it returns. The
    front ends use this with their own writer."""
    global _last, _thread
    nice = writer_nice()  # a bad setting raises here, before anything is copied
    duty = writer_duty()
    with _turn:
        wait_running()
        # Change tracking (delta checkpoints): the live tables' save generation moves on before
        # the copies are taken, so a row written after the snapshot is "changed" for the next
        # delta (one written between this and the copy is in both: sent twice, never lost). The
        # writer marks the copies when it publishes; the live tables take that mark after it.
        live = [t for name, value in tables.items() for t in shards_of(name, value)]
        tokens = [t.changes_begin() if hasattr(t, "changes_begin") else 0 for t in live]
        copies = snapshot_tables(tables)
        flat_copies = [t for shards in copies.values() for t in shards]
        # The copies' exports run on the writer thread alone: on the core's shared pool they
        # would take its helper threads (at the caller's priority, not the writer's) from the
        # training steps that wait for them.
        for t in flat_copies:
            if hasattr(t, "set_num_threads"):
                t.set_num_threads(1)
        labels_before = [getattr(t, "changes_label", None) if token else None
                         for t, token in zip(flat_copies, tokens)]
        handle = SaveHandle(path)
        pace = _Pacer(duty, handle._hurry)  # one for all the copies: they are written in turn
        wrapped = {name: [_Snapshot(t, handle, pace) for t in shards]
                   for name, shards in copies.items()}

        def mark_live_tables():
            for t, copy_, token, before in zip(live, flat_copies, tokens, labels_before):
                after = copy_.changes_label if token else None
                # Only a writer that published and marked its copy (a new label) marks the
                # live table: an unchanged label with the new token would skip the rows
                # written between the old mark and the snapshot in the next delta.
                if token and after != before:
                    t.changes_commit(token, after)

        def run():
            error = None
            _lower_priority(nice)
            _commit.set_checkpoint_hook(handle._hook)
            try:
                handle._stop_if_cancelled()
                write(wrapped)
                mark_live_tables()
            except BaseException as e:  # noqa: BLE001 - handed to wait(), never dropped
                error = e
            finally:
                _commit.set_checkpoint_hook(None)
                try:
                    destroy(copies)
                except Exception as e:  # noqa: BLE001
                    error = error or e
                handle._finish(error)

        thread = threading.Thread(target=run, name=f"dualemb-background-save:{path}")
        try:
            thread.start()
        except BaseException:
            destroy(copies)  # no thread to free them (e.g. RuntimeError: can't start new thread)
            raise
        with _lock:
            _last, _thread = handle, thread
    return handle


def save(path, tables, *, steps=None, dense=None, metadata=None, page_rows=1 << 16,
         blocking: bool = True, **options):
    """Saves `tables` (name -> Table or list of its live shards), their optimizer `steps` (one
    integer, or name -> integer), the `dense` parameters (name -> array) and JSON `metadata` as a
    checkpoint directory at `path`, atomically replacing any checkpoint already there; tables
    are exported `page_rows` rows at a time. See docs/checkpoint_format.md.

    ``blocking=True`` (the default) writes it now and returns None. ``blocking=False`` copies the
    tables (``Table.clone()``), dense arrays, steps and metadata during the call, returns a
    :class:`SaveHandle` at once and writes that state on a background thread with the same files
    and commit protocol, at a lower CPU priority than the caller's (Linux; the environment
    variable ``DUALEMB_BACKGROUND_SAVE_NICE`` sets by how many nice steps, default 10) and
    pausing between pages so that it works only a fraction of the time
    (``DUALEMB_BACKGROUND_SAVE_DUTY``, default 0.15; see docs/online_learning.md). A bad setting
    raises ``ValueError`` before anything is copied. Either first waits for a background save still
    running in this process, and raises its error if it failed and nobody waited for it.
    ``options`` go to the writer unchanged."""
    if not isinstance(blocking, bool):
        raise TypeError(f"blocking must be True or False, got {blocking!r}")
    if blocking:
        with _turn:
            wait_running()
            _blocking.save(path, tables, steps=steps, dense=dense, metadata=metadata,
                           page_rows=page_rows, **options)
        return None
    # Everything the caller may change after this call is read or copied now; the arguments
    # are checked now as well (the writer checks them again, on the copies).
    path = _fs.normalize(path)
    if not isinstance(tables, Mapping):
        raise TypeError(f"tables must be a mapping of name -> Table, got {type(tables).__name__}")
    for name, value in tables.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"table names must be non-empty strings, got {name!r}")
        describe(name, shards_of(name, value))
    if isinstance(steps, Mapping):
        unknown = set(steps) - set(tables)
        if unknown:
            raise ValueError(f"steps given for unknown tables {sorted(unknown)}")
        steps = {name: int_or_none(name, s) for name, s in steps.items()}
    else:
        steps = {name: int_or_none(name, steps) for name in tables}
    dense = {k: np.array(a, copy=True) for k, a in dense_arrays(dense).items()} or None
    if metadata is not None:
        if not isinstance(metadata, Mapping):
            raise TypeError(f"metadata must be a JSON object (dict), got "
                            f"{type(metadata).__name__}")
        dumps({"metadata": dict(metadata)})
        metadata = copy.deepcopy(dict(metadata))

    def write(copies):
        _blocking.save(path, copies, steps=steps, dense=dense, metadata=metadata,
                       page_rows=page_rows, **options)

    return start(path, tables, write)


@atexit.register
def _report_at_exit() -> None:
    # Runs after the interpreter joined the (non-daemon) save thread.
    last = _last
    if last is not None and last.done() and not last._observed and last._error is not None:
        _log.error("dualemb: the background checkpoint save to %s failed and was never waited "
                   "for: %r", last.path, last._error)

"""The one commit protocol of every save: P writers (P = 1 for ``checkpoint.save``) write one
checkpoint, and one of them, the coordinator, publishes it (docs/checkpoint_format.md §6).

The processes coordinate only through ``sync``, which the caller passes in (as Orbax's atomicity
module takes its barrier): ``sync(tag, values) -> sums`` returns, on every writer, the
element-wise sum over all writers of their lists of non-negative integers (each below 2**31), and
returns only once every writer has called it: a barrier that also reduces. A TF job passes its
strategy's all-reduce, a JAX job ``multihost_utils.process_allgather``, one process
:func:`single_process`. ``tag`` names the step (for logs; collectives match calls by order).

1. begin: the coordinator checks the path, removes stale staging directories of dead saves and
   makes a locked staging directory (``_staging.Staging.begin``); ``sync`` hands its token to
   every writer (0: it failed) and checks that exactly one writer coordinates;
2. write: every writer calls ``write(staging) -> record`` (its files, fsynced, described with
   their checksums in the returned JSON object) and stores the record as its part record;
   ``sync`` counts the writers that succeeded;
3. publish: the coordinator reads every record, calls ``manifest(staging, records) -> dict``
   (which may write more files first, e.g. dense weights) and commits: manifest last, fsync,
   atomic rename; or removes the staging directory if any writer failed. ``sync`` tells every
   writer whether the checkpoint was published, so none returns before it exists and all raise
   if it does not (each its own error, or one naming the failure elsewhere).

What is written is the caller's: the tables' shards (``_parts.py``), or a delta checkpoint's
changed rows and tombstones (``_delta.py``), each passing its own ``write`` and ``manifest``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from dualemb.core.checkpoint._manifest import CheckpointError
from dualemb.core.checkpoint._staging import Staging

Sync = Callable[[str, Sequence[int]], Sequence[int]]

# A background save (``_background.py``) runs the protocol on its own thread and may be
# cancelled: it sets this thread's ``checkpoint`` hook, which every writer calls after writing
# its part (``final``: a writer that is not the coordinator can no longer stop the save after
# this) and the coordinator calls once more just before publishing (``final=True``). The hook
# raises to stop the save; nothing is then published. Thread-local, so saves on other threads
# (and every blocking save) run without it.
_hooks = threading.local()


def set_checkpoint_hook(hook: Callable[[bool], None] | None) -> None:
    """Sets (None: clears) this thread's hook (see above)."""
    _hooks.checkpoint = hook


def _checkpoint(final: bool) -> None:
    hook = getattr(_hooks, "checkpoint", None)
    if hook is not None:
        hook(final)


def single_process(tag: str, values: Sequence[int]) -> list:
    """``sync`` of a save with one writer."""
    return [int(v) for v in values]


def _sums(sync: Sync, tag: str, values: list) -> list:
    out = [int(v) for v in sync(tag, values)]
    if len(out) != len(values):
        raise ValueError(f"sync({tag!r}) returned {len(out)} values for {len(values)}")
    return out


def commit(path, sync: Sync, *, part: int, num_parts: int, coordinator: bool,
           write: Callable[[Staging], dict],
           manifest: Callable[[Staging, list], dict]) -> None:
    """Runs the protocol above as writer ``part`` of ``num_parts`` (every writer calls it, with
    the same ``path`` and ``num_parts``). Raises on every writer if the checkpoint was not
    published; ``path`` then still holds the previous checkpoint."""
    failure = None
    staging = None
    try:
        # 1. begin
        token = 0
        if coordinator:
            try:
                staging = Staging.begin(path)
                token = staging.token
            except Exception as e:  # noqa: BLE001 - every writer must reach the sync
                failure = e
        token, coordinators = _sums(sync, "dualemb-checkpoint-begin", [token, int(coordinator)])
        if coordinators != 1:
            raise ValueError(f"{path}: {coordinators} writers claim to coordinate one save; "
                             "exactly one must")
        if token == 0:
            raise failure or CheckpointError(f"{path}: the coordinator could not start the "
                                             "checkpoint (see its log)")

        # 2. write
        ok = 1
        try:
            mine = staging if coordinator else Staging.join(path, token)
            record = write(mine)
            _checkpoint(not coordinator)
            mine.write_record(part, record)
        except Exception as e:  # noqa: BLE001
            failure, ok = e, 0
        (written,) = _sums(sync, "dualemb-checkpoint-written", [ok])

        # 3. publish
        published = 0
        if coordinator:
            try:
                if written != num_parts:
                    raise CheckpointError(f"{path}: {num_parts - written} of {num_parts} "
                                          "writers failed to write their part; the previous "
                                          "checkpoint is kept")
                body = manifest(staging, staging.read_records(num_parts))
                _checkpoint(True)
                staging.commit(body)
                published = 1
            except Exception as e:  # noqa: BLE001
                failure = failure or e
        (published,) = _sums(sync, "dualemb-checkpoint-published", [published])
        if not published:
            raise failure or CheckpointError(f"{path}: the checkpoint was not written (see the "
                                             "coordinator's log); the previous checkpoint is "
                                             "kept")
    finally:
        if staging is not None:
            staging.abort()  # a no-op once committed

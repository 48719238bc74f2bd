"""Waiting out a worker's recovery under ``ParameterServerStrategy``, so the chief can exit.

When a worker fails, TF's ``ClusterCoordinator`` puts its closure back in the queue (another
worker runs it) and starts a recovery thread that calls ``update_server_def`` until the worker
answers again at its address. ``coordinator.join()`` returns as soon as every closure has run, which
can be while that recovery is still in progress. If the chief's Python then exits, the
coordinator's ``__del__`` waits for a lock the recovery thread holds, and that thread (a daemon)
is frozen by interpreter shutdown: the process never exits (TF 2.21; reproduced here with a
worker killed and restarted mid-training — the rows were all written, the chief hung at exit).

``wait_for_recovery(coordinator, timeout)`` after ``join()`` waits until no recovery is pending
(the worker came back and TF reconnected to it), or raises ``TimeoutError`` saying so. It reads
the coordinator's recovery flag (a ``threading.Event`` both of TF's failure handlers keep); it
changes nothing in TF.
"""

from __future__ import annotations

import time


def _recovery_event(coordinator):
    """The event TF's failure handler sets while a cluster update (worker recovery) is due."""
    cluster = getattr(coordinator, "_cluster", None)
    if cluster is None:
        raise TypeError(f"expected a tf.distribute.coordinator.ClusterCoordinator, got "
                        f"{type(coordinator).__name__}")
    handler = getattr(cluster, "failure_handler", None)
    if handler is None:  # fault tolerance off (no failure handler): nothing is ever recovered
        return None
    event = getattr(handler, "_cluster_due_for_update_or_finish", None)
    if event is None:
        # A TF whose coordinator keeps its recovery state elsewhere: refuse rather than report
        # "nothing pending" and let the chief hang at exit.
        raise RuntimeError(
            f"this TensorFlow ({type(handler).__name__}) does not expose the recovery flag "
            "dualemb.tf.distribute.wait_for_recovery reads; it needs updating for this version")
    return event


def recovery_pending(coordinator) -> bool:
    """Whether ``coordinator`` is still reconnecting to a worker that failed."""
    event = _recovery_event(coordinator)
    return bool(event is not None and event.is_set())


def wait_for_recovery(coordinator, timeout: float, poll: float = 0.2) -> None:
    """Blocks until ``coordinator`` has no worker recovery in progress.

    Call it after ``coordinator.join()`` and before the chief exits. Raises ``TimeoutError`` if a
    failed worker has not come back at its address within ``timeout`` seconds: TF then waits for
    it (up to an hour) and the process cannot exit normally; restart the worker at the same
    address, or save what you need and end the process with ``os._exit``.
    """
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0, got {timeout!r}")
    deadline = time.monotonic() + timeout
    while recovery_pending(coordinator):
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"a failed worker has not come back within {timeout} s: TensorFlow's "
                "ClusterCoordinator is still reconnecting to it and the chief cannot exit "
                "cleanly until it does (restart the worker at its address, or end the process "
                "with os._exit after saving)")
        time.sleep(poll)

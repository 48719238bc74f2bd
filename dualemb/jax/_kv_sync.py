"""The checkpoint protocol's ``sync`` for a save that runs on a background thread of a
jax.distributed job: a sum-and-barrier over the job's key-value store, not over XLA collectives.

Why not the collective the blocking save uses (``multihost_utils.process_allgather``): XLA's
collectives are matched across processes by the order in which each process launches them, and
the training loop launches its own (the sharded table's all-to-all, the model's all-reduce) on
the main thread. A background thread that launches an all-gather at the same time would be
matched, in one process, against the other process's training step: a deadlock, or a sum over
the wrong buffers. The coordination service's key-value store (``jax.distributed``'s client:
``key_value_set``, ``blocking_key_value_get``, ``wait_at_barrier``) is a separate RPC channel
that never enters an XLA program, so the save's rounds cannot interleave with training.

Each round ``r`` of save ``s`` writes this process's values under
``dualemb/checkpoint/<s>/<path digest>/<r>/<process>`` and reads every process's; the sum is the
round's result, and reading them all is the barrier. Every process must start its background
saves in the same order (as it must call any collective): the save number ``s`` is a counter
per process, the path's digest is in the key, so two processes that disagree wait on different
keys and fail after ``timeout_s`` instead of joining the wrong saves. After the last round the
processes meet at a key-value barrier and each deletes its own keys.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections.abc import Sequence

import jax

_counter = itertools.count()
_counter_lock = threading.Lock()


def _client():
    from jax._src import distributed  # the client jax.distributed.initialize made
    client = getattr(distributed.global_state, "client", None)
    if client is None:
        raise RuntimeError("a background sharded save in several processes needs "
                           "jax.distributed.initialize() (its key-value store synchronises "
                           "the save)")
    return client


class KeyValueSync:
    """One save's ``sync(tag, values) -> sums`` (see the module docstring)."""

    def __init__(self, path: str, timeout_s: float):
        self._client = _client()
        self._me = jax.process_index()
        self._n = jax.process_count()
        self._timeout_ms = int(timeout_s * 1000)
        with _counter_lock:
            number = next(_counter)
        where = hashlib.sha256(str(path).encode()).hexdigest()[:16]
        self._prefix = f"dualemb/checkpoint/{number}/{where}"
        self._round = 0
        self._mine: list = []
        self.path = path

    def __call__(self, tag: str, values: Sequence[int]) -> list:
        key = f"{self._prefix}/{self._round}"
        self._round += 1
        mine = f"{key}/{self._me}"
        self._client.key_value_set(mine, ",".join(str(int(v)) for v in values))
        self._mine.append(mine)
        total = [0] * len(values)
        for q in range(self._n):
            try:
                got = self._client.blocking_key_value_get(f"{key}/{q}", self._timeout_ms)
            except Exception as e:  # noqa: BLE001 - named with the save and the round
                raise RuntimeError(
                    f"background save to {self.path}: process {q} did not reach step {tag!r} "
                    f"within {self._timeout_ms / 1000:.0f} s (every process must start the "
                    f"same background saves in the same order): {e}") from e
            parts = [int(v) for v in got.split(",")] if got else []
            if len(parts) != len(values):
                raise RuntimeError(f"background save to {self.path}: process {q} sent "
                                   f"{len(parts)} values at step {tag!r}, this one "
                                   f"{len(values)}; the processes run different saves")
            total = [a + b for a, b in zip(total, parts)]
        return total

    def close(self) -> None:
        """After the save's last round on every process: meet, then drop this process's keys
        (no process reads them after the barrier)."""
        self._client.wait_at_barrier(f"{self._prefix}/end", self._timeout_ms)
        for key in self._mine:
            self._client.key_value_delete(key)

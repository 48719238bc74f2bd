"""Keep freed host memory in the process, for training loops that allocate big buffers each step.

XLA's CPU runtime allocates every result of a jitted step afresh (a lookup's rows, the rows'
gradients, the MLP's activations) and frees it when the step's outputs are dropped. glibc's
malloc serves big requests with ``mmap`` and gives the free top of a heap back to the OS past
its trim threshold (128 KiB by default, raised only as far as the largest ``mmap``-ed chunk
freed so far), so the next step asks the kernel for the same memory again and faults every page
of it in afresh (zero-filled). Measured on a 2-core AMD EPYC, a jitted step of 26 lookups of
4,096 keys at dim 64 (27 MB of rows): 5,400 minor page faults and 18 ms of system time per step,
more than the lookups' own 13 ms; after :func:`tune_malloc`, 800 faults and 2 ms. A whole
training step at that size also allocates its temporaries (the concatenated rows, the MLP's
activations and their gradients) as one buffer of 54.5 MB, above the largest mmap threshold
glibc allows (32 MiB): it was mapped and unmapped every step (14,000 faults, a quarter of the
step's CPU time) until ``M_MMAP_MAX`` = 0 made the heaps serve it too (the step 1.4x faster).
Served by a thread's own arena, such a buffer still went back to the OS now and then: glibc
unmaps a secondary arena's heap once all of it is free (2,800-6,900 faults per step in some
rounds of 10 steps). With one arena (``M_ARENA_MAX`` = 1) every thread allocates from the main
heap, which only shrinks past the trim threshold: 0 faults per step, and the step 10-20% faster
again (the first steps still fault a buffer's pages in now and then, 1-3 in the first 10 steps:
a step that starts while XLA's threads are still freeing the last one's buffer finds no hole
and grows the heap, which keeps that room from then on; on 2 cores; every thread then takes
the same malloc lock, which a many-core process with many small allocations may feel:
``arena_max=None`` keeps glibc's arenas).
Call it first thing in the program: a thread that already has an arena of its own keeps it.

:func:`tune_malloc` sets glibc's ``M_MMAP_THRESHOLD``, ``M_TRIM_THRESHOLD``, ``M_MMAP_MAX``
and ``M_ARENA_MAX`` (``mallopt``) so that such buffers come from, and return to, the heap. It
changes the whole process (every library's allocations; freed memory up to ``trim_threshold`` per heap stays with
the process instead of going back to the OS; with ``mmap_max=0`` even a huge buffer, once freed,
returns to the OS only from the top of a heap), so dualemb never calls it on import: the demo
and the benchmarks call it, and a training program may. The tables' own memory is not malloc's
(the core maps it itself) and still goes back to the OS when rows are erased or cleared. The
same settings can be given before the process starts:
``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=536870912 MALLOC_MMAP_MAX_=0
MALLOC_ARENA_MAX=1``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["tune_malloc"]

# glibc's malloc.h parameter numbers.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
# glibc refuses an mmap threshold above 32 MiB on 64-bit machines (HEAP_MAX_SIZE / 2).
MAX_MMAP_THRESHOLD = 32 << 20


def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 (raises AttributeError on musl and others)
    except (OSError, AttributeError):
        return None
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.mallopt.restype = ctypes.c_int
    return libc


def _check_int(name: str, v, low: int, allow_none: bool = False) -> None:
    # tune_malloc's arguments: ints in [low, 2**31) (mallopt takes a C int), or None if allowed.
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v < 2**31:
        either = "None or " if allow_none else ""
        raise ValueError(f"tune_malloc: {name} must be {either}an int in [{low}, 2**31), "
                         f"got {v!r}")


def tune_malloc(mmap_threshold: int = MAX_MMAP_THRESHOLD, trim_threshold: int = 512 << 20,
                mmap_max: int | None = 0, arena_max: int | None = 1) -> bool:
    """Sets glibc's malloc to serve requests below ``mmap_threshold`` bytes from its heaps and to
    keep up to ``trim_threshold`` bytes of free heap top instead of returning it to the OS, and
    (``mmap_max``, glibc's ``M_MMAP_MAX``: the most requests served by ``mmap`` at once) with the
    default 0 to serve larger requests from the heaps too, and (``arena_max``, ``M_ARENA_MAX``)
    with the default 1 to have every thread allocate from the main heap; ``None`` leaves glibc's
    own setting (see the module docstring for why and what it costs). Returns True when applied,
    False where the C library is not glibc (nothing changes there). Raises ValueError for a
    threshold that is not a positive int (or an mmap threshold above 32 MiB, which glibc
    refuses), an ``mmap_max`` that is not None or an int >= 0, or an ``arena_max`` that is not
    None or an int >= 1, before changing anything."""
    _check_int("mmap_threshold", mmap_threshold, 1)
    _check_int("trim_threshold", trim_threshold, 1)
    _check_int("mmap_max", mmap_max, 0, allow_none=True)
    _check_int("arena_max", arena_max, 1, allow_none=True)
    if mmap_threshold > MAX_MMAP_THRESHOLD:
        raise ValueError(f"tune_malloc: glibc refuses an mmap_threshold above "
                         f"{MAX_MMAP_THRESHOLD} bytes (32 MiB), got {mmap_threshold}")
    libc = _glibc()
    if libc is None:
        return False
    settings = [(_M_MMAP_THRESHOLD, mmap_threshold), (_M_TRIM_THRESHOLD, trim_threshold)]
    if mmap_max is not None:
        settings.append((_M_MMAP_MAX, mmap_max))
    if arena_max is not None:
        settings.append((_M_ARENA_MAX, arena_max))
    if not all(libc.mallopt(param, value) == 1 for param, value in settings):
        raise OSError("tune_malloc: glibc's mallopt refused the settings "
                      f"(mmap_threshold={mmap_threshold}, trim_threshold={trim_threshold}, "
                      f"mmap_max={mmap_max}, arena_max={arena_max})")
    return True

"""Keep freed host memory in the process, for training loops that allocate big buffers each step.

XLA's CPU runtime allocates every result of a jitted step afresh (a lookup's rows, the rows'
gradients, the MLP's activations) and frees it when the step's outputs are dropped. glibc's
malloc serves big requests with ``mmap`` and gives the free top of a heap back to the OS past
its trim threshold (128 KiB by default, raised only as far as the largest ``mmap``-ed chunk
freed so far), so the next step asks the kernel for the same memory again and faults every page
of it in afresh (zero-filled). Measured on a 2-core AMD EPYC, a jitted step of 26 lookups of
4,096 keys at dim 64 (27 MB of rows): 5,400 minor page faults and 18 ms of system time per step,
more than the lookups' own 13 ms; after :func:`tune_malloc`, 800 faults and 2 ms.

:func:`tune_malloc` sets glibc's ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` (``mallopt``) so
that such buffers come from, and return to, the heap. It changes the whole process (every
library's allocations; freed memory up to ``trim_threshold`` per heap stays with the process
instead of going back to the OS), so dualemb never calls it on import: the demo and the
benchmarks call it, and a training program may. The same settings can be given before the
process starts: ``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=536870912``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["tune_malloc"]

# glibc's malloc.h parameter numbers.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
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


def tune_malloc(mmap_threshold: int = MAX_MMAP_THRESHOLD, trim_threshold: int = 512 << 20) -> bool:
    """Sets glibc's malloc to serve requests below ``mmap_threshold`` bytes from its heaps and to
    keep up to ``trim_threshold`` bytes of free heap top instead of returning it to the OS (see
    the module docstring for why and what it costs). Returns True when applied, False where the
    C library is not glibc (nothing changes there). Raises ValueError for a threshold that is not
    a positive int (or an mmap threshold above 32 MiB, which glibc refuses)."""
    for name, v in (("mmap_threshold", mmap_threshold), ("trim_threshold", trim_threshold)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0 or v >= 2**31:
            raise ValueError(f"tune_malloc: {name} must be an int in [1, 2**31), got {v!r}")
    if mmap_threshold > MAX_MMAP_THRESHOLD:
        raise ValueError(f"tune_malloc: glibc refuses an mmap_threshold above "
                         f"{MAX_MMAP_THRESHOLD} bytes (32 MiB), got {mmap_threshold}")
    libc = _glibc()
    if libc is None:
        return False
    if libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold) != 1 or \
            libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold) != 1:
        raise OSError("tune_malloc: glibc's mallopt refused the settings "
                      f"(mmap_threshold={mmap_threshold}, trim_threshold={trim_threshold})")
    return True

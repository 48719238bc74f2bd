"""GPU tables from JAX: the table's rows in GPU memory (``libdualemb_cuda.so``), reached by the
CUDA-platform XLA FFI handlers on XLA's stream (``csrc/jax/cuda``) — no host callback, no
Python per call.

``dualemb.jax.create(..., placement="gpu")`` makes one (on a GPU backend, with a build that has
the GPU table). Such a handle is a :class:`~dualemb.jax.Table` with the static field
``placement == "gpu"``; its id names a table of the GPU registry, not of the core's. Under
``jit``/``grad``/``vmap`` it takes :func:`~dualemb.jax.lookup`, :func:`~dualemb.jax.find`,
:func:`~dualemb.jax.find_or_insert` and :func:`~dualemb.jax.apply_gradients` with a fused
optimizer; every other operation refuses it with an error naming what to use instead
(:func:`host_table` gives the ``dualemb.core._cuda.GpuTable``, whose interface is the CPU
table's, for host-side reads, restrict, and ``dualemb.core.checkpoint`` save/load).

The process keeps each GPU table's host object here, under its id, until :func:`destroy`
(``dualemb.jax.destroy`` calls it), like the core's registry keeps host tables.

Run on an H200 on 2026-11-28 (tests/gpu, docs/jax.md "GPU tables"; csrc/cuda/README.md).
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_tables: dict = {}  # id -> dualemb.core._cuda.GpuTable

GPU_OPS = ("lookup", "find", "find_or_insert", "apply_gradients")


def available() -> tuple[bool, str]:
    """(True, device) when a GPU table can be made here, else (False, the reason)."""
    import jax

    from dualemb.core import _cuda

    if jax.default_backend() != "gpu":
        return False, f"the JAX backend is {jax.default_backend()!r}, not 'gpu'"
    ok, why = _cuda.available()
    if not ok:
        return False, why
    try:
        from dualemb.jax import _ffi

        _ffi.register_cuda()
    except Exception as e:  # a build without the CUDA FFI module, or a stale one
        return False, f"the CUDA FFI handlers cannot be registered: {e}"
    return True, why


def make(dim: int, *, initializer, optimizer_spec, capacity: int, evict_policy: str):
    """A new GPU table's host object, registered under its id; raises RuntimeError naming why
    no GPU table can be made."""
    ok, why = available()
    if not ok:
        raise RuntimeError(f"placement='gpu': no GPU table can be made here: {why}")
    from dualemb.core import _cuda

    t = _cuda.GpuTable(dim, initializer=initializer, optimizer=optimizer_spec,
                       capacity=capacity, evict_policy=evict_policy)
    with _lock:
        _tables[t.id] = t
    return t


def lookup_table(table_id: int):
    """The host object of a GPU table id, or KeyError."""
    with _lock:
        t = _tables.get(int(table_id))
    if t is None:
        raise KeyError(f"unknown GPU table id {table_id}: it was destroyed, or not created in "
                       "this process")
    return t


def exists(table_id: int) -> bool:
    with _lock:
        return int(table_id) in _tables


def destroy(table_id: int) -> None:
    with _lock:
        t = _tables.pop(int(table_id), None)
    if t is not None:
        t.destroy()


def host_table(table):
    """The ``dualemb.core._cuda.GpuTable`` of a GPU table handle, after the writes it depends
    on (host-side reads, export/import, restrict, ``dualemb.core.checkpoint``)."""
    import jax

    if getattr(table, "placement", "host") != "gpu":
        raise TypeError(f"{table!r} is not a GPU table")
    # dualemb.jax.table.block, written out: table.py imports this module (no import cycle).
    jax.block_until_ready((table.version, table.step_code))
    return lookup_table(table.id)


def refuse(table, op: str) -> None:
    """Raises NotImplementedError if ``table`` is a GPU table (``op`` has no CUDA handler)."""
    if getattr(table, "placement", "host") == "gpu":
        raise NotImplementedError(
            f"dualemb.jax.{op} is not available on a GPU table yet (a GPU table takes "
            f"{', '.join(GPU_OPS)} under jit); use dualemb.jax.gpu.host_table(table) for "
            "host-side operations, or create the table with placement='host'")

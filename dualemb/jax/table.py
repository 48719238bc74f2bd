"""Table: the JAX handle of a core table — a small pytree.

Leaves (traced under jit, so one compiled function serves every table of the same kind):
``handle`` (the table's id, a runtime operand of every FFI call: :attr:`Table.id` reads it back
outside ``jit``), ``version`` (the token that orders the side-effecting calls: always use the
table a write returned), ``step`` (optimizer updates made, :attr:`Table.step`), ``opt_state`` and
``slot_tables`` (the generic Optax path's state, or an injected learning rate). Every leaf is
float32 with exact integer chunks, so a table in a pytree given to ``jax.grad`` gets zero
cotangents; a leaf changed by an optimizer's weight decay or a cast is refused by the next call
("corrupted table handle"). Static (jit's cache key): ``dim``, key and value dtype, the
optimizer, the number of companion state tables. The rows live in the core's registry under the
id, shared with ``dualemb.core`` and ``dualemb.tf``; a table lives until :func:`destroy`. Why
floats, and why no finalizer: docs/jax.md, "What the pytree holds" and "Lifetime".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dualemb.core.table import Table as CoreTable
from dualemb.jax import _chunks, _values
from dualemb.jax import optimizers as _opts
from dualemb.jax._pytree import register_table

_core = None


def _core_module():
    global _core
    if _core is None:
        from dualemb._native import load_extension
        _core = load_extension("_core")
    return _core


def _is_traced(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def _int_id(x) -> int | None:
    """x as a Python int if it is a table id (an integer), else None (a handle)."""
    if isinstance(x, bool):
        raise TypeError("a table id is an integer, got a bool")
    if isinstance(x, int):
        return x
    if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.integer) and jnp.ndim(x) == 0 \
            and not _is_traced(x):
        return int(x)
    return None


def _as_handle(x):
    """A handle leaf from a table id (int) or an existing handle (array, tracer)."""
    i = _int_id(x)
    return x if i is None else _chunks.id_to_handle(i)


@register_table  # keyed: pytree checkpointers refuse a table instead of losing its rows
class Table:
    """A dynamic embedding table as seen from JAX (see the module docstring).

    Build one with :func:`create`, :func:`attach` or :func:`dualemb.jax.load`; never mutate it —
    every write returns a new one.
    """

    __slots__ = ("handle", "dim", "key_dtype", "optimizer", "slot_tables", "version",
                 "_step", "_opt_code", "_opt_dtypes", "_id", "value_dtype", "placement")

    def __init__(self, id, dim: int, key_dtype: str, optimizer, version, step,
                 opt_state=None, slot_tables: tuple = (), value_dtype: str = "float32",
                 placement: str = "host"):
        # "host": a core table (in this process' memory or Redis); "gpu": a GPU table
        # (dualemb.jax.gpu). Static: it chooses the custom calls.
        self.placement = placement
        self.handle = _as_handle(id)
        self._id = _int_id(id)
        self.dim = int(dim)
        self.key_dtype = key_dtype
        self.value_dtype = _values.name_of(value_dtype)
        self.optimizer = optimizer
        self.slot_tables = tuple(_as_handle(t) for t in slot_tables)
        self.version = jnp.asarray(version, jnp.float32)
        self._step = _chunks.encode(step, jnp.int32)
        if opt_state is None and isinstance(optimizer, _opts.Optimizer):
            opt_state = optimizer.initial_state()  # an injected learning rate, else None
        self._set_opt_state(opt_state)

    def _set_opt_state(self, opt_state) -> None:
        if opt_state is None:
            self._opt_code, self._opt_dtypes = None, None
            return
        values = tuple(jnp.asarray(s) for s in opt_state)
        self._opt_dtypes = tuple(v.dtype.name for v in values)
        self._opt_code = tuple(_chunks.encode(v) for v in values)

    # -- pytree ------------------------------------------------------------------------------

    def tree_flatten(self):
        return ((self.handle, self.version, self._step, self._opt_code, self.slot_tables),
                (self.dim, self.key_dtype, self.optimizer, self._opt_dtypes, self.value_dtype,
                 self.placement))

    @classmethod
    def tree_unflatten(cls, aux, children):
        # Leaves may be tracers, cotangents or placeholders here: store them as they are.
        t = object.__new__(cls)
        t.handle, t.version, t._step, t._opt_code, t.slot_tables = children
        t.dim, t.key_dtype, t.optimizer, t._opt_dtypes, t.value_dtype = aux[:5]
        t.placement = aux[5] if len(aux) > 5 else "host"  # sharded.py's per-device tables
        t._id = None
        return t

    # -- fields ------------------------------------------------------------------------------

    @property
    def id(self) -> int:
        """The table's id as a Python int (outside ``jit``; inside, the id is a runtime value).

        Identity is an operand of every call, so compiled code does not depend on it."""
        if self._id is None:
            if _is_traced(self.handle):
                raise TypeError(
                    "Table.id is not known while tracing (jit, vmap, grad): the table's "
                    "identity is a runtime operand; read it outside the transformation")
            self._id = _chunks.handle_to_id(self.handle)
        return self._id

    @property
    def dtype(self):
        """The JAX dtype of the rows lookups return (the table's ``value_dtype``)."""
        return _values.jnp_dtype(self.value_dtype)

    @property
    def step(self) -> jax.Array:
        """The number of optimizer updates made (int32 scalar)."""
        return _chunks.decode(self._step, jnp.int32)

    @property
    def step_code(self):
        """The step count as the leaf carries it (float32 chunks; what the FFI call takes)."""
        return self._step

    @property
    def opt_state(self):
        """The generic path's scalar state (a tuple, in its own dtypes), or None."""
        if self._opt_code is None:
            return None
        return tuple(_chunks.decode(c, d) for c, d in zip(self._opt_code, self._opt_dtypes))

    @property
    def slot_ids(self) -> tuple:
        """The ids of the generic path's state tables (Python ints; outside ``jit``)."""
        return tuple(_chunks.handle_to_id(h) for h in self.slot_tables)

    def replace(self, **changes) -> "Table":
        """A copy with some fields changed (``id``, ``step``, ``opt_state`` and
        ``slot_tables`` are given as :func:`create` takes them: ints, int32 step, dtyped
        state)."""
        t = object.__new__(Table)
        for k in Table.__slots__:
            setattr(t, k, getattr(self, k))
        for k, v in changes.items():
            if k == "id":
                t.handle, t._id = _as_handle(v), _int_id(v)
            elif k == "step":
                t._step = _chunks.encode(v, jnp.int32)
            elif k == "opt_state":
                t._set_opt_state(v)
            elif k == "slot_tables":
                t.slot_tables = tuple(_as_handle(h) for h in v)
            elif k == "version":
                t.version = jnp.asarray(v, jnp.float32)
            elif k == "value_dtype":
                t.value_dtype = _values.name_of(v)
            elif k in ("dim", "key_dtype", "optimizer"):
                setattr(t, k, v)
            else:
                raise TypeError(f"Table.replace() got an unknown field {k!r}")
        return t

    def core(self) -> CoreTable:
        """The host-side ``dualemb.core.Table`` of this id, after every write this handle
        depends on has finished (it blocks on ``version``)."""
        from dualemb.jax import gpu
        gpu.refuse(self, "Table.core")
        block(self)
        return CoreTable.attach(self.id)

    def __repr__(self) -> str:
        who = "traced" if _is_traced(self.handle) else self.id
        dtype = "" if self.value_dtype == "float32" else f", value_dtype={self.value_dtype}"
        where = "" if self.placement == "host" else f", placement={self.placement!r}"
        return (f"Table(id={who}, dim={self.dim}, key_dtype={self.key_dtype}{dtype}, "
                f"optimizer={self.optimizer!r}{where})")


def block(table: Table) -> Table:
    """Waits until every write this table handle depends on has run; returns the table.
    A host-side read (``dualemb.core``, ``dualemb.tf``, a checkpoint) after a jitted write must
    wait like this: jitted calls run asynchronously."""
    jax.block_until_ready((table.version, table.step_code))
    return table


def check_exists(table: Table) -> None:
    """Raises KeyError if the table's id is not in this process's registry (TypeError if
    ``table`` is not a Table). Inside ``jit`` the id is a runtime value: the FFI handler makes
    the same check when the call runs, and fails the computation with the same message."""
    if not isinstance(table, Table):
        raise TypeError(f"expected a dualemb.jax.Table, got {type(table).__name__}")
    if _is_traced(table.handle):
        return
    if table.placement == "gpu":
        from dualemb.jax import gpu
        gpu.lookup_table(table.id)  # KeyError naming the id
        return
    if not _core_module().exists(table.id):
        raise KeyError(
            f"unknown table id {table.id}: it was destroyed, or not created or loaded in this "
            "process (after a restart, restore it with dualemb.jax.load or an Orbax restore "
            "first)")


def _scalar(value) -> jax.Array:
    return jnp.asarray(value, jnp.int32)


MAX_STEP = 2**31 - 2  # the count is int32 (as Optax's), and the core is given count + 1


def check_step(step) -> int:
    """A step count as a Python int, or TypeError/ValueError (before anything is built)."""
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
        raise TypeError(f"step must be an int (the number of updates made), got {step!r}")
    if not 0 <= int(step) <= MAX_STEP:
        raise ValueError(f"step must be in [0, {MAX_STEP}], got {step}")
    return int(step)


def value_dtype_of(core: CoreTable) -> str:
    """The core table's value dtype name, once it is known that JAX can hold such rows (float64
    and int64 need jax_enable_x64: TypeError otherwise)."""
    name = _values.name_of(core.value_dtype)
    _values.require_available(name)
    return name


def _optimizer(optimizer):
    """(fused Optimizer | GenericOptimizer | None) from what the user passed."""
    if optimizer is None or isinstance(optimizer, _opts.Optimizer):
        return optimizer
    from dualemb.jax.generic import GenericOptimizer
    if isinstance(optimizer, GenericOptimizer):
        return optimizer
    return GenericOptimizer.of(optimizer)  # raises TypeError for non-transformations


def canonical(core: CoreTable, opt):
    """``opt`` with the hyper-parameters as the core records them (every one, defaults
    included), so that handles made by create, attach and load compare equal."""
    if not isinstance(opt, _opts.Optimizer) or core.optimizer is None:
        return opt
    return _opts.from_spec(core.optimizer, opt.learning_rate)


def create(dim: int, *, key_dtype: str = "int64", value_dtype="float32", initializer=None,
           optimizer=None, capacity: int = 0, evict_policy: str = "recency", num_threads: int = 0,
           table_id: int = 0, name: str | None = None, backend=None,
           placement: str = "host") -> Table:
    """Creates a table in the core and returns its handle (version 0, step 0).

    Args:
      dim: row length.
      key_dtype: "int64" (default) or "int32".
      value_dtype: the rows' dtype, a name or a dtype (``jnp.float16``): "float32" (default),
        "float16", "bfloat16", "int8", "int32", and with ``jax_enable_x64`` "float64" and
        "int64" (refused without it). Lookups return rows of this dtype and writes take it
        (see :mod:`dualemb.jax._values` for conversions). Only float32, float16 and bfloat16
        tables train (half precision with float32 arithmetic in the core, rounded back);
        integer tables take "zeros", "constant" or "vector" initializers with exact values.
      initializer: what a missing key reads as and a new key starts from: a
        ``dualemb.jax.initializers`` spec, a number, or None (zeros). Initial rows are a pure
        function of (seed, key).
      optimizer: a ``dualemb.jax.optimizers`` optimizer (fused in the core), any
        ``optax.GradientTransformation`` (generic path), or None.
      capacity, evict_policy: an optional size limit; writes past it evict by "recency" or
        "frequency".
      num_threads: threads one batched call may use (0 = all cores).
      table_id: create under (or attach to) this id; 0 draws a fresh one.
      backend: where the rows live: None (this process' memory) or ``{"redis": {...}}`` (a
        Redis server; see docs/redis.md). The calls are the same either way. A Redis table
        takes a fused optimizer (its slots live in Redis with the rows); the generic Optax
        path keeps its state in memory and is refused there.
      placement: "host" (default: a core table, as above) or "gpu": the rows in GPU memory,
        trained by the CUDA XLA FFI handlers (:mod:`dualemb.jax.gpu`: int64 keys, float32
        values, a fused optimizer or none; on a GPU backend with a build that has the GPU
        table, else RuntimeError naming why). Not yet run on a GPU.
    """
    if placement not in ("host", "gpu"):
        raise ValueError(f"placement must be 'host' or 'gpu', got {placement!r}")
    if placement == "gpu":
        return _create_gpu(dim, key_dtype=key_dtype, value_dtype=value_dtype,
                           initializer=initializer, optimizer=optimizer, capacity=capacity,
                           evict_policy=evict_policy, table_id=table_id, backend=backend)
    if isinstance(table_id, bool) or not isinstance(table_id, (int, np.integer)) or \
            not 0 <= int(table_id) < 2**63:
        raise ValueError(f"table_id must be a non-negative 63-bit int (0 = a fresh id), got "
                         f"{table_id!r}")
    if key_dtype == "string":
        from dualemb.jax.ids import STRING_KEYS_MESSAGE
        raise TypeError(f"key_dtype='string': {STRING_KEYS_MESSAGE}")
    vd = _values.name_of(value_dtype)
    _values.require_available(vd)
    opt = _optimizer(optimizer)
    if opt is not None:
        _values.check_trainable(vd, "create(optimizer=...)")
    fused = opt if isinstance(opt, _opts.Optimizer) else None
    if backend not in (None, "memory") and opt is not None and fused is None:
        raise ValueError("the generic Optax path keeps optimizer state in memory tables, so it "
                         "cannot train a table with backend=" + repr(backend) + "; use a fused "
                         "optimizer (dualemb.jax.optimizers), whose slots live with the rows")
    core = CoreTable(dim, key_dtype=key_dtype, value_dtype=vd, initializer=initializer,
                     optimizer=fused.spec if fused else None, capacity=capacity,
                     evict_policy=evict_policy, num_threads=num_threads, table_id=table_id,
                     name=name, backend=backend)
    table = Table(core.id, core.dim, core.key_dtype.name, canonical(core, fused), _scalar(0),
                  _scalar(0), value_dtype=vd)
    if opt is not None and fused is None:
        try:
            table = opt.bind(table, core)
        except Exception:
            core.destroy()
            raise
    return table


def _create_gpu(dim, *, key_dtype, value_dtype, initializer, optimizer, capacity, evict_policy,
                table_id, backend) -> Table:
    """create(placement="gpu"): a GPU table (dualemb.jax.gpu) and its handle."""
    from dualemb.jax import gpu
    if key_dtype != "int64" or _values.name_of(value_dtype) != "float32":
        raise ValueError("placement='gpu' takes key_dtype='int64' and value_dtype='float32' "
                         f"(got {key_dtype!r}, {_values.name_of(value_dtype)!r})")
    if table_id or backend not in (None, "memory"):
        raise ValueError("placement='gpu' takes neither table_id nor backend (GPU tables get "
                         "their own ids, and their rows live in GPU memory)")
    opt = _optimizer(optimizer)
    if opt is not None and not isinstance(opt, _opts.Optimizer):
        raise ValueError("placement='gpu' trains with a fused optimizer "
                         "(dualemb.jax.optimizers); the generic Optax path is host-only")
    t = gpu.make(dim, initializer=initializer, optimizer_spec=opt.spec if opt else None,
                 capacity=capacity, evict_policy=evict_policy)
    if opt is not None and t.optimizer is not None:
        opt = _opts.from_spec(t.optimizer, opt.learning_rate)
    return Table(t.id, t.dim, "int64", opt, _scalar(0), _scalar(0), placement="gpu")


def attach(table_id: int, *, optimizer=None, step: int = 0, learning_rate=None) -> Table:
    """A handle on an existing core table (made by ``dualemb.core``, ``dualemb.tf`` or another
    handle in this process).

    The optimizer: ``optimizer`` if given (attached to the core table; if it differs from the
    one there, the slots are reset), else the core table's own optimizer with ``learning_rate``
    (required then, since the core does not store learning rates). ``step`` is the number of
    updates already made (the core does not store it either).
    """
    step = check_step(step)
    core = CoreTable.attach(int(table_id))
    if core.key_dtype_name == "string":
        from dualemb.jax.ids import STRING_KEYS_MESSAGE
        raise TypeError(f"table {int(table_id)} has string keys: {STRING_KEYS_MESSAGE}")
    vd = value_dtype_of(core)
    opt = _optimizer(optimizer)
    if opt is not None:
        _values.check_trainable(vd, "attach(optimizer=...)")
    if opt is None:
        spec = core.optimizer
        if spec is not None:
            if learning_rate is None:
                raise ValueError(
                    f"table {table_id} has optimizer {spec['name']!r} in the core; pass "
                    "learning_rate=... (or optimizer=...) to train it from JAX")
            opt = _opts.from_spec(spec, learning_rate)
    elif isinstance(opt, _opts.Optimizer):
        core.set_optimizer(opt.spec)
    table = Table(core.id, core.dim, core.key_dtype.name,
                  canonical(core, opt) if isinstance(opt, _opts.Optimizer) else None,
                  _scalar(0), _scalar(step), value_dtype=vd)
    if opt is not None and not isinstance(opt, _opts.Optimizer):
        table = opt.bind(table, core, step=step)
    return table


def destroy(table: Table) -> None:
    """Removes the table (and the generic path's state tables) from the core's registry, after
    the writes this handle depends on. Every copy of the handle, and every compiled function
    called with one later, then fails with "unknown table id" (never reads another table)."""
    if not isinstance(table, Table):
        raise TypeError(f"expected a dualemb.jax.Table, got {type(table).__name__}")
    block(table)
    if table.placement == "gpu":
        from dualemb.jax import gpu
        gpu.destroy(table.id)
        return
    for tid in (table.id,) + table.slot_ids:
        if _core_module().exists(int(tid)):
            _core_module().destroy(int(tid))


def evicted_total(table: Table) -> int:
    """How many keys the table's capacity limit has evicted since it was created, every write
    counted (``apply_gradients``, ``insert``, lookups that insert). Functional writes return the
    next table, not a count, so this cumulative counter is how JAX reports evictions; it is the
    same counter ``dualemb.core.Table.evicted_total`` and ``de.Variable.evicted_total()`` read.
    Waits for the writes this handle depends on."""
    if not isinstance(table, Table):
        raise TypeError(f"expected a dualemb.jax.Table, got {type(table).__name__}")
    block(table)
    check_exists(table)
    if table.placement == "gpu":
        from dualemb.jax import gpu
        return int(gpu.lookup_table(table.id).evicted_total)
    return int(_core_module().evicted_total(int(table.id)))


def capture_evicted(table: Table, enabled: bool = True, *, rows: bool = False) -> None:
    """From now on keeps the keys (with ``rows=True`` also the values and optimizer slots) that
    the table's capacity limit evicts or a restrict removes, for :func:`take_evicted`: JAX writes
    return the next table, not the evicted keys, so they are collected in the core until taken.
    Each call drops what was kept; ``enabled=False`` stops. Int keys, numeric values only."""
    if not isinstance(table, Table):
        raise TypeError(f"expected a dualemb.jax.Table, got {type(table).__name__}")
    table.core().capture_evicted(enabled, rows=rows)


def take_evicted(table: Table) -> dict:
    """The rows evicted since :func:`capture_evicted` or the last take, oldest first, as numpy
    arrays: ``keys``, ``last_update``, ``update_count`` (and ``values``, ``slots`` when capturing
    rows); they are forgotten. Waits for the writes this handle depends on."""
    if not isinstance(table, Table):
        raise TypeError(f"expected a dualemb.jax.Table, got {type(table).__name__}")
    return table.core().take_evicted()

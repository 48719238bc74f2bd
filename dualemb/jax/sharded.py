"""dualemb.jax.sharded: a table sharded along one axis of a device mesh, ids routed by all-to-all.

A :class:`ShardedTable` is one core table per device of the mesh axis (each process creates the
shards of its own addressable devices). Device ``d`` owns the ids with
``dualemb.core.routing.shard_of(id, N) == d`` — the rule the common checkpoint, ``dualemb.tf``
and the TFRA importers use, so a checkpoint of N shards reloads anywhere. The pytree's leaves
are the shards' handles (float32[N, 4]) and version tokens (float32[N]), both sharded over the
axis so that every device's program receives its own table, plus the step count (replicated).

Inside ``jax.jit`` (ids and gradients sharded along their first axis over the mesh axis),
:func:`lookup` and :func:`apply_gradients` run under ``jax.shard_map``. Per device:

1. deduplicate the local ids (``dualemb_unique``), find each distinct id's owner;
2. place them in an exchange buffer ``[N, capacity_per_shard]`` (row ``e``: the ids for shard
   ``e``) and ``jax.lax.all_to_all`` it, so each device receives the ids it owns;
3. the owner runs the single-device FFI call on its own table (find, or the fused optimizer on
   the first ``count`` received (id, summed gradient) pairs), and for a lookup the rows travel
   back by the inverse all-to-all.

Capacity: the buffer's width ``capacity_per_shard`` is static (XLA needs fixed shapes). The
default, the local batch size (ids per device), can never overflow. A smaller value trades
memory and bytes exchanged for a risk: if one device's batch holds more distinct ids for one
shard than fit, the step fails on every device, before the exchange and before any write, with
an error naming ``capacity_per_shard`` — ids are never dropped. Size it from the batch's
distinct ids per shard (about ``unique_ids_per_device / N`` for well-spread ids) with margin;
see docs/scaling_jax.md.

Gradients of duplicate ids are summed on the sending device, then the owner sums what the
devices sent (in device order), so the float32 sums can associate differently from the
single-device table's left-to-right sum: bit-identical when no device's local batch repeats an
id, within float32 rounding otherwise.

Limits: fused optimizers only (the generic Optax path keeps per-table state tables); the mesh
axis must span every device of the mesh (other axes of size 1); in several processes, pass ids
as global ``jax.Array`` s (e.g. ``jax.make_array_from_process_local_data``).
"""

from __future__ import annotations

import functools
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from dualemb.core.routing import shard_of
from dualemb.jax import _chunks, _ffi, _values
from dualemb.jax import optimizers as _opts
from dualemb.jax.ids import Ids, key_operand
from dualemb.jax.table import Table, check_step, create as _create_one

_F32 = jnp.float32


@jax.tree_util.register_pytree_node_class
class ShardedTable:
    """A table sharded over ``mesh`` axis ``axis`` (see the module docstring). Build it with
    :func:`create` (or :func:`dualemb.jax.sharded.load`); every write returns a new one."""

    __slots__ = ("handles", "versions", "step_code", "mesh", "axis", "dim", "key_dtype",
                 "optimizer", "capacity_per_shard", "value_dtype")

    def tree_flatten(self):
        return ((self.handles, self.versions, self.step_code),
                (self.mesh, self.axis, self.dim, self.key_dtype, self.optimizer,
                 self.capacity_per_shard, self.value_dtype))

    @classmethod
    def tree_unflatten(cls, aux, children):
        t = object.__new__(cls)
        t.handles, t.versions, t.step_code = children
        (t.mesh, t.axis, t.dim, t.key_dtype, t.optimizer, t.capacity_per_shard,
         t.value_dtype) = aux
        return t

    @property
    def dtype(self):
        """The JAX dtype of the rows lookups return (the shards' ``value_dtype``)."""
        return _values.jnp_dtype(self.value_dtype)

    @property
    def num_shards(self) -> int:
        return int(self.mesh.shape[self.axis])

    @property
    def step(self) -> jax.Array:
        """The number of optimizer updates made (int32 scalar, replicated)."""
        return _chunks.decode(self.step_code, jnp.int32)

    def replace(self, **changes) -> "ShardedTable":
        t = object.__new__(ShardedTable)
        for k in ShardedTable.__slots__:
            setattr(t, k, changes.pop(k, getattr(self, k)))
        if changes:
            raise TypeError(f"ShardedTable.replace() got unknown fields {sorted(changes)}")
        return t

    def local_tables(self) -> dict[int, Table]:
        """``{shard index: single-device Table}`` for the shards this process holds (outside
        ``jit``; waits for pending writes). Use them with the host APIs (``core()``, save)."""
        jax.block_until_ready((self.handles, self.versions, self.step_code))
        step = int(np.asarray(jax.device_get(_local_replica(self.step))))
        versions = {_shard_index(s): s.data for s in self.versions.addressable_shards}
        out = {}
        for s in self.handles.addressable_shards:
            d = _shard_index(s)
            tid = _chunks.handle_to_id(np.asarray(s.data).reshape(4))
            out[d] = Table(tid, self.dim, self.key_dtype, self.optimizer,
                           np.asarray(versions[d]).reshape(()), step,
                           value_dtype=self.value_dtype)
        return out

    def __repr__(self) -> str:
        return (f"ShardedTable(shards={self.num_shards} over axis {self.axis!r}, dim={self.dim},"
                f" key_dtype={self.key_dtype}, value_dtype={self.value_dtype}, "
                f"optimizer={self.optimizer!r}, "
                f"capacity_per_shard={self.capacity_per_shard})")


def _local_replica(x: jax.Array):
    """This process's copy of a replicated array (readable in any process)."""
    return x.addressable_shards[0].data if isinstance(x, jax.Array) else x


def _shard_index(shard) -> int:
    start = shard.index[0].start
    return 0 if start is None else int(start)


def _check_mesh(mesh: Mesh, axis) -> str:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if axis is None:
        if len(mesh.axis_names) != 1:
            raise ValueError(f"the mesh has axes {mesh.axis_names}: pass axis=...")
        axis = mesh.axis_names[0]
    if axis not in mesh.axis_names:
        raise ValueError(f"axis {axis!r} is not an axis of the mesh {mesh.axis_names}")
    if mesh.devices.size != mesh.shape[axis]:
        raise ValueError(
            f"the table's axis {axis!r} ({mesh.shape[axis]} devices) must span the whole mesh "
            f"({mesh.devices.size} devices): other axes would hold duplicate shards")
    return axis


def _check_capacity(capacity_per_shard):
    if capacity_per_shard is None:
        return None
    if isinstance(capacity_per_shard, bool) or not isinstance(capacity_per_shard,
                                                              (int, np.integer)) \
            or not 1 <= capacity_per_shard < 2**31:
        raise ValueError(f"capacity_per_shard must be a positive int (or None: the local batch "
                         f"size, which never overflows), got {capacity_per_shard!r}")
    return int(capacity_per_shard)


def _from_shards(mesh: Mesh, axis: str, ids_of_shard, dim, key_dtype, optimizer, step: int,
                 capacity_per_shard, value_dtype: str = "float32") -> ShardedTable:
    """A ShardedTable whose shard d (for this process's devices) is the core table
    ``ids_of_shard(d)``."""
    n = int(mesh.shape[axis])
    sharded = NamedSharding(mesh, P(axis))
    handles = jax.make_array_from_callback(
        (n, 4), sharded,
        lambda idx: np.asarray(_chunks.id_to_handle(ids_of_shard(idx[0].start or 0)))[None])
    versions = jax.make_array_from_callback((n,), sharded, lambda idx: np.zeros(1, np.float32))
    code = np.asarray(_chunks.encode(jnp.asarray(check_step(step), jnp.int32), jnp.int32))
    step_code = jax.make_array_from_callback(code.shape, NamedSharding(mesh, P()),
                                             lambda idx: code[idx])
    t = object.__new__(ShardedTable)
    t.handles, t.versions, t.step_code = handles, versions, step_code
    t.mesh, t.axis, t.dim, t.key_dtype = mesh, axis, int(dim), key_dtype
    t.optimizer, t.capacity_per_shard = optimizer, _check_capacity(capacity_per_shard)
    t.value_dtype = _values.name_of(value_dtype)
    return t


def create(mesh: Mesh, dim: int, *, axis: str | None = None, capacity_per_shard: int | None = None,
           key_dtype: str = "int64", value_dtype="float32", initializer=None, optimizer=None,
           **kwargs) -> ShardedTable:
    """Creates a table sharded over ``mesh``'s ``axis``: this process creates the core tables
    of its addressable devices. Arguments as :func:`dualemb.jax.create` (``optimizer`` must be
    a fused ``dualemb.jax.optimizers`` one; initial rows are a function of (seed, id), so they
    do not depend on the shard count), plus ``capacity_per_shard`` (see the module docstring;
    None = the local batch size, which never overflows). ``value_dtype`` as
    :func:`dualemb.jax.create`: lookups return rows of it (they cross the all-to-all in it),
    float16/bfloat16 shards train with float32 gradients."""
    axis = _check_mesh(mesh, axis)
    value_dtype = _values.name_of(value_dtype)
    _values.require_available(value_dtype)
    if optimizer is not None:
        _values.check_trainable(value_dtype, "sharded.create(optimizer=...)")
    if optimizer is not None and not isinstance(optimizer, _opts.Optimizer):
        raise TypeError("a sharded table needs a fused optimizer from dualemb.jax.optimizers "
                        f"(the generic Optax path is single-device), got {optimizer!r}")
    capacity_per_shard = _check_capacity(capacity_per_shard)
    made: dict[int, Table] = {}

    def shard(d: int) -> int:
        if d not in made:
            made[d] = _create_one(dim, key_dtype=key_dtype, value_dtype=value_dtype,
                                  initializer=initializer, optimizer=optimizer, **kwargs)
        return made[d].id

    try:
        t = _from_shards(mesh, axis, shard, dim, key_dtype, None, 0, capacity_per_shard,
                         value_dtype)
    except BaseException:
        from dualemb.jax.table import destroy
        for m in made.values():
            destroy(m)
        raise
    any_table = next(iter(made.values()))
    return t.replace(optimizer=any_table.optimizer, key_dtype=any_table.key_dtype)


def destroy(table: ShardedTable) -> None:
    """Removes this process's shards from the core's registry."""
    from dualemb.jax.table import destroy as destroy_one
    for t in table.local_tables().values():
        destroy_one(t)


# ---- the per-device program ----------------------------------------------------------------

def _local_table(table: ShardedTable, handle, version, step_code) -> Table:
    return Table.tree_unflatten((table.dim, table.key_dtype, table.optimizer, None,
                                 table.value_dtype),
                                (handle.reshape(4), version.reshape(()), step_code, None, ()))


class _Route:
    """Where each of one device's distinct ids goes: built once per call, used both ways."""

    def __init__(self, keys, n: int, capacity: int, axis: str):
        pairs = keys.dtype == jnp.uint32
        b = keys.shape[0]
        uniq, self.inverse, count = _ffi.unique(keys, b)
        owner = shard_of(Ids(uniq) if pairs else uniq, n).astype(jnp.int32)
        valid = jnp.arange(b, dtype=jnp.int32) < count
        self.dest = jnp.where(valid, owner, n)  # n: padding, dropped by the scatters below
        onehot = (self.dest[:, None] == jnp.arange(n, dtype=jnp.int32)[None, :]).astype(jnp.int32)
        self.counts = onehot.sum(axis=0)  # distinct ids per destination
        self.pos = jnp.take_along_axis(jnp.cumsum(onehot, axis=0) - 1,
                                       jnp.minimum(self.dest, n - 1)[:, None], axis=1)[:, 0]
        # Every device checks the largest count of the whole axis, so that all fail together
        # before any enters the all-to-all (one failing alone would leave the others waiting).
        needed = jax.lax.pmax(self.counts.max(), axis)
        send = jnp.zeros((n, capacity) + keys.shape[1:], keys.dtype)
        send = send.at[self.dest, self.pos].set(uniq, mode="drop")
        self.send_keys = _ffi.exchange_check(needed, capacity, send)
        self.n, self.capacity, self.axis = n, capacity, axis

    def scatter(self, rows_per_distinct):
        """[distinct, ...] -> the exchange buffer [n, capacity, ...]."""
        buf = jnp.zeros((self.n, self.capacity) + rows_per_distinct.shape[1:],
                        rows_per_distinct.dtype)
        return buf.at[self.dest, self.pos].set(rows_per_distinct, mode="drop")

    def gather(self, buf):
        """The exchange buffer [n, capacity, ...] -> [distinct, ...] (padding reads garbage)."""
        return buf[jnp.minimum(self.dest, self.n - 1), jnp.minimum(self.pos, self.capacity - 1)]

    def exchange(self, buf):
        """Row e of every device's buffer goes to device e (which receives one row per sender,
        in device order)."""
        return jax.lax.all_to_all(buf, self.axis, 0, 0)


def _flat(keys, shape):
    return keys.reshape((-1,) + keys.shape[len(shape):])


def _capacity(table: ShardedTable, local_batch: int) -> int:
    c = table.capacity_per_shard
    return local_batch if c is None else c


def _local_lookup(table: ShardedTable, handle, version, step_code, keys, shape):
    t = _local_table(table, handle, version, step_code)
    flat = _flat(keys, shape)
    b = flat.shape[0]
    route = _Route(flat, table.num_shards, _capacity(table, b), table.axis)
    received = route.exchange(route.send_keys)  # [n, capacity, ...]: ids this device owns
    owned = _flat(received, (table.num_shards, route.capacity))
    rows, _ = _ffi.find(t.handle, t.dim, t.version, owned, (owned.shape[0],), with_exists=False,
                        dtype=t.dtype)
    back = route.exchange(rows.reshape(table.num_shards, route.capacity, t.dim))
    return route.gather(back)[route.inverse].reshape(tuple(shape) + (t.dim,))


def _local_apply(table: ShardedTable, handle, version, step_code, keys, grads, shape):
    t = _local_table(table, handle, version, step_code)
    flat = _flat(keys, shape)
    b = flat.shape[0]
    n = table.num_shards
    route = _Route(flat, n, _capacity(table, b), table.axis)
    summed = jax.ops.segment_sum(grads.reshape(b, t.dim), route.inverse, num_segments=b)
    recv_keys = route.exchange(route.send_keys)
    recv_grads = route.exchange(route.scatter(summed))
    recv_counts = route.exchange(route.counts.reshape(n, 1)).reshape(n)
    valid = (jnp.arange(route.capacity)[None, :] < recv_counts[:, None]).reshape(-1)
    # Received pairs first, in sender order (a stable sort), padding after: the owner's core
    # then sums a repeated id's gradients in device order.
    order = jnp.argsort(~valid, stable=True)
    owned = _flat(recv_keys, (n, route.capacity))[order]
    g = recv_grads.reshape(n * route.capacity, t.dim)[order]
    lr = t.optimizer.learning_rate_at(t.step)
    new_version = _ffi.apply_gradients_first(t.handle, t.version, owned, g, lr, t.step_code,
                                             valid.sum(dtype=jnp.int32))
    return new_version.reshape(1)


# ---- the global API -------------------------------------------------------------------------

def _keys_of(table: ShardedTable, ids):
    if not isinstance(table, ShardedTable):
        raise TypeError(f"expected a dualemb.jax.sharded.ShardedTable, got "
                        f"{type(table).__name__}")
    _values.require_available(table.value_dtype)
    keys, shape = key_operand(ids, table.key_dtype)
    shape = tuple(shape)
    n = table.num_shards
    if len(shape) == 0 or shape[0] % n or shape[0] == 0:
        raise ValueError(f"ids have shape {shape}: their first axis is split over the "
                         f"{n} shards of axis {table.axis!r}, so it must be a positive "
                         f"multiple of {n}")
    return keys, shape


def _spec_of(table: ShardedTable):
    return P(table.axis)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _lookup(table: ShardedTable, keys, shape: tuple):
    n = table.num_shards
    local_shape = (shape[0] // n,) + shape[1:]
    ax = _spec_of(table)
    body = functools.partial(_local_lookup, table, shape=local_shape)
    return jax.shard_map(
        lambda h, v, s, k: body(h, v, s, k), mesh=table.mesh,
        in_specs=(ax, ax, P(), ax), out_specs=ax, check_vma=False)(
        table.handles, table.versions, table.step_code, keys)


def _lookup_fwd(table, keys, shape):
    return _lookup(table, keys, shape), None


def _lookup_bwd(shape, _, g):
    return None, None  # the table and the ids get no cotangent (as dualemb.jax.lookup)


_lookup.defvjp(_lookup_fwd, _lookup_bwd)


def lookup(table: ShardedTable, ids) -> jax.Array:
    """Rows of ``ids`` (``ids.shape + (dim,)``, sharded like the ids along their first axis),
    read from the owning shards; the table is not changed. Differentiable like
    :func:`dualemb.jax.lookup` (take ``jax.grad`` with respect to the rows)."""
    keys, shape = _keys_of(table, ids)
    return _lookup(table, keys, shape)


def apply_gradients(table: ShardedTable, ids, grads) -> ShardedTable:
    """One fused optimizer step on the rows of ``ids`` (per-position ``grads``,
    ``ids.shape + (dim,)``), each on its owning shard; returns the next table (``step + 1``).
    Gradients of repeated ids are summed (see the module docstring for the order)."""
    keys, shape = _keys_of(table, ids)
    _values.check_trainable(table.value_dtype, "sharded.apply_gradients")
    if table.optimizer is None:
        raise ValueError(f"{table!r} has no optimizer: create it with optimizer=...")
    want = shape + (table.dim,)
    if tuple(jnp.shape(grads)) != want:
        raise ValueError(f"gradients have shape {tuple(jnp.shape(grads))}, expected "
                         f"ids.shape + (dim,) = {want}")
    if not jnp.issubdtype(grads.dtype, jnp.floating):
        raise TypeError(f"gradients must be floating point, got dtype {grads.dtype}")
    n = table.num_shards
    local_shape = (shape[0] // n,) + shape[1:]
    ax = _spec_of(table)
    body = functools.partial(_local_apply, table, shape=local_shape)
    versions = jax.shard_map(
        lambda h, v, s, k, g: body(h, v, s, k, g), mesh=table.mesh,
        in_specs=(ax, ax, P(), ax, ax), out_specs=ax, check_vma=False)(
        table.handles, table.versions, table.step_code, keys, jnp.asarray(grads, _F32))
    return table.replace(versions=versions,
                         step_code=_chunks.encode(table.step + 1, jnp.int32))


def exchange_bytes(table: ShardedTable, local_batch: int) -> dict[str, int]:
    """Bytes one device sends per :func:`lookup` and per :func:`apply_gradients` for a local
    batch of ``local_batch`` ids (the buffers are fixed-size, so this is exact; a device's
    row for itself is counted too, though it does not cross a link)."""
    n, c = table.num_shards, _capacity(table, int(local_batch))
    key_bytes = 4 if table.key_dtype == "int32" else 8
    ids = n * c * key_bytes
    rows = n * c * table.dim * table.dtype.itemsize
    return {"lookup": ids + rows, "apply_gradients": ids + rows + n * 4}



# ---- a replicated (unsharded) table in a sharded step -----------------------------------------

def apply_gradients_replicated(table: Table, ids, grads, *, mesh: Mesh,
                               axis: str | None = None) -> Table:
    """:func:`dualemb.jax.apply_gradients` on a single-device (replicated) ``table`` whose
    ``ids`` and ``grads`` are sharded over ``mesh``'s ``axis`` (one process).

    ``jax.jit(dej.apply_gradients)`` on sharded inputs fails inside XLA ("Side-effect HLO must
    have sharding"): the partitioner cannot place a write to one table. Here the write runs once,
    on the axis' first device, on the whole batch gathered in order (so the result equals the
    single-device step on the global batch), and the next version token is broadcast to every
    device, so later reads on any device wait for it. Reads (:func:`dualemb.jax.lookup`) of a
    replicated table work on sharded ids as they are.
    """
    axis = _check_mesh(mesh, axis)
    if jax.process_count() > 1:
        raise NotImplementedError(
            "a replicated table is one process's table: with several processes, use a "
            "sharded table (dualemb.jax.sharded.create)")
    from dualemb.jax.train import apply_gradients as apply_one
    keys, shape = key_operand(ids, table.key_dtype)
    ax = P(axis)

    def body(t, k, g):
        k = jax.lax.all_gather(k, axis, axis=0, tiled=True)
        g = jax.lax.all_gather(g, axis, axis=0, tiled=True)
        first = jax.lax.axis_index(axis) == 0
        key_arg = Ids(k) if k.dtype == jnp.uint32 else k
        new = jax.lax.cond(first, lambda: apply_one(t, key_arg, g).version,
                           lambda: t.version)
        version = jax.lax.psum(jnp.where(first, new, jnp.zeros_like(new)), axis)
        return version

    version = jax.shard_map(body, mesh=mesh, in_specs=(P(), ax, ax), out_specs=P(),
                            check_vma=False)(table, keys, jnp.asarray(grads, _F32))
    return table.replace(version=version, step=table.step + 1)


def save(table: ShardedTable, path, *, name: str = "table", page_rows: int = 1 << 16,
         base=None, blocking: bool = True, sync_timeout_s: float = 1800.0):
    """Saves the table as ONE checkpoint in the common format (every process calls it, in the
    same order: each writes its shards, process 0 the manifest). ``base``: a delta on that
    checkpoint (the rows written since, and tombstones; the table was last saved to or loaded
    from it). ``blocking=False``: copies this process's shards now and writes them in the
    background; returns a ``dualemb.core.checkpoint.SaveHandle`` (``wait()``, ``cancel()``).
    See :mod:`dualemb.jax._sharded_checkpoint`."""
    from dualemb.jax import _sharded_checkpoint
    return _sharded_checkpoint.save(table, path, name=name, page_rows=page_rows, base=base,
                                    blocking=blocking, sync_timeout_s=sync_timeout_s)


def load(path, mesh: Mesh, *, name: str | None = None, axis: str | None = None,
         capacity_per_shard: int | None = None, optimizer=None,
         learning_rate=None) -> ShardedTable:
    """Loads a checkpoint (from any number of processes or shards, or from ``dualemb.tf``) as a
    table sharded over ``mesh`` (every process calls it), slots and step included."""
    from dualemb.jax import _sharded_checkpoint
    axis = _check_mesh(mesh, axis)

    def build(shard_id_of, dim, key_dtype, opt, step, value_dtype="float32"):
        return _from_shards(mesh, axis, shard_id_of, dim, key_dtype, opt, step,
                            capacity_per_shard, value_dtype)
    return _sharded_checkpoint.load(path, mesh, axis, build, name=name, optimizer=optimizer,
                                    learning_rate=learning_rate)

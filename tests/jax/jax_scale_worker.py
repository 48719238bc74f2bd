"""Worker of the JAX scale-out tests (tests/jax/test_jax_sharded.py, tests/jax/test_jax_multiprocess.py):
trains a small model (an embedding table summed per example, a fixed linear head, squared
error) on deterministic global batches, and writes this process's table state to an .npz.

Run as ``python tests/jax/jax_scale_worker.py --out F [--processes P --process-id i --port N]
[--reference] ...``; XLA_FLAGS (the device count) must be set by the caller. A reference run
(``--reference``) trains one single-device table on the same global batches. With
``--unique-per-device``, WORKER_DRAW=K draws batches with no id repeated within each K-th of
the batch (default: the device count; 1 = no repeat in the whole batch).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

DIM = 4
BAG = 3  # ids per example


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--process-id", type=int, default=0)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--start-step", type=int, default=0, help="first batch index (continuation)")
    p.add_argument("--batch", type=int, default=16, help="global examples per step")
    p.add_argument("--unique-per-device", action="store_true",
                   help="no id repeats within one device's batch (exact summation order)")
    p.add_argument("--reference", action="store_true")
    p.add_argument("--capacity", type=int, default=0)
    p.add_argument("--save", default="")
    p.add_argument("--load", default="")
    p.add_argument("--die-after-init", action="store_true")
    p.add_argument("--hold-save", default="",
                   help="process 0 stops in the save once every shard file is written (before "
                        "the manifest), creates this file and waits to be killed")
    p.add_argument("--callback", action="store_true", help="force the host-callback path")
    p.add_argument("--online", default="",
                   help="after the run (its state written), continue online into this "
                        "directory: a full base save, 5 deltas (erases, capacity evictions, "
                        "restricts between them; the third in the background while training "
                        "goes on) and a full save at the last step; see online()")
    p.add_argument("--table-capacity", type=int, default=0, help="rows per shard (0: none)")
    return p.parse_args()


def batches(args, num_devices):
    import numpy as np
    for s in range(args.start_step, args.start_step + args.steps):
        rng = np.random.default_rng(1000 + s)
        n = args.batch * BAG
        if args.unique_per_device:
            per = n // num_devices
            ids = np.concatenate([rng.choice(200, per, replace=False) for _ in range(num_devices)])
        else:
            ids = rng.integers(0, 60, n)
        ids = (ids.astype(np.int64) - 100) * (2**33 + 1)  # negative and above 2**32 too
        y = rng.normal(size=(args.batch,)).astype(np.float32)
        yield ids.reshape(args.batch, BAG), y


def export_state(tables, path):
    """Every row of this process's shards (all export fields) into the .npz `path`."""
    import numpy as np
    pages = [t.core().export() for _, t in sorted(tables.items())]
    np.savez(path, **{f: np.concatenate([p[f] for p in pages]) for f in pages[0]})


def online(args, table, train, n):
    """Online learning into args.online (tests/jax/test_jax_multiprocess.py checks it): a full
    base save, then five deltas, each on the last, with the table changed between them by
    training, erases, capacity evictions (batches over more ids than the capacity holds) and
    restricts; the third delta is saved in the background while two more steps train (its write
    is held until they ran, so it must hold the state of its call); a full save at the end, at
    the step of the last delta. Writes bg-state<i>.npz (the state at the background call) and
    final-state<i>.npz (the state at the end). Then a background save that fails in process 1,
never waited for, and the next save (after-failure<i>.txt: what it did)."""
    import threading

    import numpy as np
    from dualemb.core.checkpoint import _parts_delta
    from dualemb.core.routing import shard_of
    from dualemb.jax import sharded

    d = args.online
    me = args.process_id
    path = lambda name: os.path.join(d, name)  # noqa: E731
    step = args.start_step + args.steps

    def steps(k, hi):
        nonlocal table, step
        for _ in range(k):
            table = train(table, hi, step)
            step += 1

    def erase(ids):
        ids = (np.asarray(ids, np.int64) - 100) * (2**33 + 1)  # as batches() makes ids
        for s, t in table.local_tables().items():
            t.core().erase(ids[shard_of(ids, n) == s])

    def restrict(rows):
        for t in table.local_tables().values():
            t.core().restrict(rows, by="recency")

    sharded.save(table, path("base"))
    steps(2, 60)
    erase([0, 1, 2, 3, 4, 5])
    sharded.save(table, path("d1"), base=path("base"))
    steps(2, 140)  # more distinct ids than the capacity: evictions
    sharded.save(table, path("d2"), base=path("d1"))
    steps(1, 60)
    restrict(20)
    # The background delta: its shard files wait until two more steps trained.
    trained = threading.Event()
    write_shard = _parts_delta.write_shard

    def held(*a, **k):
        if not trained.wait(120):
            raise RuntimeError("the held background save was never released")
        return write_shard(*a, **k)

    _parts_delta.write_shard = held
    try:
        handle = sharded.save(table, path("d3"), base=path("d2"), blocking=False)
        export_state(table.local_tables(), path(f"bg-state{me}.npz"))
        steps(2, 60)
        if handle.done():
            handle.wait()  # its error, if it failed
            raise AssertionError("the background save ended before its write was released")
        trained.set()
        handle.wait(300)
    finally:
        _parts_delta.write_shard = write_shard
    erase([6, 7, 8, 9])
    steps(1, 100)
    sharded.save(table, path("d4"), base=path("d3"))
    restrict(25)
    steps(1, 60)
    sharded.save(table, path("d5"), base=path("d4"))
    sharded.save(table, path("full"))
    export_state(table.local_tables(), path(f"final-state{me}.npz"))
    with open(path(f"steps{me}.txt"), "w") as f:
        f.write(str(step))
    # A background save that fails in process 1 and that nobody waits for: the next save raises
    # its error on every process (inside the protocol: no process is left at a barrier).
    from dualemb.core.checkpoint import CheckpointError

    def broken(*a, **k):
        raise OSError("injected write failure")

    if me == 1:
        _parts_delta.write_shard = broken
    try:
        sharded.save(table, path("bad"), base=path("full"), blocking=False)
        try:
            sharded.save(table, path("after-failure"))
            outcome = "saved"
        except CheckpointError as e:
            outcome = f"raised: {e}"
    finally:
        _parts_delta.write_shard = write_shard
    with open(path(f"after-failure{me}.txt"), "w") as f:
        f.write(outcome)


def hold_before_manifest(marker: str) -> None:
    """Makes this process's next checkpoint save stop where a crash leaves only shard files: the
    coordinator writes the manifest after every process wrote its shards; instead it says so
    (creates `marker`) and waits for the test's SIGKILL. Set before the checkpoint modules bind
    the function (dualemb.jax imports the sharded checkpoint code on first use)."""
    from dualemb.core.checkpoint import _manifest

    def hold(directory, manifest, write_file):
        with open(marker + ".tmp", "w") as f:
            f.write(directory)
        os.rename(marker + ".tmp", marker)
        time.sleep(600)
        os._exit(4)  # never reached in the test: it kills this process

    _manifest.write_files = hold


def main():
    args = parse()
    if args.callback:  # read when dualemb.jax is imported (dualemb/jax/_ffi.py)
        os.environ["DUALEMB_JAX_HOST_CALLBACK"] = "1"
    import jax
    if args.processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}",
                                   num_processes=args.processes, process_id=args.process_id,
                                   initialization_timeout=60, heartbeat_timeout_seconds=10,
                                   shutdown_timeout_seconds=10)
        if args.die_after_init and args.process_id == args.processes - 1:
            os._exit(3)  # a crash: no goodbye to the coordinator
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import dualemb.jax as dej
    from dualemb.core.routing import shard_of
    from dualemb.jax import _ffi, sharded
    if args.hold_save and args.process_id == 0:
        hold_before_manifest(args.hold_save)

    assert _ffi.uses_host_callback() or not args.callback, "--callback: the FFI was chosen"
    w = jnp.asarray(np.linspace(-1.0, 1.0, DIM), jnp.float32)
    init = dej.initializers.normal(0.0, 0.1, seed=7)
    opt = dej.optimizers.adam(0.05)

    def loss_fn(rows, y):
        return jnp.sum((rows.sum(axis=1) @ w - y) ** 2)

    out = {}
    if args.reference:
        table = dej.load(args.load) if args.load else dej.create(DIM, initializer=init,
                                                                  optimizer=opt)

        @jax.jit
        def step(t, ids, y):
            g = jax.grad(loss_fn)(dej.lookup(t, ids), y)
            return dej.apply_gradients(t, ids, g)

        for ids, y in batches(args, int(os.environ.get("WORKER_DRAW", "1"))):
            table = step(table, dej.ids(ids), y)
        if args.save:
            dej.save(table, args.save)
        e = table.core().export(0, 10**6)
        out.update(keys=e["keys"], values=e["values"], slots=e["slots"],
                   step=int(table.step))
        np.savez(args.out, **out)
        return

    mesh = Mesh(np.array(jax.devices()), ("shards",))
    n = mesh.devices.size
    cap = args.capacity or None
    if args.load:
        table = sharded.load(args.load, mesh, capacity_per_shard=cap)
    else:
        extra = {"capacity": args.table_capacity} if args.table_capacity else {}
        table = sharded.create(mesh, DIM, initializer=init, optimizer=opt,
                               capacity_per_shard=cap, **extra)
    data = NamedSharding(mesh, P("shards"))
    local = args.batch // args.processes
    lo = args.process_id * local

    @jax.jit
    def step(t, ids, y):
        g = jax.grad(loss_fn)(sharded.lookup(t, ids), y)
        return sharded.apply_gradients(t, ids, g)

    for ids, y in batches(args, int(os.environ.get("WORKER_DRAW", n))):
        gids = jax.make_array_from_process_local_data(
            data, dej.ids(ids[lo:lo + local]).halves, (args.batch, BAG, 2))
        gy = jax.make_array_from_process_local_data(data, y[lo:lo + local], (args.batch,))
        table = step(table, dej.Ids(gids), gy)
    if args.save:
        sharded.save(table, args.save)
    keys, values, slots = [], [], []
    for d, t in sorted(table.local_tables().items()):
        e = t.core().export(0, 10**6)
        assert (np.asarray(shard_of(e["keys"], n)) == d).all(), "a row on a wrong shard"
        keys.append(e["keys"]), values.append(e["values"]), slots.append(e["slots"])
    out.update(keys=np.concatenate(keys), values=np.concatenate(values),
               slots=np.concatenate(slots),
               step=int(next(iter(table.local_tables().values())).step))
    np.savez(args.out, **out)
    if args.online:
        def train(t, hi, s):  # one step on batch s, ids drawn from [0, hi)
            rng = np.random.default_rng(5000 + s)
            ids = (rng.integers(0, hi, (args.batch, BAG)).astype(np.int64) - 100) * (2**33 + 1)
            y = rng.normal(size=(args.batch,)).astype(np.float32)
            gids = jax.make_array_from_process_local_data(
                data, dej.ids(ids[lo:lo + local]).halves, (args.batch, BAG, 2))
            gy = jax.make_array_from_process_local_data(data, y[lo:lo + local], (args.batch,))
            return step(t, dej.Ids(gids), gy)
        online(args, table, train, n)
    if args.processes > 1:
        # Everyone has read its state before anyone leaves (the coordinator is process 0).
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices("dualemb-test-done")


if __name__ == "__main__":
    sys.exit(main())

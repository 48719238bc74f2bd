"""Trains a sharded dualemb table with several JAX processes on one machine (CPU, gloo).

    python examples/jax_multiprocess.py --processes 2          # starts the workers itself

Each worker: jax.distributed on 127.0.0.1, a 1-D mesh over every process's devices, a table
sharded over it (dualemb.jax.sharded), a few training steps, one checkpoint. See
docs/scaling_jax.md.
"""

import argparse
import socket
import subprocess
import sys


def worker(args):
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}",
                               num_processes=args.processes, process_id=args.process_id,
                               heartbeat_timeout_seconds=10)  # a dead peer fails us in ~10 s
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import dualemb.jax as dej
    from dualemb.jax import sharded

    mesh = Mesh(np.array(jax.devices()), ("shards",))  # every device of every process
    table = sharded.create(mesh, 8, optimizer=dej.optimizers.adam(0.01),
                           initializer=dej.initializers.normal(0.0, 0.05, seed=0),
                           capacity_per_shard=None)  # None: the local batch (never overflows)
    w = jnp.linspace(-1.0, 1.0, 8)

    @jax.jit
    def step(table, ids, y):
        def loss(rows):
            return jnp.mean((rows.sum(axis=1) @ w - y) ** 2)
        value, g = jax.value_and_grad(loss)(sharded.lookup(table, ids))
        return sharded.apply_gradients(table, ids, g), value

    data = NamedSharding(mesh, P("shards"))
    batch, local = 256, 256 // args.processes
    for s in range(20):
        rng = np.random.default_rng(s)  # the same global batch in every process
        ids = rng.integers(0, 10**12, size=(batch, 4))
        y = rng.normal(size=batch).astype(np.float32)
        lo = args.process_id * local  # this process's slice of it
        gids = jax.make_array_from_process_local_data(
            data, dej.ids(ids[lo:lo + local]).halves, (batch, 4, 2))
        gy = jax.make_array_from_process_local_data(data, y[lo:lo + local], (batch,))
        table, value = step(table, dej.Ids(gids), gy)
    sharded.save(table, args.checkpoint)  # one checkpoint, written by every process
    if args.process_id == 0:
        print(f"step {int(next(iter(table.local_tables().values())).step)}, "
              f"checkpoint at {args.checkpoint}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--process-id", type=int, default=-1)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--checkpoint", default="/tmp/dualemb-multiprocess-ckpt")
    args = p.parse_args()
    if args.process_id >= 0:
        return worker(args)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, "--processes", str(args.processes),
                               "--process-id", str(i), "--port", str(port),
                               "--checkpoint", args.checkpoint])
             for i in range(args.processes)]
    try:
        return max(p.wait(timeout=600) for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


if __name__ == "__main__":
    sys.exit(main())

"""Scale-out benchmark of dualemb.jax.sharded (JSON on stdout).

    python benchmarks/bench_scale_jax.py [--steps 30]

Measures examples/s of a demo-sized model (4 ids per example, dim 16, Adam; a fixed linear head)
for: the single-device table in 1 process; the sharded table in 1 process (1 device: the
overhead of the exchange path); the sharded table in 2 processes with the same global batch
(strong scaling) and with twice the global batch (weak scaling); plus the bytes one device
sends per step. Timings exclude compilation (the first 3 steps). The machine may be shared:
the load average is recorded.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(a):
    import jax
    if a.processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{a.port}",
                                   num_processes=a.processes, process_id=a.process_id,
                                   heartbeat_timeout_seconds=20)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import dualemb.jax as dej
    from dualemb.jax import sharded
    dim, bag = 16, 4
    w = jnp.linspace(-1.0, 1.0, dim)
    opt, init = dej.optimizers.adam(0.01), dej.initializers.normal(0.0, 0.05, seed=0)

    def loss(rows, y):
        return jnp.mean((rows.sum(axis=1) @ w - y) ** 2)

    local = a.batch // a.processes
    rng = np.random.default_rng(a.process_id)
    batches = [(rng.integers(0, 10**6, size=(local, bag)), rng.normal(size=local)
                .astype(np.float32)) for _ in range(8)]
    if a.mode == "single":
        t = dej.create(dim, optimizer=opt, initializer=init)

        @jax.jit
        def step(t, ids, y):
            return dej.apply_gradients(t, ids, jax.grad(loss)(dej.lookup(t, ids), y))
        feed = [(dej.ids(i), jnp.asarray(y)) for i, y in batches]
        sent = 0
    else:
        mesh = Mesh(np.array(jax.devices()), ("s",))
        t = sharded.create(mesh, dim, optimizer=opt, initializer=init)
        data = NamedSharding(mesh, P("s"))

        @jax.jit
        def step(t, ids, y):
            g = jax.grad(loss)(sharded.lookup(t, ids), y)
            return sharded.apply_gradients(t, ids, g)
        feed = [(dej.Ids(jax.make_array_from_process_local_data(
            data, dej.ids(i).halves, (a.batch, bag, 2))),
            jax.make_array_from_process_local_data(data, y, (a.batch,))) for i, y in batches]
        b = sharded.exchange_bytes(t, local * bag)
        sent = b["lookup"] + b["apply_gradients"]
    for i in range(3):
        t = step(t, *feed[i % 8])
    jax.block_until_ready(t)
    t0 = time.perf_counter()
    for i in range(a.steps):
        t = step(t, *feed[i % 8])
    jax.block_until_ready(t)
    dt = time.perf_counter() - t0
    if a.process_id == 0:
        print(json.dumps({"examples_per_s": a.batch * a.steps / dt,
                          "bytes_sent_per_device_per_step": sent}))


def run(mode, processes, batch, steps):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", "--mode", mode,
                               "--processes", str(processes), "--process-id", str(i),
                               "--port", str(port), "--batch", str(batch),
                               "--steps", str(steps)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for i in range(processes)]
    try:
        outs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    line = [ln for ln in outs[0].splitlines() if ln.startswith("{")][-1]
    return json.loads(line)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    p.add_argument("--mode", default="sharded")
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--process-id", type=int, default=0)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--steps", type=int, default=30)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    load0 = os.getloadavg()
    res = {"batch": a.batch, "ids_per_example": 4, "dim": 16, "cores": os.cpu_count(),
           "single_1proc": run("single", 1, a.batch, a.steps),
           "sharded_1proc": run("sharded", 1, a.batch, a.steps),
           "sharded_2proc_strong": run("sharded", 2, a.batch, a.steps),
           "sharded_2proc_weak": run("sharded", 2, 2 * a.batch, a.steps)}
    res["sharded_overhead_1proc"] = (res["single_1proc"]["examples_per_s"]
                                     / res["sharded_1proc"]["examples_per_s"])
    res["load_average_before_after"] = [load0[0], os.getloadavg()[0]]
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    sys.exit(main())

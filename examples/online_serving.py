"""Online learning end to end: a trainer publishes delta checkpoints while a server answers
lookups from tables that follow them, without a restart.

    python examples/online_serving.py                      # both, in one process (threads)
    python examples/online_serving.py --mode train --dir D # the trainer alone
    python examples/online_serving.py --mode serve --dir D # a server alone (another process)

The trainer (JAX, fused Adam in the dualemb core) trains a user-embedding table on a toy click
task and every ``--every`` steps publishes the table into ``--dir`` with
``dej.Publisher``: a full checkpoint every ``--full-every`` publishes, deltas between. The
server creates an empty table, follows the directory with ``dej.follow(...).start()``, and
answers jitted lookups while updates are applied; each lookup sees every row before or after an
update, never half-written. No network: the two sides share only the directory. Everything is
bounded by ``--steps`` (trainer) and ``--seconds`` (server).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

import dualemb.jax as dej

DIM = 16
USERS = 5_000


def make_table(optimizer=None):
    return dej.create(DIM, initializer=dej.initializers.normal(0.0, 0.05, seed=7),
                      optimizer=optimizer)


def train(directory: str, steps: int, every: int, full_every: int, log=print) -> None:
    """Logistic regression of a click on <user embedding, fixed item vector>."""
    table = make_table(dej.optimizers.adam(0.05))
    item = jnp.ones(DIM) / DIM
    rng = np.random.default_rng(0)
    pub = dej.Publisher(directory, full_every=full_every)

    @jax.jit
    def step(table, ids, clicks):
        def loss(rows):
            logits = rows @ item
            return jnp.mean(jnp.logaddexp(0.0, logits) - clicks * logits)
        rows = dej.lookup(table, ids)
        value, grads = jax.value_and_grad(loss)(rows)
        return dej.apply_gradients(table, ids, grads), value

    for k in range(1, steps + 1):
        users = rng.integers(0, USERS, 256)
        clicks = (users % 3 == 0).astype(np.float32)  # users divisible by 3 click
        table, value = step(table, dej.ids(users), clicks)
        if k % every == 0:
            path = pub.publish(table)
            log(f"trainer: step {k} loss {float(value):.4f} published {os.path.basename(path)}")
    dej.destroy(table)


def serve(directory: str, seconds: float, stop: threading.Event | None = None,
          log=print) -> int:
    """Follows ``directory`` and scores users until ``seconds`` pass (or ``stop`` is set);
    returns how many lookups it answered."""
    table = make_table()
    item = jnp.ones(DIM) / DIM
    score = jax.jit(lambda t, ids: jax.nn.sigmoid(dej.lookup(t, ids) @ item))
    probe = np.arange(30)
    answered, last = 0, ""
    follower = dej.follow(directory, table).start(interval=0.05)
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
            p = np.asarray(score(table, dej.ids(probe)))
            answered += 1
            if follower.applied and follower.applied[-1].digest != last:
                a = follower.applied[-1]
                last = a.digest
                clickers, others = p[probe % 3 == 0].mean(), p[probe % 3 != 0].mean()
                log(f"server: now at step {a.steps['table']} ({'delta' if a.delta else 'full'})"
                    f": p(click) clickers {clickers:.3f}, others {others:.3f}")
            time.sleep(0.005)
        # One last poll, so a run that ends with the trainer shows its final step.
        follower.stop()
        for a in follower.poll():
            log(f"server: now at step {a.steps['table']} ({'delta' if a.delta else 'full'})")
        if follower.error is not None:
            log(f"server: last follower error: {follower.error}")
    finally:
        follower.stop()
        dej.destroy(table)
    return answered


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("both", "train", "serve"), default="both")
    ap.add_argument("--dir", help="the checkpoint directory (default: a temporary one)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--full-every", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args(argv)
    if args.mode != "both" and not args.dir:
        ap.error("--mode train/serve needs --dir (the directory the two processes share)")
    with tempfile.TemporaryDirectory(prefix="dualemb_online_") as tmp:
        directory = args.dir or tmp
        os.makedirs(directory, exist_ok=True)
        if args.mode == "train":
            train(directory, args.steps, args.every, args.full_every)
        elif args.mode == "serve":
            serve(directory, args.seconds)
        else:
            stop = threading.Event()
            answered = [0]
            server = threading.Thread(
                target=lambda: answered.__setitem__(0, serve(directory, args.seconds, stop)))
            server.start()
            try:
                train(directory, args.steps, args.every, args.full_every)
                time.sleep(0.3)  # the follower's next poll picks up the last publish
            finally:
                stop.set()
                server.join()
            print(f"server answered {answered[0]} lookups while the trainer ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A throw-away TensorFlow cluster on 127.0.0.1, for tests, examples and benchmarks.

    with LocalCluster(num_workers=2, num_ps=2) as cluster:
        resolver = cluster.resolver()          # the chief's SimpleClusterResolver
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)

Each PS and worker task is a ``python -m dualemb.tf.server`` subprocess (so it has the ops
loaded); the chief's address is reserved in the spec for the process that builds the strategy.
Ports are found by binding port 0. Every process started is killed by its pid when the context
exits, also on error; ``kill(job, task)`` kills one earlier (fault tests). Starting waits until
every task listens (``start_timeout``, generous: importing TensorFlow in several processes at
once on a loaded machine takes minutes).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports the OS reports free on 127.0.0.1 (held open together while chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class LocalCluster:
    """Starts ``num_ps`` PS and ``num_workers`` worker server processes (plus a chief address when
    ``chief``). ``spec``: the cluster dict; ``processes``: (job, task) -> Popen."""

    def __init__(self, num_workers: int = 1, num_ps: int = 1, chief: bool = True,
                 start_timeout: float = 300.0, env: dict | None = None, log_dir: str | None = None):
        ports = free_ports(num_workers + num_ps + int(chief))
        addr = [f"127.0.0.1:{p}" for p in ports]
        self.spec = {"worker": addr[:num_workers]}
        if num_ps:
            self.spec["ps"] = addr[num_workers:num_workers + num_ps]
        if chief:
            self.spec["chief"] = [addr[-1]]
        self.start_timeout = start_timeout
        self.env = dict(os.environ if env is None else env)
        self.log_dir = log_dir
        self.processes: dict[tuple[str, int], subprocess.Popen] = {}

    # ---- processes ------------------------------------------------------------------------------
    def start(self) -> "LocalCluster":
        try:
            for job in ("ps", "worker"):
                for task in range(len(self.spec.get(job, ()))):
                    self._start(job, task)
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, job: str, task: int) -> None:
        out = subprocess.DEVNULL
        if self.log_dir:
            out = open(os.path.join(self.log_dir, f"{job}{task}.log"), "ab")
        cmd = [sys.executable, "-m", "dualemb.tf.server", "--job", job, "--task", str(task),
               "--cluster", json.dumps(self.spec)]
        self.processes[(job, task)] = subprocess.Popen(cmd, env=self.env, stdout=out,
                                                       stderr=subprocess.STDOUT)
        if out is not subprocess.DEVNULL:
            out.close()

    def restart(self, job: str, task: int, *more: tuple[str, int]) -> None:
        """Starts task (job, task) — and each further (job, task) in ``more`` — again on its port
        (after ``kill``), all at once, then waits until each listens. Restarting several tasks
        together keeps the window short in which TF's coordinator sees some of them back and
        others not (it then attempts a cluster update that fails and must be retried)."""
        tasks = [(job, task), *more]
        for j, t in tasks:
            self.kill(j, t)
        for j, t in tasks:
            self._start(j, t)
        self.wait_ready(tasks)  # not the others: another may be killed on purpose

    def wait_ready(self, tasks=None) -> None:
        """Waits until every started task (or each (job, task) in ``tasks``) listens; raises if
        one exits or time runs out."""
        deadline = time.monotonic() + self.start_timeout
        for (job, task), proc in self.processes.items():
            if tasks is not None and (job, task) not in tasks:
                continue
            port = int(self.spec[job][task].rsplit(":", 1)[1])
            while not _listening(port):
                if proc.poll() is not None:
                    raise RuntimeError(f"{job}:{task} exited with {proc.returncode} before "
                                       "listening")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{job}:{task} did not listen on {port} within "
                                       f"{self.start_timeout} s")
                time.sleep(0.2)

    def kill(self, job: str, task: int) -> None:
        """Kills task (job, task) by its pid and reaps it."""
        proc = self.processes.get((job, task))
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)

    def stop(self) -> None:
        for job, task in list(self.processes):
            try:
                self.kill(job, task)
            except Exception:  # keep killing the others
                pass

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- what a chief needs ---------------------------------------------------------------------
    def resolver(self, task_type: str = "chief", task_id: int = 0):
        """A ``SimpleClusterResolver`` for this cluster, as seen by ``task_type:task_id``."""
        import tensorflow as tf
        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(self.spec), rpc_layer="grpc", task_type=task_type,
            task_id=task_id)

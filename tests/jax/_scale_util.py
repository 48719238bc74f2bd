"""Helpers of the JAX scale-out tests: run workers (tests/jax/jax_scale_worker.py) as subprocesses
with bounded time, every process killed by pid, and compare their table state."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import _paths

ROOT = str(_paths.ROOT)
WORKER = str(_paths.TESTS / "jax" / "jax_scale_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(devices: int) -> dict:
    e = dict(os.environ)
    e["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("JAX_PLATFORMS", None)
    e["JAX_PLATFORMS"] = "cpu"
    return e


def start_processes(tmp, processes: int, args: list, *, devices: int = 1,
                    extra_env: dict | None = None) -> list:
    """Starts `processes` workers (one jax.distributed job when processes > 1), each in its own
    session, logging to tmp/worker<i>.log; returns [(Popen, log file)]. End them with
    end_processes (also when the test fails)."""
    port = free_port()
    procs = []
    try:
        for i in range(processes):
            log = open(os.path.join(tmp, f"worker{i}.log"), "w+")
            e = env(devices)
            e.update(extra_env or {})
            cmd = [sys.executable, WORKER, "--out", os.path.join(tmp, f"state{i}.npz"),
                   "--processes", str(processes), "--process-id", str(i),
                   "--port", str(port)] + list(args)
            try:
                procs.append((subprocess.Popen(cmd, env=e, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True), log))
            except BaseException:
                log.close()
                raise
    except BaseException:
        end_processes(procs)
        raise
    return procs


def end_processes(procs) -> list:
    """Kills every worker still running (by its process group) and closes the logs; returns
    [(returncode, output)]."""
    outs = []
    for p, log in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)  # its own session: the worker and children
        p.wait()
        log.seek(0)
        outs.append((p.returncode, log.read()))
        log.close()
    return outs


def run_processes(tmp, processes: int, args: list, *, devices: int = 1, timeout: float = 240,
                  extra_env: dict | None = None) -> list:
    """Starts `processes` workers (one jax.distributed job when processes > 1), waits at most
    `timeout` seconds; returns [(returncode, output)] (None: still running after `timeout`);
    every process is killed in the end."""
    procs = start_processes(tmp, processes, args, devices=devices, extra_env=extra_env)
    try:
        deadline = time.monotonic() + timeout
        for p, _ in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        codes = [p.poll() for p, _ in procs]
    finally:
        outs = end_processes(procs)
    return [(code, out) for code, (_, out) in zip(codes, outs)]


def load_state(tmp, processes: int) -> dict:
    parts = [np.load(os.path.join(tmp, f"state{i}.npz")) for i in range(processes)]
    keys = np.concatenate([p["keys"] for p in parts])
    order = np.argsort(keys)
    steps = {int(p["step"]) for p in parts}
    assert len(steps) == 1, f"processes disagree on the step: {steps}"
    return {"keys": keys[order],
            "values": np.concatenate([p["values"] for p in parts])[order],
            "slots": np.concatenate([p["slots"] for p in parts])[order],
            "step": steps.pop()}


def check_ok(outs):
    for i, (rc, out) in enumerate(outs):
        assert rc == 0, f"worker {i} exited with {rc}:\n{out[-4000:]}"

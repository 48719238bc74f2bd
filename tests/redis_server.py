"""Redis servers for tests: each started on a free 127.0.0.1 port in its own temporary directory,
without persistence (``--save "" --appendonly no``; ``persistent=True``: an append-only file
synced at every write, so a server killed by its pid restarts with its data), and stopped by its
pid.

``redis_server_or_skip()`` skips the calling test, naming the Debian package, when
``redis-server`` is not installed (CI installs it with the README's install command).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

START_TIMEOUT_S = 10.0


def require_redis() -> None:
    for tool in ("redis-server", "redis-cli"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (Debian/Ubuntu package: redis-server)")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port(cluster: bool = False) -> int:
    """A free port; for a cluster node also its bus port (port + 10000, which must exist)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not cluster or (port + 10000 <= 65535 and _bindable(port + 10000)):
            return port
    raise RuntimeError("no free port (with a free cluster bus port) found")


class RedisServer:
    """One redis-server process; ``stop()`` kills it by pid (idempotent)."""

    def __init__(self, port: int | None = None, password: str | None = None,
                 cluster: bool = False, persistent: bool = False):
        require_redis()
        self.port = port or free_port(cluster)
        self.password = password
        self.dir = tempfile.mkdtemp(prefix="dualemb-redis-")
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--dir", self.dir,
                "--protected-mode", "no"]
        args += ["--appendonly", "yes", "--appendfsync", "always"] if persistent else [
            "--appendonly", "no"]
        if password:
            args += ["--requirepass", password]
        if cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file",
                     os.path.join(self.dir, "nodes.conf"), "--cluster-node-timeout", "2000"]
        self.args = args
        self.proc = self._spawn()
        self._wait_ready()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cli(self, *args: str, timeout: float = 10.0) -> str:
        cmd = ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port)]
        if self.password:
            cmd += ["--no-auth-warning", "-a", self.password]
        out = subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout)
        return out.stdout.strip()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                with open(os.path.join(self.dir, "server.log"), errors="replace") as f:
                    log = f.read()[-2000:]
                raise RuntimeError(f"redis-server on port {self.port} exited at start:\n{log}")
            try:
                if self.cli("PING", timeout=2.0) == "PONG":
                    return
            except subprocess.TimeoutExpired:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not answer PING in time")

    def pause(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)  # a paused server cannot die cleanly
            except ProcessLookupError:
                pass
            self.proc.kill()
            self.proc.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.proc = self._spawn()
        self._wait_ready()

    def _spawn(self) -> subprocess.Popen:
        # The server's log stays in its directory, for the error message if it fails to start.
        with open(os.path.join(self.dir, "server.log"), "ab") as log:
            return subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisCluster:
    """Three masters, no replicas, created with ``redis-cli --cluster create``."""

    def __init__(self, masters: int = 3, persistent: bool = False):
        self.nodes = []
        try:
            for _ in range(masters):
                self.nodes.append(RedisServer(cluster=True, persistent=persistent))
            out = subprocess.run(
                ["redis-cli", "--cluster", "create", *[n.address for n in self.nodes],
                 "--cluster-replicas", "0", "--cluster-yes"],
                capture_output=True, text=True, timeout=60)
            if out.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout}{out.stderr}")
            self.wait_ok()
        except BaseException:
            self.cleanup()
            raise

    @property
    def addresses(self) -> list:
        return [n.address for n in self.nodes]

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every node reports cluster_state:ok (after creation, or a node's restart)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all("cluster_state:ok" in n.cli("CLUSTER", "INFO") for n in self.nodes):
                return
            time.sleep(0.1)
        raise RuntimeError("redis cluster did not reach cluster_state:ok")

    def node_of(self, key: str) -> "RedisServer":
        """The master serving ``key``'s hash slot."""
        slot = int(self.nodes[0].cli("CLUSTER", "KEYSLOT", key))
        for line in self.nodes[0].cli("CLUSTER", "NODES").splitlines():
            fields = line.split()
            if "master" not in fields[2]:
                continue
            for r in fields[8:]:
                lo, _, hi = r.partition("-")
                if r[0].isdigit() and int(lo) <= slot <= int(hi or lo):
                    port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
                    return next(n for n in self.nodes if n.port == port)
        raise RuntimeError(f"no master serves slot {slot}")

    def cleanup(self) -> None:
        for n in self.nodes:
            n.cleanup()


def running_server():
    """A fresh RedisServer for a pytest fixture (the test files choose the scope): yields it and
    stops it by pid afterwards, also when the test fails."""
    s = RedisServer()
    try:
        yield s
    finally:
        s.cleanup()

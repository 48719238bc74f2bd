"""Local S3 (moto) and GCS (gcp-storage-emulator) servers for the object-store checkpoint tests:
started on 127.0.0.1 at a free port, ready within a bounded time, ended by their pid, and the
fsspec configuration (``fsspec.config.conf``) that points s3:// / gs:// at them."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

START_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server process (its own process group, so a kill ends every child it started)."""

    def __init__(self, argv: list, port: int, probe: str, cwd: str, log: str):
        self.argv, self.port, self.probe, self.cwd, self.log = argv, port, probe, cwd, log
        self.proc = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "Server":
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, cwd=self.cwd, stdout=out, stderr=out,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                urllib.request.urlopen(self.endpoint + self.probe, timeout=2).read()
                return self
            except urllib.error.HTTPError:
                return self  # it answers (an error status is still an answer)
            except OSError:
                time.sleep(0.2)
        self.kill()
        with open(self.log, "rb") as f:
            tail = f.read()[-2000:].decode("utf-8", "replace")
        raise RuntimeError(f"{self.argv[:4]} did not start within {START_TIMEOUT_S} s:\n{tail}")

    def kill(self) -> None:
        """SIGKILL by pid (its process group), as a crash would."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=30)
        self.proc = None


def moto_s3(tmp_dir: str) -> Server:
    pytest.importorskip("moto.server", reason="the moto[server] package (local S3) is not "
                                              "installed (the test extra)")
    pytest.importorskip("s3fs", reason="s3fs (the object-store extra) is not installed")
    port = free_port()
    return Server([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                  port, "/", tmp_dir, os.path.join(tmp_dir, "moto.log")).start()


def gcs_emulator(tmp_dir: str, port: int | None = None) -> Server:
    """gcp-storage-emulator storing on disk under ``tmp_dir`` (so a restarted server, given the
    same ``port``, still holds what was written before it was killed)."""
    pytest.importorskip("gcp_storage_emulator", reason="the gcp-storage-emulator package (local "
                                                       "GCS) is not installed (the test extra)")
    pytest.importorskip("gcsfs", reason="gcsfs (the object-store extra) is not installed")
    port = port or free_port()
    return Server([sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
                   "--port", str(port), "--default-bucket", "bucket", "-q"],
                  port, "/storage/v1/b", tmp_dir, os.path.join(tmp_dir, "gcs.log")).start()


def s3_options(server: Server) -> dict:
    return {"endpoint_url": server.endpoint, "key": "testing", "secret": "testing",
            "client_kwargs": {"region_name": "us-east-1"}}


@contextlib.contextmanager
def s3_bucket(tmp_dir: str):
    """A moto S3 server with the bucket ``bucket``, set as fsspec's ``s3`` options for as long as
    the block runs (then the server is killed and the options restored); yields its URL."""
    fsspec = pytest.importorskip("fsspec", reason="fsspec (the object-store extra) is not "
                                                  "installed")
    server = moto_s3(tmp_dir)
    old = fsspec.config.conf.get("s3")
    try:
        fsspec.config.conf["s3"] = s3_options(server)
        fsspec.filesystem("s3").call_s3("create_bucket", Bucket="bucket")
        yield "s3://bucket"
    finally:
        server.kill()
        fsspec.config.conf.pop("s3", None)
        if old is not None:
            fsspec.config.conf["s3"] = old


def gcs_options(server: Server) -> dict:
    return {"endpoint_url": server.endpoint, "token": "anon", "project": "test"}

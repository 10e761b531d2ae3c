"""One ``store`` fixture, run once per backend: memory, local disk, S3 (moto), GCS (fake-gcs).

Emulators start once per session, on first use, on 127.0.0.1, and stop at session end.
Each test gets a fresh prefix, so tests never see each other's objects.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from storage import Store  # noqa: E402
from tests.servers import (  # noqa: E402
    Server,
    fake_gcs_with_bucket,
    moto_with_bucket,
)

BUCKET = "evalsnap-test"
BACKENDS = ["memory", "local", "s3", "gcs"]
AWS_SECRET = "testing"


@dataclass(frozen=True)
class BackendCase:
    """Where one backend's test stores live, and how to reach its raw bytes."""

    name: str
    base_url: str
    raw_options: dict[str, Any]  # fsspec options to open object URLs directly
    server: Server | None = None

    def new_url(self) -> str:
        return f"{self.base_url}/t-{uuid.uuid4().hex[:12]}"

    def raw_fs_and_path(self, url: str) -> tuple[Any, str]:
        """An fsspec filesystem bypassing Store, to tamper with or inspect stored bytes."""
        import fsspec.core

        return fsspec.core.url_to_fs(url, **self.raw_options)  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def moto_server() -> Iterator[Server]:
    with moto_with_bucket(BUCKET) as server:
        yield server


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[Server]:
    with fake_gcs_with_bucket(BUCKET) as server:
        yield server


@pytest.fixture(autouse=True)
def _offline_cloud_env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dummy credentials and emulator endpoints, for each storage test only.

    Set per test (not for the session) so nothing leaks into tests outside this folder.
    No credential files, no metadata servers: nothing may leave 127.0.0.1.
    """
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    # google-auth: never look for a GCE metadata server; if anything still tries, the
    # address is a closed port on loopback, not the link-local metadata IP.
    monkeypatch.setenv("NO_GCE_CHECK", "true")
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    if "backend" in request.fixturenames:
        backend: BackendCase = request.getfixturevalue("backend")
        if backend.name == "s3" and backend.server:
            monkeypatch.setenv("AWS_ENDPOINT_URL", backend.server.url)
        if backend.name == "gcs" and backend.server:
            monkeypatch.setenv("STORAGE_EMULATOR_HOST", backend.server.url)


@pytest.fixture(scope="session", params=BACKENDS)
def backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> BackendCase:
    """Session-scoped, parametrized over the backends; servers start on first use."""
    name = request.param
    if name == "memory":
        return BackendCase(name, f"memory://evalsnap-{uuid.uuid4().hex[:8]}", {})
    if name == "local":
        return BackendCase(name, str(tmp_path_factory.mktemp("stores")), {})
    if name == "s3":
        moto: Server = request.getfixturevalue("moto_server")
        return BackendCase(name, f"s3://{BUCKET}", {"endpoint_url": moto.url}, moto)
    gcs: Server = request.getfixturevalue("gcs_server")
    return BackendCase(name, f"gs://{BUCKET}", {"endpoint_url": gcs.url, "token": "anon"}, gcs)


@pytest.fixture
def store(backend: BackendCase) -> Store:
    """A store at a fresh prefix of the current backend."""
    return Store(backend.new_url())

"""Failures that make a store unusable raise StoreUnavailable, fast, naming the URL, and
never show a credential."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from storage import Store, StoreUnavailable
from tests.servers import free_port

KIND = "unit"


def _run_with_guard(fn: Callable[[], Any], guard_s: float = 60.0) -> Any:
    """Run ``fn`` in a thread; return its result or exception. Fails if it hangs."""
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(guard_s)
    assert not thread.is_alive(), f"call still running after {guard_s} s: it hangs"
    return outcome[0]


def test_local_store_that_is_a_file_is_unavailable(tmp_path: Path) -> None:
    target = tmp_path / "not-a-dir"
    target.write_text("x")
    store = Store(str(target))
    for call in (store.check, lambda: store.put_object(KIND, b"x")):
        with pytest.raises(StoreUnavailable) as caught:
            call()
        assert str(target) in str(caught.value)


def test_unknown_protocol() -> None:
    with pytest.raises(StoreUnavailable) as caught:
        Store("foo://x")
    assert "foo://x" in str(caught.value)
    assert caught.value.exit_code == 2


def test_credentials_in_url_are_rejected_without_echoing_them() -> None:
    with pytest.raises(StoreUnavailable) as caught:
        Store("s3://AKIDEXAMPLE:sup3rs3cret@bucket/prefix")
    assert "sup3rs3cret" not in str(caught.value)
    assert "sup3rs3cret" not in caught.value.url


# -- object-store failures --------------------------------------------------------------


@pytest.mark.parametrize("backend", ["s3", "gcs"], indirect=True)
def test_missing_bucket(backend: Any) -> None:
    protocol = backend.base_url.split("://")[0]
    store = Store(f"{protocol}://no-such-bucket-{uuid.uuid4().hex[:8]}/p")
    calls: list[Callable[[], Any]] = [
        store.check,
        lambda: store.put_object(KIND, b"x"),
        lambda: store.get_ref("runs", "latest"),
        lambda: list(store.iter_objects(KIND)),
    ]
    for call in calls:
        outcome = _run_with_guard(call)
        assert isinstance(outcome, StoreUnavailable), outcome
        assert store.url in str(outcome) and "does not exist" in str(outcome)


@pytest.mark.parametrize("protocol", ["s3", "gs"])
def test_unreachable_endpoint(protocol: str) -> None:

    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    store = Store(f"{protocol}://bucket/prefix", {"endpoint_url": endpoint})
    outcome = _run_with_guard(lambda: store.put_object(KIND, b"x"))
    assert isinstance(outcome, StoreUnavailable), outcome
    assert store.url in str(outcome)


@pytest.mark.parametrize("backend", ["s3"], indirect=True)
def test_no_credentials_in_url_or_stored_bytes(backend: Any) -> None:
    secret = "s3cr3t-value-do-not-store"
    store = Store(backend.new_url(), {"key": "AKIDEXAMPLE", "secret": secret})
    store.check()
    oid = store.put_object(KIND, b"payload")
    store.put_ref("runs", "latest", oid.encode())

    env_secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    shown = [store.url, repr(store), store.prefect_storage_basepath(), store.object_url(KIND, oid)]
    fs, root = backend.raw_fs_and_path(store.url)
    stored = [fs.cat_file(path) for path in fs.find(root)]
    assert len(stored) == 3  # marker, object, ref
    missing = Store("s3://no-such-bucket-for-secrets/p", {"key": "AKIDEXAMPLE", "secret": secret})
    with pytest.raises(StoreUnavailable) as caught:
        missing.put_object(KIND, b"x")
    shown += [str(caught.value), repr(caught.value), missing.url]
    for needle in (secret, env_secret):
        assert not [text for text in shown if needle in text]
        assert not [blob for blob in stored if needle.encode() in blob]

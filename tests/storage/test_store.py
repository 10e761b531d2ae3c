"""Store behaviour, run once per backend (memory, local, S3 on moto, GCS on fake-gcs-server)."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import pickle
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

import storage
from storage import CorruptObjectError, ObjectNotFound, Store, oid_of

KIND = "unit"
WRITERS = 8


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _raw_files(backend: Any, store: Store) -> list[str]:
    """Every file under the store root, read around the Store API."""
    fs, root = backend.raw_fs_and_path(store.url)
    try:
        return sorted(str(p) for p in fs.find(root))
    except FileNotFoundError:
        return []


# -- objects ----------------------------------------------------------------------------


def test_round_trip(store: Store) -> None:
    data = b'{"score": 0.75, "case": "c1"}\n'
    oid = store.put_object(KIND, data)

    assert oid == _sha(data)
    assert store.get_object(KIND, oid) == data
    assert store.has_object(KIND, oid)
    assert list(store.iter_objects(KIND)) == [oid]
    assert list(store.iter_objects("judge")) == []
    hexdigest = oid.removeprefix("sha256:")
    assert (
        store.object_url(KIND, oid)
        == f"{store.url}/v1/objects/unit/{hexdigest[:2]}/{hexdigest[2:]}"
    )
    assert store.verify() == []


def test_empty_object_round_trips(store: Store) -> None:
    oid = store.put_object("record", b"")
    assert store.get_object("record", oid) == b""


def test_second_write_is_a_noop(store: Store, backend: Any) -> None:
    data = b"same bytes twice"
    oid = store.put_object(KIND, data)
    files_before = _raw_files(backend, store)
    stat_before = os.stat(store.object_url(KIND, oid)) if backend.name == "local" else None

    assert store.put_object(KIND, data) == oid

    assert _raw_files(backend, store) == files_before
    assert list(store.iter_objects(KIND)) == [oid]
    if stat_before is not None:
        stat_after = os.stat(store.object_url(KIND, oid))
        # not written again (same file), only freshened for gc (docs/gc.md)
        assert stat_after.st_ino == stat_before.st_ino
        assert stat_after.st_mtime_ns >= stat_before.st_mtime_ns


def test_concurrent_thread_writers_store_one_object(store: Store, backend: Any) -> None:
    data = b"written by eight threads at once " * 100
    barrier = threading.Barrier(WRITERS)
    results: list[str] = []
    errors: list[BaseException] = []

    def write(own_instance: bool) -> None:
        target = Store(store.url) if own_instance else store
        barrier.wait(timeout=30)
        try:
            results.append(target.put_object(KIND, data))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i % 2 == 0,)) for i in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert errors == []
    assert results == [_sha(data)] * WRITERS
    assert list(store.iter_objects(KIND)) == [_sha(data)]
    assert store.get_object(KIND, _sha(data)) == data
    assert _raw_files(backend, store) == [
        backend.raw_fs_and_path(store.object_url(KIND, _sha(data)))[1]
    ]


def _put_in_process(url: str, data: bytes, barrier: Any, results: Any) -> None:
    barrier.wait(timeout=60)
    try:
        results.put(Store(url).put_object(KIND, data))
    except BaseException as exc:
        results.put(f"error: {exc!r}")
        raise


def test_concurrent_process_writers_local(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    data = b"written by eight processes at once " * 1000
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WRITERS)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_put_in_process, args=(url, data, barrier, results))
        for _ in range(WRITERS)
    ]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(60)

    assert outcomes == [_sha(data)] * WRITERS
    assert [proc.exitcode for proc in procs] == [0] * WRITERS
    files = [p for p in Path(url).rglob("*") if p.is_file()]
    assert [str(p) for p in files] == [Store(url).object_url(KIND, _sha(data))]


def test_flipped_byte_is_detected(store: Store, backend: Any) -> None:
    data = bytes(range(256))
    oid = store.put_object(KIND, data)
    url = store.object_url(KIND, oid)
    fs, path = backend.raw_fs_and_path(url)
    flipped = bytearray(fs.cat_file(path))
    flipped[100] ^= 0x01
    if backend.name == "local":
        with open(path, "r+b") as handle:  # damage in place, as a disk or an editor would
            handle.seek(100)
            handle.write(bytes([flipped[100]]))
    else:
        fs.pipe_file(path, bytes(flipped))

    with pytest.raises(CorruptObjectError) as caught:
        Store(store.url).get_object(KIND, oid)
    assert caught.value.url == url
    assert caught.value.expected == oid
    assert caught.value.actual == _sha(bytes(flipped))
    assert url in str(caught.value) and caught.value.exit_code == 2

    problems = store.verify()
    assert [(p.path, p.kind) for p in problems] == [(url, KIND)]
    assert "corrupt" in problems[0].message

    # Writing the content again notices the damage and replaces the object whole.
    assert store.put_object(KIND, data) == oid
    assert fs.cat_file(path) == data
    assert store.get_object(KIND, oid) == data


def test_missing_object(store: Store) -> None:
    oid = oid_of(b"never stored")
    assert not store.has_object(KIND, oid)
    with pytest.raises(ObjectNotFound) as caught:
        store.get_object(KIND, oid)
    assert caught.value.url == store.object_url(KIND, oid)
    assert caught.value.url in str(caught.value)


# -- refs -------------------------------------------------------------------------------


def test_refs_put_get_list_replace_delete(store: Store) -> None:
    assert store.get_ref("runs", "latest") is None
    assert store.list_refs("runs") == []

    store.put_ref("runs", "latest", b"one")
    assert store.get_ref("runs", "latest") == b"one"
    store.put_ref("runs", "latest", b"two")
    assert store.get_ref("runs", "latest") == b"two"

    store.put_ref("runs", "other", b"x")
    store.put_ref("runs/2024", "nested", b"y")
    assert store.list_refs("runs") == ["latest", "other"]
    assert store.list_refs("runs/2024") == ["nested"]

    store.delete_ref("runs", "other")
    store.delete_ref("runs", "other")
    assert store.list_refs("runs") == ["latest"]
    assert all(list(store.iter_objects(kind)) == [] for kind in storage.OBJECT_KINDS)


# -- health, urls, layout ---------------------------------------------------------------


def test_check_and_prefect_basepath(store: Store, backend: Any) -> None:
    store.check()
    store.check(write=False)
    assert store.verify() == []
    assert store.prefect_storage_basepath() == f"{store.url}/v1/prefect"
    if backend.name == "local":
        assert os.path.isabs(store.prefect_storage_basepath())
    else:
        assert store.prefect_storage_basepath().startswith(backend.base_url + "/")


def test_store_pickles(store: Store) -> None:
    oid = store.put_object(KIND, b"pickled")
    clone = pickle.loads(pickle.dumps(store))
    assert clone.url == store.url
    assert clone.get_object(KIND, oid) == b"pickled"


def test_no_temp_files_left_on_local_disk(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "store"))
    store.check()
    for i in range(20):
        store.put_object(KIND, f"object {i}".encode())
        store.put_object(KIND, f"object {i}".encode())
        store.put_ref("runs", "latest", f"run {i}".encode())
    names = [
        p.relative_to(tmp_path / "store").as_posix() for p in tmp_path.rglob("*") if p.is_file()
    ]
    assert not [n for n in names if Path(n).name.startswith(".")]
    assert sorted(n for n in names if not n.startswith("v1/objects/")) == [
        "v1/STORE",
        "v1/refs/runs/latest",
    ]
    assert len([n for n in names if n.startswith("v1/objects/unit/")]) == 20


def test_verify_reports_stray_files_and_listing_ignores_them(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    oid = store.put_object(KIND, b"good")
    stray = tmp_path / "v1" / "objects" / KIND / "ab" / ".tmp-deadbeef"
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"half")

    assert list(store.iter_objects(KIND)) == [oid]
    problems = store.verify()
    assert [(p.path, p.kind) for p in problems] == [(str(stray), KIND)]
    assert "unexpected file" in problems[0].message


def test_url_normalization(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert Store("rel/store").url == str(tmp_path / "rel" / "store")
    assert Store(f"file://{tmp_path}/x/").url == str(tmp_path / "x")
    assert Store("memory://norm/").url == "memory://norm"
    assert Store("s3://bucket/prefix/").url == "s3://bucket/prefix"
    assert Store("gcs://bucket/p", {"token": "anon"}).url == "gs://bucket/p"


def test_writing_good_bytes_again_repairs_a_damaged_object(store: Store, backend: Any) -> None:
    """Write-once must not make damage permanent: the next write of the content repairs it."""
    data = b"evalsnap repair " * 64
    oid = store.put_object(KIND, data)
    url = store.object_url(KIND, oid)
    fs, path = backend.raw_fs_and_path(url)
    damaged = bytearray(data)
    damaged[3] ^= 0x20
    if backend.name == "local":
        with open(path, "r+b") as handle:
            handle.seek(3)
            handle.write(bytes([damaged[3]]))
    else:
        fs.pipe_file(path, bytes(damaged))
    with pytest.raises(CorruptObjectError):
        Store(store.url).get_object(KIND, oid)
    assert store.put_object(KIND, data) == oid
    assert Store(store.url).get_object(KIND, oid) == data
    assert store.verify() == []


def test_a_streamed_write_stores_the_same_object_and_repairs_damage(
        store: Store, backend: Any) -> None:
    """``put_object_streamed``: bytes given a part at a time (a long record) become the same
    object as ``put_object`` of their join; on local disk never held whole, and a damaged
    file of that id is replaced whole, an intact one kept."""
    parts = [b"{", *(b'"part %d", ' % i for i in range(500)), b'"end"}']
    data = b"".join(parts)
    oid = store.put_object_streamed(KIND, iter(parts))
    assert oid == _sha(data)
    assert Store(store.url).get_object(KIND, oid) == data
    assert store.put_object_streamed(KIND, iter(parts)) == oid  # there already: kept
    fs, path = backend.raw_fs_and_path(store.object_url(KIND, oid))
    damaged = bytearray(data)
    damaged[7] ^= 0x20
    if backend.name == "local":
        with open(path, "r+b") as handle:
            handle.seek(7)
            handle.write(bytes([damaged[7]]))
    else:
        fs.pipe_file(path, bytes(damaged))
    with pytest.raises(CorruptObjectError):
        Store(store.url).get_object(KIND, oid)
    assert store.put_object_streamed(KIND, iter(parts)) == oid
    assert Store(store.url).get_object(KIND, oid) == data
    assert store.verify() == []
    if backend.name == "local":  # no temporary file left in the kind's folder
        assert [n for n in os.listdir(os.path.dirname(os.path.dirname(path)))
                if not n.isalnum()] == []


def test_a_run_reads_each_object_once_and_never_heads(store: Store) -> None:
    """Within a run (``new_run`` … ``end_run``) objects are immutable to the store instance:
    an object read or written once costs no second request; outside a run, every read goes
    to the store (a command that only reads sees what the store holds now)."""
    data = b"read me once " * 32
    store.put_object(KIND, b"first call: the store is probed once (a bucket: one HEAD)")
    store.new_run()
    oid = store.put_object(KIND, data)
    assert store.get_object(KIND, oid) == data and store.put_object(KIND, data) == oid
    counts = store.requests.snapshot()
    assert counts["get"] == 0 and counts["head"] == 0 and counts["put"] == 1, counts
    store.end_run()
    assert store.get_object(KIND, oid) == data
    assert store.requests.snapshot()["get"] == 1 and store.requests.snapshot()["head"] == 0


def test_local_reads_never_follow_a_link_out_of_the_store(tmp_path: Any) -> None:
    """Issue 29 item 7, reads: an object area linked to a directory outside the store is
    refused (a typed error naming the link), not read from there."""
    from storage import StoreUnavailable

    outside = tmp_path / "outside"
    outside.mkdir()
    store = Store(str(tmp_path / "s"))
    oid = store.put_object(KIND, b"inside")
    area = tmp_path / "s" / "v1" / "objects" / KIND
    shutil.move(str(area), str(outside / KIND))
    area.symlink_to(outside / KIND, target_is_directory=True)
    with pytest.raises(StoreUnavailable, match="link"):
        Store(str(tmp_path / "s")).get_object(KIND, oid)

"""Batched durability on local disk: writes are visible at once, fsynced at flush or commit.

fsync has no observable effect short of a power cut, so these tests record which paths
``os.fsync`` is called on (through ``/proc/self/fd``) while the real calls still run.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from storage import Store, _local

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")


@pytest.fixture()
def synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = os.fsync

    def recording(fd: int) -> None:
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(_local.os, "fsync", recording)
    return calls


def _objects(root: Path) -> list[str]:
    return sorted(str(p) for p in (root / "v1" / "objects").rglob("*") if p.is_file())


def test_each_mode_fsyncs_every_write(tmp_path: Path, synced: list[str]) -> None:
    store = Store(str(tmp_path))
    store.put_object("unit", b'{"a": 1}')
    [obj] = _objects(tmp_path)
    assert os.path.dirname(obj) in synced  # the directory entry of the new object
    assert any(p.startswith(os.path.dirname(obj)) and p != os.path.dirname(obj) for p in synced)


def test_batch_mode_defers_fsync_until_flush(tmp_path: Path, synced: list[str]) -> None:
    store = Store(str(tmp_path), durability="batch")
    oids = [store.put_object("unit", f'{{"n": {i}}}'.encode()) for i in range(5)]
    store.put_ref("index/unit", "abc", b"{}")
    assert synced == []
    assert [store.get_object("unit", oid) for oid in oids]  # visible before any fsync
    store.flush()
    objects = _objects(tmp_path)
    ref = str(tmp_path / "v1" / "refs" / "index" / "unit" / "abc")
    assert set(objects) | {ref} <= set(synced)
    assert {os.path.dirname(p) for p in objects} <= set(synced)
    synced.clear()
    store.flush()
    assert synced == []  # nothing pending twice


def test_commit_flushes_everything_before_the_commit_ref(tmp_path: Path,
                                                         synced: list[str]) -> None:
    store = Store(str(tmp_path), durability="batch")
    store.put_object("unit", b'{"x": 1}')
    store.put_ref("runs", "r1", b"manifest", commit=True)
    [obj] = _objects(tmp_path)
    manifest_dir = str(tmp_path / "v1" / "refs" / "runs")
    assert obj in synced and manifest_dir in synced
    assert synced.index(obj) < synced.index(manifest_dir)  # object durable before the commit


def test_existing_object_written_again_is_flushed_too(tmp_path: Path,
                                                      synced: list[str]) -> None:
    # another process may have created it without flushing yet
    Store(str(tmp_path), durability="batch").put_object("unit", b'{"y": 2}')
    again = Store(str(tmp_path), durability="batch")
    again.put_object("unit", b'{"y": 2}')
    again.flush()
    assert _objects(tmp_path)[0] in synced


def test_durability_survives_pickling(tmp_path: Path) -> None:
    store = pickle.loads(pickle.dumps(Store(str(tmp_path), durability="batch")))
    assert store._durability == "batch"
    with pytest.raises(ValueError, match="durability"):
        Store(str(tmp_path), durability="sometimes")


def test_a_large_batch_is_flushed_with_one_syncfs(tmp_path: Path, synced: list[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    real = _local._syncfs_call()
    if real is None:
        pytest.skip("no syncfs here (not Linux)")
    calls: list[str] = []

    def recording(fd: int) -> int:
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        return int(real(fd))

    monkeypatch.setattr(_local, "_syncfs_call", lambda: recording)
    store = Store(str(tmp_path), durability="batch")
    few = [store.put_object("unit", f'{{"few": {i}}}'.encode()) for i in range(3)]
    store.flush()
    assert calls == [] and len(synced) >= len(few)  # a small batch: file by file
    synced.clear()
    for i in range(_local.SYNCFS_MIN_FILES):
        store.put_object("unit", f'{{"many": {i}}}'.encode())
    store.flush()
    assert len(calls) == 1 and calls[0].startswith(str(tmp_path))
    assert synced == []  # the one syncfs covered every file and directory

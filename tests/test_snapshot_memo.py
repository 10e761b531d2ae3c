"""A snapshot freeze has just written is kept as a read of it would parse it (issue 31:
publish read back and parsed the run's snapshot, ~66 MB at 30,000 cases, that this process
had just written)."""

from __future__ import annotations

from pathlib import Path

from evalsnap.records import Snapshot, repo

FIXTURES = Path(__file__).parent / "fixtures" / "records"


def test_the_snapshot_remembered_is_the_snapshot_read(tmp_path: Path) -> None:
    stored = Snapshot.from_bytes((FIXTURES / "snapshot_v1.json").read_bytes())
    # as freeze makes it: its cases as a list of models, created now
    made = stored.model_copy(update={"cases": list(stored.cases),
                                     "created_at": "2026-12-04T19:00:00+00:00"})
    url = str(tmp_path / "store")
    store = repo.open_store(url)
    oid = repo.put(store, made)
    repo.remember_snapshot(store, oid, made)
    before = store.requests.snapshot()
    kept = repo.get_snapshot(store, oid)
    assert store.requests.snapshot() == before  # nothing read
    other = repo.open_store(url)
    read = repo.get_snapshot(other, oid)  # another store instance reads it
    assert other.requests.snapshot().get("get", 0) >= 1  # (the count counts a read)
    assert kept.model_dump() == read.model_dump()
    assert kept.to_bytes() == read.to_bytes()
    assert kept.created_at == read.created_at == ""  # volatile: never stored, never kept
    assert made.created_at  # the writer's own copy is not changed

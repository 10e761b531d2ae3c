"""A long record (a snapshot, an evaluation record) is read from local disk a part at a
time and parsed as its parts come: its bytes and text are never whole in memory (issue 31:
a snapshot of 30,000 cases is ~66 MB, which a scoring process read and decoded whole, twice
its size, at its start), and still nothing damaged, cut, missing or crafted is ever handed
out."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from evalsnap.records import Snapshot, repo
from storage import CorruptObjectError, ObjectNotFound

FIXTURES = Path(__file__).parent / "fixtures" / "records"


def _long_snapshot(n: int) -> Snapshot:
    """The fixture snapshot with its one case over again ``n`` times (distinct ids)."""
    stored = Snapshot.from_bytes((FIXTURES / "snapshot_v1.json").read_bytes())
    case = list(stored.cases)[0]
    cases = [case.model_copy(update={"eval_id": f"{case.eval_id}-{i}"}) for i in range(n)]
    return stored.model_copy(update={"cases": cases})


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, Snapshot, bytes]:
    url = str(tmp_path_factory.mktemp("long") / "store")
    snapshot = _long_snapshot(6000)
    store = repo.open_store(url)
    oid = repo.put(store, snapshot)
    data = store.get_object("snapshot", oid)
    assert len(data) > 4 << 20  # long enough to be read in parts
    return url, oid, snapshot, data


def _path(url: str, oid: str) -> Path:
    from storage._layout import object_rel

    path = Path(url) / object_rel("snapshot", oid)
    assert path.is_file()
    return path


def test_a_long_snapshot_reads_in_parts_as_it_reads_whole(stored) -> None:
    url, oid, snapshot, data = stored
    store = repo.open_store(url)
    parts = list(store.get_object_parts("snapshot", oid))
    assert len(parts) > 4 and b"".join(parts) == data
    read = repo.get(repo.open_store(url), Snapshot, oid)
    assert read.to_bytes() == data == Snapshot.from_bytes(data).to_bytes()
    assert [c.eval_id for c in read.cases] == [c.eval_id for c in snapshot.cases]


def test_its_text_is_never_whole_in_memory(stored, monkeypatch: pytest.MonkeyPatch) -> None:
    url, oid, _, data = stored
    import evalsnap.rows

    # the rows it is read into go to their temporary file past 256 KB (not 4 MB), so that
    # what the read itself holds is what is measured
    monkeypatch.setattr(evalsnap.rows, "ROWS_IN_MEMORY", 1 << 18)
    store = repo.open_store(url)
    tracemalloc.start()
    try:
        read = repo.get(store, Snapshot, oid)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(read.cases) == 6000
    # read whole, its bytes and text were twice its size at once; in parts, a few parts
    assert peak < len(data) / 2, (peak, len(data))


@pytest.mark.parametrize("damage", ["a byte changed", "cut short", "crafted", "deleted"])
def test_a_damaged_long_object_is_never_handed_out(stored, tmp_path: Path, damage: str) -> None:
    url, oid, _, data = stored
    import shutil

    copy = tmp_path / "store"
    shutil.copytree(url, copy)
    path = _path(str(copy), oid)
    if damage == "a byte changed":
        i = data.index(b'"eval_id"', len(data) // 2)
        path.write_bytes(data[:i + 12] + b"X" + data[i + 13:])
    elif damage == "cut short":
        path.write_bytes(data[: len(data) - 1000])
    elif damage == "crafted":  # valid JSON of the right shape, not the bytes its name says
        doc = json.loads(data)
        doc["cases"] = doc["cases"][:-1]
        path.write_bytes(json.dumps(doc).encode())
    else:
        path.unlink()
    store = repo.open_store(str(copy))
    error = repo.NotFoundError if damage == "deleted" else CorruptObjectError
    with pytest.raises(error):
        repo.get(store, Snapshot, oid)
    with pytest.raises(ObjectNotFound if damage == "deleted" else CorruptObjectError):
        list(store.get_object_parts("snapshot", oid))

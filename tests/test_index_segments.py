"""Issue 31: the unit and judge indexes as segments (``evalsnap/records/segments.py``).

A segment is one ref per batch of index entries; which entry answers a key is what the
per-key refs said (newest complete unit, an incomplete one only when no complete one is
indexed; newest judge answer), a bad segment counts as absent, the per-key refs of earlier
stores are still read, and one store instance sees what another wrote once it refreshes.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evalsnap.errors import CorruptRecordError
from evalsnap.records import repo, segments
from storage import Store

KEY = "a" * 64
OTHER = "b" * 64


def _oid(n: int) -> str:
    return f"sha256:{n:064x}"


def _store(path: Path) -> Store:
    store = Store(str(path))
    store.new_run()
    return store


def test_an_incomplete_unit_never_hides_a_complete_one_and_the_newest_complete_wins(
        tmp_path: Path) -> None:
    writer = _store(tmp_path)
    segments.write_segment(writer, run_id="r1", record_oid=_oid(90),
                           units=[(KEY, _oid(1), True, "r1")])
    time.sleep(0.01)
    segments.write_segment(writer, run_id="r2", record_oid=_oid(91),
                           units=[(KEY, _oid(2), False, "r2"), (OTHER, _oid(3), False, "r2")])
    reader = _store(tmp_path)
    found = segments.unit_entries(reader, KEY)
    assert [e["unit_oid"] for e in found] == [_oid(1), _oid(2)]  # complete first, then incomplete
    assert found[0] == {"unit_oid": _oid(1), "run_id": "r1", "record_oid": _oid(90),
                        "complete": True}
    assert [e["complete"] for e in segments.unit_entries(reader, OTHER)] == [False]
    assert segments.unit_entries(reader, "c" * 64) == []

    time.sleep(0.01)
    segments.write_segment(writer, run_id="r3", record_oid=_oid(92),
                           units=[(KEY, _oid(4), True, "r3")])
    # a lookup answers from memory until the instance refreshes (a scoring task's start)
    assert segments.unit_entries(reader, KEY)[0]["unit_oid"] == _oid(1)
    segments.refresh(reader, only_if_listed=True)
    assert [e["unit_oid"] for e in segments.unit_entries(reader, KEY)] == [
        _oid(4), _oid(1), _oid(2)]


def test_lookups_cost_one_listing_and_one_read_per_segment_then_nothing(tmp_path: Path) -> None:
    writer = _store(tmp_path)
    for n in range(3):
        segments.write_segment(writer, run_id=f"r{n}", judge=[(f"{n:064x}", _oid(n))])
    reader = _store(tmp_path)
    before = reader.requests.snapshot()
    assert [segments.judge_entry(reader, f"{n:064x}") for n in range(3)] == [
        _oid(0), _oid(1), _oid(2)]
    assert segments.judge_entry(reader, "f" * 64) is None
    after = reader.requests.snapshot()
    assert after["get"] - before["get"] == 3  # each segment once; the misses cost nothing more
    assert after["list"] - before["list"] == 2  # the segments, and the per-key refs of old stores
    # a unit lookup reads the unit segments only (a no-op run never reads the judge's)
    segments.write_segment(writer, run_id="r9", units=[(KEY, _oid(9), True, "r9")])
    units_reader = _store(tmp_path)
    before = units_reader.requests.snapshot()
    assert segments.unit_entries(units_reader, KEY)[0]["unit_oid"] == _oid(9)
    assert units_reader.requests.snapshot()["get"] - before["get"] == 1


def test_what_an_instance_writes_before_it_looks_is_seen_by_its_first_lookup(
        tmp_path: Path) -> None:
    store = _store(tmp_path)
    segments.write_segment(store, run_id="r1", units=[(KEY, _oid(1), True, "r1")])
    assert segments.unit_entries(store, KEY)[0]["unit_oid"] == _oid(1)


@pytest.mark.parametrize("bad", [b"[" * 30000 + b"]" * 30000, b"{}", b'{"schema": "x"}',
                                 b'{"schema": "evalsnap.index-segment/1", "run_id": "r", '
                                 b'"created_at": "t", "units": [["zz", 1, true, null]]}'])
def test_a_bad_segment_counts_as_absent_and_the_others_still_answer(
        tmp_path: Path, bad: bytes) -> None:
    writer = _store(tmp_path)
    segments.write_segment(writer, run_id="r1", units=[(KEY, _oid(1), True, "r1")])
    writer.put_ref(segments.NAMESPACE, "units-bad", bad)
    with pytest.raises(CorruptRecordError, match="index segment"):
        segments.parse_segment(bad, where="units-bad")
    reader = _store(tmp_path)
    assert [e["unit_oid"] for e in segments.unit_entries(reader, KEY)] == [_oid(1)]


def test_per_key_refs_of_an_earlier_store_are_still_read(tmp_path: Path) -> None:
    store = _store(tmp_path)
    repo.write_index_entry(store, "index/unit", KEY, {
        "unit_oid": _oid(1), "run_id": "old", "record_oid": _oid(9), "complete": True})
    repo.write_index_entry(store, "index/judge", OTHER, {"oid": _oid(2)})
    store.put_ref("index/unit", OTHER, b"{not json")
    # a newer incomplete unit in a segment does not hide the earlier complete one
    segments.write_segment(store, run_id="new", units=[(KEY, _oid(3), False, "new")])
    reader = _store(tmp_path)
    assert [e["unit_oid"] for e in segments.unit_entries(reader, KEY)] == [_oid(1), _oid(3)]
    assert segments.judge_entry(reader, OTHER) == _oid(2)
    assert segments.unit_entries(reader, OTHER) == []  # the bad entry: absent


def test_entries_given_one_at_a_time_become_segments_a_few_at_a_time_all_found(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A publish of 210,000 units gives its index entries as they come (a generator) and
    holds a few segments at a time; what the writer keeps for itself is bounded, and what
    it let go it reads back from the store."""
    monkeypatch.setattr(segments, "SEGMENT_ENTRIES", 3)
    monkeypatch.setattr(segments, "_WRITE_BATCH", 2)
    monkeypatch.setattr(segments, "_PENDING_BYTES", 1000)  # about two of these segments
    writer = _store(tmp_path)
    given: list[int] = []

    def entries():  # type: ignore[no-untyped-def]
        for n in range(10):
            given.append(n)
            yield f"{n:064x}", _oid(n), True, "r1"

    names = segments.write_segment(writer, run_id="r1", record_oid=_oid(99), units=entries())
    assert len(names) == 4 == len(set(names))  # 3 + 3 + 3 + 1 entries
    assert given == list(range(10))
    kept = segments._catalog(writer).pending
    assert 0 < len(kept) < 4 and sum(map(len, kept.values())) <= 1000
    for store in (writer, _store(tmp_path)):  # the writer reads back what it let go
        for n in range(10):
            assert [e["unit_oid"] for e in segments.unit_entries(store, f"{n:064x}")] == [_oid(n)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.lists(st.tuples(st.integers(0, 30),
                                                                st.integers(0, 3)),
                                                      max_size=12)), max_size=8))
def test_the_judge_index_keeps_what_a_dict_of_the_newest_segment_keeps(segs) -> None:
    """The compact judge index (~100 bytes an entry) answers as the dict it replaced: each
    ref's oid and packs from the newest segment naming it (the first read, on a tie)."""
    index = segments._JudgeIndex()
    expected: dict[str, tuple[tuple[str, str], str, tuple[str, ...]]] = {}
    for n, (age, entries) in enumerate(segs):
        order = (f"2026-12-0{age}", f"judge-{n}")
        packs = (f"sha256:{n:064x}",) * (n % 2)
        number = index.segment(order, packs)
        for ref, which in entries:
            ref_hex, oid = f"{ref:064x}", f"sha256:{(ref * 7 + which):064x}"
            index.put(ref_hex, oid, number)
            old = expected.get(ref_hex)
            if old is None or old[0] < order:
                expected[ref_hex] = (order, oid, packs)
    assert len(index) == len(expected)
    for ref in range(31):
        found = expected.get(f"{ref:064x}")
        assert index.get(f"{ref:064x}") == (None if found is None else found[1:])

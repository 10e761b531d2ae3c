"""The store's read cache when packs are opened ``spare`` (publish reading the run's own
packs): members are kept only where the cache has room, and one that was not kept is read
from its pack again, whole and verified."""

from __future__ import annotations

from pathlib import Path

import pytest

import storage.store as store_module
from evalsnap.records import pack
from storage import Store, oid_of


def _members(n: int, size: int) -> list[tuple[str, bytes]]:
    return [("unit", (f'{{"n": {i}, "pad": "' + "x" * size + '"}').encode()) for i in range(n)]


@pytest.mark.parametrize("spare", [False, True])
def test_a_full_cache_keeps_what_it_has_when_packs_are_opened_spare(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spare: bool) -> None:
    monkeypatch.setattr(store_module, "READ_CACHE_BYTES", 80_000)
    monkeypatch.setattr(store_module, "READ_CACHE_JUDGE_BYTES", 10_000)  # 70 KB for units
    store = Store(str(tmp_path / "store"))
    first, second = _members(20, 2_000), _members(40, 2_000)[20:]  # ~40 KB each
    packs = pack.write_packs(store, first) + pack.write_packs(store, second)
    assert len(packs) == 2
    store.new_run()
    store.open_packs([packs[0]])
    store.open_packs([packs[1]], spare=spare)
    held = [store.remembered("unit", oid_of(d)) is not None for _, d in first + second]
    # spare: the first pack's members all kept, the second's as far as there was room;
    # else the second's all kept, the first's oldest pushed out
    assert all(held[:20]) == spare and all(held[20:]) != spare and not all(held)
    before = store.requests.snapshot()["get"]
    for kind, data in first + second:  # every member still read whole (its pack again)
        assert store.get_object(kind, oid_of(data)) == data
    reopened = store.requests.snapshot()["get"] - before
    assert reopened == (1 if spare else 2)  # spare: only the second pack is read again


def test_spare_puts_only_what_fits() -> None:
    each = store_module._ByteLRU.cost("a", b"a" * 240)  # its bytes, its key, the entry
    lru = store_module._ByteLRU(4 * each + each // 2)
    for key in "abc":
        lru.put(key, key.encode() * 240)
    lru.put("d", b"d" * 240, spare=True)  # fits: 4 of 4.5
    assert lru.get("d") == b"d" * 240
    lru.put("e", b"e" * 240, spare=True)  # would push "a" out: not kept
    assert lru.get("e") is None and lru.get("a") == b"a" * 240
    lru.put("e", b"e" * 240)  # not spare: the least recently used ("b") goes
    assert lru.get("e") == b"e" * 240 and lru.get("b") is None and lru.get("a") is not None


def test_an_entry_costs_what_it_holds_in_memory() -> None:
    """The budget is the memory the entries hold, their keys and the dict's entries too, not
    only their bytes: many small objects (units) stay within it, measured."""
    import hashlib
    import tracemalloc

    keys = [f"v1/objects/unit/{h[:2]}/{h[2:]}"
            for h in (hashlib.sha256(str(i).encode()).hexdigest() for i in range(20_000))]
    budget = 4 << 20
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        lru = store_module._ByteLRU(budget)
        for i, key in enumerate(keys):  # made here: held by the cache alone once kept
            lru.put(key[:-1] + key[-1], str(i).encode() * 100)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert lru._size <= budget
    assert budget * 0.85 <= held <= budget * 1.1, held

"""The store's read cache when packs are opened ``spare`` (publish reading the run's own
packs): members are kept only where the cache has room, and one that was not kept is read
from its pack again, whole and verified."""

from __future__ import annotations

from pathlib import Path

import pytest

import storage.store as store_module
from evalsnap.records import pack
from storage import Store, oid_of
from storage.readcache import ENTRY_BYTES, OWN_BYTES, SlabLRU


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
    lru = SlabLRU(4 * 1000, slab_bytes=1000)  # four slabs (the keys' cost aside)
    for key in "abc":  # a slab each (700 bytes: two do not fit in one)
        lru.put(key, key.encode() * 700)
    lru.put("d", b"d" * 700, spare=True)  # no fourth slab: its key's cost goes over
    assert lru.get("d") is None and lru.size <= 4000
    lru.put("e", b"e" * 200, spare=True)  # fits in the third slab's room
    assert lru.get("e") == b"e" * 200
    lru.put("d", b"d" * 700)  # not spare: the oldest slab goes, with "a" (never read)
    assert lru.get("d") == b"d" * 700 and lru.get("a") is None
    assert [lru.get(k) for k in "bce"] == [b"b" * 700, b"c" * 700, b"e" * 200]
    assert lru.size <= 4000


def test_the_least_recently_used_go_first() -> None:
    """An entry read becomes the most recent: the least recently used go first, and a slab
    is given back once none of its entries is kept."""
    lru = SlabLRU(4 * 1000 + 4 * (3 + ENTRY_BYTES), slab_bytes=1000)
    for key in ("k0", "k1", "k2", "k3"):
        lru.put(key, key.encode().ljust(800, b"."))  # 800 bytes: a slab each
    assert lru.get("k0") == b"k0".ljust(800, b".")  # now the most recent: k1 is the least
    lru.put("k4", b"k4".ljust(800, b"."))
    assert [k in lru for k in ("k0", "k1", "k2", "k3", "k4")] == [True, False, True, True, True]
    assert len(lru._slabs) == 4 and lru.size <= lru._budget
    for i in range(5, 40):  # k0 read every time: never let go of, while the rest come and go
        lru.put(f"k{i}", f"k{i}".encode().ljust(800, b"."))
        assert lru.get("k0") == b"k0".ljust(800, b".")
    assert "k5" not in lru and lru.get("k39") == b"k39".ljust(800, b".") and lru.size <= lru._budget


def test_a_slab_mostly_let_go_of_is_emptied_before_anything_else_goes() -> None:
    lru = SlabLRU(3 * 1000 + 12 * (3 + ENTRY_BYTES), slab_bytes=1000)
    for i in range(9):  # three slabs of three 300-byte entries
        lru.put(f"k{i:02}", bytes([i]) * 300)
    for i in (0, 1, 3, 4):  # the first two slabs: one entry left in each
        lru.drop(f"k{i:02}")
    lru.put("k09", b"\x09" * 300)  # room from emptying the sparse slabs, nothing let go of
    assert all(lru.get(f"k{i:02}") == bytes([i]) * 300 for i in (2, 5, 6, 7, 8, 9))
    assert lru.size <= lru._budget and len(lru._slabs) <= 3


def test_large_entries_are_their_own_and_go_whole() -> None:
    big = b"x" * (OWN_BYTES + 1)
    lru = SlabLRU(8 * OWN_BYTES)
    lru.put("big", big)
    assert lru.get("big") is big  # not copied in, nor out
    lru.drop("big")
    assert lru.get("big") is None and lru.size == 0


def test_an_entry_costs_what_it_holds_in_memory() -> None:
    """The budget is the memory the cache takes: its slabs (mapped whole, whatever they hold),
    and each entry's key and place in the index, measured: many small objects (units) stay
    within it."""
    import hashlib
    import tracemalloc

    keys = [f"v1/objects/unit/{h[:2]}/{h[2:]}"
            for h in (hashlib.sha256(str(i).encode()).hexdigest() for i in range(40_000))]
    budget = 4 << 20
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        lru = SlabLRU(budget)
        for i, key in enumerate(keys):  # made here: held by the cache alone once kept
            lru.put(key[:-1] + key[-1], str(i).encode() * 100)
        index = tracemalloc.get_traced_memory()[0] - before  # the slabs are not the heap's
    finally:
        tracemalloc.stop()
    slabs = sum(len(slab) for slab in lru._slabs.values())
    assert lru.size <= budget
    assert budget * 0.85 <= index + slabs <= budget * 1.1, (index, slabs)
    assert 0 < len(lru) < len(keys)


def test_a_forked_child_cannot_change_what_the_cache_holds() -> None:
    """A slab is private memory: a process forked from this one (multiprocessing's fork, in a
    user's metric) that writes into its copy of the cache leaves this process's bytes as
    they were (a shared map would hand out the child's bytes here, as if verified)."""
    import multiprocessing
    import sys

    if sys.platform != "linux":
        pytest.skip("fork")
    lru = SlabLRU(8 << 20)
    lru.put("a", b"a" * 1000)

    def child() -> None:
        lru.put("b", b"b" * 1000)  # the next 1,000 bytes of the same slab, in the child
        slab = next(iter(lru._slabs.values()))
        slab[0:1000] = b"x" * 1000  # and over "a" itself

    proc = multiprocessing.get_context("fork").Process(target=child)
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0
    lru.put("c", b"c" * 1000)
    assert lru.get("a") == b"a" * 1000 and lru.get("c") == b"c" * 1000 and lru.get("b") is None


def test_a_key_put_again_holds_what_was_put_last() -> None:
    """Prefect's task results are kept by name, and a name can be written again with other
    bytes: the cache then hands out the new ones (the same bytes again only touch it)."""
    lru = SlabLRU(64 * 1000, slab_bytes=1000)
    lru.put("result", b"old" * 100)
    lru.put("result", b"new" * 100)
    assert lru.get("result") == b"new" * 100
    lru.put("result", b"longer" * 100)
    assert lru.get("result") == b"longer" * 100 and len(lru) == 1
    slabs = len(lru._slabs)
    lru.put("result", b"longer" * 100)  # the same again: no copy, no new place
    assert len(lru._slabs) == slabs and lru.get("result") == b"longer" * 100


def test_a_written_outcomes_object_is_not_kept_in_the_read_cache() -> None:
    """A metric's outcomes (a row per case, ~29 MB at 30,000 cases) are held by the task
    that wrote them and read by a later run: like a pack's bytes, not kept on writing."""
    from storage import Store
    from storage._layout import object_rel

    store = Store("memory://read-cache-outcomes")
    store.new_run()
    oid = store.put_object_streamed("outcomes", [b"[\n", b"{}\n]\n"])
    other = store.put_object("inference", b"{}")
    assert not store._cache.holds(object_rel("outcomes", oid))
    assert store._cache.holds(object_rel("inference", other))  # the test can see a kept one
    assert store.get_object("outcomes", oid) == b"[\n{}\n]\n"

"""The read cache of a store instance: verified objects' bytes by key, bounded by the memory
they take, the least recently used let go past the budget.

The bytes are copied into slabs (private anonymous maps of :data:`SLAB_BYTES`), not kept as
one ``bytes`` object each: a run keeps tens of thousands of 1-10 KB objects here for a while
and lets go of them in another order than it made them, among the many more short-lived
objects of the same sizes it makes meanwhile (a chunk's judge prompts, answers, unit JSON).
Kept in glibc's heap, each one left pinned the pages around it, and those holes grew with the
objects read, not with what the cache held: at 6,006 cases the flow's process ended a judge
metric with 50 MB free in its heap and its heap ~3 MB larger each chunk of 500 units (glibc's
``mallinfo2``, after a trim), which put its peak at 30,030 cases 10-20 % above the
10,010-case run's (bench/RESULTS.md, stops 54-55). A slab is given back to the system whole
when it goes, whatever was in it.

An entry of :data:`OWN_BYTES` or more is kept as its own ``bytes`` object: the allocator maps
anything that large on its own (and gives it back whole), and copying it would cost more.

Least recently used: an entry read or put again becomes the most recent, and the least
recent go first when room is needed. An entry let go of leaves its place in its slab unused;
a slab none of whose entries is left is given back, and one that is mostly unused is emptied
into the newest slab (its entries keep their place in the order) before anything else is let
go of. The cache's budget counts whole slabs, so that it is what the cache takes.
"""

from __future__ import annotations

import mmap
import threading
from collections import OrderedDict

__all__ = ["ENTRY_BYTES", "OWN_BYTES", "SLAB_BYTES", "ReadCache", "SlabLRU"]

#: Bytes of one slab (a fresh slab costs memory only as it is written: its pages are the
#: system's zero pages until then).
SLAB_BYTES = 4 << 20
#: Entries at least this long are their own ``bytes`` object, not copied into a slab.
OWN_BYTES = 1 << 20
#: What an entry takes besides its bytes and its key's characters (the key's object header,
#: the index's dict entry and the entry's location, an ``int``): counted in the budget.
ENTRY_BYTES = 160

_OFFSET_BITS = 23  # offsets and lengths within a slab: < 8 MB
_MASK = (1 << _OFFSET_BITS) - 1


def _slab(size: int) -> mmap.mmap:
    """A new slab: private anonymous memory. Not ``mmap``'s default (shared), whose pages a
    process forked from this one (``multiprocessing``'s fork, in user code) would share and
    could overwrite: a copy-on-write page is the child's own."""
    flags = getattr(mmap, "MAP_PRIVATE", None)
    anonymous = getattr(mmap, "MAP_ANONYMOUS", None)
    if flags is None or anonymous is None:  # Windows: an anonymous map is the process's own
        return mmap.mmap(-1, size)
    return mmap.mmap(-1, size, flags=flags | anonymous)


def _where(serial: int, offset: int, length: int) -> int:
    return (((serial << _OFFSET_BITS) | offset) << _OFFSET_BITS) | length


def _parts(where: int) -> tuple[int, int, int]:
    return where >> (2 * _OFFSET_BITS), (where >> _OFFSET_BITS) & _MASK, where & _MASK


class SlabLRU:
    """Bytes by key in slabs, at most ``budget`` bytes of memory (whole slabs, entries of
    their own, and :data:`ENTRY_BYTES` plus the key for each entry); thread-safe."""

    def __init__(self, budget: int, slab_bytes: int | None = None) -> None:
        # at least 8 slabs to a budget: a small cache (a test's) lets go of an eighth at a time
        slab = slab_bytes or max(1, min(SLAB_BYTES, budget // 8))
        if not 0 < slab <= _MASK:
            raise ValueError(f"a slab is 1 … {_MASK} bytes, not {slab}")
        self._budget = budget
        self._slab_bytes = slab
        self._own_bytes = min(OWN_BYTES, slab)
        self._lock = threading.Lock()
        #: key → its serial, offset and length (:func:`_where`), least recently used first
        self._order: OrderedDict[str, int] = OrderedDict()
        #: serial → a slab (``mmap``) or an entry of its own (``bytes``)
        self._slabs: dict[int, mmap.mmap | bytes] = {}
        self._live: dict[int, int] = {}  # serial → bytes of its entries still kept
        self._keys: dict[int, list[str]] = {}  # serial → the keys put there
        self._serial = 0  # the last serial given
        self._filling = 0  # the slab filled now (0: none)
        self._fill = 0  # bytes of it used
        self._size = 0

    @staticmethod
    def cost(key: str) -> int:
        """What an entry takes of the budget besides its bytes (or its share of a slab)."""
        return len(key) + ENTRY_BYTES

    @property
    def size(self) -> int:
        """The memory the cache takes now, as its budget counts it."""
        return self._size

    def __contains__(self, key: object) -> bool:
        return key in self._order

    def __len__(self) -> int:
        return len(self._order)

    def get(self, key: str) -> bytes | None:
        with self._lock:
            where = self._order.get(key)
            if where is None:
                return None
            self._order.move_to_end(key)
            return self._bytes(where)

    def _bytes(self, where: int) -> bytes:
        serial, offset, length = _parts(where)
        slab = self._slabs[serial]
        return slab if isinstance(slab, bytes) else slab[offset:offset + length]

    def drop(self, key: str) -> None:
        with self._lock:
            where = self._order.pop(key, None)
            if where is not None:
                self._let_go(key, where)

    def _let_go(self, key: str, where: int) -> None:
        """``key`` (out of the order already) is let go of: its slab too, once empty."""
        serial, _, length = _parts(where)
        self._size -= self.cost(key)
        self._live[serial] -= length
        if not self._live[serial] and serial != self._filling:
            self._free(serial)

    def _free(self, serial: int) -> None:
        slab = self._slabs.pop(serial)
        del self._live[serial], self._keys[serial]
        self._size -= len(slab)
        if isinstance(slab, mmap.mmap):
            slab.close()  # given back now, whole

    def put(self, key: str, data: bytes, *, spare: bool = False) -> None:
        """Keeps ``data`` under ``key`` (instead of what it held), letting go of the least
        recently used if need be; ``spare``: only if it fits without letting anything go.
        The same bytes again (an object's: its members are put again as its pack is written)
        only make the key the most recent."""
        if len(data) + self.cost(key) > self._budget // 4:
            return  # one huge object would push out everything else
        with self._lock:
            where = self._order.get(key)
            if where is not None:
                if _parts(where)[2] == len(data) and self._bytes(where) == data:
                    self._order.move_to_end(key)
                    return
                del self._order[key]
                self._let_go(key, where)
            if spare and self._size + self._grows(key, len(data)) > self._budget:
                return
            self._make_room(key, len(data))
            self._order[key] = self._place(key, bytes(data) if type(data) is not bytes
                                           else data)

    def _grows(self, key: str, length: int) -> int:
        """What putting an entry would add to the cache's size."""
        if length >= self._own_bytes:
            return self.cost(key) + length
        new_slab = not self._filling or self._fill + length > self._slab_bytes
        return self.cost(key) + (self._slab_bytes if new_slab else 0)

    def _place(self, key: str, data: bytes) -> int:
        """Puts ``data`` in the newest slab (or on its own): where it is."""
        length = len(data)
        self._size += self.cost(key)
        if length >= self._own_bytes:
            self._serial += 1
            self._slabs[self._serial], self._keys[self._serial] = data, [key]
            self._live[self._serial] = length
            self._size += length
            return _where(self._serial, 0, length)
        if not self._filling or self._fill + length > self._slab_bytes:
            if self._filling and not self._live[self._filling]:
                self._free(self._filling)  # filled, and every entry let go of since
            self._serial += 1
            self._filling, self._fill = self._serial, 0
            self._slabs[self._serial] = _slab(self._slab_bytes)
            self._keys[self._serial], self._live[self._serial] = [], 0
            self._size += self._slab_bytes
        slab = self._slabs[self._filling]
        assert isinstance(slab, mmap.mmap)
        slab[self._fill:self._fill + length] = data
        self._keys[self._filling].append(key)
        self._live[self._filling] += length
        self._fill += length
        return _where(self._filling, self._fill - length, length)

    def _make_room(self, key: str, length: int) -> None:
        """Until an entry of ``length`` bytes fits the budget: a slab at most half of whose
        bytes are still kept is emptied into the newest (its entries keep their place in the
        order), else the least recently used entry is let go of."""
        while self._order and self._size + self._grows(key, length) > self._budget:
            sparse = min((s for s in self._slabs if s != self._filling
                          and not isinstance(self._slabs[s], bytes)),
                         key=self._live.__getitem__, default=0)
            if sparse and self._live[sparse] * 2 <= self._slab_bytes:
                self._empty(sparse)
            else:
                old_key, where = self._order.popitem(last=False)
                self._let_go(old_key, where)

    def _empty(self, serial: int) -> None:
        """Moves the entries still kept in slab ``serial`` to the newest, then frees it."""
        slab = self._slabs[serial]
        assert isinstance(slab, mmap.mmap)
        for k in self._keys[serial]:
            where = self._order.get(k)
            if where is None or _parts(where)[0] != serial:
                continue  # let go of already
            self._live[serial] -= _parts(where)[2]
            self._size -= self.cost(k)
            self._order[k] = self._place(k, self._bytes(where))  # same place in the order
        self._free(serial)


class ReadCache:
    """The read cache of a store instance: a :class:`SlabLRU` for judge ledger entries
    (``judge_budget``) and one for every other object (the rest of ``budget``)."""

    def __init__(self, budget: int, judge_budget: int, judge_prefix: str) -> None:
        self._judge_prefix = judge_prefix
        self._judge = SlabLRU(judge_budget)
        self._rest = SlabLRU(budget - judge_budget)

    def _lane(self, key: str) -> SlabLRU:
        return self._judge if key.startswith(self._judge_prefix) else self._rest

    def get(self, key: str) -> bytes | None:
        return self._lane(key).get(key)

    def holds(self, key: str) -> bool:
        """Whether ``key`` is kept (without copying its bytes out)."""
        return key in self._lane(key)

    def drop(self, key: str) -> None:
        self._lane(key).drop(key)

    def put(self, key: str, data: bytes, *, spare: bool = False) -> None:
        self._lane(key).put(key, data, spare=spare)

"""What a process remembers of many objects, a few dozen bytes each: maps from a path's or
an id's 16-byte :func:`~storage.ids.short_key` to a small number, in one ``bytearray``.

A run of 30,000 cases remembers ~400,000 pack members (which pack holds each), 210,000 unit
verdicts (their row), and every object it wrote or proved. As a ``dict`` of ``bytes`` keys
that is ~105 bytes an entry, each key a small object of its own among the interpreter's
(which pins its memory pools); here it is 20 bytes a slot, 55-80 % of the slots full
(25-36 bytes an entry), in two blocks the allocator gives back whole when they grow.

Open addressing with linear probing: a slot is the 16-byte key (in one ``bytearray``) and a
32-bit word (in an ``array``): 0 for a slot never used, ``0xFFFFFFFF`` for a removed entry,
else the number + 1. The keys are blake2b digests, so their bits spread evenly without
another hash (a key's first slot is its first 8 bytes modulo the table's size, which is any
size: the table grows to what its entries need, not to the next power of two).
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Hashable
from typing import Generic, TypeVar, overload

from storage.ids import short_key

__all__ = ["KeyMap", "KeyNumbers"]

_GONE = 0xFFFFFFFF
#: The largest number an entry holds (its word holds the number + 1; all ones: removed).
MAX_NUMBER = _GONE - 2

V = TypeVar("V", bound=Hashable)


class KeyNumbers:
    """16-byte keys to numbers (0 … :data:`MAX_NUMBER`); thread-safe (a store's maps are
    read and written by the run's threads: a lookup must never see a half-grown table)."""

    __slots__ = ("_keys", "_words", "_size", "_filled", "_n", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clear(8)

    def _clear(self, capacity: int) -> None:
        self._keys = bytearray(capacity * 16)
        self._words = array("I", bytes(capacity * 4))
        self._size = capacity
        self._filled = 0  # slots not empty: entries and removed ones
        self._n = 0

    def _find(self, key: bytes) -> tuple[int, bool]:
        """The slot of ``key`` and True, else the slot it would take and False."""
        keys, words, size = self._keys, self._words, self._size
        i = int.from_bytes(key[:8], "little") % size
        free = -1
        while True:
            word = words[i]
            if not word:
                return (i if free < 0 else free), False
            if word == _GONE:
                if free < 0:
                    free = i
            elif keys[i * 16:i * 16 + 16] == key:
                return i, True
            i += 1
            if i == size:
                i = 0

    def get_key(self, key: bytes) -> int | None:
        with self._lock:
            i, found = self._find(key)
            return self._words[i] - 1 if found else None

    def put_key(self, key: bytes, number: int) -> None:
        if not 0 <= number <= MAX_NUMBER:
            raise ValueError(f"a KeyNumbers number is 0 … {MAX_NUMBER}, not {number}")
        if len(key) != 16:
            raise ValueError(f"a KeyNumbers key is 16 bytes, not {len(key)}")
        with self._lock:
            i, found = self._find(key)
            if not found:
                if not self._words[i]:
                    self._filled += 1
                self._n += 1
                self._keys[i * 16:i * 16 + 16] = key
            self._words[i] = number + 1
            if self._filled * 5 > self._size * 4:
                self._grow()

    def pop_key(self, key: bytes) -> int | None:
        with self._lock:
            i, found = self._find(key)
            if not found:
                return None
            number = self._words[i] - 1
            self._words[i] = _GONE
            self._n -= 1
            return number

    def _grow(self) -> None:
        """Slots enough for the entries to fill 55 % of them (removed ones left behind):
        past 80 % full the table grows again. (Grown by doubling to at most 35 % full, a
        table of 400,000 entries had 2,097,152 slots, 42 MB: one of 210,000 at most 35 %
        is 1,048,576 when 382,000 slots do.)"""
        keys, words = self._keys, self._words
        self._clear(max(8, self._n * 20 // 11 + 1))
        new_keys, new_words, size = self._keys, self._words, self._size
        for j, word in enumerate(words):
            if word and word != _GONE:
                key = keys[j * 16:j * 16 + 16]
                i = int.from_bytes(key[:8], "little") % size
                while new_words[i]:
                    i += 1
                    if i == size:
                        i = 0
                new_keys[i * 16:i * 16 + 16] = key
                new_words[i] = word
                self._n += 1
        self._filled = self._n

    def items(self) -> list[tuple[bytes, int]]:
        """Every (key, number), in no particular order."""
        with self._lock:
            keys = self._keys
            return [(bytes(keys[i * 16:i * 16 + 16]), word - 1)
                    for i, word in enumerate(self._words) if word and word != _GONE]

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0


class KeyMap(Generic[V]):
    """A dict by path or id (kept as its :func:`~storage.ids.short_key`), for values of which
    there are few (a pack's id, a tuple of packs shared by a record's objects, ``None`` in a
    set): each distinct value is held once, each entry is its number. As a set of paths,
    :meth:`add` and :meth:`discard`."""

    __slots__ = ("_numbers", "_values", "_number_of", "_last", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a value's number is given once (two threads, one value)
        self._numbers = KeyNumbers()
        self._values: list[V] = []
        self._number_of: dict[V, int] = {}
        self._last: tuple[object, int] = (object(), 0)  # the last value set (often the next)

    def _number(self, value: V) -> int:
        if value is self._last[0]:
            return self._last[1]
        number = self._number_of.get(value)
        if number is None:
            number = self._number_of[value] = len(self._values)
            self._values.append(value)
        self._last = (value, number)
        return number

    @overload
    def get(self, text: str) -> V | None: ...

    @overload
    def get(self, text: str, default: V) -> V: ...

    def get(self, text: str, default: V | None = None) -> V | None:
        number = self._numbers.get_key(short_key(text))
        return default if number is None else self._values[number]

    def __getitem__(self, text: str) -> V:
        number = self._numbers.get_key(short_key(text))
        if number is None:
            raise KeyError(text)
        return self._values[number]

    def __setitem__(self, text: str, value: V) -> None:
        key = short_key(text)
        with self._lock:
            self._numbers.put_key(key, self._number(value))

    def add(self, text: str) -> None:
        self[text] = None  # type: ignore[assignment]  # a set: KeyMap[None]

    def discard(self, text: str) -> None:
        self._numbers.pop_key(short_key(text))

    def __contains__(self, text: object) -> bool:
        return isinstance(text, str) and self._numbers.get_key(short_key(text)) is not None

    def __len__(self) -> int:
        return len(self._numbers)

    def __bool__(self) -> bool:
        return bool(self._numbers)

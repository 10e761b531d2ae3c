"""``storage.keymap``: what a process remembers of many objects behaves as the dict it
replaces (by a path's short key), through growth, removal and the slots removal leaves."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.ids import short_key
from storage.keymap import MAX_NUMBER, KeyMap, KeyNumbers

_TEXTS = st.text(alphabet="abcdef/0123456789", min_size=1, max_size=6)
_OPS = st.lists(st.tuples(st.sampled_from(["set", "add", "discard"]), _TEXTS,
                          st.sampled_from([None, "pack-a", "pack-b", ("p1", "p2")])),
                max_size=400)


@settings(max_examples=200, deadline=None)
@given(_OPS)
def test_a_key_map_is_the_dict_it_replaces(ops: list[tuple[str, str, object]]) -> None:
    m: KeyMap[object] = KeyMap()
    d: dict[str, object] = {}
    for op, text, value in ops:
        if op == "set":
            m[text], d[text] = value, value
        elif op == "add":
            m.add(text)
            d[text] = None
        else:
            m.discard(text)
            d.pop(text, None)
        assert len(m) == len(d) and bool(m) == bool(d)
    for _, text, _ in ops:
        assert (text in m) == (text in d)
        assert m.get(text, "absent") == d.get(text, "absent")
        if text in d:
            assert m[text] == d[text]
        else:
            with pytest.raises(KeyError):
                m[text]


def test_many_keys_grow_the_table_and_keep_every_entry() -> None:
    """Past the growth of the table (and with removed slots in it), every number is found,
    none that was removed is, and the table stays at most 80 % full."""
    numbers = KeyNumbers()
    keys = [short_key(f"v1/objects/unit/{i:06d}") for i in range(20_000)]
    for i, key in enumerate(keys):
        numbers.put_key(key, i)
    for key in keys[::3]:
        assert numbers.pop_key(key) is not None
    assert numbers.pop_key(keys[0]) is None
    for i, key in enumerate(keys):
        assert numbers.get_key(key) == (None if i % 3 == 0 else i)
    for i, key in enumerate(keys[::3]):  # removed slots taken again
        numbers.put_key(key, MAX_NUMBER - i)
    assert len(numbers) == len(keys)
    assert sorted(n for _, n in numbers.items()) == sorted(
        i if i % 3 else MAX_NUMBER - i // 3 for i in range(len(keys)))
    assert len(numbers._words) * 0.8 >= numbers._filled


def test_a_table_has_at_most_twice_the_slots_of_its_entries() -> None:
    """20 bytes a slot: the table of a run's 400,000 pack members once grew to 2,097,152
    slots (42 MB, 19 % full); at every size it now has at most 1/0.55 slots an entry."""
    numbers = KeyNumbers()
    for i in range(300_000):
        numbers.put_key(short_key(f"v1/objects/judge/{i:07d}"), i)
        if i % 997 == 0 or i == 299_999:
            assert len(numbers._words) <= (i + 1) * 20 / 11 + 8, i
            assert len(numbers._keys) == 16 * len(numbers._words)


@pytest.mark.parametrize("bad", [-1, MAX_NUMBER + 1])
def test_a_number_out_of_range_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="KeyNumbers number"):
        KeyNumbers().put_key(short_key("x"), bad)


def test_a_key_of_another_length_is_refused() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        KeyNumbers().put_key(b"short", 1)


def test_threads_that_write_and_read_at_once_lose_nothing() -> None:
    """A store's maps are written by the run's threads at once (inference, scoring tasks,
    the event loop's reads): every entry is there after, none read wrong during."""
    import sys
    import threading

    m: KeyMap[str] = KeyMap()
    wrong: list[str] = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can

    def work(t: int) -> None:
        for i in range(3_000):
            m[f"{t}/{i}"] = f"pack-{t}-{i % 7}"
            got = m.get(f"{t}/{i // 2}")
            if got != f"pack-{t}-{(i // 2) % 7}":
                wrong.append(f"{t}/{i // 2}: {got}")

    try:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(interval)
    assert not wrong
    assert len(m) == 6 * 3_000
    assert all(m[f"{t}/{i}"] == f"pack-{t}-{i % 7}" for t in range(6) for i in range(3_000))

"""evalsnap's processes use glibc's malloc with fewer arenas and a fixed mmap threshold
(``startup.fewer_malloc_arenas``), and pass both on to the processes they start."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

PROBE = r"""
import ctypes, json, os, subprocess, sys
from evalsnap import startup

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                "usmblks", "fsmblks", "uordblks", "fordblks",
                                                "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
startup.fewer_malloc_arenas()
# glibc's own threshold would rise to a 20 MiB block once it is freed, and a 4 MiB block
# would then come from the heap; with the threshold fixed it is mapped on its own
libc.free(libc.malloc(20 << 20))
before = libc.mallinfo2().hblkhd
block = libc.malloc(4 << 20)
mapped = libc.mallinfo2().hblkhd - before
libc.free(block)
child = subprocess.run([sys.executable, "-c", "import json, os; print(json.dumps("
                        "[os.environ.get('MALLOC_ARENA_MAX'), os.environ.get('MALLOC_MMAP_THRESHOLD_')]))"],
                       capture_output=True, text=True, check=True).stdout
print(json.dumps({"mapped": mapped, "child": json.loads(child)}))
"""


def _probe(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_")}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env={**clean, **env, "PYTHONPATH": str(ROOT)}, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's malloc")
def test_large_blocks_are_mapped_on_their_own_and_children_inherit_it():
    found = _probe()
    assert found["mapped"] >= 4 << 20, found  # the 4 MiB block was mapped, not from the heap
    assert found["child"] == ["2", str(1 << 20)], found


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's malloc")
def test_a_value_the_user_set_is_kept():
    found = _probe(MALLOC_ARENA_MAX="4", MALLOC_MMAP_THRESHOLD_=str(64 << 20))
    assert found["child"] == ["4", str(64 << 20)], found
    assert found["mapped"] == 0, found  # under a 64 MiB threshold the block is the heap's


TRIM_PROBE = r"""
import ctypes, json
from evalsnap import startup

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
startup.fewer_malloc_arenas()
# 200 MiB of blocks under the mmap threshold (from the heap), each touched; the last one
# kept, so the heap cannot shrink from its top: what was freed is in its middle
blocks = [libc.malloc(64 << 10) for _ in range(3200)]
for b in blocks:
    ctypes.memset(b, 1, 64 << 10)
for b in blocks[:-1]:
    libc.free(b)
freed = rss()
startup.give_back_freed()
print(json.dumps({"freed": freed, "given_back": rss()}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's malloc")
def test_memory_freed_in_the_middle_of_the_heap_is_given_back():
    """Issue 31 (memory): between a run's phases ``give_back_freed`` returns what a phase
    freed to the system (glibc keeps free pages in the middle of its heap otherwise, and the
    next phase's peak counted them)."""
    out = subprocess.run([sys.executable, "-c", TRIM_PROBE], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["freed"] - found["given_back"] > 150 << 20, found


def test_a_trim_inside_a_phase_is_at_most_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """``give_back_now_and_then`` (called per chunk scored, per member of the own packs read)
    trims at most once every ``TRIM_EVERY`` seconds: a trim walks the arenas."""
    from evalsnap import startup

    trims: list[float] = []
    clock = [1000.0]
    monkeypatch.setattr(startup, "give_back_freed", lambda: trims.append(clock[0]))
    monkeypatch.setattr(startup, "_trimmed", [0.0])
    monkeypatch.setattr("time.monotonic", lambda: clock[0])
    for _ in range(50):  # one instant: one trim
        startup.give_back_now_and_then()
    clock[0] += startup.TRIM_EVERY / 2
    startup.give_back_now_and_then()
    clock[0] += startup.TRIM_EVERY / 2
    startup.give_back_now_and_then()
    assert trims == [1000.0, 1000.0 + startup.TRIM_EVERY]

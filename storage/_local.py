"""Crash-safe writes on local disk.

A reader must never see a half-written file, so bytes go to a temporary file in the final
directory (same filesystem), are fsynced (unless the caller defers durability, see
``sync``), and only then get their final name:

* write-once objects: ``os.link`` (fails if the name exists, so the first writer wins and
  later writers of the same content do nothing);
* mutable refs: ``os.replace`` (atomic whole-file replacement).

Temporary names start with ``.tmp-``; ids cannot start with a dot, so a leftover from a
crash never looks like an object or a ref.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
import sys
from typing import Any

__all__ = ["TEMP_PREFIX", "fsync_paths", "write_once", "write_replace"]

TEMP_PREFIX = ".tmp-"

# Filesystems without hard links (some FUSE, SMB and FAT mounts) answer these.
_NO_LINK_ERRNOS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV}


def write_once(path: str, data: bytes, *, sync: bool = True) -> bool:
    """Create ``path`` with ``data`` unless it exists; safe against concurrent writers.

    Returns whether this call created it. With ``sync=False`` nothing is fsynced: the
    caller must :func:`fsync_paths` the file and its directory before anything durable
    points at it (a crash of the process loses nothing; a power cut may).
    """
    if os.path.exists(path):
        return False
    directory = os.path.dirname(path)
    tmp = _write_temp(directory, data, sync)
    try:
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False  # another writer stored the same content first
        except OSError as exc:
            if exc.errno not in _NO_LINK_ERRNOS:
                raise
            # No hard links here: a rename is still atomic, and replacing a content-addressed
            # file with the same content is harmless.
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    if sync:
        _fsync(directory, strict=False)
    return True


def write_replace(path: str, data: bytes, *, sync: bool = True) -> None:
    """Atomically replace ``path`` with ``data`` (readers see old or new, never a mix)."""
    directory = os.path.dirname(path)
    tmp = _write_temp(directory, data, sync)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if sync:
        _fsync(directory, strict=False)


def fsync_paths(files: list[str], directories: list[str]) -> None:
    """Make deferred writes durable: each file, then each directory that names them.

    A file that is gone (a ref replaced meanwhile by a durable write) needs nothing. On
    Linux a batch of many files on one filesystem takes a single ``syncfs(2)`` instead,
    which writes out everything dirty on that filesystem, these files and directories
    included: ext4 then commits its journal once, not once per fsync (PostgreSQL's
    ``recovery_init_sync_method=syncfs`` makes the same trade).
    """
    if len(files) >= SYNCFS_MIN_FILES and _syncfs(directories):
        return
    for name in files:
        _fsync(name, strict=True)
    for name in directories:
        _fsync(name, strict=False)


#: Batches of at least this many files are flushed with one ``syncfs`` where it exists.
SYNCFS_MIN_FILES = 64


@functools.cache
def _syncfs_call() -> Any:
    """libc's ``syncfs``, or None (not Linux, or no such symbol)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        call = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int]
    call.restype = ctypes.c_int
    return call


def _syncfs(directories: list[str]) -> bool:
    """One ``syncfs`` for the filesystem that holds all of ``directories``; False when it
    cannot be used here (then the caller fsyncs file by file)."""
    call = _syncfs_call()
    if call is None or not directories:
        return False
    try:
        devices = {os.stat(d).st_dev for d in directories}
    except OSError:
        return False
    if len(devices) != 1:
        return False  # more than one filesystem
    fd = os.open(directories[0], os.O_RDONLY)
    try:
        if call(fd) != 0:  # the GIL is released during the call (ctypes.CDLL)
            import ctypes

            code = ctypes.get_errno()
            raise OSError(code, f"syncfs: {os.strerror(code)}", directories[0])
    finally:
        os.close(fd)
    return True


_temp_ids = itertools.count()


def _write_temp(directory: str, data: bytes, sync: bool = True) -> str:
    """Write ``data`` to a new temporary file in ``directory`` (created if missing)."""
    # O_EXCL: never write through a file someone else created; 0o644 is filtered by umask.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        # unique in this process; the pid keeps processes apart, O_EXCL catches the rest
        tmp = os.path.join(directory, f"{TEMP_PREFIX}{os.getpid()}-{next(_temp_ids)}")
        try:
            fd = os.open(tmp, flags, 0o644)
            break
        except FileExistsError:
            continue  # a leftover of a crashed process that had the same pid
        except FileNotFoundError:
            os.makedirs(directory, exist_ok=True)  # first write into this directory
    try:
        with open(fd, "wb", closefd=True) as handle:
            handle.write(data)
            if sync:
                handle.flush()
                os.fsync(handle.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return tmp


def _fsync(path: str, *, strict: bool) -> None:
    """fsync one file or directory. A missing one needs nothing; other errors raise only
    when ``strict`` (some filesystems cannot open or fsync directories)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    except OSError:
        if strict:
            raise
        return
    try:
        os.fsync(fd)
    except OSError:
        if strict:
            raise
    finally:
        os.close(fd)

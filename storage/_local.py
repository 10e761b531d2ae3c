"""Crash-safe writes on local disk.

A reader must never see a half-written file, so bytes go to a temporary file in the final
directory (same filesystem), are fsynced (unless the caller defers durability, see
``sync``), and only then get their final name:

* write-once objects: ``os.link`` (fails if the name exists, so the first writer wins and
  later writers of the same content do nothing);
* mutable refs: ``os.replace`` (atomic whole-file replacement).

Temporary names start with ``.tmp-``; ids cannot start with a dot, so a leftover from a
crash never looks like an object or a ref.

**Confinement.** A store's files live inside its directory: writes, gc's listing and gc's
deletions refuse a path that passes through a symbolic link below the store root
(:func:`confine`, ``StoreUnavailable`` naming the link). The root itself may be a link (a
store on another disk); ``v1/`` or anything under it may not: through a link, a write
would land outside the store (where ``verify`` and gc never look) and a deletion would
remove someone else's files.

**Freshening.** Writing an object that is already there refreshes its modification time,
as git does for loose objects, so that gc sees it as young again; gc deletes a local object
only if it has not been refreshed since gc listed it (:func:`remove`). See ``docs/gc.md``.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
import stat
import sys
from collections.abc import Callable, Iterable
from typing import Any

from storage._layout import LAYOUT_VERSION
from storage.errors import StoreUnavailable

__all__ = ["TEMP_PREFIX", "confine", "fsync_paths", "list_tree", "remove", "store_root",
           "write_once", "write_replace"]

TEMP_PREFIX = ".tmp-"

# Filesystems without hard links (some FUSE, SMB and FAT mounts) answer these.
_NO_LINK_ERRNOS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV}


#: What follows ``v1/`` in every path a store writes (``v1/STORE`` aside).
_AREAS = frozenset({"objects", "refs", "prefect", "reports", "site"})


def store_root(path: str) -> str | None:
    """The store root of a path a store writes (``<root>/v1/<area>/…``, ``<root>/v1/STORE``),
    or None. Nothing below ``v1/`` is named ``v1`` followed by an area, so the deepest such
    split is the root even if the root's own path has one."""
    parts = path.split(os.sep)
    for i in range(len(parts) - 2, 0, -1):
        nxt = parts[i + 1]
        if parts[i] == LAYOUT_VERSION and (nxt in _AREAS or (nxt == "STORE" and i + 2 == len(parts))):
            return os.sep.join(parts[:i]) or os.sep
    return None


def confine(root: str, path: str, *, final: bool = False) -> None:
    """Raise ``StoreUnavailable`` if ``path`` is not under ``root`` or reaches it through a
    symbolic link below ``root`` (``final``: ``path`` itself included). Components that do
    not exist yet are fine: writing creates them as real directories."""
    root = root.rstrip(os.sep) or os.sep
    rel = os.path.relpath(path, root)
    if rel == os.curdir or rel.startswith(os.pardir + os.sep) or rel == os.pardir \
            or os.path.isabs(rel):
        raise StoreUnavailable(root, f"{path} is not inside the store directory")
    parts = rel.split(os.sep)
    current = root
    for part in parts if final else parts[:-1]:
        current = os.path.join(current, part)
        try:
            mode = os.lstat(current).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return
        if stat.S_ISLNK(mode):
            raise StoreUnavailable(root, _link_reason(current))


def _link_reason(link: str) -> str:
    try:
        target = os.readlink(link)
    except OSError:
        target = "?"
    return (f"{link} is a symbolic link (to {target}); evalsnap keeps a local store's files "
            "inside its directory and follows no link below it (writes, gc). Replace the "
            "link with a real directory (move its files in), or pass --store the directory "
            "that holds v1/ itself")


def _confined(path: str, root: str | None, *, final: bool) -> None:
    root = root or store_root(path)
    if root is not None:
        confine(root, path, final=final)


def _freshen(path: str) -> bool:
    """Refresh the modification time of an existing file; False if there is none. A file
    this user may not touch (a shared store) is left as it is."""
    try:
        os.utime(path)
    except FileNotFoundError:
        return False
    except PermissionError:
        return os.path.exists(path)
    return True


def write_once(path: str, data: bytes, *, sync: bool = True, root: str | None = None) -> bool:
    """Create ``path`` with ``data`` unless it exists; safe against concurrent writers.

    Returns whether this call created it; an existing file is freshened (see the module
    docstring). With ``sync=False`` nothing is fsynced: the caller must :func:`fsync_paths`
    the file and its directory before anything durable points at it (a crash of the
    process loses nothing; a power cut may). ``root``: the store root (default: found
    from the path, :func:`store_root`); nothing below it may be a symbolic link.
    """
    _confined(path, root, final=True)
    if _freshen(path):
        return False
    return _place_once(_write_temp(os.path.dirname(path), data, sync), path, sync)


def write_once_streamed(directory: str, parts: Iterable[bytes], name: Callable[[], str], *,
                        intact: Callable[[str], bool], sync: bool = True,
                        root: str | None = None) -> tuple[str, bool]:
    """:func:`write_once` of bytes given a part at a time, never held whole: they go to a
    temporary file in ``directory`` (on the same file system as every path ``name`` gives),
    then ``name()`` (called once every part is written: e.g. their hash) says where the
    file goes. A file there already is kept if ``intact(path)``, else replaced (damage: the
    same name must hold the same bytes). Returns that path and whether this call wrote it."""
    _confined(directory, root, final=False)
    tmp = _write_temp(directory, parts, sync)
    try:
        path = name()
        _confined(path, root, final=True)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if _freshen(path):
        if intact(path):
            os.unlink(tmp)
            return path, False
        try:
            os.replace(tmp, path)  # repaired whole
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        if sync:
            _fsync(os.path.dirname(path), strict=False)
        return path, True
    return path, _place_once(tmp, path, sync)


def _place_once(tmp: str, path: str, sync: bool) -> bool:
    """Moves the temporary file ``tmp`` to ``path`` unless a file is there already."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    try:
        try:
            os.link(tmp, path)
        except FileExistsError:
            _freshen(path)
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


def write_replace(path: str, data: bytes | Iterable[bytes], *, sync: bool = True,
                  root: str | None = None) -> None:
    """Atomically replace ``path`` with ``data`` (its bytes, or its parts one after another;
    readers see old or new, never a mix, nor a part: a failure while the parts come leaves
    the old); a link at ``path`` itself is replaced, never written through (``root``: as
    for :func:`write_once`)."""
    _confined(path, root, final=False)
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


def list_tree(root: str, area: str) -> list[tuple[str, int, float]]:
    """(path relative to ``root``, size, mtime) of every file under ``root/area``, sorted;
    a symbolic link anywhere there raises ``StoreUnavailable`` naming it (never followed)."""
    base = os.path.join(root, area)
    confine(root, base, final=True)
    out: list[tuple[str, int, float]] = []
    stack = [base]
    while stack:
        directory = stack.pop()
        try:
            entries = os.scandir(directory)
        except (FileNotFoundError, NotADirectoryError):
            continue
        with entries:
            for entry in entries:
                if entry.is_symlink():
                    raise StoreUnavailable(root, _link_reason(entry.path))
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # removed since the directory was read
                    out.append((os.path.relpath(entry.path, root).replace(os.sep, "/"),
                                st.st_size, st.st_mtime))
    return sorted(out)


def remove(root: str, path: str, *, listed_mtime: float | None = None) -> bool:
    """Delete ``path`` (confined to ``root``); a missing file is not an error. With
    ``listed_mtime`` (write-once objects), the file is deleted only if it still has that
    modification time: it is renamed aside first, so that a writer freshening it
    (:func:`write_once`) either does so before the rename — then it is seen and restored —
    or finds it gone and writes it again. Returns whether the file was deleted."""
    confine(root, path, final=False)
    if listed_mtime is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return True
    aside = os.path.join(os.path.dirname(path), f"{TEMP_PREFIX}gc-{os.getpid()}-{next(_temp_ids)}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return True
    try:
        if os.lstat(aside).st_mtime != listed_mtime:  # freshened since the listing: keep
            try:
                os.link(aside, path)
            except FileExistsError:
                pass  # written again meanwhile: the same content
            except OSError as exc:
                if exc.errno not in _NO_LINK_ERRNOS:
                    raise
                os.replace(aside, path)
            return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(aside)
    return True


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


def _write_temp(directory: str, data: bytes | Iterable[bytes], sync: bool = True) -> str:
    """Write ``data`` (bytes, or its parts one after another) to a new temporary file in
    ``directory`` (created if missing)."""
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
            if isinstance(data, bytes | bytearray | memoryview):
                handle.write(data)
            else:
                for part in data:
                    handle.write(part)
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
